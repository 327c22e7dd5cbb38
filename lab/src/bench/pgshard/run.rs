//! The measurement of `bench pg-shard`:
//!
//! 1. One PostgreSQL server from the refract-testkit (no replica), with `bench pgbench`'s
//!    server settings, and `pgbench -i` on it.
//! 2. refract `unsharded` and refract `sharded` ([`config`](super::config)) on free loopback
//!    ports, both running for the whole measurement; `/* refract: explain */` through the
//!    sharded one records where a few keys go (each to one shard).
//! 3. Per protocol, pairs of runs of the keyed-read script: one through each refract, back to
//!    back, the order alternating from pair to pair (so drift in the machine's load hits both
//!    alike), with the CPU the machine and each refract process used during its runs.

use super::report::{self, Cell, Results};
use super::{config, load, PgShardArgs, PgShardOptions, Ports, SCRIPT, SCRIPT_FILE, TARGETS};
use crate::bench::pairs::cpu;
use crate::bench::pgbench::client;
use crate::bench::pgbench::options::SERVER_SETTINGS;
use crate::bench::pgbench::run::{clients_and, loadavg, restart, run_as, step, tempdir, versions};
use crate::bench::pgbench::targets::{self, Setup, Target};
use crate::report::environment::Environment;
use crate::support::{interrupt, sh};
use anyhow::{anyhow, Context, Result};
use refract_testkit::{self as testkit, PgCluster, PgServer};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// `bench pg-shard`: measures, writes the section, prints the table.
pub fn run(args: PgShardArgs) -> Result<()> {
    let opts = args.into_options()?;
    interrupt::install();
    let results = measure(&opts)?;
    report::write(&results)
}

/// The whole measurement (no files written except in temp directories).
pub fn measure(opts: &PgShardOptions) -> Result<Results> {
    let started = Instant::now();
    let load_at_start = loadavg();
    let (pgbench, psql) = clients_and(&opts.refract_bin)?;
    step(started, "starting a PostgreSQL server (refract-testkit)");
    let cluster = PgCluster::start_with_replicas(0).map_err(|e| anyhow!("starting PostgreSQL: {e}"))?;
    let run_as = run_as()?;
    tune(&cluster.primary, &run_as)?;
    step(started, &format!("pgbench -i -s {}", opts.scale));
    initialise(&pgbench, cluster.primary.port, opts.scale)?;
    let work = tempdir(&run_as)?;
    let script = work.path().join(SCRIPT_FILE);
    std::fs::write(&script, SCRIPT).with_context(|| format!("writing {}", script.display()))?;
    let ctx = Setup {
        primary: cluster.primary.port,
        replica: cluster.primary.port,
        pool_size: opts.clients,
        refract_bin: opts.refract_bin.clone(),
        psql,
        dir: work.path().to_path_buf(),
        run_as,
        placement: opts.placement,
        read_from_primary: false,
    };
    step(started, "starting refract unsharded and refract sharded (2 shards, one server)");
    let mut running = start(&ctx, opts)?;
    let routes = routes(&ctx, running[1].port)?;
    let mut results = Results {
        opts: opts.clone(),
        env: Environment::detect(),
        versions: versions(&pgbench),
        loadavg: (load_at_start, String::new()),
        configs: running.iter().map(|t| (t.name.clone(), t.config.clone())).collect(),
        routes,
        cells: vec![],
    };
    if opts.warmup {
        step(started, "warm-up: 2 s through each refract (not recorded)");
        for t in &running {
            if let Err(e) = client::run(&pgbench, &load(opts, &script, "simple", 2), t.port)? {
                eprintln!("    warm-up through {} failed: {e}", t.name);
            }
        }
    }
    for &mode in &opts.modes {
        results.cells.push(pairs(opts, &pgbench, &script, &running, mode, started)?);
    }
    running.iter_mut().for_each(Target::stop);
    results.loadavg.1 = loadavg();
    step(started, "done");
    Ok(results)
}

/// Appends [`SERVER_SETTINGS`] to the server's config and restarts it.
fn tune(server: &PgServer, run_as: &Option<(String, u32, u32)>) -> Result<()> {
    let conf = server.data_dir().join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).with_context(|| format!("reading {}", conf.display()))?;
    text.push_str("\n# refract bench pg-shard\n");
    text.push_str(SERVER_SETTINGS);
    std::fs::write(&conf, text).with_context(|| format!("writing {}", conf.display()))?;
    restart(server, run_as)
}

/// `pgbench -i -s scale` on the server on 127.0.0.1:`port`.
fn initialise(pgbench: &Path, port: u16, scale: u32) -> Result<()> {
    let mut c = Command::new(pgbench);
    c.args(["-i", "-q", "-s", &scale.to_string(), "-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-U", testkit::USER, testkit::DATABASE])
        .env("PGPASSWORD", testkit::PASSWORD);
    sh::run(c).map(drop)
}

/// Both refracts, in [`TARGETS`] order.
fn start(ctx: &Setup, opts: &PgShardOptions) -> Result<Vec<Target>> {
    TARGETS
        .iter()
        .map(|&name| {
            targets::start_refract_with(ctx, name, |pg, http, admin| {
                config(name, ctx.primary, opts.clients, Ports { pg, http, admin })
            })
            .with_context(|| format!("starting refract {name}"))
        })
        .collect()
}

/// `/* refract: explain */` of the script's statement for a few keys through the sharded
/// refract: the report shows that a keyed read goes to one shard, and to each in turn.
fn routes(ctx: &Setup, port: u16) -> Result<String> {
    let mut out = String::new();
    for aid in 1..=4 {
        let sql = format!("/* refract: explain */ SELECT abalance FROM pgbench_accounts WHERE aid = {aid}");
        let answer = targets::psql(ctx, port, &sql).with_context(|| format!("explaining aid = {aid}"))?;
        out.push_str(&format!("aid = {aid}: {}\n", answer.replace('\n', " / ")));
    }
    Ok(out)
}

/// `opts.pairs` pairs of runs in `mode`, A then B in even pairs, B then A in odd ones.
fn pairs(
    opts: &PgShardOptions,
    pgbench: &Path,
    script: &Path,
    running: &[Target],
    mode: &'static str,
    started: Instant,
) -> Result<Cell> {
    let mut cell = Cell::new(mode);
    let load = load(opts, script, mode, opts.seconds);
    for i in 0..opts.pairs {
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            interrupt::check()?;
            let t = &running[side];
            let before = cpu::Before::take(t.pid());
            let outcome = client::run(pgbench, &load, t.port)?;
            let shown = match &outcome {
                Ok(s) => format!("{:>7.0} TPS  {:.3} ms", s.tps, s.latency_ms),
                Err(e) => format!("failed: {e}"),
            };
            let used = outcome.as_ref().ok().and_then(|s| before.finish(s.transactions as f64));
            cell.record(side, outcome, used);
            let elapsed = started.elapsed().as_secs_f64();
            eprintln!("[{elapsed:>4.0} s] {mode:<8} pair {:>2}/{} {:<9} {shown}", i + 1, opts.pairs, t.name);
        }
    }
    Ok(cell)
}
