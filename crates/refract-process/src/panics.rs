//! What a panic does: one inside a connection's task ([`contain`]) ends that connection, and
//! the process serves on; any other (an event loop, an accept loop, a health check, the
//! signal thread, the log writer) ends the process with [`EXIT_PANIC`]. Either way the panic,
//! its thread and its place are logged at error level (with a backtrace when `RUST_BACKTRACE`
//! asks for one). A thread or a background task that died alone would leave a process that
//! still holds its listeners but no longer accepts, stops or drains as it should.

use std::any::Any;
use std::backtrace::BacktraceStatus;
use std::future::Future;
use std::time::Duration;

/// The exit status after a panic outside a connection (Rust's own for a panic in `main`).
pub const EXIT_PANIC: i32 = 101;

/// How long a fatal panic waits for its log line to be written before the process exits.
const LOG_GRACE: Duration = Duration::from_millis(500);

tokio::task_local! {
    /// Set while a connection's task runs: a panic there ends that connection only.
    static CONTAINED: &'static str;
}

/// Runs a connection's task (`what` names it in the log) so that a panic in it ends that task
/// only: tokio catches the panic and drops the task, which closes its connection and releases
/// what it held. Work the task spawns is not contained.
pub async fn contain<F: Future>(what: &'static str, task: F) -> F::Output {
    CONTAINED.scope(what, task).await
}

/// Installs the panic hook (once, at start).
pub fn install() {
    std::panic::set_hook(Box::new(|info| on_panic(info.location(), info.payload())));
}

fn on_panic(location: Option<&std::panic::Location<'_>>, payload: &(dyn Any + Send)) {
    let thread = std::thread::current();
    let thread = thread.name().unwrap_or("unnamed");
    let at = location.map(|l| l.to_string()).unwrap_or_default();
    let message = message(payload);
    let backtrace = std::backtrace::Backtrace::capture();
    let contained = CONTAINED.try_with(|w| *w);
    match contained {
        Ok(what) => tracing::error!(thread, at, "panicked: {message}; this {what} is closed, the process goes on"),
        Err(_) => tracing::error!(thread, at, "panicked: {message}; exiting with status {EXIT_PANIC}"),
    }
    if backtrace.status() == BacktraceStatus::Captured {
        tracing::error!(thread, "backtrace of that panic:\n{backtrace}");
    }
    if contained.is_err() {
        crate::log::flush(LOG_GRACE);
        std::process::exit(EXIT_PANIC);
    }
}

fn message(payload: &(dyn Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => (*s).to_owned(),
        (_, Some(s)) => s.clone(),
        _ => "(no message)".to_owned(),
    }
}
