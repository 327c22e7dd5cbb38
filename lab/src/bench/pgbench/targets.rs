//! The poolers `bench pgbench` compares, each its own process on a free loopback port with its
//! config written into the run's temp directory: refract (`refract dispatch`), PgBouncer
//! (transaction pooling, pointed at the primary) and pgpool-II (streaming-replication mode,
//! load balancing, connection cache). PgBouncer refuses to run as root, so as root both it and
//! pgpool-II run as the user the PostgreSQL test kit runs its servers as (`nobody`, or
//! `$REFRACT_PG_RUN_AS`). Each process is its own process group; dropping a [`Target`] stops it.

use crate::support::sh;
use anyhow::{bail, Context, Result};
use refract_testkit::{DATABASE, PASSWORD, USER};
use std::ffi::OsStr;
use std::fmt::Write;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The targets of the TPS table, in report order.
pub const TARGETS: [&str; 5] = ["direct", "direct-replica", "refract", "pgbouncer", "pgpool"];
/// refract with `read_your_writes = false` (only in the read/write mix).
pub const REFRACT_NO_RYW: &str = "refract-ryw-off";
/// PgBouncer's binary (Debian's package).
pub const PGBOUNCER: &str = "/usr/sbin/pgbouncer";
/// pgpool-II's binary (Debian's package).
pub const PGPOOL: &str = "/usr/sbin/pgpool";

/// How long a pooler may take to answer `SELECT 1`.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// What every target is built from.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The primary's port on 127.0.0.1.
    pub primary: u16,
    /// The replica's port on 127.0.0.1.
    pub replica: u16,
    /// Server connections per server (refract's `pool_size`, PgBouncer's `default_pool_size`,
    /// pgpool-II's `num_init_children`).
    pub pool_size: usize,
    /// The refract binary.
    pub refract_bin: PathBuf,
    /// psql, to probe readiness.
    pub psql: PathBuf,
    /// Where configs, logs and sockets go (the run's temp directory).
    pub dir: PathBuf,
    /// `(user, uid, gid)` to run PgBouncer and pgpool-II as (when root).
    pub run_as: Option<(String, u32, u32)>,
    /// Where the poolers run, for the scheduler.
    pub placement: Placement,
    /// refract's primary serves reads beside the replica (`[balance] read_from_primary`), and
    /// PgBouncer, which has one server, gets as many connections to it as refract has to both.
    pub read_from_primary: bool,
}

/// Where the poolers run, for the kernel's scheduler: with `sched_autogroup` on, every session
/// is one scheduling group (the CPUs are shared between sessions first, then between the
/// threads of a session).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Placement {
    /// Each pooler in a session of its own (`setsid`), as a service manager or `pgbouncer -d`
    /// runs it and as `pg_ctl` runs each PostgreSQL server.
    Own,
    /// The poolers in the harness's session, with pgbench (their own process groups only).
    Shared,
}

/// A running target (or `direct`, which has no process).
#[derive(Debug)]
pub struct Target {
    /// `direct`, `refract`, `refract-ryw-off`, `pgbouncer`, `pgpool`.
    pub name: String,
    /// Where pgbench connects (127.0.0.1).
    pub port: u16,
    /// The config it runs with (empty for `direct`).
    pub config: String,
    proc: Option<Proc>,
}

impl Target {
    /// The target's process id (`None` for `direct`): the pooler itself, since [`spawn`] execs
    /// it (through `setsid`) without forking, unless it runs through `runuser`.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(|p| p.child.id())
    }

    /// Stops the target's process (no-op for `direct`).
    pub fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.stop();
        }
    }
}

/// One child process, in its own process group.
#[derive(Debug)]
struct Proc {
    child: Child,
    /// The signal that shuts it down quickly (`TERM`; pgpool-II's fast shutdown is `INT`).
    signal: &'static str,
    log: PathBuf,
}

impl Proc {
    fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let pgid = self.child.id();
        signal_group(pgid, self.signal);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) && !group_alive(pgid) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        signal_group(pgid, "KILL");
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Sends `sig` to the process group `pgid` (one this harness created).
fn signal_group(pgid: u32, sig: &str) {
    let _ = sh::output(Command::new("kill").args(["-s", sig, "--", &format!("-{pgid}")]));
}

/// Whether any process of group `pgid` is left (pgpool-II's children exit after its main).
fn group_alive(pgid: u32) -> bool {
    sh::ok(sh::cmd(None, "pgrep", &["-g", &pgid.to_string()]))
}

/// Starts `name` (`direct` starts nothing) and waits until it answers `SELECT 1`.
pub fn start(ctx: &Setup, name: &str) -> Result<Target> {
    match name {
        "direct" => Ok(Target { name: name.into(), port: ctx.primary, config: String::new(), proc: None }),
        // The server refract reads from, without a pooler: what refract's reads could reach.
        "direct-replica" => Ok(Target { name: name.into(), port: ctx.replica, config: String::new(), proc: None }),
        "refract" | REFRACT_NO_RYW => start_refract(ctx, name, name == "refract"),
        "pgbouncer" => start_pgbouncer(ctx),
        "pgpool" => start_pgpool(ctx),
        _ => bail!("unknown target {name:?}"),
    }
}

fn start_refract(ctx: &Setup, name: &str, read_your_writes: bool) -> Result<Target> {
    start_refract_with(ctx, name, |port, http, admin| refract_config(ctx, port, http, admin, read_your_writes))
}

/// Starts refract as `name` with the config `config(pg_port, http_port, admin_port)` makes
/// (free loopback ports each), and waits until it answers `SELECT 1`.
pub fn start_refract_with(ctx: &Setup, name: &str, config: impl FnOnce(u16, u16, u16) -> String) -> Result<Target> {
    let (port, http, admin) = (free_port()?, free_port()?, free_port()?);
    let config = config(port, http, admin);
    let path = ctx.dir.join(format!("{name}.toml"));
    std::fs::write(&path, &config).with_context(|| format!("writing {}", path.display()))?;
    let mut c = Command::new(&ctx.refract_bin);
    c.arg("dispatch").arg("--config").arg(&path).env("RUST_LOG", "warn");
    let proc = spawn(ctx, c, name, "TERM", false)?;
    ready(ctx, name, port, config, proc)
}

fn start_pgbouncer(ctx: &Setup) -> Result<Target> {
    let port = free_port()?;
    let dir = private_dir(ctx, "pgbouncer")?;
    let config = pgbouncer_config(ctx, &dir, port);
    let (ini, users) = (dir.join("pgbouncer.ini"), dir.join("userlist.txt"));
    std::fs::write(&users, format!("\"{USER}\" \"{PASSWORD}\"\n"))?;
    // A pid file left by an earlier instance of this run would stop it from starting.
    let _ = std::fs::remove_file(dir.join("pgbouncer.pid"));
    std::fs::write(&ini, &config)?;
    hand_over(ctx, &[&ini, &users])?;
    let mut c = Command::new(PGBOUNCER);
    c.arg(&ini);
    let proc = spawn(ctx, c, "pgbouncer", "TERM", true)?;
    ready(ctx, "pgbouncer", port, config, proc)
}

fn start_pgpool(ctx: &Setup) -> Result<Target> {
    let (port, pcp) = (free_port()?, free_port()?);
    let dir = private_dir(ctx, "pgpool")?;
    let config = pgpool_config(ctx, &dir, port, pcp);
    let (conf, pcp_conf, hba, passwd) =
        (dir.join("pgpool.conf"), dir.join("pcp.conf"), dir.join("pool_hba.conf"), dir.join("pool_passwd"));
    std::fs::write(&conf, &config)?;
    std::fs::write(&pcp_conf, "")?;
    std::fs::write(&hba, "")?;
    // `TEXT` marks a clear-text password, which pgpool-II needs to log into the servers by SCRAM.
    std::fs::write(&passwd, format!("{USER}:TEXT{PASSWORD}\n"))?;
    hand_over(ctx, &[&conf, &pcp_conf, &hba, &passwd])?;
    let _ = std::fs::remove_file(dir.join("pgpool.pid"));
    let mut c = Command::new(PGPOOL);
    // -n: stay in the foreground; -D: forget node states an earlier instance recorded.
    c.arg("-n").arg("-D").arg("-f").arg(&conf).arg("-F").arg(&pcp_conf).arg("-a").arg(&hba);
    let proc = spawn(ctx, c, "pgpool", "INT", true)?;
    ready(ctx, "pgpool", port, config, proc)
}

/// refract's config: `[postgres]` in transaction mode over the primary and the replica.
pub fn refract_config(ctx: &Setup, port: u16, http: u16, admin: u16, read_your_writes: bool) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "# Generated by refract-lab (lab/src/bench/pgbench/targets.rs) for `refract bench pgbench`.\n\
         [http]\nlisten = \"127.0.0.1:{http}\"\n\n[listen]\nadmin = \"127.0.0.1:{admin}\"\n\n\
         [admin]\ninsecure_loopback = true\n\n\
         [postgres]\nlisten = \"127.0.0.1:{port}\"\ndatabase = \"{DATABASE}\"\npool_mode = \"transaction\"\n\
         pool_size = {}\nread_your_writes = {read_your_writes}\nserver_user = \"{USER}\"\n\
         server_password = \"{PASSWORD}\"\n\n\
         [[postgres.user]]\nname = \"{USER}\"\npassword = \"{PASSWORD}\"\nauth = \"scram-sha-256\"\n\n\
         [[postgres.server]]\nname = \"primary\"\naddr = \"127.0.0.1:{}\"\nrole = \"primary\"\n\n\
         [[postgres.server]]\nname = \"replica\"\naddr = \"127.0.0.1:{}\"\nrole = \"replica\"\n",
        ctx.pool_size, ctx.primary, ctx.replica
    );
    if ctx.read_from_primary {
        s.push_str("\n[balance]\nread_from_primary = true\n");
    }
    s
}

/// PgBouncer's config: transaction pooling, one database entry (the primary), SCRAM with a
/// clear-text userlist (so that it can log into the server by SCRAM too).
pub fn pgbouncer_config(ctx: &Setup, dir: &Path, port: u16) -> String {
    let d = dir.display();
    format!(
        "; Generated by refract-lab (lab/src/bench/pgbench/targets.rs) for `refract bench pgbench`.\n\
         ; PgBouncer sends every statement to the one server of its database entry: the primary.\n\
         [databases]\n{DATABASE} = host=127.0.0.1 port={} dbname={DATABASE}\n\n\
         [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
         auth_type = scram-sha-256\nauth_file = {d}/userlist.txt\npool_mode = transaction\n\
         default_pool_size = {}\nmax_client_conn = 1000\nignore_startup_parameters = extra_float_digits\n\
         logfile = {d}/pgbouncer.log\npidfile = {d}/pgbouncer.pid\n",
        ctx.primary,
        ctx.pool_size * if ctx.read_from_primary { 2 } else { 1 }
    )
}

/// pgpool-II's config: streaming-replication mode over the primary and the replica, load
/// balancing on (weights 1:1), a connection cache of one connection per child and backend,
/// `pool_size` children (= concurrent clients), lag checks like refract's.
pub fn pgpool_config(ctx: &Setup, dir: &Path, port: u16, pcp_port: u16) -> String {
    let d = dir.display();
    format!(
        "# Generated by refract-lab (lab/src/bench/pgbench/targets.rs) for `refract bench pgbench`.\n\
         backend_clustering_mode = 'streaming_replication'\n\
         listen_addresses = '127.0.0.1'\nport = {port}\nsocket_dir = '{d}'\n\
         pcp_listen_addresses = '127.0.0.1'\npcp_port = {pcp_port}\npcp_socket_dir = '{d}'\n\
         backend_hostname0 = '127.0.0.1'\nbackend_port0 = {}\nbackend_weight0 = 1\n\
         backend_flag0 = 'ALLOW_TO_FAILOVER'\n\
         backend_hostname1 = '127.0.0.1'\nbackend_port1 = {}\nbackend_weight1 = 1\n\
         backend_flag1 = 'ALLOW_TO_FAILOVER'\n\
         num_init_children = {}\nmax_pool = 1\nconnection_cache = on\nchild_life_time = 0\n\
         connection_life_time = 0\nclient_idle_limit = 0\n\
         load_balance_mode = on\n\
         sr_check_period = 10\nsr_check_user = '{USER}'\nsr_check_password = '{PASSWORD}'\n\
         sr_check_database = '{DATABASE}'\ndelay_threshold = 16777216\n\
         health_check_period = 0\nfailover_on_backend_error = off\n\
         enable_pool_hba = off\npool_passwd = '{d}/pool_passwd'\n\
         pid_file_name = '{d}/pgpool.pid'\nlogdir = '{d}'\nlog_destination = 'stderr'\n\
         use_watchdog = off\n",
        ctx.primary, ctx.replica, ctx.pool_size
    )
}

/// A directory for one pooler, owned by the user it runs as.
fn private_dir(ctx: &Setup, name: &str) -> Result<PathBuf> {
    let dir = ctx.dir.join(name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    hand_over(ctx, &[&dir])?;
    Ok(dir)
}

fn hand_over(ctx: &Setup, paths: &[&Path]) -> Result<()> {
    if let Some((_, uid, gid)) = &ctx.run_as {
        for p in paths {
            std::os::unix::fs::chown(p, Some(*uid), Some(*gid)).with_context(|| format!("chown {}", p.display()))?;
        }
    }
    Ok(())
}

/// Starts `c` in its own process group, and in its own session with [`Placement::Own`],
/// output to `NAME.log`; `unprivileged` runs it as the run-as user when root.
///
/// Its own session, as `pg_ctl` gives each PostgreSQL server and as a service manager or
/// `pgbouncer -d` gives a pooler: the kernel's scheduler (with `sched_autogroup`) then shares
/// the CPUs between the servers and the load generator, instead of making the pooler under
/// test share pgbench's share.
fn spawn(ctx: &Setup, c: Command, name: &str, signal: &'static str, unprivileged: bool) -> Result<Proc> {
    let own = ctx.placement == Placement::Own;
    let mut words: Vec<&OsStr> = vec![];
    if own {
        words.push("setsid".as_ref());
    }
    if let (Some((user, _, _)), true) = (&ctx.run_as, unprivileged) {
        words.extend(["runuser", "-u", user, "--"].map(|w| -> &OsStr { w.as_ref() }));
    }
    words.push(c.get_program());
    words.extend(c.get_args());
    let mut s = Command::new(words[0]);
    s.args(&words[1..]);
    if !own {
        s.process_group(0);
    }
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => s.env(k, v),
            None => s.env_remove(k),
        };
    }
    let mut c = s;
    let log = ctx.dir.join(format!("{name}.log"));
    let file = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    // setsid(1) makes the process a session and process group leader without forking (it is
    // not a group leader when it starts), so, either way, its pid is the group [`Proc::stop`]
    // signals.
    c.stdin(Stdio::null()).stdout(file.try_clone()?).stderr(file).current_dir(&ctx.dir);
    let child = c.spawn().with_context(|| format!("cannot start `{}`", sh::show(&c)))?;
    Ok(Proc { child, signal, log })
}

/// Waits until `SELECT 1` through 127.0.0.1:`port` succeeds; on failure stops the process and
/// reports the end of its log.
fn ready(ctx: &Setup, name: &str, port: u16, config: String, mut proc: Proc) -> Result<Target> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        crate::support::interrupt::check()?;
        if psql(ctx, port, "SELECT 1").is_ok_and(|o| o == "1") {
            return Ok(Target { name: name.into(), port, config, proc: Some(proc) });
        }
        let exited = matches!(proc.child.try_wait(), Ok(Some(_)));
        if exited || Instant::now() > deadline {
            proc.stop();
            let log = std::fs::read_to_string(&proc.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect();
            let why = if exited { "exited" } else { "did not answer `SELECT 1` within 20 s" };
            bail!("{name} {why}; its log ends:\n{}", tail.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `psql -XAtq -c SQL` against 127.0.0.1:`port` as the test kit's user; trimmed output.
pub fn psql(ctx: &Setup, port: u16, sql: &str) -> Result<String> {
    let mut c = Command::new(&ctx.psql);
    c.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", USER, "-d", DATABASE, "-XAtq"])
        .args(["-v", "ON_ERROR_STOP=1", "-c", sql])
        .env("PGPASSWORD", PASSWORD)
        .env("PGCONNECT_TIMEOUT", "5");
    Ok(sh::run(c)?.trim().to_string())
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> Setup {
        Setup {
            primary: 5433,
            replica: 5434,
            pool_size: 16,
            refract_bin: "refract".into(),
            psql: "psql".into(),
            dir: "/tmp/x".into(),
            run_as: None,
            placement: Placement::Own,
            read_from_primary: false,
        }
    }

    #[test]
    fn refract_config_parses_as_toml() {
        let text = refract_config(&ctx(), 6432, 8080, 8081, false);
        let v: toml::Value = toml::from_str(&text).expect("toml");
        assert_eq!(v["postgres"]["pool_size"].as_integer(), Some(16));
        assert_eq!(v["postgres"]["read_your_writes"].as_bool(), Some(false));
        assert_eq!(v["postgres"]["server"][1]["addr"].as_str(), Some("127.0.0.1:5434"));
    }

    #[test]
    fn with_read_from_primary_refract_reads_from_both_and_pgbouncer_has_their_connections() {
        let ctx = Setup { read_from_primary: true, ..ctx() };
        let v: toml::Value = toml::from_str(&refract_config(&ctx, 6432, 8080, 8081, false)).expect("toml");
        assert_eq!(v["balance"]["read_from_primary"].as_bool(), Some(true));
        assert!(pgbouncer_config(&ctx, Path::new("/tmp/x"), 7000).contains("default_pool_size = 32"));
    }

    #[test]
    fn pooler_configs() {
        let b = pgbouncer_config(&ctx(), Path::new("/tmp/x/pgbouncer"), 7000);
        assert!(b.contains("postgres = host=127.0.0.1 port=5433 dbname=postgres"));
        assert!(b.contains("pool_mode = transaction") && b.contains("default_pool_size = 16"));
        let p = pgpool_config(&ctx(), Path::new("/tmp/x/pgpool"), 7001, 7002);
        assert!(p.contains("backend_port0 = 5433") && p.contains("backend_port1 = 5434"));
        assert!(p.contains("num_init_children = 16") && p.contains("load_balance_mode = on"));
    }

    /// Fields 5 and 6 of `/proc/PID/stat`: process group and session.
    fn group_and_session(pid: u32) -> (u32, u32) {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        let after = &stat[stat.rfind(')').expect("comm") + 2..];
        let f: Vec<u32> = after.split(' ').skip(2).take(2).map(|x| x.parse().expect("number")).collect();
        (f[0], f[1])
    }

    #[test]
    fn poolers_run_in_a_session_of_their_own_or_in_ours() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mine = group_and_session(std::process::id()).1;
        for placement in [Placement::Own, Placement::Shared] {
            let setup = Setup { dir: dir.path().to_path_buf(), placement, ..ctx() };
            let mut c = Command::new("sleep");
            c.arg("30").env("RUST_LOG", "warn");
            let mut p = spawn(&setup, c, "sleeper", "TERM", false).expect("spawn");
            let pid = p.child.id();
            // setsid(1) runs its setsid() and exec() after fork: wait until it is `sleep`, with
            // its environment in place (exec names the process before it lays out the new
            // environment, so a loaded machine can show one without the other).
            let deadline = Instant::now() + Duration::from_secs(5);
            let execed = || {
                std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim() == "sleep"
                    && !std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default().is_empty()
            };
            while !execed() {
                assert!(Instant::now() < deadline, "{placement:?}: the child never became `sleep`");
                std::thread::sleep(Duration::from_millis(10));
            }
            let env = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
            assert!(env.split(|&b| b == 0).any(|kv| kv == b"RUST_LOG=warn"), "{placement:?}: env passed on");
            let (group, session) = group_and_session(pid);
            assert_eq!(group, pid, "{placement:?}: its own process group, which stop() signals");
            match placement {
                Placement::Own => assert_eq!(session, pid, "a session of its own"),
                Placement::Shared => assert_eq!(session, mine, "our session"),
            }
            p.stop();
            assert!(matches!(p.child.try_wait(), Ok(Some(_))), "{placement:?}: stopped");
        }
    }
}
