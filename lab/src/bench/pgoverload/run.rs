//! Running `bench pg-overload`: the cluster, the capacity, the open-loop points per target.

use super::openloop::{self, Pool};
use super::report::{self, Point, Results};
use super::{PgOverloadArgs, SQL};
use crate::bench::pgbench::client::{self, Load};
use crate::bench::pgbench::run::{run_as, tempdir};
use crate::bench::pgbench::targets::{self, Placement, Setup};
use crate::support::interrupt;
use anyhow::{anyhow, Context, Result};
use refract_pg::testkit::{self, PgCluster};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

/// The targets, in report order.
pub const TARGETS: [&str; 2] = ["refract", "pgbouncer"];

/// Measures and writes the section.
pub fn run(args: PgOverloadArgs) -> Result<()> {
    interrupt::install();
    let started = Instant::now();
    let refract_bin = match &args.refract_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe().context("locating this binary")?,
    };
    let pgbench = testkit::tool("pgbench")?;
    step(started, "starting a PostgreSQL primary and streaming replica (refract-pg test kit)");
    let cluster = PgCluster::start().map_err(|e| anyhow!("starting PostgreSQL: {e}"))?;
    let run_as = run_as()?;
    let work = tempdir(&run_as)?;
    let setup = Setup {
        primary: cluster.primary.port,
        replica: cluster.replica().port,
        pool_size: args.pool_size,
        refract_bin,
        psql: testkit::tool("psql")?,
        dir: work.path().to_path_buf(),
        run_as,
        placement: Placement::Own,
        read_from_primary: true,
    };
    let mut res = Results::new(&args, &pgbench);
    let mut refract = targets::start(&setup, "refract")?;
    let script = work.path().join("sleep.sql");
    std::fs::write(&script, format!("{SQL};\n"))?;
    // Twice the server connections of both servers: enough to keep every one busy.
    let clients = args.pool_size * 4;
    let load = Load {
        clients,
        jobs: 2,
        seconds: args.seconds,
        mode: "simple".into(),
        script: vec!["-f".into(), script.display().to_string()],
    };
    step(started, &format!("capacity: {} through refract", load.shown()));
    let _ = client::run(&pgbench, &Load { seconds: 1, ..load.clone() }, refract.port)?; // warm-up
    let summary = client::run(&pgbench, &load, refract.port)?.map_err(|e| anyhow!("pgbench: {e}"))?;
    res.capacity = summary.tps;
    res.capacity_load = load.shown();
    refract.stop();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    for name in TARGETS {
        let mut t = targets::start(&setup, name)?;
        res.configs.push((name.to_owned(), t.config.clone()));
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, t.port));
        let points = rt.block_on(measure(&args, addr, res.capacity, started, name))?;
        res.points.push((name.to_owned(), points));
        t.stop();
    }
    drop(cluster);
    step(started, "done");
    report::write(&args.out, &res)
}

/// The open-loop points of one target: a warm-up at the first load, then each load.
async fn measure(
    args: &PgOverloadArgs,
    addr: SocketAddr,
    capacity: f64,
    started: Instant,
    name: &str,
) -> Result<Vec<Point>> {
    let pool = Pool::new(addr, args.max_conns);
    pool.prefill(64.min(args.max_conns)).await?;
    let timeout = Duration::from_millis(args.timeout_ms);
    let first = args.loads.first().copied().unwrap_or(0.5);
    openloop::run(&pool, SQL, first * capacity, 1.0, 1, timeout).await;
    let mut points = vec![];
    for (i, &x) in args.loads.iter().enumerate() {
        interrupt::check()?;
        step(started, &format!("{name}: {x}× = {:.0} statements/s for {} s", x * capacity, args.seconds));
        let shots = openloop::run(&pool, SQL, x * capacity, args.seconds as f64, 100 + i as u64, timeout).await;
        let p = Point::of(x, x * capacity, &shots, args.seconds as f64);
        eprintln!("    {}", p.describe());
        points.push(p);
        // Let a backlog drain before the next point (PgBouncer's queue outlives the load).
        tokio::time::sleep(Duration::from_millis(args.timeout_ms + 500)).await;
    }
    Ok(points)
}

fn step(started: Instant, what: &str) {
    eprintln!("[{:>4.0} s] {what}", started.elapsed().as_secs_f64());
}
