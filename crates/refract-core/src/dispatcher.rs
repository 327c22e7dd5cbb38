//! The dispatcher: binds the listeners, runs the accept loop, health checks and admin, and
//! drains in-flight requests on shutdown.

use crate::config::Config;
use crate::membership::Membership;
use crate::metrics::Metrics;
use crate::overload::{RetryBudget, UserLimits};
use crate::{admin, health, session};
use refract_http::Classifier;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What every session shares.
pub struct Ctx {
    /// The configuration.
    pub cfg: Config,
    /// The backends.
    pub members: Membership,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Request classification.
    pub classifier: Classifier,
    /// Cancelled when the dispatcher starts draining.
    pub stop: CancellationToken,
    /// Retries allowed (shared by all sessions).
    pub budget: RetryBudget,
    /// Per-user token buckets.
    pub users: UserLimits,
    /// The PostgreSQL front end's shared state, once it runs (for the admin `/pg/*` views).
    pub(crate) pg: std::sync::OnceLock<Arc<crate::pg::Shared>>,
}

/// A running dispatcher.
pub struct Dispatcher {
    ctx: Arc<Ctx>,
    http_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    sessions: TaskTracker,
}

impl Ctx {
    /// The shared state for a configuration.
    pub fn new(cfg: Config) -> Arc<Ctx> {
        let metrics = Arc::new(Metrics::new());
        let members = Membership::new(
            &cfg.backend_list(),
            cfg.balance.clone(),
            cfg.limits.max_idle_per_backend,
            metrics.clone(),
            &cfg.overload,
        );
        let o = &cfg.overload;
        let budget = RetryBudget::new(o.retry_budget_ratio, o.retry_budget_floor, 100.0);
        let users = UserLimits::new(o.users.iter().map(|u| (u.name.as_str(), u.rate, u.burst)));
        let classifier = Classifier::new(cfg.routes.clone());
        let (stop, pg) = (CancellationToken::new(), std::sync::OnceLock::new());
        Arc::new(Ctx { cfg, members, metrics, classifier, stop, budget, users, pg })
    }

    /// Starts the side services on the current runtime: health checks, the PostgreSQL front
    /// end, the admin listener. Returns the admin address.
    async fn start_services(self: &Arc<Self>) -> std::io::Result<Option<SocketAddr>> {
        tokio::spawn(health::run(self.clone()));
        if let Some(pg) = self.cfg.postgres.clone() {
            crate::pg::start(self.clone(), pg).await?;
        }
        let Some(addr) = self.cfg.listen.admin else { return Ok(None) };
        let listener = TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        tokio::spawn(admin::serve(self.clone(), listener));
        Ok(Some(bound))
    }
}

impl Dispatcher {
    /// Binds the listeners and starts serving on the current runtime.
    pub async fn start(cfg: Config) -> std::io::Result<Dispatcher> {
        let ctx = Ctx::new(cfg);
        let listener = TcpListener::bind(ctx.cfg.listen.http).await?;
        let http_addr = listener.local_addr()?;
        let admin_addr = ctx.start_services().await?;
        let sessions = TaskTracker::new();
        tokio::spawn(accept_loop(ctx.clone(), listener, sessions.clone()));
        tracing::info!(http = %http_addr, admin = ?admin_addr, "dispatcher listening");
        Ok(Dispatcher { ctx, http_addr, admin_addr, sessions })
    }

    /// The bound client address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The bound admin address.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The shared context (for tests and embedding).
    pub fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// Stops accepting, lets in-flight requests finish (at most `drain_ms`), then returns
    /// whether every session ended in time.
    pub async fn shutdown(self) -> bool {
        self.ctx.stop.cancel();
        self.sessions.close();
        let drain = Duration::from_millis(self.ctx.cfg.timeouts.drain_ms);
        let drained = tokio::time::timeout(drain, self.sessions.wait()).await.is_ok();
        if !drained {
            tracing::warn!(left = self.sessions.len(), "drain timeout: closing remaining connections");
        }
        drained
    }
}

async fn accept_loop(ctx: Arc<Ctx>, listener: TcpListener, sessions: TaskTracker) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = ctx.stop.cancelled() => return,
        };
        match accepted {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                ctx.metrics.connections.inc();
                sessions.spawn(session::run(ctx.clone(), stream));
            }
            Err(e) => {
                // Out of descriptors or similar: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Runs the dispatcher with one single-threaded event loop per shard, each accepting on its
/// own `SO_REUSEPORT` listener and keeping its own backend connections, like HAProxy's threads:
/// a connection never changes thread, so no request pays a cross-thread wake-up. Shard 0 also
/// runs health checks, admin and the PostgreSQL front end. Returns after `stop` and the drain.
pub fn run_sharded(ctx: Arc<Ctx>, shards: usize) -> std::io::Result<()> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let mut threads = Vec::new();
    for i in 0..shards {
        let (ctx, ready) = (ctx.clone(), ready_tx.clone());
        let t = std::thread::Builder::new().name(format!("refract-{i}")).spawn(move || shard_main(ctx, i, ready))?;
        threads.push(t);
    }
    drop(ready_tx);
    let mut first_error = None;
    for r in ready_rx.iter().take(shards) {
        if let Err(e) = r {
            ctx.stop.cancel();
            first_error.get_or_insert(e);
        }
    }
    if first_error.is_none() {
        tracing::info!(http = %ctx.cfg.listen.http, shards, "dispatcher listening");
    }
    for t in threads {
        let _ = t.join();
    }
    first_error.map_or(Ok(()), Err)
}

fn shard_main(ctx: Arc<Ctx>, i: usize, ready: std::sync::mpsc::Sender<std::io::Result<()>>) {
    crate::shard::enter(i);
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    rt.block_on(async move {
        let started = async {
            let listener = reuseport_listener(ctx.cfg.listen.http)?;
            if i == 0 {
                ctx.start_services().await?;
            }
            Ok::<_, std::io::Error>(listener)
        };
        let listener = match started.await {
            Ok(l) => l,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        let sessions = TaskTracker::new();
        accept_loop(ctx.clone(), listener, sessions.clone()).await;
        sessions.close();
        let drain = Duration::from_millis(ctx.cfg.timeouts.drain_ms);
        if tokio::time::timeout(drain, sessions.wait()).await.is_err() {
            tracing::warn!(shard = i, left = sessions.len(), "drain timeout: closing remaining connections");
        }
    });
}

/// A listener that shares its address with the other shards' (the kernel spreads connections).
fn reuseport_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}
