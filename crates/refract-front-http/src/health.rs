//! Active health checks: every backend is probed at an interval (a TCP connect, or an HTTP GET
//! of a configured path that must answer 2xx); a failing backend is marked down and skipped, a
//! recovered one comes back. Requests mark a backend down at once when connecting fails. Each
//! interval also runs the engine's latency outlier check (`membership::eject_slow`).

use refract_core::backend::Backend;
use refract_core::config::Health;
use refract_core::ctx::Ctx;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;

/// Probes all backends until the dispatcher stops.
pub async fn run(ctx: Arc<Ctx>) {
    let cfg = ctx.cfg.health.clone();
    let path: Option<Arc<str>> =
        crate::config::HttpConfig::of(&ctx.cfg).listening.health_path.as_deref().map(Arc::from);
    let mut tick = tokio::time::interval(Duration::from_millis(cfg.interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {},
            _ = ctx.stop.cancelled() => return,
        }
        let mut probes = JoinSet::new();
        for b in ctx.members.snapshot().iter().cloned() {
            let (cfg, path) = (cfg.clone(), path.clone());
            probes.spawn(async move {
                let ok = probe(&b, &cfg, path.as_deref()).await;
                (b, ok)
            });
        }
        while let Some(Ok((b, ok))) = probes.join_next().await {
            if b.set_up(ok) {
                tracing::warn!(backend = %b.name, up = ok, "backend health changed");
            }
        }
        refract_core::membership::eject_slow(&ctx.members.snapshot(), &ctx.cfg.overload);
    }
}

/// One probe (a connect, then a GET of `path` if set); true when healthy.
pub async fn probe(b: &Backend, cfg: &Health, path: Option<&str>) -> bool {
    let timeout = Duration::from_millis(cfg.timeout_ms);
    let check = async {
        let mut conn = b.connect(timeout).await.ok()?;
        let Some(path) = path else { return Some(true) };
        let req = format!("GET {path} HTTP/1.1\r\nhost: {}\r\nconnection: close\r\n\r\n", b.addr);
        conn.stream.write_all(req.as_bytes()).await.ok()?;
        let mut head = [0u8; 12];
        conn.stream.read_exact(&mut head).await.ok()?;
        Some(head.starts_with(b"HTTP/1.") && head[9] == b'2')
    };
    matches!(tokio::time::timeout(timeout, check).await, Ok(Some(true)))
}
