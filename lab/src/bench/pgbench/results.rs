//! What a `bench pgbench` run measured: the `-S` runs, the read/write mix and where its
//! transactions ran, the versions; the report reads these and nothing else.

use crate::bench::pgbench::client::Outcome;
use crate::bench::pgbench::options::PgbenchOptions;
use crate::report::environment::Environment;

/// One `-S` run.
#[derive(Debug, Clone)]
pub struct Run {
    /// The target.
    pub target: String,
    /// `simple` or `prepared`.
    pub mode: String,
    /// 1-based repeat number.
    pub run: usize,
    /// pgbench's summary or error.
    pub outcome: Outcome,
}

/// Activity counters of one server over a mix run (deltas).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// `pg_stat_database.xact_commit` of the benchmark database: every transaction, the
    /// poolers' own included.
    pub commits: u64,
    /// `pg_stat_user_tables.idx_scan` of `pgbench_accounts`: one per select-only transaction,
    /// two per simple-update transaction (its UPDATE and its SELECT); nothing else touches it.
    pub account_scans: u64,
}

/// One read/write-mix run and where its transactions ran.
#[derive(Debug, Clone)]
pub struct Mix {
    /// The target.
    pub target: String,
    /// pgbench's summary (with per-script counts) or error.
    pub outcome: Outcome,
    /// On the primary.
    pub primary: Counters,
    /// On the replica.
    pub replica: Counters,
}

/// Versions of everything involved.
#[derive(Debug, Clone, Default)]
pub struct Versions {
    /// `postgres --version`.
    pub postgres: String,
    /// `pgbench --version`.
    pub pgbench: String,
    /// `pgbouncer --version`, first line.
    pub pgbouncer: String,
    /// `pgpool --version`.
    pub pgpool: String,
}

/// Everything a run measured, and what it ran with.
#[derive(Debug, Clone)]
pub struct Results {
    /// The options.
    pub opts: PgbenchOptions,
    /// The machine.
    pub env: Environment,
    /// Tool versions.
    pub versions: Versions,
    /// The `-S` runs.
    pub runs: Vec<Run>,
    /// The mix runs.
    pub mix: Vec<Mix>,
    /// Targets that could not be started, with the reason.
    pub unavailable: Vec<(String, String)>,
    /// `(target, config text)` of the poolers as run.
    pub configs: Vec<(String, String)>,
    /// The `-S` load, per mode (for the report).
    pub tps_load: Vec<String>,
    /// The mix load (for the report).
    pub mix_load: String,
    /// `/proc/loadavg`'s 1, 5 and 15 minute figures when the run started and when it ended:
    /// other work on the machine shows up here.
    pub loadavg: (String, String),
    /// `kernel.sched_autogroup_enabled` when the run started (`1`: every session is one
    /// scheduling group, which makes where each process runs part of the setup).
    pub autogroup: String,
}
