//! `refract bench pgbench`: [`run`](mod@run) measures pgbench through refract, PgBouncer and pgpool-II
//! (started by [`targets`]) on a PostgreSQL primary and replica, running pgbench with
//! [`client`]; [`options`] says what to run, [`results`] holds what it measured, and
//! [`report`] writes the section and the CSV from the results alone.

pub mod client;
pub mod options;
pub mod report;
pub mod results;
pub mod run;
pub mod targets;

pub use options::{PgbenchArgs, PgbenchOptions};
pub use results::Results;
pub use run::{measure, run};
