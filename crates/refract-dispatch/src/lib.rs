//! refract's dispatcher: the engine (`refract-core`) started with its front ends (HTTP,
//! PostgreSQL, the admin API), the whole configuration file, reload and signals. This is the
//! one crate that names every front end; the engine and the front ends never name each other.
//!
//! # Layout
//! - [`config`]: the whole TOML file, parsed and validated into the engine's configuration.
//! - [`dispatcher`]: the front ends, started on the engine.
//! - `admin`: `/backends`, drain, `/reload`, `/metrics`, `/pg/*`; who may use it
//!   (`admin/guard.rs`).
//! - `reload`: SIGHUP / `refract reload`: re-read, validate, apply.

mod admin;
pub mod config;
pub mod dispatcher;
mod reload;

pub use dispatcher::{run_sharded, Dispatcher};
pub use refract_core::{Config, Ctx};

use refract_core::{ctx, shard};
use std::path::Path;

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
/// SIGHUP; then drains and says whether the drain finished in time.
pub fn run_dispatcher_from_file(path: &Path) -> anyhow::Result<Exit> {
    let cfg = config::load(path)?;
    let workers = match cfg.listen.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    if cfg.listen.runtime == refract_core::config::RuntimeKind::PerCore {
        shard::set_count(workers);
        let ctx = ctx::Ctx::new(cfg);
        let _ = ctx.config_path.set(path.to_path_buf());
        // Handlers are installed before any listener opens: a SIGHUP must never find the
        // default action (terminate) in place.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let signals = {
            let _in = rt.enter();
            Signals::install()?
        };
        let stopper = ctx.clone();
        std::thread::Builder::new().name("refract-signals".into()).spawn(move || {
            rt.block_on(signals.serve(&stopper));
            stopper.stop.cancel();
        })?;
        run_sharded(ctx.clone(), workers)?;
        return Ok(Exit::of(&ctx));
    }
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.worker_threads(workers);
    rt.enable_all().build()?.block_on(async move {
        let signals = Signals::install()?;
        let dispatcher = Dispatcher::start(cfg).await?;
        let ctx = dispatcher.ctx().clone();
        let _ = ctx.config_path.set(path.to_path_buf());
        signals.serve(&ctx).await;
        dispatcher.shutdown().await;
        Ok(Exit::of(&ctx))
    })
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

    /// Reloads on every SIGHUP; returns at SIGTERM or SIGINT (time to drain).
    async fn serve(mut self, ctx: &ctx::Ctx) {
        loop {
            tokio::select! {
                _ = self.term.recv() => break,
                _ = self.int.recv() => break,
                _ = self.hup.recv() => {
                    tracing::info!("SIGHUP: reloading the configuration");
                    let _ = reload::reload_logged(ctx);
                }
            }
        }
        tracing::info!("signal received: draining");
    }
}
