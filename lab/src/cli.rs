//! The command line: `refract lab …`, `refract bench …`, `refract demo`.

pub use crate::bench::overload::OverloadArgs;
use crate::bench::sweep::run::Plan;
use crate::bench::sweep::{self, SweepOptions};
use crate::support::units::{parse_duration, ByteSize, Rate};
use crate::{demo, fabric, lab};
use anyhow::Result;
use clap::{Args, Subcommand};
use std::path::PathBuf;

/// `refract lab …`: the network-namespace lab (needs root).
#[derive(Debug, Subcommand)]
pub enum LabCmd {
    /// Build the lab (or repair it): hosts rf-c1, rf-c2, rf-d, rf-b1, rf-b2 on a bridge in rf-sw.
    Up {
        /// Link rate for tbf on both ends of every link (`1gbit`, `100mbit`, …) or `none`.
        #[arg(long, default_value = "1gbit", value_parser = Rate::parse)]
        rate: Rate,
        /// Also start a cluster (`--db`): by default blob servers and agents on b1, b2; refract
        /// hybrid (VIP:8080), refract relay-only (VIP:8081), its busy-polling variant
        /// (VIP:8083) and HAProxy in rf-d.
        #[arg(long)]
        cluster: bool,
        /// Which cluster `--cluster` starts: `http` (above) or `postgres`: a PostgreSQL primary
        /// on b1 and streaming replica on b2 (port 5432, user/password refract), refract hybrid
        /// (VIP:6432), refract relay-only (VIP:6433) and PgBouncer (198.18.0.2:6434) in rf-d.
        #[arg(long, value_enum, default_value = "http", requires = "cluster")]
        db: lab::Db,
        /// TCP congestion control in every namespace (default: `$REFRACT_LAB_CC`, else
        /// `cubic`). One the host does not allow is allowed for the lab's lifetime (`lab down`
        /// restores the host's list); one the kernel lacks falls back to the host's default.
        #[arg(long)]
        cc: Option<String>,
        /// With `--cluster`: also N dispatcher hosts rf-d1…rf-dN (the VIP on `lo`), a router
        /// rf-r with an ECMP route to the VIP over them (5-tuple hash) that the clients go
        /// through, and etcd in rf-e; each host runs refract relay-only (VIP:8081) and hybrid
        /// (VIP:8080), or with `--db postgres` VIP:6433 and VIP:6432, each with `[cluster]`
        /// (docs/deploy.md, "Several dispatchers in the lab").
        #[arg(long, requires = "cluster", value_parser = clap::value_parser!(u8).range(1..=2))]
        dispatchers: Option<u8>,
    },
    /// Kill the dispatchers of one host of `lab up --dispatchers` (SIGKILL, as a host failure)
    /// and withdraw its next hop from rf-r's route, as a BGP withdrawal would.
    KillDispatcher {
        /// The host: `d1` or `d2`.
        host: String,
    },
    /// Stop the cluster (agents included; PostgreSQL by `pg_ctl stop -m fast`, its data
    /// deleted) and remove every rf-* namespace.
    Down,
    /// Show what is up.
    Status,
    /// Run a command in a host (c1, c2, d, b1, b2) and return its exit code.
    Exec {
        /// The host: `c1` or `rf-c1`.
        host: String,
        /// The command and its arguments (after `--`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        cmd: Vec<String>,
    },
}

impl LabCmd {
    /// Run the subcommand.
    pub fn run(self) -> Result<()> {
        match self {
            LabCmd::Up { rate, cluster, db, cc, dispatchers } => {
                lab::up(rate, cluster.then_some(db), &crate::fabric::congestion::requested(cc.as_deref()))?;
                match dispatchers {
                    Some(n) => lab::up_dispatchers(usize::from(n), db, rate, &std::env::current_exe()?),
                    None => Ok(()),
                }
            }
            LabCmd::KillDispatcher { host } => {
                lab::require_root()?;
                crate::multi::kill_dispatcher(&host)
            }
            LabCmd::Down => lab::down(),
            LabCmd::Status => lab::status(),
            LabCmd::Exec { host, cmd } => {
                lab::require_root()?;
                let code = fabric::exec(&host, &cmd)?;
                if code != 0 {
                    std::process::exit(code);
                }
                Ok(())
            }
        }
    }
}

/// `refract bench …`: measurements in the lab (needs root).
#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// Throughput per payload size and target, plus 1-byte latency; writes the report.
    Sweep(SweepArgs),
    /// The paper's reproduction: the sweep of direct, refract relay, hand-over, hybrid and
    /// HAProxy at 1 Gbit/s and unshaped, hand-over figures, acceptance figures; writes its
    /// sections of docs/benchmarks.md (about 25 minutes with the defaults).
    Paper(crate::bench::paper::PaperArgs),
    /// Two targets in alternating short runs at the same sizes (pairs), with a confidence
    /// interval on their ratio: for "performs alike" and "faster by" questions that single
    /// runs are too noisy to decide; writes section `pairs:A-B-RATE` of docs/benchmarks.md.
    Pairs(crate::bench::pairs::PairsArgs),
    /// Overload: goodput and latency from 0.25× to 3× capacity, a slow replica, retrying
    /// clients; refract with and without overload control, and HAProxy; writes docs/overload.md.
    Overload(OverloadArgs),
    /// PostgreSQL: pgbench -S (simple and prepared) and a read/write mix through refract,
    /// PgBouncer and pgpool-II vs direct, on a local primary and replica; writes its section of
    /// docs/benchmarks.md and docs/pgbench.csv.
    Pgbench(crate::bench::pgbench::PgbenchArgs),
    /// PostgreSQL past saturation: an open loop of 20 ms reads at 0.5×, 1× and 3× the
    /// capacity through refract and PgBouncer; writes its section of docs/overload.md.
    PgOverload(crate::bench::pgoverload::PgOverloadArgs),
    /// PostgreSQL large results in the lab (2 clients, 1 KiB – 256 MiB): direct, relay, hybrid
    /// and PgBouncer interleaved, plus `pgbench -S` pairs hybrid/relay; writes section
    /// `pglarge:RATE` of docs/benchmarks.md and its figure.
    PgLarge(crate::bench::pglarge::PgLargeArgs),
    /// PostgreSQL sharding's routing cost: keyed `pgbench -S` reads through refract sharded (2
    /// shards, both on one server) vs unsharded, in paired runs (simple and extended protocol);
    /// writes section `pgshard:loopback` of docs/benchmarks.md.
    PgShard(crate::bench::pgshard::PgShardArgs),
    /// PostgreSQL cache-affinity routing: keyed reads (uniform, Zipf, scattered Zipf) through
    /// refract under `peak-ewma` and `affinity`, and the ideal (each replica's clients straight
    /// to it, its key range only), on a loopback primary and replicas whose memory cgroups hold
    /// about their share of the table; per replica hit ratios, disk reads per query, load;
    /// writes section `pgcache:loopback` of docs/benchmarks.md (needs root).
    PgCache(crate::bench::pgcache::PgCacheArgs),
    /// Several dispatchers behind one address: relay through one dispatcher vs two, hybrid
    /// through two (16 MiB results, 4 connections, rf-r's ECMP route; `lab up --dispatchers`);
    /// writes section `cluster:RATE` of docs/benchmarks.md.
    Cluster(crate::bench::cluster::ClusterArgs),
    /// The byte-checking pipelined client `bench cluster` runs in a client namespace (JSON).
    #[command(hide = true)]
    Streams(crate::bench::streams::StreamsSpec),
    /// The open-loop load generator `bench overload` runs in a client namespace (JSON on stdout).
    #[command(hide = true)]
    Loadgen(crate::bench::loadgen::Spec),
}

/// Options of `bench sweep`.
#[derive(Debug, Args)]
pub struct SweepArgs {
    /// Payload sizes (K = 1024).
    #[arg(long, default_value = "1,8,64,512,4K,32K,256K,1M,2M,16M,128M", value_delimiter = ',', value_parser = ByteSize::parse)]
    sizes: Vec<ByteSize>,
    /// Targets: direct, refract (relay-only), handover (mode always), hybrid, haproxy.
    #[arg(long, default_value = "direct,refract,haproxy", value_delimiter = ',')]
    targets: Vec<String>,
    /// wrk duration per measurement.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    duration: std::time::Duration,
    /// Interleaved runs per cell (targets take turns); the median run is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Link rate (`1gbit`, …) or `none`.
    #[arg(long, default_value = "1gbit", value_parser = Rate::parse)]
    rate: Rate,
    /// The markdown page; the CSV and PNG go next to it.
    #[arg(long, default_value = "docs/benchmarks.md")]
    out: PathBuf,
    /// The page section to (re)write; defaults to the rate (`1gbit`, `none`).
    #[arg(long)]
    section: Option<String>,
    /// Skip Table 2 (1-byte latency on one connection).
    #[arg(long)]
    no_latency: bool,
}

impl BenchCmd {
    /// Run the subcommand.
    pub fn run(self) -> Result<()> {
        match self {
            BenchCmd::Sweep(a) => sweep::sweep(&a.into_options()),
            BenchCmd::Paper(a) => crate::bench::paper::run(&a.into_plan()),
            BenchCmd::Pairs(a) => a.run(),
            BenchCmd::Overload(a) => crate::bench::overload::run(&a.into_options()),
            BenchCmd::Pgbench(a) => crate::bench::pgbench::run(&a.into_options()?).map(drop),
            BenchCmd::PgOverload(a) => crate::bench::pgoverload::run(a),
            BenchCmd::PgLarge(a) => crate::bench::pglarge::run(&a),
            BenchCmd::PgShard(a) => crate::bench::pgshard::run(a),
            BenchCmd::PgCache(a) => crate::bench::pgcache::run(a),
            BenchCmd::Cluster(a) => crate::bench::cluster::run(&a),
            BenchCmd::Streams(spec) => crate::bench::streams::main(&spec),
            BenchCmd::Loadgen(spec) => crate::bench::loadgen::main(&spec),
        }
    }
}

impl SweepArgs {
    fn into_options(self) -> SweepOptions {
        let sizes = self.sizes;
        let command =
            sweep::rerun_command(&sizes, &self.targets, self.duration, self.rate, &self.out, self.section.as_deref())
                + &format!(" --repeat {}", self.repeat);
        SweepOptions {
            section: self.section.unwrap_or_else(|| self.rate.label()),
            plan: Plan {
                sizes,
                targets: self.targets,
                duration: self.duration,
                latency: !self.no_latency,
                repeat: self.repeat,
            },
            rate: self.rate,
            out: self.out,
            command,
        }
    }
}

/// `refract demo`: a cluster, routing shown, a short sweep, in the lab a PostgreSQL line; under 90 s.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Fewer sizes, no latency table (about half a minute).
    #[arg(long)]
    quick: bool,
    /// Use loopback (127.0.0.1) even when root.
    #[arg(long)]
    loopback: bool,
}

impl DemoArgs {
    /// Run the demo.
    pub fn run(self) -> Result<()> {
        demo::run(self.quick, self.loopback)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `refract lab …` as the binary parses it.
    #[derive(Debug, Parser)]
    struct Lab {
        #[command(subcommand)]
        cmd: LabCmd,
    }

    fn up(args: &[&str]) -> Result<(bool, lab::Db), clap::Error> {
        let argv = ["lab", "up"].iter().chain(args);
        match Lab::try_parse_from(argv)?.cmd {
            LabCmd::Up { cluster, db, .. } => Ok((cluster, db)),
            other => panic!("not `up`: {other:?}"),
        }
    }

    #[test]
    fn the_http_cluster_is_the_default_and_postgres_is_asked_for() {
        assert_eq!(up(&[]).expect("bare"), (false, lab::Db::Http));
        assert_eq!(up(&["--cluster"]).expect("http"), (true, lab::Db::Http));
        assert_eq!(up(&["--cluster", "--db", "http"]).expect("http"), (true, lab::Db::Http));
        assert_eq!(up(&["--cluster", "--db", "postgres"]).expect("pg"), (true, lab::Db::Postgres));
        assert!(up(&["--db", "postgres"]).is_err(), "--db without --cluster starts nothing: refused");
        assert!(up(&["--cluster", "--db", "mysql"]).is_err());
    }
}
