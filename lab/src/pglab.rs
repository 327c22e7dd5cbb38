//! The PostgreSQL lab cluster (`lab up --cluster --db postgres`): a primary on rf-b1 and its
//! streaming replica on rf-b2, each with `refract agent` in front of it, refract hybrid
//! (VIP:6432, through the agents) and relay-only (VIP:6433) and PgBouncer (198.18.0.2:6434) in
//! rf-d. The servers are started by `pg_ctl` (they daemonise themselves), the agents, refract
//! and PgBouncer as daemons with logs and pid files in the state directory; `stop` stops them
//! all (PostgreSQL with `pg_ctl stop -m fast`) and deletes the data.
//!
//! Inside: [`layout`] (names, addresses, ports, the configs; `refract_server_addr` and
//! `agent_addr`), [`server`] (PostgreSQL), [`pgbouncer`] (its config).

pub mod layout;
pub mod pgbouncer;
pub mod server;

use crate::fabric::topology::{C1, DISPATCHER};
use crate::support::{interrupt, sh, state};
use anyhow::{bail, Context, Result};
use layout::{pg_dir, pgbouncer_addr, PgDispatcher, SERVERS};
use refract_testkit::{DATABASE, PASSWORD, USER};
use server::Pg;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// How long the cluster may take to answer on every listener, the replica streaming.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Start the cluster (anything of an earlier one is stopped and deleted first), with
/// `refract_bin` as the dispatchers, and wait until every listener answers from rf-c1. The
/// processes outlive this call; [`stop`] ends them. On failure, what was started is stopped.
pub fn start(refract_bin: &Path) -> Result<()> {
    stop();
    let pg = Pg::find()?;
    start_all(&pg, refract_bin).inspect_err(|_| stop())
}

fn start_all(pg: &Pg, refract_bin: &Path) -> Result<()> {
    let dispatchers = layout::dispatchers()?;
    std::fs::create_dir_all(pg_dir()).with_context(|| format!("creating {}", pg_dir().display()))?;
    let [primary, replica] = SERVERS;
    pg.init_primary(&primary)?;
    pg.start(&primary)?;
    pg.base_backup(&replica, &primary)?;
    pg.start(&replica)?;
    start_agents(refract_bin, &dispatchers)?;
    for d in &dispatchers {
        let config = state::write(&format!("{}.toml", d.name), d.text)?;
        let config = config.to_string_lossy().into_owned();
        spawn(&DISPATCHER.ns(), d.name, refract_bin, &["dispatch", "--config", &config])?;
    }
    start_pgbouncer(pg, &dispatchers)?;
    wait_ready()
}

/// An agent on each server's host, and the lab key into the file the hybrid dispatcher's
/// `[handover] key_file` names (owner-only).
fn start_agents(refract_bin: &Path, dispatchers: &[PgDispatcher]) -> Result<()> {
    let agents = layout::agents()?;
    for (s, text) in SERVERS.iter().zip(layout::PG_AGENT_TOMLS) {
        let config = state::write(&format!("{}.toml", s.agent_name()), text)?;
        let config = config.to_string_lossy().into_owned();
        spawn(&s.host.ns(), &s.agent_name(), refract_bin, &["agent", "--config", &config])?;
    }
    let key = agents.first().map(|a| a.key.as_str()).context("no agent")?;
    for file in dispatchers.iter().filter_map(|d| d.config.handover.as_ref()?.key_file.as_deref()) {
        crate::cluster::write_private(Path::new(file), key)?;
    }
    wait_agents(&agents)
}

/// Until every agent listens (its server port and its control port). The hybrid dispatcher
/// must not start before: a server connection it makes while the agent is not there goes
/// straight to the server, stays in its pool, and never hands a result over.
fn wait_agents(agents: &[layout::PgAgentConfig]) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    for (s, a) in SERVERS.iter().zip(agents) {
        for addr in [&a.postgres_listen, &a.control] {
            let listening = || {
                let out = sh::run(sh::cmd(Some(&s.host.ns()), "ss", &["-ltnH", "src", addr])).unwrap_or_default();
                !out.trim().is_empty()
            };
            while !listening() {
                interrupt::check()?;
                let name = s.agent_name();
                if Instant::now() > deadline {
                    bail!(
                        "{name} is not listening on {addr}; {name}.log:\n{}",
                        state::log_tail(&format!("{name}.log"), 20)
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    Ok(())
}

/// PgBouncer in rf-d as the server user (`-u`; it refuses to run as root).
fn start_pgbouncer(pg: &Pg, dispatchers: &[PgDispatcher]) -> Result<()> {
    if !Path::new(pgbouncer::BINARY).exists() {
        bail!("PgBouncer is not installed ({}): apt-get install pgbouncer", pgbouncer::BINARY);
    }
    let dir = pgbouncer::dir();
    pg.owned_dir(&dir)?;
    let pool = dispatchers.first().map_or(1, |d| d.config.postgres.pool_size) * SERVERS.len();
    let (ini, users) = (dir.join("pgbouncer.ini"), dir.join("userlist.txt"));
    std::fs::write(&ini, pgbouncer::config(&SERVERS[0], pool))?;
    std::fs::write(&users, pgbouncer::userlist())?;
    pg.give(&ini)?;
    pg.give(&users)?;
    let ini = ini.to_string_lossy().into_owned();
    let mut args: Vec<&str> = pg.user().map(|u| vec!["-u", u]).unwrap_or_default();
    args.push(&ini);
    spawn(&DISPATCHER.ns(), layout::PGBOUNCER, Path::new(pgbouncer::BINARY), &args)
}

/// Start a daemon in namespace `ns`: its own process group, output to `NAME.log`, pid to
/// `NAME.pid`.
pub(crate) fn spawn(ns: &str, name: &str, program: &Path, args: &[&str]) -> Result<()> {
    let mut c = sh::cmd(Some(ns), &program.to_string_lossy(), args);
    let log = std::fs::File::create(state::path(&format!("{name}.log")))?;
    c.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).env("RUST_LOG", "warn").process_group(0);
    // `ip netns exec` execs the program, so this pid is the daemon's.
    let child = c.spawn().with_context(|| format!("cannot start `{}`", sh::show(&c)))?;
    state::write(&format!("{name}.pid"), &child.id().to_string())?;
    Ok(())
}

/// The daemons started by [`spawn`]: name and the program their command line names.
fn daemons() -> Vec<(String, &'static str)> {
    let mut v: Vec<(String, &'static str)> = SERVERS.iter().map(|s| (s.agent_name(), "refract")).collect();
    v.extend(layout::dispatchers().unwrap_or_default().iter().map(|d| (d.name.to_string(), "refract")));
    v.push((layout::PGBOUNCER.to_string(), "pgbouncer"));
    v
}

/// A daemon's pid, if its pid file names a live process whose command line names `program`
/// (for a moment after the start, that is `ip netns exec rf-d PROGRAM …`).
pub fn daemon_pid(name: &str, program: &str) -> Option<u32> {
    let pid: u32 = state::read(&format!("{name}.pid"))?.trim().parse().ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    (sh::alive(pid) && String::from_utf8_lossy(&cmdline).contains(program)).then_some(pid)
}

/// Stop everything of the cluster (those not running are skipped) and delete its data;
/// logs stay. Best effort: `lab down` and `lab up` call it whatever is left.
pub fn stop() {
    let mut pids: Vec<u32> = Vec::new();
    for (name, program) in daemons() {
        pids.extend(daemon_pid(&name, program));
        let _ = std::fs::remove_file(state::path(&format!("{name}.pid")));
    }
    sh::stop_pids(&pids);
    if let Ok(pg) = Pg::find() {
        // The replica first: the primary's fast shutdown then has no standby to wait for.
        for s in SERVERS.iter().rev() {
            pg.stop(s);
        }
    }
    let _ = std::fs::remove_dir_all(pg_dir());
}

/// `psql -XAtq -c SQL` from namespace `ns` to `IP:PORT` as the lab user; trimmed output.
pub fn psql(ns: &str, addr: &str, sql: &str) -> Result<String> {
    let psql = refract_testkit::tool("psql").context("finding psql")?;
    let (host, port) = addr.rsplit_once(':').with_context(|| format!("{addr} is no IP:PORT"))?;
    let args = ["-h", host, "-p", port, "-U", USER, "-d", DATABASE, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql];
    let mut c = sh::cmd(Some(ns), &psql.to_string_lossy(), &args);
    c.env("PGPASSWORD", PASSWORD).env("PGCONNECT_TIMEOUT", "5");
    Ok(sh::run(c)?.trim().to_string())
}

/// The readiness checks, from rf-c1: each listener answers `SELECT 1`, the replica streams.
fn checks() -> Result<Vec<(String, String, &'static str, &'static str)>> {
    let mut v: Vec<(String, String, &str, &str)> =
        SERVERS.iter().map(|s| (s.name(), s.listen_addr(), "SELECT 1", "1")).collect();
    let streaming = "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'";
    v.push(("streaming replication".into(), SERVERS[0].listen_addr(), streaming, "1"));
    // A plain client through an agent is proxied byte for byte: this checks it and its server.
    v.extend(SERVERS.iter().map(|s| (s.agent_name(), layout::agent_addr(s), "SELECT 1", "1")));
    for d in layout::dispatchers()? {
        v.push((d.name.to_string(), d.addr().to_string(), "SELECT 1", "1"));
    }
    v.push((layout::PGBOUNCER.into(), pgbouncer_addr(), "SELECT 1", "1"));
    Ok(v)
}

/// Whether every listener answers and the replica streams, right now.
pub fn is_ready() -> bool {
    let ns = C1.ns();
    checks().is_ok_and(|c| c.iter().all(|(_, addr, sql, want)| psql(&ns, addr, sql).is_ok_and(|o| o == *want)))
}

/// Poll the checks until all pass; fail early, with its log, if a daemon exits.
fn wait_ready() -> Result<()> {
    let ns = C1.ns();
    let mut pending = checks()?;
    let deadline = Instant::now() + READY_TIMEOUT;
    while !pending.is_empty() {
        interrupt::check()?;
        for (name, _) in daemons() {
            // Only whether the pid lives: while `ip netns exec` execs the daemon, its command
            // line can read empty.
            let pid = state::read(&format!("{name}.pid")).and_then(|p| p.trim().parse().ok());
            if !pid.is_some_and(sh::alive) {
                bail!("{name} exited; {name}.log:\n{}", state::log_tail(&format!("{name}.log"), 20));
            }
        }
        pending.retain(|(_, addr, sql, want)| !psql(&ns, addr, sql).is_ok_and(|o| o == *want));
        if Instant::now() > deadline {
            let names: Vec<&str> = pending.iter().map(|p| p.0.as_str()).collect();
            bail!("not answering after {READY_TIMEOUT:?}: {} (logs in {})", names.join(", "), state::dir().display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Whether any process of the cluster runs (else `lab status` need not probe it).
pub fn any_running() -> bool {
    SERVERS.iter().any(|s| server::pid(s).is_some()) || daemons().iter().any(|(n, p)| daemon_pid(n, p).is_some())
}

/// One line per process for `lab status`: name, namespace, running or stopped, pid, what.
pub fn status_lines() -> Vec<String> {
    let mut rows: Vec<(String, String, Option<u32>, String)> = SERVERS
        .iter()
        .map(|s| {
            let what = if s.primary { "PostgreSQL primary" } else { "PostgreSQL streaming replica of pg-b1" };
            (
                s.name(),
                s.host.ns(),
                server::pid(s),
                format!("{} ({what}, data {})", s.listen_addr(), s.data().display()),
            )
        })
        .collect();
    for s in &SERVERS {
        let what = format!(
            "{} (refract agent in front of {}, control {})",
            layout::agent_addr(s),
            s.name(),
            s.agent_control()
        );
        rows.push((s.agent_name(), s.host.ns(), daemon_pid(&s.agent_name(), "refract"), what));
    }
    for d in layout::dispatchers().unwrap_or_default() {
        let admin = d.config.listen.admin.clone().unwrap_or_else(|| "-".into());
        let what = format!("{} (refract, `{}`, admin {admin})", d.addr(), d.source);
        rows.push((d.name.to_string(), DISPATCHER.ns(), daemon_pid(d.name, "refract"), what));
    }
    let what = format!("{} (PgBouncer, transaction pooling over pg-b1)", pgbouncer_addr());
    rows.push((layout::PGBOUNCER.into(), DISPATCHER.ns(), daemon_pid(layout::PGBOUNCER, "pgbouncer"), what));
    rows.into_iter()
        .map(|(name, ns, pid, what)| {
            let (state, pid) = match pid {
                Some(p) => ("running", p.to_string()),
                None => ("stopped", "-".to_string()),
            };
            format!("  {name:<17} {ns:<6} {state:<8} {pid:<8} {what}")
        })
        .collect()
}

/// Live processes of the PostgreSQL lab: working in or naming its directory (every PostgreSQL
/// process works in its data directory; PgBouncer's command line names its config there).
pub fn lab_pids() -> Vec<u32> {
    let root = pg_dir();
    let prefix = format!("{}/", root.display());
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let named = String::from_utf8_lossy(&cmdline).contains(&prefix);
            sh::alive(*pid) && (cwd.is_some_and(|c| c.starts_with(&root)) || named)
        })
        .collect()
}
