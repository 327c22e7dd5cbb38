//! `refract bench pg-large`: large PostgreSQL results in the lab's PostgreSQL cluster. Two
//! clients (rf-c1, rf-c2, at once) fetch results of each size through `direct` (each client
//! straight to one server), `relay` (VIP:6433), `hybrid` (VIP:6432, large results handed to the
//! agents) and `pgbouncer` (198.18.0.2:6434), the targets taking turns round after round; then
//! `pgbench -S` pairs hybrid against relay. [`fetch`] runs the clients, [`run`] the rounds,
//! [`report`] writes the section of docs/benchmarks.md and its figure.

pub mod fetch;
pub mod plot;
pub mod report;
pub mod run;

pub use run::run;

/// Options of `bench pg-large`.
#[derive(Debug, Clone, clap::Args)]
pub struct PgLargeArgs {
    /// Result sizes (binary multiples: 1K, 64K, 1M, …).
    #[arg(long, default_value = "1K,64K,1M,16M,64M,256M")]
    pub sizes: String,
    /// Rounds: every target fetches every size once per round.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Link rate of every lab link (`1gbit`, `none`).
    #[arg(long, default_value = "1gbit")]
    pub rate: String,
    /// `pgbench -S -c 16` pairs, hybrid against relay (0: none).
    #[arg(long, default_value_t = 6)]
    pub pairs: usize,
    /// Seconds per pgbench run.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// The page whose `pglarge:RATE` section is (re)written.
    #[arg(long, default_value = "docs/benchmarks.md")]
    pub out: std::path::PathBuf,
}
