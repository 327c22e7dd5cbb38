//! Running `bench pg-large`: the lab's PostgreSQL cluster (brought up if it is not ready), the
//! rounds over sizes and targets, the hand-over counters around them, the pgbench pairs.

use super::fetch::{self, TARGETS};
use super::report::{self, Results};
use super::PgLargeArgs;
use crate::bench::pairs::Estimate;
use crate::bench::pgbench::client;
use crate::bench::sweep::handover_stats::HandoverStats;
use crate::fabric::{self, congestion};
use crate::lab::{self, Db};
use crate::pglab::{self, layout};
use crate::support::units::{ByteSize, Rate};
use crate::support::{interrupt, sh};
use anyhow::{bail, Context, Result};
use std::time::Instant;

/// The hybrid dispatcher's admin listener (pg-hybrid.toml), reached from rf-d.
const HYBRID_ADMIN: &str = "198.18.0.2:6532";

/// Measures and writes the section.
pub fn run(args: &PgLargeArgs) -> Result<()> {
    interrupt::install();
    let started = Instant::now();
    let sizes = ByteSize::parse_list(&args.sizes)?;
    if sizes.is_empty() || args.repeat == 0 {
        bail!("--sizes needs at least one size and --repeat at least 1");
    }
    let rate = Rate::parse(&args.rate)?;
    ensure_cluster(rate)?;
    let mut res = Results::new(args, rate, &sizes);
    let before = hybrid_stats()?;
    for round in 0..args.repeat {
        for (si, size) in sizes.iter().enumerate() {
            for k in 0..TARGETS.len() {
                interrupt::check()?;
                // Each round and size starts with another target, so drift hits all alike.
                let target = TARGETS[(k + round + si) % TARGETS.len()];
                let bps = fetch::measure(target, size.0)?;
                step(started, &format!("round {} {:>8} {target:<9} {:>8.1} MiB/s", round + 1, size.human(), mib(bps)));
                res.add(size.0, target, bps);
            }
        }
    }
    res.handovers = hybrid_stats()?.since(&before);
    res.pgbench = pgbench_pairs(args, started)?;
    res.took_s = started.elapsed().as_secs_f64();
    super::plot::draw(&args.out.with_file_name(report::figure_name(rate)), &res)?;
    report::write(&args.out, &res)
}

fn mib(bps: f64) -> f64 {
    bps / f64::from(1u32 << 20)
}

fn step(started: Instant, what: &str) {
    eprintln!("[{:>5.0} s] {what}", started.elapsed().as_secs_f64());
}

/// The fabric shaped at `rate` and the PostgreSQL cluster ready (started if not; it stays up).
fn ensure_cluster(rate: Rate) -> Result<()> {
    lab::require_root()?;
    if fabric::is_complete() && pglab::is_ready() {
        fabric::shape(rate)?;
        return Ok(());
    }
    let exe = std::env::current_exe().context("locating the refract binary")?;
    lab::up_with(rate, Some(Db::Postgres), &congestion::requested(None), &exe)
}

/// The hybrid dispatcher's hand-over counters now (the demo's PostgreSQL section reads them too).
pub(crate) fn hybrid_stats() -> Result<HandoverStats> {
    let url = format!("http://{HYBRID_ADMIN}/metrics");
    let body = sh::run(sh::cmd(Some("rf-d"), "curl", &["-sf", "--max-time", "5", &url]))?;
    Ok(HandoverStats::parse(&body))
}

/// `pgbench -S -c 16 -j 2` from rf-c1, hybrid and relay back to back, the order alternating;
/// the paired ratio hybrid/relay with its 90 % interval, and the TPS of each run.
fn pgbench_pairs(args: &PgLargeArgs, started: Instant) -> Result<Option<report::Pgbench>> {
    if args.pairs == 0 {
        return Ok(None);
    }
    let bin = refract_pg::testkit::tool("pgbench")?.to_string_lossy().into_owned();
    step(started, "pgbench -i -s 10 on the primary");
    pgbench(&bin, &layout::SERVERS[0].listen_addr(), &["-i", "-q", "-s", "10"])?;
    wait_replayed()?;
    let load = ["-n", "-S", "-c", "16", "-j", "2", "-M", "simple"];
    let secs = args.seconds.to_string();
    let mut p = report::Pgbench { load: format!("pgbench {} -T {secs}", load.join(" ")), ..Default::default() };
    for i in 0..args.pairs {
        let mut tps = [0.0; 2];
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            let addr = layout::vip(if which == 0 { 6432 } else { 6433 });
            let mut a: Vec<&str> = load.to_vec();
            a.extend(["-T", &secs]);
            let out = pgbench(&bin, &addr, &a)?;
            let s = client::parse(&out).with_context(|| format!("pgbench through {addr}: {out}"))?;
            tps[which] = s.tps;
        }
        step(started, &format!("pgbench pair {}: hybrid {:.0}, relay {:.0} TPS", i + 1, tps[0], tps[1]));
        p.hybrid.push(tps[0]);
        p.relay.push(tps[1]);
    }
    let logs: Vec<f64> = p.hybrid.iter().zip(&p.relay).map(|(h, r)| (h / r).ln()).collect();
    p.estimate = Estimate::of(&logs);
    Ok(Some(p))
}

/// Until the replica has the pgbench tables (reads through refract go there too), ≤ 30 s.
fn wait_replayed() -> Result<()> {
    let replica = layout::SERVERS[1].listen_addr();
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    while pglab::psql("rf-c1", &replica, "SELECT count(*) FROM pgbench_branches").ok().as_deref() != Some("10") {
        if Instant::now() > deadline {
            bail!("the replica has not replayed `pgbench -i` after 30 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    Ok(())
}

/// pgbench with `args` from rf-c1 against `addr`; its output.
fn pgbench(bin: &str, addr: &str, args: &[&str]) -> Result<String> {
    let (host, port) = addr.rsplit_once(':').context("IP:PORT")?;
    let mut c = sh::cmd(Some("rf-c1"), bin, &["-h", host, "-p", port, "-U", "refract"]);
    c.args(args).arg("postgres").env("PGPASSWORD", "refract");
    sh::run(c)
}
