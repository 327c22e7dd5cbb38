//! `refract bench pgbench`: pgbench through refract, PgBouncer and pgpool-II, and directly
//! against the primary, on one machine in one run.
//!
//! 1. A primary and a streaming replica from the refract-testkit, given room for every
//!    pooler's connections (`max_connections`) and the data set (`shared_buffers`), then
//!    `pgbench -i` on the primary and a wait until the replica has replayed it.
//! 2. refract, PgBouncer and pgpool-II start on free loopback ports
//!    ([`targets`]); a pooler that cannot start is reported, not fatal (refract must start).
//! 3. `pgbench -S` in simple and prepared mode against every target, interleaved per repeat
//!    (so drift in the machine's load hits all targets alike); the median run is reported.
//! 4. A read/write mix (pgbench's `select-only@8` and `simple-update@2`) through each pooler,
//!    started afresh and stopped afterwards (its server connections closing flushes their
//!    statistics): `pg_stat_database.xact_commit` on the primary and on the replica, before
//!    and after, shows where the transactions ran.
//! 5. The report section and `pgbench.csv` ([`report`](crate::bench::pgbench::report)).

use crate::bench::pgbench::client::{self, Load, Outcome};
use crate::bench::pgbench::options::{PgbenchOptions, SERVER_SETTINGS};
use crate::bench::pgbench::results::{Counters, Mix, Results, Run, Versions};
use crate::bench::pgbench::targets::{self as targets, Setup as TargetContext, Target, REFRACT_NO_RYW};
use crate::report::environment::Environment;
use crate::support::{interrupt, sh};
use anyhow::{anyhow, bail, Context, Result};
use refract_testkit::{self as testkit, PgCluster, PgServer};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Measures, writes the report section and the CSV, prints the tables.
pub fn run(opts: &PgbenchOptions) -> Result<Results> {
    interrupt::install();
    let results = measure(opts)?;
    crate::bench::pgbench::report::write(&results)?;
    Ok(results)
}

/// The whole measurement (no files written except in a temp directory).
pub fn measure(opts: &PgbenchOptions) -> Result<Results> {
    let started = Instant::now();
    let load_at_start = loadavg();
    let pgbench = testkit::tool("pgbench").context("finding pgbench")?;
    let psql = testkit::tool("psql").context("finding psql")?;
    for t in [&pgbench, &psql] {
        if !t.exists() {
            bail!("{} is not installed (Debian: postgresql-client)", t.display());
        }
    }
    if !opts.refract_bin.exists() {
        bail!("the refract binary {} does not exist", opts.refract_bin.display());
    }
    let versions = versions(&pgbench);
    let env = Environment::detect();

    step(started, "starting a PostgreSQL primary and streaming replica (refract-testkit)");
    let cluster = PgCluster::start().map_err(|e| anyhow!("starting PostgreSQL: {e}"))?;
    let run_as = run_as()?;
    tune(&cluster, &run_as)?;
    step(started, &format!("pgbench -i -s {} on the primary, then waiting for the replica", opts.scale));
    initialise(&cluster, &pgbench, opts.scale)?;

    let work = tempdir(&run_as)?;
    let ctx = TargetContext {
        primary: cluster.primary.port,
        replica: cluster.replica().port,
        pool_size: opts.clients,
        refract_bin: opts.refract_bin.clone(),
        psql,
        dir: work.path().to_path_buf(),
        run_as,
        placement: opts.placement,
        read_from_primary: false,
    };
    let mut results = Results {
        opts: opts.clone(),
        env,
        versions,
        runs: vec![],
        mix: vec![],
        unavailable: vec![],
        configs: vec![],
        tps_load: opts
            .modes
            .iter()
            .map(|m| Load::select_only(opts.clients, opts.jobs, opts.seconds, m).shown())
            .collect(),
        mix_load: Load::read_write_mix(opts.clients, opts.jobs, opts.mix_seconds).shown(),
        loadavg: (load_at_start, String::new()),
        autogroup: std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled")
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|e| e.to_string()),
    };

    step(started, "starting refract, PgBouncer and pgpool-II");
    let mut running = start_targets(&ctx, &opts.targets, &mut results)?;
    results.configs =
        running.iter().filter(|t| !t.config.is_empty()).map(|t| (t.name.clone(), t.config.clone())).collect();
    if opts.warmup {
        step(started, "warm-up: 2 s of pgbench -S through every target (not recorded)");
        for t in &running {
            let load = Load::select_only(opts.clients, opts.jobs, 2, "simple");
            if let Err(e) = client::run(&pgbench, &load, t.port)? {
                eprintln!("    warm-up through {} failed: {e}", t.name);
            }
        }
    }
    tps_runs(opts, &pgbench, &running, &mut results, started)?;
    running.iter_mut().for_each(Target::stop);
    drop(running);

    step(started, &format!("read/write mix: {}", results.mix_load));
    let available: Vec<&str> = ["refract", REFRACT_NO_RYW, "pgbouncer", "pgpool"]
        .into_iter()
        // refract-ryw-off runs when refract does.
        .filter(|&t| opts.mix && opts.targets.contains(&if t == REFRACT_NO_RYW { "refract" } else { t }))
        .filter(|t| !results.unavailable.iter().any(|(u, _)| u == t))
        .collect();
    for name in available {
        let m = mix_run(&ctx, &pgbench, opts, name)?;
        eprintln!("    {:<16} {}", name, describe_mix(&m));
        results.mix.push(m);
    }
    results.loadavg.1 = loadavg();
    step(started, "done");
    drop(cluster);
    Ok(results)
}

/// pgbench and psql of the kit's PostgreSQL, checked to exist with `refract_bin`.
pub(crate) fn clients_and(refract_bin: &Path) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let pgbench = testkit::tool("pgbench").context("finding pgbench")?;
    let psql = testkit::tool("psql").context("finding psql")?;
    for t in [&pgbench, &psql, refract_bin] {
        if !t.exists() {
            bail!("{} does not exist (pgbench and psql: Debian's postgresql-client)", t.display());
        }
    }
    Ok((pgbench, psql))
}

/// The first three fields of `/proc/loadavg`.
pub(crate) fn loadavg() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

pub(crate) fn step(started: Instant, what: &str) {
    eprintln!("[{:>4.0} s] {what}", started.elapsed().as_secs_f64());
}

/// The user the test kit runs servers as when root (PgBouncer and pgpool-II run as it too).
pub(crate) fn run_as() -> Result<Option<(String, u32, u32)>> {
    if !sh::is_root() {
        return Ok(None);
    }
    let name = std::env::var("REFRACT_PG_RUN_AS").unwrap_or_else(|_| "nobody".to_owned());
    let id = |flag: &str| -> Result<u32> {
        let out = sh::run(sh::cmd(None, "id", &[flag, &name]))?;
        out.trim().parse().with_context(|| format!("id {flag} {name}: {out}"))
    };
    Ok(Some((name.clone(), id("-u")?, id("-g")?)))
}

/// A temp directory the run-as user can enter (pgpool-II and PgBouncer keep files there).
pub(crate) fn tempdir(run_as: &Option<(String, u32, u32)>) -> Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new().prefix("refract-pgbench-").tempdir()?;
    if run_as.is_some() {
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(dir)
}

/// Appends [`SERVER_SETTINGS`] and restarts the replica, then the primary: a hot standby
/// needs `max_connections` at least the primary's.
fn tune(cluster: &PgCluster, run_as: &Option<(String, u32, u32)>) -> Result<()> {
    for server in [cluster.replica(), &cluster.primary] {
        let conf = server.data_dir().join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).with_context(|| format!("reading {}", conf.display()))?;
        text.push_str("\n# refract bench pgbench\n");
        text.push_str(SERVER_SETTINGS);
        std::fs::write(&conf, text).with_context(|| format!("writing {}", conf.display()))?;
        restart(server, run_as)?;
    }
    cluster.wait_replicated(Duration::from_secs(60)).map_err(|e| anyhow!("replica after restart: {e}"))
}

/// `pg_ctl restart` (it reuses the options the server was started with, port included).
pub(crate) fn restart(server: &PgServer, run_as: &Option<(String, u32, u32)>) -> Result<()> {
    let pg_ctl = testkit::tool("pg_ctl")?;
    let data = server.data_dir().to_string_lossy().into_owned();
    // The server's output must go to a file: left on pg_ctl's stdout it would hold our pipe
    // open forever. `DATA.log` is the file the test kit started it with (`primary.log`, …).
    let log = format!("{data}.log");
    let args = ["-D", data.as_str(), "-l", log.as_str(), "-w", "-t", "60", "-m", "fast", "restart"];
    let mut c = match run_as {
        Some((user, _, _)) => {
            let mut c = Command::new("runuser");
            c.args(["-u", user, "--"]).arg(&pg_ctl).args(args);
            c
        }
        None => {
            let mut c = Command::new(&pg_ctl);
            c.args(args);
            c
        }
    };
    c.current_dir("/");
    sh::run(c).map(drop).with_context(|| format!("restarting the server on port {}:\n{}", server.port, server.log()))
}

/// `pgbench -i` on the primary; waits until the replica has replayed it.
fn initialise(cluster: &PgCluster, pgbench: &Path, scale: u32) -> Result<()> {
    let mut c = Command::new(pgbench);
    c.args(["-i", "-q", "-s", &scale.to_string(), "-h", "127.0.0.1", "-p", &cluster.primary.port.to_string()])
        .args(["-U", testkit::USER, testkit::DATABASE])
        .env("PGPASSWORD", testkit::PASSWORD);
    sh::run(c)?;
    cluster.wait_replicated(Duration::from_secs(300)).map_err(|e| anyhow!("waiting for the replica: {e}"))
}

/// Starts every target; a pooler other than refract that fails is recorded as unavailable.
fn start_targets(ctx: &TargetContext, names: &[&str], results: &mut Results) -> Result<Vec<Target>> {
    let mut running = vec![];
    for &name in names {
        match targets::start(ctx, name) {
            Ok(t) => running.push(t),
            Err(e) if name == "pgbouncer" || name == "pgpool" => {
                eprintln!("    {name} is not part of this run: {e:#}");
                results.unavailable.push((name.to_string(), format!("{e:#}")));
                // refract-ryw-off shares refract's fate; the poolers' mix rows go too.
            }
            Err(e) => return Err(e.context(format!("starting {name}"))),
        }
    }
    Ok(running)
}

/// Every (repeat, mode, target) `-S` run, targets taking turns.
fn tps_runs(
    opts: &PgbenchOptions,
    pgbench: &Path,
    running: &[Target],
    results: &mut Results,
    started: Instant,
) -> Result<()> {
    let total = opts.repeat * opts.modes.len() * running.len();
    let mut done = 0;
    for run in 1..=opts.repeat {
        for &mode in &opts.modes {
            for t in turn_order(running.len(), run).map(|i| &running[i]) {
                interrupt::check()?;
                let load = Load::select_only(opts.clients, opts.jobs, opts.seconds, mode);
                let outcome = client::run(pgbench, &load, t.port)?;
                done += 1;
                let left = (total - done) as u64 * (opts.seconds + 1);
                eprintln!(
                    "[{:>4.0} s] run {run}/{} {mode:<8} {:<10} {}  ({done}/{total}, ~{left} s left)",
                    started.elapsed().as_secs_f64(),
                    opts.repeat,
                    t.name,
                    describe(&outcome)
                );
                results.runs.push(Run { target: t.name.clone(), mode: mode.into(), run, outcome });
            }
        }
    }
    Ok(())
}

/// The order of the targets in round `run` (1-based): each round starts one target later, so
/// no target always runs right after the same one (what a run leaves behind, such as the
/// servers' state after `direct`'s 60k TPS, hits every target alike).
fn turn_order(n: usize, run: usize) -> impl Iterator<Item = usize> {
    let first = run.saturating_sub(1) % n.max(1);
    (0..n).map(move |i| (first + i) % n)
}

fn describe(o: &Outcome) -> String {
    match o {
        Ok(s) => format!("{:>9.0} TPS  {:.3} ms", s.tps, s.latency_ms),
        Err(e) => format!("failed: {e}"),
    }
}

fn describe_mix(m: &Mix) -> String {
    format!(
        "{}; commits: primary {}, replica {}; pgbench_accounts scans: primary {}, replica {}",
        describe(&m.outcome),
        m.primary.commits,
        m.replica.commits,
        m.primary.account_scans,
        m.replica.account_scans
    )
}

/// One mix run through a freshly started `name`, stopped afterwards so that its server
/// connections close and flush their statistics before the counters are read again.
fn mix_run(ctx: &TargetContext, pgbench: &Path, opts: &PgbenchOptions, name: &str) -> Result<Mix> {
    let servers = [ctx.primary, ctx.replica];
    // The previous target's connections must be gone (and flushed) before counting starts.
    wait_quiet(ctx, &servers)?;
    let mut target = targets::start(ctx, name)?;
    let before = counters(ctx, &servers)?;
    let load = Load::read_write_mix(opts.clients, opts.jobs, opts.mix_seconds);
    let outcome = client::run(pgbench, &load, target.port)?;
    target.stop();
    wait_quiet(ctx, &servers)?;
    let after = counters(ctx, &servers)?;
    let delta = |i: usize| Counters {
        commits: after[i].commits.saturating_sub(before[i].commits),
        account_scans: after[i].account_scans.saturating_sub(before[i].account_scans),
    };
    Ok(Mix { target: name.into(), outcome, primary: delta(0), replica: delta(1) })
}

/// The [`Counters`] of each server, read with psql directly.
fn counters(ctx: &TargetContext, servers: &[u16; 2]) -> Result<[Counters; 2]> {
    let sql = format!(
        "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = '{}') || ' ' || \
         (SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_user_tables WHERE relname = 'pgbench_accounts')",
        testkit::DATABASE
    );
    let mut v = [Counters::default(); 2];
    for (i, port) in servers.iter().enumerate() {
        let out = targets::psql(ctx, *port, &sql)?;
        let mut nums = out.split_whitespace().map(str::parse::<u64>);
        match (nums.next(), nums.next()) {
            (Some(Ok(commits)), Some(Ok(account_scans))) => v[i] = Counters { commits, account_scans },
            _ => bail!("reading the statistics on port {port}: {out:?}"),
        }
    }
    Ok(v)
}

/// Waits (up to 15 s) until no client backend but the asking one is left on either server:
/// a backend flushes its statistics when it exits.
fn wait_quiet(ctx: &TargetContext, servers: &[u16; 2]) -> Result<()> {
    let sql = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()";
    let deadline = Instant::now() + Duration::from_secs(15);
    for port in servers {
        while targets::psql(ctx, *port, sql)? != "0" {
            if Instant::now() > deadline {
                eprintln!("    warning: server on port {port} still has client connections; counts may be low");
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

/// The versions of the servers, pgbench and the poolers.
pub(crate) fn versions(pgbench: &Path) -> Versions {
    let first = |program: &Path, args: &[&str]| -> String {
        match sh::output(Command::new(program).args(args)) {
            Ok(o) => {
                let text = [o.stdout, o.stderr].concat();
                String::from_utf8_lossy(&text).lines().next().unwrap_or("?").trim().to_string()
            }
            Err(_) => "not installed".into(),
        }
    };
    let postgres = testkit::tool("postgres").map(|p| first(&p, &["--version"])).unwrap_or_else(|_| "?".into());
    Versions {
        postgres,
        pgbench: first(pgbench, &["--version"]),
        pgbouncer: first(Path::new(targets::PGBOUNCER), &["--version"]),
        pgpool: first(Path::new(targets::PGPOOL), &["--version"]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_round_starts_one_target_later() {
        let rounds: Vec<Vec<usize>> = (1..=5).map(|r| turn_order(4, r).collect()).collect();
        assert_eq!(rounds[0], [0, 1, 2, 3]);
        assert_eq!(rounds[1], [1, 2, 3, 0]);
        assert_eq!(rounds[3], [3, 0, 1, 2]);
        assert_eq!(rounds[4], [0, 1, 2, 3]);
        assert_eq!(turn_order(0, 3).count(), 0);
    }
}
