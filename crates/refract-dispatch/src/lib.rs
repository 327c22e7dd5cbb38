//! refract's dispatcher: the engine (`refract-core`) started with its front ends (HTTP,
//! PostgreSQL, the admin API), the whole configuration file, reload and signals. This is the
//! one crate that names every front end; the engine and the front ends never name each other.
//!
//! # Layout
//! - [`config`]: the whole TOML file, parsed and validated into the engine's configuration.
//! - [`dispatcher`]: the front ends, started on the engine.
//! - `admin`: `/backends`, drain, `/reload`, `/metrics`, `/pg/*`; who may use it
//!   (`admin/guard.rs`).
//! - `members`: membership changes on this dispatcher, either front end's members.
//! - `cluster`: several dispatchers sharing membership and reloads through etcd (`[cluster]`).
//! - `peers`: CancelRequests forwarded between dispatchers, authenticated (the frame:
//!   `refract_pg::peer_cancel`).
//! - `reload`: SIGHUP / `refract reload`: re-read, validate, apply.

mod admin;
mod cluster;
pub mod config;
pub mod dispatcher;
mod members;
mod peers;
mod reload;

pub use dispatcher::{run_workers, Dispatcher};
pub use refract_core::{Config, Ctx};

use refract_core::{ctx, worker};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How a dispatcher run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Every session finished within `drain_ms`.
    Drained,
    /// The drain timed out with sessions still open (they were cut).
    DrainTimedOut,
}

impl Exit {
    /// The process exit code (docs/operations.md): 0 drained, 3 the drain timed out.
    pub fn code(self) -> i32 {
        match self {
            Exit::Drained => 0,
            Exit::DrainTimedOut => 3,
        }
    }

    fn of(ctx: &ctx::Ctx) -> Exit {
        match ctx.drain_timed_out.load(std::sync::atomic::Ordering::Relaxed) {
            true => Exit::DrainTimedOut,
            false => Exit::Drained,
        }
    }
}

pub use reload::request as request_reload;

/// Loads the configuration and runs the dispatcher until SIGINT/SIGTERM, reloading it on
/// SIGHUP; then drains and says whether the drain finished in time. From the stop signal on,
/// the watchdog (`refract_process::watchdog`) ends the process if it is still running
/// `drain_ms` + 0.5 s later.
pub fn run_dispatcher_from_file(path: &Path) -> anyhow::Result<Exit> {
    let cfg = config::load(path)?;
    let workers = match cfg.listen.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let per_core = cfg.listen.runtime == refract_core::config::RuntimeKind::PerCore;
    if per_core {
        worker::set_count(workers);
    }
    let ctx = ctx::Ctx::new(cfg);
    let _ = ctx.config_path.set(path.to_path_buf());
    let bound = ctx.clone();
    refract_process::watchdog::start(move || Duration::from_millis(bound.cfg.timeouts.drain_ms))?;
    match per_core {
        true => run_per_core(ctx, workers),
        false => run_work_stealing(ctx, workers),
    }
}

/// One event loop per worker thread; signals on a thread of their own.
fn run_per_core(ctx: Arc<ctx::Ctx>, workers: usize) -> anyhow::Result<Exit> {
    // Handlers are installed before any listener opens: a SIGHUP must never find the default
    // action (terminate) in place.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let signals = {
        let _in = rt.enter();
        Signals::install()?
    };
    let stopper = ctx.clone();
    std::thread::Builder::new().name("refract-signals".into()).spawn(move || rt.block_on(signals.serve(&stopper)))?;
    run_workers(ctx.clone(), workers)?;
    Ok(Exit::of(&ctx))
}

/// One multi-threaded runtime for everything.
fn run_work_stealing(ctx: Arc<ctx::Ctx>, workers: usize) -> anyhow::Result<Exit> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build()?;
    let exit = rt.block_on(async move {
        let signals = Signals::install()?;
        let dispatcher = Dispatcher::start_on(ctx.clone()).await?;
        signals.serve(&ctx).await;
        dispatcher.shutdown().await;
        Ok(Exit::of(&ctx))
    });
    rt.shutdown_timeout(refract_core::engine::RUNTIME_GRACE);
    exit
}

/// The signals the dispatcher acts on.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers (on the current runtime).
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// Reloads on every SIGHUP; at SIGTERM or SIGINT starts the drain (`stop`) and returns.
    async fn serve(mut self, ctx: &ctx::Ctx) {
        let signal = loop {
            tokio::select! {
                _ = self.term.recv() => break "SIGTERM",
                _ = self.int.recv() => break "SIGINT",
                _ = self.hup.recv() => {
                    tracing::info!("SIGHUP: reloading the configuration");
                    let _ = reload::reload_logged(ctx);
                }
            }
        };
        if refract_process::failpoint::is("stop-hang") {
            tracing::warn!(signal, "failpoint stop-hang: the drain never starts");
            std::future::pending::<()>().await;
        }
        ctx.stop.cancel();
        tracing::info!(signal, drain_ms = ctx.cfg.timeouts.drain_ms, "signal received: draining");
    }
}
