//! How a refract process runs and ends, whichever its subcommand (`dispatch`, `agent`,
//! `blob-server`): its log never blocks and never fails, a panic ends either one connection or
//! the whole process (never one thread alone), and once a stop signal arrived the process ends
//! within its bound whatever else goes wrong. docs/operations.md ("Signals", "Exit status",
//! "Logs") says what an operator sees.
//!
//! # Layout
//! - [`log`]: the queue every log line goes through and the thread that writes it to stderr.
//! - [`panics`]: the panic hook; [`contain`] for a connection's task.
//! - [`watchdog`]: [`StopSignals`] (SIGTERM, SIGINT) and the thread that enforces the bound.
//! - [`failpoint`]: `REFRACT_FAILPOINT`, the tests' way to make a process misbehave.

pub mod failpoint;
pub mod log;
pub mod panics;
pub mod watchdog;

pub use panics::{contain, EXIT_PANIC};
pub use watchdog::{StopSignals, EXIT_WATCHDOG};

/// Sets up a process: starts the log writer and installs the panic hook. Call once, first
/// thing in `main`.
pub fn start() -> std::io::Result<()> {
    log::init()?;
    panics::install();
    Ok(())
}
