//! refract's PostgreSQL front end, on the engine (`refract-core`): a listener speaking the v3
//! protocol to clients, pooling server connections and routing each statement to the primary
//! or a replica (`docs/postgres.md`).
//!
//! # Layout
//! - [`PgFront`]: the [`Front`](refract_core::engine::Front) the engine runs.
//! - `admit`: admission control (adaptive limit, deadline queue) before a server connection;
//!   `baseline`: each server's no-load time per kind of statement, which its limit reads;
//!   `lru`: the bounded table both keep per kind of statement (and `startup` per set of
//!   startup settings).
//! - [`config`]: `[postgres]` ([`PgConfig`]), parsed and validated.
//! - `login`: startup, SSLRequest (TLS with rustls), CancelRequest and client authentication;
//!   `greeting`: the ParameterStatus set at login, the primary's for the client's settings;
//!   `startup`: what the client's startup settings become (SETs replayed, greetings kept).
//! - `session`: the per-client loop: simple queries, COPY, routing, binding and release.
//! - `batch`: extended-protocol batches, rewritten for per-server prepared statements.
//! - `large`: large DataRow / CopyData relayed in pieces, never held whole.
//! - `handover`: a large result written to the client by the server's agent (the client's
//!   socket lent to it; the agent's digest replayed muted), or relayed.
//! - `bind`: large Bind messages relayed in pieces, as a dispatch point of their batch.
//! - `unreadable`: text that is not UTF-8 (LATIN1, WIN1252 ...): relayed as sent, classified
//!   conservatively.
//! - `names`: the unnamed statement and SQL-prepared names, mirrored onto shared connections.
//! - `partial`: partial replicas (the tables each holds) and the shares of a class of reads.
//! - `servers`: servers, health, lag, the choice of one; `pool`: connections per server;
//!   `sizes`: which kinds of statement answer small (they go straight to the server, not
//!   through its agent).
//! - `server`: one server connection; `wire`: framed sockets (plain or TLS); `cancel`: cancel keys.
//! - `reset`: giving a server connection back (`DISCARD ALL` after a session-mode client).
//! - `held`: the session state refract keeps for a client (pins, LISTEN channels, SETs).
//! - `pin`: pinning a transaction-mode client to its connection while session state lasts.
//! - `notify`: LISTEN/NOTIFY in transaction mode (one listener connection to the primary);
//!   `listen`: a client's LISTEN/UNLISTEN answered by refract, its notifications delivered.
//! - `extended`: SETs run through the extended protocol, tracked at Sync.
//! - `sharding`: a sharded cluster: the rules (which shard holds a key), each statement's
//!   shards, scatter-gather reads and writes over several shards, `/pg/shards`.
//! - `shared`: what every session shares (kept by the [`PgFront`]).
//! - `clients`: the connected clients; `status`: the admin views (`/pg/*`) and pool gauges.
//! - `error`: the error type.

mod admit;
mod client;
pub mod config;
mod error;
mod server;
mod session;
mod sharding;
mod shared;
mod status;

pub use config::{AuthKind, PgConfig, PgRole, PgServerConfig, PgSettings, PgUser, PoolMode};
pub use error::PgError;
pub use server::servers::ChangeError;

/// A membership change from the admin API.
pub enum Change<'a> {
    /// A server joins (its name is `pg:NAME`).
    Add(&'a refract_core::config::BackendConfig),
    /// `pg:NAME` leaves.
    Remove(&'a str),
    /// `pg:NAME` is drained (`true`) or undrained.
    Drain(&'a str, bool),
}

use refract_core::engine::{Front, Serving};
use refract_core::{Config, Ctx};
use refract_handover::config::HandoverConfig;
use serde_json::Value;
use shared::Shared;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::net::TcpStream;

/// The PostgreSQL front end: clients on `[postgres] listen`, servers from `[[postgres.server]]`.
#[derive(Default)]
pub struct PgFront {
    /// What every session shares, built on first use (the pools need the shard count).
    shared: OnceLock<Arc<Shared>>,
}

impl PgFront {
    /// The front end's shared state for `[postgres]` of the configuration in force.
    fn shared(&self, ctx: &Ctx) -> Option<Arc<Shared>> {
        let cfg = ctx.cfg.sections.get::<PgConfig>()?;
        let c = &ctx.cfg;
        Some(
            self.shared
                .get_or_init(|| {
                    let handover = c.sections.get::<HandoverConfig>().cloned();
                    Arc::new(Shared::new(cfg, &ctx.metrics, &ctx.stop, &c.overload, &c.balance, handover))
                })
                .clone(),
        )
    }

    /// An admin view (`/pg/pools`, `/pg/clients`, `/pg/servers`), once the front end runs.
    pub fn view(&self, path: &str) -> Option<Value> {
        let shared = self.shared.get()?;
        match path {
            "/pg/pools" => Some(status::pools_view(shared)),
            "/pg/clients" => Some(status::clients_view(shared)),
            "/pg/servers" => Some(status::servers_view(shared)),
            "/pg/shards" => Some(match &shared.sharding {
                Some(sh) => sharding::view(sh, &shared.shards),
                None => serde_json::json!({"sharded": false, "shards": []}),
            }),
            _ => None,
        }
    }

    /// The servers as the engine's members, for `GET /backends` (empty when not running).
    pub fn members(&self) -> Vec<Value> {
        self.shared.get().map_or_else(Vec::new, |s| status::members_view(s))
    }

    /// Runtime membership from the admin API, for a member named `pg:NAME`: a replica joins
    /// ([`Change::Add`]), leaves, is drained or undrained. `None`: not a PostgreSQL name, or
    /// the front end does not run.
    pub fn change(&self, ctx: &Ctx, change: Change<'_>) -> Option<Result<(), ChangeError>> {
        let shared = self.shared.get()?;
        let servers = &shared.servers;
        Some(match change {
            Change::Add(def) => {
                let name = def.name.strip_prefix("pg:")?;
                let role = match def.role {
                    refract_core::config::Role::Primary => PgRole::Primary,
                    refract_core::config::Role::Replica => PgRole::Replica,
                };
                servers.add(
                    &PgServerConfig { name: name.into(), addr: def.addr, role, through: None, tables: None },
                    &ctx.metrics,
                )
            }
            Change::Remove(name) => servers.remove(name.strip_prefix("pg:")?, &ctx.metrics),
            Change::Drain(name, drained) => {
                let name = name.strip_prefix("pg:")?;
                let s = servers.get(name).ok_or_else(|| ChangeError::Unknown(name.into()));
                s.map(|s| {
                    if s.member.set_drained(drained) {
                        tracing::info!(server = %s.name, drained, "postgres server drain changed");
                    }
                })
            }
        })
    }

    /// Brings the pool gauges up to date (before `/metrics` is written).
    pub fn publish_metrics(&self) {
        if let Some(shared) = self.shared.get() {
            status::publish_metrics(shared);
        }
    }
}

impl Front for PgFront {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn listener(&self, cfg: &Config) -> Option<(&'static str, SocketAddr)> {
        cfg.sections.get::<PgConfig>().map(|pg| ("[postgres] listen", pg.listen))
    }

    /// PostgreSQL sessions are not drained: an idle client may stay connected for hours.
    fn drained(&self) -> bool {
        false
    }

    /// Starts the health checks and lag polls.
    fn start(&self, ctx: &Arc<Ctx>) -> std::io::Result<()> {
        status::PgMetrics::of(&ctx.metrics);
        let Some(shared) = self.shared(ctx) else { return Ok(()) };
        let interval = Duration::from_millis(shared.cfg.health_interval_ms);
        for servers in &shared.shards {
            if shared.cfg.read_your_writes && servers.list().iter().any(|s| s.role == PgRole::Replica) {
                tokio::spawn(server::probes::run_lsn_poll(servers.clone(), ctx.stop.clone()));
            }
            let (min_idle, metrics, stop) = (shared.cfg.min_idle, ctx.metrics.clone(), ctx.stop.clone());
            tokio::spawn(server::probes::run_health(servers.clone(), interval, min_idle, metrics, stop));
        }
        if let Some(Ok(log)) = shared.sharding.as_ref().map(|s| s.log.clone()) {
            tokio::spawn(sharding::recover(log, shared.shards.clone(), interval, ctx.stop.clone()));
        }
        Ok(())
    }

    fn serve(&self, ctx: Arc<Ctx>, stream: TcpStream, peer: SocketAddr) -> Serving {
        let shared = self.shared(&ctx);
        Box::pin(async move {
            if let Some(shared) = shared {
                session::run(shared, stream, peer).await;
            }
        })
    }
}
