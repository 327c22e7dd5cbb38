//! The dispatcher: binds the listeners, runs the accept loop, health checks and admin, and
//! drains in-flight requests on shutdown.

use crate::config::Config;
use crate::membership::Membership;
use crate::metrics::Metrics;
use crate::overload::RetryBudget;
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
}

/// A running dispatcher.
pub struct Dispatcher {
    ctx: Arc<Ctx>,
    http_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    sessions: TaskTracker,
}

impl Dispatcher {
    /// Binds the listeners and starts serving.
    pub async fn start(cfg: Config) -> std::io::Result<Dispatcher> {
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
        let classifier = Classifier::new(cfg.routes.clone());
        let listener = TcpListener::bind(cfg.listen.http).await?;
        let admin = match cfg.listen.admin {
            Some(a) => Some(TcpListener::bind(a).await?),
            None => None,
        };
        let http_addr = listener.local_addr()?;
        let admin_addr = admin.as_ref().map(|l| l.local_addr()).transpose()?;
        let ctx = Arc::new(Ctx { cfg, members, metrics, classifier, stop: CancellationToken::new(), budget });
        let sessions = TaskTracker::new();
        tokio::spawn(accept_loop(ctx.clone(), listener, sessions.clone()));
        tokio::spawn(health::run(ctx.clone()));
        if let Some(pg) = ctx.cfg.postgres.clone() {
            crate::pg::start(ctx.clone(), pg).await?;
        }
        if let Some(l) = admin {
            tokio::spawn(admin::serve(ctx.clone(), l));
        }
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
