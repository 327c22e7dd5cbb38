//! The measurement of `bench pg-cache`:
//!
//! 1. The cluster ([`Cluster`]): a primary and the replicas in their cgroups, `rf_cache`
//!    loaded, the replicas restarted cold.
//! 2. Whether this refract takes `policy = "affinity"`: one is started with that config; if
//!    it refuses the config (an unknown variant or key, until affinity lands), the affinity
//!    runs are skipped and the report says so, with refract's reason.
//! 3. Per read-cap variant (set on the replicas' blkio cgroups) and workload, `pairs` pairs:
//!    each pair one run of every target, the order rotating from pair to pair; each run a
//!    warm-up through its target, then the recorded run between two snapshots of every
//!    replica's counters. A refract is started for each run (warm-up and run) and stopped
//!    after it, so that no idle pool holds server connections, and memory, during another's.

use super::cluster::{Cluster, Counters};
use super::report::{self, Affinity, Cell, Measured, Results, Run};
use super::{config, load, split, Dist, PgCacheArgs, PgCacheOptions, Ports};
use crate::bench::pgbench::client::{self, Outcome, Summary};
use crate::bench::pgbench::run::{clients_and, loadavg, run_as, step, tempdir};
use crate::bench::pgbench::targets::{self, Placement, Setup, Target};
use crate::report::environment::Environment;
use crate::support::{interrupt, sh};
use anyhow::{anyhow, bail, Context, Result};
use refract_testkit as testkit;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// `bench pg-cache`: measures, writes the section, prints the table.
pub fn run(args: PgCacheArgs) -> Result<()> {
    let opts = args.into_options()?;
    interrupt::install();
    let results = measure(&opts)?;
    report::write(&results)
}

/// What every run uses.
struct Ctx<'a> {
    opts: &'a PgCacheOptions,
    cluster: &'a Cluster,
    setup: Setup,
    pgbench: PathBuf,
    scripts: Vec<(Dist, PathBuf)>,
}

/// The whole measurement (no files written except in temp directories).
pub fn measure(opts: &PgCacheOptions) -> Result<Results> {
    let started = Instant::now();
    if !sh::is_root() {
        bail!("bench pg-cache needs root: it creates cgroups under /sys/fs/cgroup (run it with sudo)");
    }
    let load_at_start = loadavg();
    let (pgbench, psql) = clients_and(&opts.refract_bin)?;
    eta(started, opts, opts.targets.len());
    step(
        started,
        &format!("starting a primary and {} replicas (memory cgroups of {} bytes)", opts.replicas, opts.replica_mem),
    );
    let mut cluster = Cluster::start(opts.replicas, opts.replica_mem)?;
    let say = |s: &str| step(started, s);
    let loaded = cluster.load(opts.rows, &say)?;
    step(
        started,
        &format!(
            "loaded: table {} MB + index {} MB; {} relation files evicted per replica, {} bytes still resident",
            loaded.table >> 20,
            loaded.index >> 20,
            loaded.files,
            loaded.resident.map_or_else(|| "?".into(), |b| b.to_string())
        ),
    );
    let run_as = run_as()?;
    let work = tempdir(&run_as)?;
    let mut scripts = vec![];
    for &d in &opts.dists {
        let path = work.path().join(d.file());
        std::fs::write(&path, d.script()).with_context(|| format!("writing {}", path.display()))?;
        scripts.push((d, path));
    }
    let setup = Setup {
        primary: cluster.primary.port,
        replica: cluster.replicas.first().map_or(0, |r| r.port),
        pool_size: opts.clients,
        refract_bin: opts.refract_bin.clone(),
        psql,
        dir: work.path().to_path_buf(),
        run_as,
        placement: Placement::Own,
        read_from_primary: false,
    };
    let ctx = Ctx { opts, cluster: &cluster, setup, pgbench: pgbench.clone(), scripts };
    let affinity = if opts.targets.contains(&"affinity") { probe_affinity(&ctx)? } else { Affinity::NotAsked };
    if let Affinity::Skipped(why) = &affinity {
        step(started, &format!("SKIPPING the affinity runs: refract refused `policy = \"affinity\"`: {why}"));
        eta(started, opts, opts.targets.len() - 1);
    }
    let targets: Vec<&'static str> =
        opts.targets.iter().copied().filter(|t| *t != "affinity" || affinity == Affinity::Ran).collect();
    let mut cells = vec![];
    for &iops in &opts.iops {
        cluster.set_read_iops(iops.0)?;
        for &dist in &opts.dists {
            let mut cell = Cell { iops, dist, runs: vec![] };
            for pair in 0..opts.pairs {
                for i in 0..targets.len() {
                    interrupt::check()?;
                    let target = targets[(pair + i) % targets.len()];
                    let outcome = one(&ctx, target, dist)?;
                    let shown = match &outcome {
                        Ok(m) => report::line(m),
                        Err(e) => format!("failed: {e}"),
                    };
                    step(
                        started,
                        &format!(
                            "{} {} pair {}/{} {target:<9} {shown}",
                            iops.label(),
                            dist.name(),
                            pair + 1,
                            opts.pairs
                        ),
                    );
                    cell.runs.push(Run { pair, target, outcome });
                }
            }
            cells.push(cell);
        }
    }
    drop(ctx);
    let device = cluster.device.clone();
    step(started, "stopping the cluster, removing its cgroups and data");
    cluster.shutdown();
    drop(cluster);
    Ok(Results {
        opts: opts.clone(),
        env: Environment::detect(),
        versions: versions(&pgbench),
        loadavg: (load_at_start, loadavg()),
        loaded,
        device,
        affinity,
        cells,
        minutes: started.elapsed().as_secs_f64() / 60.0,
    })
}

/// Says how many runs there are and how long they take.
fn eta(started: Instant, opts: &PgCacheOptions, targets: usize) {
    let (runs, secs) = (opts.runs(targets), opts.estimate_secs(targets));
    let what =
        format!("{runs} runs of {} s warm-up + {} s: about {:.0} min", opts.warmup, opts.duration, secs as f64 / 60.0);
    step(started, &what);
}

/// Starts refract with the affinity config once: `Ran` if it comes up, `Skipped(reason)` if
/// it refuses the config as unknown; any other failure is an error.
fn probe_affinity(ctx: &Ctx<'_>) -> Result<Affinity> {
    match start_refract(ctx, "affinity") {
        Ok(mut t) => {
            t.stop();
            Ok(Affinity::Ran)
        }
        Err(e) => {
            // refract's own log (the error's tail may be a backtrace when RUST_BACKTRACE is set).
            let log = std::fs::read_to_string(ctx.setup.dir.join("affinity.log")).unwrap_or_default();
            let text = format!("{log}\n{e:#}");
            // From `unknown …` on: the config's temporary path before it says nothing.
            let unknown = text.lines().find_map(|l| l.find("unknown").map(|i| l[i..].trim().to_string()));
            match unknown {
                Some(line) => Ok(Affinity::Skipped(shorten(&line, 300))),
                None => Err(e.context("starting refract with policy = \"affinity\"")),
            }
        }
    }
}

fn shorten(s: &str, n: usize) -> String {
    let t = s.trim();
    match t.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &t[..i]),
        None => t.to_string(),
    }
}

fn start_refract(ctx: &Ctx<'_>, policy: &str) -> Result<Target> {
    let (o, c) = (ctx.opts, ctx.cluster);
    let replicas = c.replica_ports();
    targets::start_refract_with(&ctx.setup, policy, |pg, http, admin| {
        config(policy, c.primary.port, &replicas, o.clients, o.load_factor, Ports { pg, http, admin })
    })
}

/// One warmed-up, recorded run of `target` on `dist`. An `Err` outcome is a run that failed
/// (recorded as such); the `Result` fails on Ctrl-C or what stops the whole measurement.
fn one(ctx: &Ctx<'_>, target: &str, dist: Dist) -> Result<std::result::Result<Measured, String>> {
    let script = ctx.scripts.iter().find(|(d, _)| *d == dist).map(|(_, p)| p.as_path()).context("no script")?;
    let o = ctx.opts;
    let mut refracts: Vec<Target> = vec![];
    let started = match target {
        "ideal" => Ok(()),
        "ideal-refract" => start_per_replica(ctx, &mut refracts),
        policy => start_refract(ctx, policy).map(|t| refracts.push(t)),
    };
    if let Err(e) = started {
        refracts.iter_mut().for_each(Target::stop);
        return Ok(Err(format!("refract did not start: {e:#}")));
    }
    let replicas = ctx.cluster.replica_ports();
    let drive = |seconds: u64| -> Result<Outcome> {
        match (target, refracts.as_slice()) {
            ("ideal", _) => parallel(ctx, script, seconds, &replicas),
            ("ideal-refract", r) => parallel(ctx, script, seconds, &r.iter().map(|t| t.port).collect::<Vec<_>>()),
            (_, [t]) => client::run(&ctx.pgbench, &load(script, o.clients, o.jobs, seconds, 1, o.rows), t.port),
            _ => Ok(Err("no refract".into())),
        }
    };
    if o.warmup > 0 {
        if let Err(e) = drive(o.warmup)? {
            eprintln!("    warm-up of {target} failed: {e}");
        }
    }
    let before = ctx.cluster.counters()?;
    let outcome = drive(o.duration)?;
    let after = ctx.cluster.counters()?;
    refracts.iter_mut().for_each(Target::stop);
    Ok(outcome.map(|s| measured(&s, &before, &after)))
}

fn measured(s: &Summary, before: &[Counters], after: &[Counters]) -> Measured {
    Measured {
        tps: s.tps,
        latency_ms: s.latency_ms,
        transactions: s.transactions,
        failed: s.failed,
        replicas: after.iter().zip(before).map(|(a, b)| a.since(b)).collect(),
    }
}

/// For `ideal-refract`: one refract per replica, over the primary and that replica only, its
/// pool the size of that replica's share of the clients.
fn start_per_replica(ctx: &Ctx<'_>, into: &mut Vec<Target>) -> Result<()> {
    let (o, c) = (ctx.opts, ctx.cluster);
    let parts = split(o.rows, o.clients, o.replicas);
    for (i, (port, part)) in c.replica_ports().into_iter().zip(parts).enumerate() {
        let name = format!("ideal-refract-{}", i + 1);
        into.push(targets::start_refract_with(&ctx.setup, &name, |pg, http, admin| {
            config("peak-ewma", c.primary.port, &[port], part.clients, o.load_factor, Ports { pg, http, admin })
        })?);
    }
    Ok(())
}

/// The ideal: one pgbench per replica at once, over its key range, to `ports[i]` (the
/// replica itself, or a refract whose only replica it is); their summaries added up (latency
/// weighted by transactions). The first failure fails it.
fn parallel(ctx: &Ctx<'_>, script: &Path, seconds: u64, ports: &[u16]) -> Result<Outcome> {
    let o = ctx.opts;
    let parts = split(o.rows, o.clients, o.replicas);
    let results: Vec<Result<Outcome>> = std::thread::scope(|s| {
        let handles: Vec<_> = parts
            .iter()
            .zip(ports)
            .map(|(p, &port)| {
                let l = load(script, p.clients, 1, seconds, p.lo, p.keys());
                let bin = &ctx.pgbench;
                s.spawn(move || client::run(bin, &l, port))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a pgbench thread panicked")))).collect()
    });
    let mut total = Summary::default();
    let mut weighted = 0.0;
    for r in results {
        match r? {
            Ok(s) => {
                total.tps += s.tps;
                total.transactions += s.transactions;
                total.failed += s.failed;
                weighted += s.latency_ms * s.transactions as f64;
            }
            Err(e) => return Ok(Err(e)),
        }
    }
    if total.transactions > 0 {
        total.latency_ms = weighted / total.transactions as f64;
    }
    Ok(Ok(total))
}

/// `postgres --version` and `pgbench --version`.
fn versions(pgbench: &Path) -> (String, String) {
    let first = |p: &Path| -> String {
        sh::output(Command::new(p).arg("--version"))
            .map(|o| String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or("?").trim().to_string())
            .unwrap_or_else(|_| "?".into())
    };
    let postgres = testkit::tool("postgres").map(|p| first(&p)).unwrap_or_else(|_| "?".into());
    (postgres, first(pgbench))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_reasons_are_shortened() {
        assert_eq!(shorten("  abc  ", 5), "abc");
        assert_eq!(shorten("abcdef", 3), "abc…");
    }

    #[test]
    fn runs_add_up_per_replica_deltas() {
        let s = Summary { tps: 10.0, latency_ms: 2.0, transactions: 100, ..Summary::default() };
        let b = [Counters { xact: 5, ..Counters::default() }, Counters { xact: 7, ..Counters::default() }];
        let a = [Counters { xact: 55, ..Counters::default() }, Counters { xact: 57, ..Counters::default() }];
        let m = measured(&s, &b, &a);
        assert_eq!(m.replicas.iter().map(|c| c.xact).collect::<Vec<_>>(), vec![50, 50]);
        assert_eq!((m.tps, m.transactions, m.imbalance()), (10.0, 100, Some(1.0)));
    }
}
