//! The PostgreSQL front end: a listener speaking the v3 protocol to clients, pooling server
//! connections and routing each statement to the primary or a replica (`docs/postgres.md`).
//!
//! # Layout
//! - `[postgres]` ([`PgConfig`]) is parsed and validated in `config/pg.rs`.
//! - `login`: startup, SSLRequest (TLS with rustls), CancelRequest and client authentication.
//! - `session`: the per-client loop: simple queries, COPY, routing, binding and release.
//! - `batch`: extended-protocol batches, rewritten for per-server prepared statements.
//! - `large`: large DataRow / CopyData relayed in pieces, never held whole.
//! - `bind`: large Bind messages relayed in pieces, as a dispatch point of their batch.
//! - `unreadable`: text that is not UTF-8 (LATIN1, WIN1252 ...): relayed as sent, classified
//!   conservatively.
//! - `names`: the unnamed statement and SQL-prepared names, mirrored onto shared connections.
//! - `servers`: servers, health, lag, the choice of one; `pool`: connections per server.
//! - `admit`: admission control (adaptive limit, deadline queue) before a server connection.
//! - `server`: one server connection; `wire`: framed sockets (plain or TLS); `cancel`: cancel keys.
//! - `reset`: giving a server connection back (`DISCARD ALL` after a session-mode client).
//! - `held`: the session state refract keeps for a client (pins, LISTEN channels, SETs).
//! - `pin`: pinning a transaction-mode client to its connection while session state lasts.
//! - `notify`: LISTEN/NOTIFY in transaction mode (one listener connection to the primary);
//!   `listen`: a client's LISTEN/UNLISTEN answered by refract, its notifications delivered.
//! - `extended`: SETs run through the extended protocol, tracked at Sync.
//! - `shared`: what every session shares (kept in the dispatcher's `ctx`).
//! - `clients`: the connected clients; `status`: the admin views (`/pg/*`) and pool gauges.
//! - `error`: the error type.

mod admit;
mod batch;
mod bind;
mod cancel;
mod clients;
mod error;
mod extended;
mod held;
mod large;
mod listen;
mod login;
mod names;
mod notify;
mod pin;
mod pool;
mod reset;
mod server;
mod servers;
mod session;
pub(crate) mod shared;
mod status;
mod unreadable;
mod wire;

pub use crate::config::pg::{AuthKind, PgConfig, PgRole, PgServerConfig, PgSettings, PgUser, PoolMode};
pub use error::PgError;

use crate::accept::{accept_each, named, OpenConnection};
use crate::ctx::Ctx;
use shared::Shared;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

pub(crate) use status::{clients_view, pools_view, publish_metrics, servers_view};

/// The front end's shared state, built on first use (the pools need the shard count).
fn shared(ctx: &Ctx, cfg: &PgConfig) -> Arc<Shared> {
    ctx.pg.get_or_init(|| Arc::new(Shared::new(cfg, &ctx.cfg.overload, &ctx.metrics, &ctx.stop))).clone()
}

/// Binds the PostgreSQL listener and starts serving (and probing the servers) in the background.
pub async fn start(ctx: Arc<Ctx>, cfg: PgConfig) -> std::io::Result<()> {
    let listener = TcpListener::bind(cfg.listen).await.map_err(named("[postgres] listen", cfg.listen))?;
    start_background(&ctx, &cfg);
    serve(&ctx, &cfg, listener)
}

/// Starts the health checks and lag polls (once per dispatcher, on any runtime).
pub(crate) fn start_background(ctx: &Ctx, cfg: &PgConfig) {
    let shared = shared(ctx, cfg);
    let servers = shared.servers.clone();
    let interval = Duration::from_millis(shared.cfg.health_interval_ms);
    if shared.cfg.read_your_writes && servers.list.iter().any(|s| s.role == PgRole::Replica) {
        tokio::spawn(servers::run_lsn_poll(servers.clone(), ctx.stop.clone()));
    }
    tokio::spawn(servers::run_health(servers, interval, shared.cfg.min_idle, ctx.metrics.clone(), ctx.stop.clone()));
}

/// Serves the clients that `listener` accepts on the current runtime. With the per-core
/// runtime and `accept = "reuseport"` every shard calls this with its own `SO_REUSEPORT`
/// listener on the same address, so sessions spread over the cores and each keeps its server
/// connections on its own loop.
pub(crate) fn serve(ctx: &Ctx, cfg: &PgConfig, listener: TcpListener) -> std::io::Result<()> {
    let shared = shared(ctx, cfg);
    let open = ctx.metrics.open_connections(crate::shard::current());
    accept_placing(ctx, cfg, listener, move |stream, peer| {
        let (shared, open) = (shared.clone(), OpenConnection::count(open.clone()));
        tokio::spawn(async move {
            session::run(shared, stream, peer).await;
            drop(open);
        });
    })
}

/// Accepts PostgreSQL clients on `listener` and hands each (with `TCP_NODELAY`) to `place`
/// (with `accept = "balanced"`: to the event loop with the fewest open client connections).
pub(crate) fn accept_placing(
    ctx: &Ctx,
    cfg: &PgConfig,
    listener: TcpListener,
    place: impl FnMut(tokio::net::TcpStream, std::net::SocketAddr) + Send + 'static,
) -> std::io::Result<()> {
    let shared = shared(ctx, cfg);
    tracing::info!(addr = %listener.local_addr()?, shard = crate::shard::current(), "postgres listening");
    tokio::spawn(async move { accept_each(&shared.stop, &shared.metrics, "postgres", listener, place).await });
    Ok(())
}

/// Serves one PostgreSQL client connection accepted elsewhere, on the current runtime.
pub(crate) async fn run_session(ctx: &Ctx, cfg: &PgConfig, stream: tokio::net::TcpStream, peer: std::net::SocketAddr) {
    session::run(shared(ctx, cfg), stream, peer).await;
}
