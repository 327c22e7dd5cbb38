//! `refract bench pg-overload`: PostgreSQL past saturation. A primary and a streaming replica
//! (the refract-testkit), statements of ~20 ms (`SELECT pg_sleep(0.02)`, a read); the
//! closed-loop capacity through refract by pgbench; then an open loop ([`openloop`]) at
//! 0.5×, 1× and 3× that capacity through refract (shipped defaults, but the primary and the
//! replica both serve reads: `[balance] read_from_primary`) and PgBouncer (transaction mode,
//! as many connections to its one server as refract has to both); [`report`] writes the
//! section of docs/overload.md.

pub mod conn;
pub mod openloop;
pub mod report;
pub mod run;

/// The statement: a read of ~20 ms, so a replica may serve it.
pub const SQL: &str = "SELECT pg_sleep(0.02)";

pub use run::run;

/// Options of `bench pg-overload`.
#[derive(Debug, Clone, clap::Args)]
pub struct PgOverloadArgs {
    /// Server connections per server (refract's `pool_size`, PgBouncer's `default_pool_size`).
    #[arg(long, default_value_t = 10)]
    pub pool_size: usize,
    /// Seconds per load point (and of the closed-loop capacity run).
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Offered loads, as multiples of the measured capacity.
    #[arg(long, default_value = "0.5,1,3", value_delimiter = ',')]
    pub loads: Vec<f64>,
    /// Client timeout per statement, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub timeout_ms: u64,
    /// Client connections at most (PgBouncer's `max_client_conn` is 1000). Enough that a
    /// backlog does not turn the open loop into a closed one of this many clients.
    #[arg(long, default_value_t = 900)]
    pub max_conns: usize,
    /// The refract binary to benchmark (default: this one).
    #[arg(long, hide = true)]
    pub refract_bin: Option<std::path::PathBuf>,
    /// The page whose `pg` section is (re)written.
    #[arg(long, default_value = "docs/overload.md")]
    pub out: std::path::PathBuf,
}
