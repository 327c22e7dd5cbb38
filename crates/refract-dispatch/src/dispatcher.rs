//! The dispatcher: the engine (`refract-core`) with its front ends: HTTP, PostgreSQL (when
//! `[postgres]` is set) and the admin API. Either one event loop per worker ([`run_workers`])
//! or one multi-threaded runtime ([`Dispatcher::start`]).

use crate::admin::Admin;
use refract_core::engine::{self, Fronts, Running};
use refract_core::{Config, Ctx};
use refract_front_http::HttpFront;
use refract_front_pg::PgFront;
use std::net::SocketAddr;
use std::sync::Arc;

/// A running dispatcher (on a multi-threaded runtime).
pub struct Dispatcher {
    running: Running,
    admin: Arc<Admin>,
}

/// The front ends of a dispatcher, the admin API last, and that admin API.
fn fronts() -> (Fronts, Arc<Admin>) {
    let pg = Arc::new(PgFront::default());
    let admin = Arc::new(Admin { pg: pg.clone(), bound: Default::default() });
    (Arc::new([Arc::new(HttpFront) as _, pg as _, admin.clone() as _]), admin)
}

impl Dispatcher {
    /// Binds the listeners and starts serving on the current runtime.
    pub async fn start(cfg: Config) -> std::io::Result<Dispatcher> {
        Dispatcher::start_on(Ctx::new(cfg)).await
    }

    /// Like [`Dispatcher::start`], on a context already made.
    pub async fn start_on(ctx: Arc<Ctx>) -> std::io::Result<Dispatcher> {
        let (fronts, admin) = fronts();
        let running = engine::start(ctx, fronts).await?;
        let d = Dispatcher { running, admin };
        tracing::info!(http = ?d.running.bound(0), admin = ?d.admin_addr(), "dispatcher listening");
        Ok(d)
    }

    /// The bound client address (HTTP).
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.running.bound(0)
    }

    /// The bound admin address.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.bound.get().copied()
    }

    /// The shared context (for tests and embedding).
    pub fn ctx(&self) -> &Arc<Ctx> {
        self.running.ctx()
    }

    /// Stops accepting, lets in-flight requests finish (at most `drain_ms`), then returns
    /// whether every session ended in time.
    pub async fn shutdown(self) -> bool {
        self.running.shutdown().await
    }
}

/// Runs the dispatcher with one single-threaded event loop per worker (see
/// [`engine::run_workers`]); returns after `stop` and the drain.
pub fn run_workers(ctx: Arc<Ctx>, workers: usize) -> std::io::Result<()> {
    engine::run_workers(ctx, fronts().0, workers)
}
