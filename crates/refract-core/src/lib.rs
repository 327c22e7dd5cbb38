//! refract's core: the listener, the session loop, backend pools, routing and balancing, health
//! checks, runtime membership, the admin listener and metrics. Protocol framing lives in the
//! protocol crates (`refract-http` today); this crate drives the sockets.
//!
//! # Layout
//! - [`config`]: the TOML configuration and its validation.
//! - [`dispatcher`]: start, accept loop, drain on shutdown.
//! - `session`: the client session loop (one request at a time, in order).
//! - `forward`: one request to one backend: admission, exchange, retry, learning.
//! - `relay`: moving bodies between client and backend with bounded buffers.
//! - `fanout`: class `all`, sent to every backend.
//! - [`membership`]: backends at runtime and the choice of one per request.
//! - [`backend`]: one backend, its health and its connection pool.
//! - `handover`: handing a client connection to a backend's agent and taking it back.
//! - `health`: active health checks.
//! - `admin`: `/backends`, `/metrics`.
//! - [`metrics`]: Prometheus metrics.
//! - [`pg`]: the PostgreSQL front end.
//! - [`overload`]: admission limits, queues, deadlines, retry budget (being wired in).
//! - [`shard`]: which per-core event loop the current thread is.
//! - [`conn`]: a client connection and its buffer.
//! - [`error`]: the error type.

mod admin;
pub mod backend;
pub mod config;
pub mod conn;
pub mod dispatcher;
pub mod error;
mod fanout;
mod forward;
mod handover;
mod health;
pub mod membership;
pub mod metrics;
pub mod overload;
pub mod pg;
mod relay;
mod session;
pub mod shard;
pub mod spin;

pub use config::Config;
pub use dispatcher::Dispatcher;
pub use error::Error;

use std::path::Path;

/// Loads the configuration, runs the dispatcher until SIGINT/SIGTERM, then drains.
pub fn run_dispatcher_from_file(path: &Path) -> anyhow::Result<()> {
    let cfg = Config::load(path)?;
    let workers = match cfg.listen.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    if cfg.listen.runtime == config::RuntimeKind::PerCore {
        shard::set_count(workers);
        let ctx = dispatcher::Ctx::new(cfg);
        let stopper = ctx.clone();
        std::thread::Builder::new().name("refract-signals".into()).spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
            if let Ok(rt) = rt {
                if rt.block_on(wait_for_signal()).is_ok() {
                    tracing::info!("signal received: draining");
                }
            }
            stopper.stop.cancel();
        })?;
        return Ok(dispatcher::run_sharded(ctx, workers)?);
    }
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.worker_threads(workers);
    rt.enable_all().build()?.block_on(async move {
        let dispatcher = Dispatcher::start(cfg).await?;
        wait_for_signal().await?;
        tracing::info!("signal received: draining");
        dispatcher.shutdown().await;
        Ok(())
    })
}

async fn wait_for_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    Ok(())
}
