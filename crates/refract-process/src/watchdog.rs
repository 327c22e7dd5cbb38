//! The stop watchdog: from the first SIGTERM or SIGINT on, the process has its bound (the
//! dispatcher's `drain_ms`) plus [`MARGIN`] to end; past it the watchdog thread logs that it
//! ends the process and exits with [`EXIT_WATCHDOG`]. The thread runs its own small runtime
//! and does nothing else, so no stuck event loop, lock or write can hold it: the bound holds
//! whatever else went wrong. A process that stops as it should never hears from it.

use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// The exit status when the watchdog ended the process.
pub const EXIT_WATCHDOG: i32 = 4;

/// Time past the bound before the watchdog acts: the normal path (the drain timed out, the
/// runtimes shut down, the log flushed) ends well within it.
pub const MARGIN: Duration = Duration::from_millis(500);

/// How long the watchdog waits for its log line to be written before it exits.
const LOG_GRACE: Duration = Duration::from_millis(100);

/// SIGTERM and SIGINT, the signals that stop a refract process.
pub struct StopSignals {
    term: Signal,
    int: Signal,
}

impl StopSignals {
    /// Installs the handlers (on the current runtime): from now on these signals no longer
    /// kill the process at once.
    pub fn install() -> std::io::Result<StopSignals> {
        Ok(StopSignals { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? })
    }

    /// Waits for the next one; its name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// Starts the watchdog thread; `bound` says, when a stop signal arrives, how long stopping
/// may take (read then, so that a reloaded `drain_ms` counts).
pub fn start(bound: impl FnOnce() -> Duration + Send + 'static) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut stop = {
        let _in = rt.enter();
        StopSignals::install()?
    };
    std::thread::Builder::new().name("refract-watchdog".into()).spawn(move || {
        let signal = rt.block_on(stop.recv());
        let since = Instant::now();
        let limit = bound() + MARGIN;
        std::thread::sleep(limit);
        let waited_ms = since.elapsed().as_millis() as u64;
        tracing::error!(
            signal,
            waited_ms,
            "shutdown watchdog: still running past the stop bound; exiting with status {EXIT_WATCHDOG}"
        );
        crate::log::flush(LOG_GRACE);
        std::process::exit(EXIT_WATCHDOG);
    })?;
    Ok(())
}
