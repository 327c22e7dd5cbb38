//! refract's PostgreSQL front end, on the engine (`refract-core`): a listener speaking the v3
//! protocol to clients, pooling server connections and routing each statement to the primary
//! or a replica (`docs/postgres.md`).
//!
//! # Layout
//! Folders are layers, each a `foo.rs` beside `foo/` whose `//!` lists its files:
//! - this file: [`PgFront`], the [`Front`](refract_core::engine::Front) the engine runs, and
//!   `Shared`, what every session shares (which the [`PgFront`] keeps).
//! - `client/`: login (startup, SSLRequest and TLS, authentication), the ParameterStatus
//!   greeting, what the startup settings become, cancel keys, the client's framed socket, the
//!   connected clients (`/pg/clients` and their gauges).
//! - `session.rs`, `session/`: the per-client loop: simple queries, extended batches, binding a
//!   server connection and relaying its answers, the protocol phase, what the session holds
//!   (pins, SETs, prepared names, LISTEN), large messages, reset, its side of the hand-over.
//! - `server.rs`, `server/`: one server connection; the servers (members, health, lag, the
//!   choice of one), pools, probes, partial replicas, which statements answer small; their
//!   admin views (`/pg/pools`, `/pg/servers`, `/backends`) and gauges; the front end's metric
//!   families (`refract_pg_*`).
//! - `admit.rs`, `admit/`: admission control (adaptive limit, deadline queue) before a server
//!   connection, its permits, the no-load baselines its limit reads.
//! - `sharding.rs`, `sharding/`: a sharded cluster: the rules (which shard holds a key), each
//!   statement's shards, scatter-gather reads and writes over several shards, `/pg/shards`.
//! - `affinity`: the key a read is routed by under `[balance] policy = "affinity"`, and the
//!   primary keys it learns from the catalog.
//! - [`config`]: `[postgres]` ([`PgConfig`]), parsed and validated.
//! - `error`: the error type.

mod admit;
mod affinity;
mod client;
pub mod config;
mod error;
mod server;
mod session;
mod sharding;

pub use client::cancel::{slot_of, CancelRelay, SLOTS};
pub use config::{AuthKind, PgConfig, PgRole, PgServerConfig, PgSettings, PgUser, PoolMode};
pub use error::PgError;
pub use server::servers::ChangeError;
pub use sharding::SharedDecisions;

/// A membership change from the admin API. A server is named plainly (`NAME`); `pg:NAME` is
/// still accepted for one release (deprecated: a warning is logged).
pub enum Change<'a> {
    /// A server joins, defined as an HTTP backend named `pg:NAME` (deprecated).
    Add(&'a refract_core::config::BackendConfig),
    /// A server joins, defined as a `[[postgres.server]]`.
    Join(&'a PgServerConfig),
    /// The server leaves.
    Remove(&'a str),
    /// The server is drained (`true`) or undrained.
    Drain(&'a str, bool),
}

/// A server's plain name: `NAME` as given, or `pg:NAME` without its deprecated prefix.
fn plain(name: &str) -> &str {
    match name.strip_prefix("pg:") {
        Some(plain) => {
            tracing::warn!(server = %plain, "the admin API's `pg:` prefix is deprecated: name the server plainly");
            plain
        }
        None => name,
    }
}

use client::cancel::Cancels;
use client::clients::Clients;
use client::startup::Greetings;
use refract_core::config::{Balance, Overload, Policy};
use refract_core::engine::{Front, Serving};
use refract_core::metrics::Metrics;
use refract_core::{Config, Ctx};
use refract_handover::config::HandoverConfig;
use refract_handover::metrics::HandoverMetrics;
use refract_pg::classify::{Classifier, ClassifierConfig};
use serde_json::Value;
use server::metrics::PgMetrics;
use server::servers::Servers;
use session::notify::Notifier;
use sharding::Sharding;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

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

    /// Several dispatchers behind one address: cancel ids come from `slot` (below [`SLOTS`]),
    /// and CancelRequests for ids this dispatcher did not hand out go to `relay`. `false`
    /// without `[postgres]` or when already joined.
    pub fn join_cluster(&self, ctx: &Ctx, slot: u32, relay: Arc<dyn CancelRelay>) -> bool {
        self.shared(ctx).is_some_and(|s| s.cancels.join(slot, relay))
    }

    /// Several dispatchers: two-phase decisions are recorded in `decisions` from now on, and
    /// this dispatcher keeps finishing the prepared transactions of dispatchers that are gone.
    /// `false` when not sharded or already shared.
    pub fn share_decisions(&self, ctx: &Ctx, decisions: Arc<dyn SharedDecisions>) -> bool {
        let Some(shared) = self.shared(ctx) else { return false };
        let Some(Ok(log)) = shared.sharding.as_ref().map(|s| s.log.clone()) else { return false };
        if !log.share(decisions) {
            return false;
        }
        let interval = Duration::from_millis(shared.cfg.health_interval_ms);
        tokio::spawn(sharding::recover(log, shared.shards.clone(), interval, ctx.stop.clone()));
        true
    }

    /// A CancelRequest another dispatcher forwarded: sent on to the server connection of this
    /// dispatcher's client with that key, if there is one; never forwarded again.
    pub async fn cancel_forwarded(&self, pid: i32, secret: [u8; 4]) {
        let Some(shared) = self.shared.get() else { return };
        let timeout = Duration::from_millis(shared.cfg.connect_timeout_ms);
        shared.cancels.deliver(pid, &secret, timeout).await;
    }

    /// An admin view (`/pg/pools`, `/pg/clients`, `/pg/servers`), once the front end runs.
    pub fn view(&self, path: &str) -> Option<Value> {
        let shared = self.shared.get()?;
        match path {
            "/pg/pools" => Some(server::views::pools_view(&shared.servers)),
            "/pg/clients" => Some(shared.clients.view(&server::views::all(&shared.shards))),
            "/pg/servers" => Some(server::views::servers_view(&shared.shards)),
            "/pg/shards" => Some(match &shared.sharding {
                Some(sh) => sharding::view(sh, &shared.shards),
                None => serde_json::json!({"sharded": false, "shards": []}),
            }),
            _ => None,
        }
    }

    /// The servers as the engine's members, for `GET /backends` (empty when not running).
    pub fn members(&self) -> Vec<Value> {
        self.shared.get().map_or_else(Vec::new, |s| server::views::members_view(&s.shards))
    }

    /// Whether a server of the (unsharded) cluster is called `name`, plain or `pg:NAME`.
    pub fn has(&self, name: &str) -> bool {
        let name = name.strip_prefix("pg:").unwrap_or(name);
        self.shared.get().is_some_and(|s| s.servers.get(name).is_some())
    }

    /// Runtime membership from the admin API: a replica joins ([`Change::Join`], or
    /// [`Change::Add`] named `pg:NAME`), leaves, is drained or undrained. `None`: not a
    /// PostgreSQL server (an `Add` without the prefix, a name no server has), or the front end
    /// does not run.
    pub fn change(&self, change: Change<'_>) -> Option<Result<(), ChangeError>> {
        let shared = self.shared.get()?;
        let servers = &shared.servers;
        Some(match change {
            Change::Add(def) => {
                def.name.strip_prefix("pg:")?;
                let name = plain(&def.name);
                let role = match def.role {
                    refract_core::config::Role::Primary => PgRole::Primary,
                    refract_core::config::Role::Replica => PgRole::Replica,
                };
                servers.add(&PgServerConfig { name: name.into(), addr: def.addr, role, through: None, tables: None })
            }
            Change::Join(def) => servers.add(def),
            Change::Remove(name) => {
                let name = plain(name);
                servers.get(name)?;
                servers.remove(name)
            }
            Change::Drain(name, drained) => {
                let s = servers.get(plain(name))?;
                if s.member.set_drained(drained) {
                    tracing::info!(server = %s.name, drained, "postgres server drain changed");
                    if !drained {
                        servers.cold(&s, "undrained");
                    }
                }
                Ok(())
            }
        })
    }

    /// Brings the server, pool and client gauges up to date (before `/metrics` is written).
    pub fn publish_metrics(&self) {
        if let Some(shared) = self.shared.get() {
            server::views::publish_metrics(&shared.shards, &shared.metrics, &shared.pg_metrics);
            shared.clients.publish_metrics(&shared.pg_metrics);
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
        PgMetrics::of(&ctx.metrics);
        let Some(shared) = self.shared(ctx) else { return Ok(()) };
        let interval = Duration::from_millis(shared.cfg.health_interval_ms);
        for servers in &shared.shards {
            if shared.cfg.read_your_writes && servers.list().iter().any(|s| s.role == PgRole::Replica) {
                tokio::spawn(server::probes::run_lsn_poll(servers.clone(), ctx.stop.clone()));
            }
            let (min_idle, metrics, stop) = (shared.cfg.min_idle, ctx.metrics.clone(), ctx.stop.clone());
            tokio::spawn(server::probes::run_health(servers.clone(), interval, min_idle, metrics, stop));
        }
        if let Some(affinity) = &shared.affinity {
            tokio::spawn(affinity::learn(affinity.clone(), shared.servers.clone(), ctx.stop.clone()));
        }
        // With shared decisions recovery starts once they are reachable (`share_decisions`).
        if let Some(Ok(log)) = shared.sharding.as_ref().map(|s| s.log.clone()).filter(|_| !shared.cfg.shared_decisions)
        {
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

/// What every PostgreSQL session shares: the configuration, the servers and their pools and
/// admission control, the classifier, cancel keys, the greetings, the clients, the LISTEN
/// channels. Kept by the [`PgFront`] (the engine's `ctx` holds the front end) for the admin
/// views, so it imports neither.
pub(crate) struct Shared {
    pub(crate) cfg: PgConfig,
    /// The servers of an unsharded cluster, or of shard 0 (`shards[0]`).
    pub(crate) servers: Arc<Servers>,
    /// Each shard's servers (one entry, `servers`, when the cluster is not sharded).
    pub(crate) shards: Vec<Arc<Servers>>,
    /// The sharding rules when `[[postgres.shard]]` is configured.
    pub(crate) sharding: Option<Arc<Sharding>>,
    pub(crate) classifier: Classifier,
    pub(crate) cancels: Arc<Cancels>,
    /// The ParameterStatus values of the last server login refract read (its server version,
    /// and the greeting when the primary cannot be asked).
    pub(crate) server_params: RwLock<Vec<(String, String)>>,
    /// The greeting per set of startup settings, learnt from the primary.
    pub(crate) greetings: Greetings,
    pub(crate) metrics: Arc<Metrics>,
    /// The front end's own metric families (`refract_pg_*`).
    pub(crate) pg_metrics: Arc<PgMetrics>,
    /// The hand-over's metric families, shared with the HTTP front end.
    pub(crate) handover_metrics: Arc<HandoverMetrics>,
    pub(crate) next_client: AtomicU64,
    pub(crate) stop: CancellationToken,
    /// Present when `tls_cert`/`tls_key` are configured: SSLRequest is answered `S`.
    pub(crate) tls: Option<TlsAcceptor>,
    /// The logged-in clients (admin views).
    pub(crate) clients: Arc<Clients>,
    /// LISTEN channels of transaction-mode clients.
    pub(crate) notifier: Arc<Notifier>,
    /// `[overload] default_timeout_ms`: the deadline of a statement whose session set no
    /// `statement_timeout` (0 = none).
    pub(crate) default_timeout_ms: u64,
    /// Advanced by DDL run through refract, and again when its transaction ends: a client's
    /// Parse after it never reuses a server statement prepared before it
    /// (`PreparedRegistry::follow_epoch`).
    pub(crate) schema_epoch: Arc<AtomicU64>,
    /// Under `[balance] policy = "affinity"`: the affinity columns, configured and learned.
    pub(crate) affinity: Option<Arc<affinity::Affinity>>,
}

impl Shared {
    /// The state for `cfg` under the engine's `[overload]` and `[balance]`; `stop` ends its
    /// background work.
    fn new(
        cfg: &PgConfig,
        metrics: &Arc<Metrics>,
        stop: &CancellationToken,
        overload: &Overload,
        balance: &Balance,
        handover: Option<HandoverConfig>,
    ) -> Shared {
        let mut ccfg = ClassifierConfig::default();
        if let Some(f) = &cfg.write_functions {
            ccfg.write_functions = f.clone();
        }
        let shards: Vec<Arc<Servers>> = if cfg.shards.is_empty() {
            vec![Arc::new(Servers::new(cfg, metrics, overload, balance, handover))]
        } else {
            (0..cfg.shards.len())
                .map(|i| Arc::new(Servers::new(&cfg.for_shard(i), metrics, overload, balance, handover.clone())))
                .collect()
        };
        let sharding = (!cfg.shards.is_empty()).then(|| Arc::new(Sharding::new(cfg, metrics)));
        Shared {
            servers: shards[0].clone(),
            shards,
            sharding,
            classifier: Classifier::new(ccfg),
            cancels: Arc::default(),
            server_params: RwLock::new(vec![]),
            greetings: Greetings::default(),
            metrics: metrics.clone(),
            pg_metrics: PgMetrics::of(metrics),
            handover_metrics: metrics.families(HandoverMetrics::register),
            next_client: AtomicU64::new(1),
            stop: stop.clone(),
            tls: cfg.tls().cloned().map(TlsAcceptor::from),
            clients: Arc::default(),
            notifier: Arc::default(),
            default_timeout_ms: overload.default_timeout_ms,
            schema_epoch: Arc::default(),
            affinity: (balance.policy == Policy::Affinity).then(|| Arc::new(affinity::Affinity::new(&cfg.affinity))),
            cfg: cfg.clone(),
        }
    }

    /// The schema may have changed (DDL ran, its transaction ended, a server said a plan is
    /// stale): Parses from now on do not share server statements prepared before.
    pub(crate) fn new_schema_epoch(&self) {
        self.schema_epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// The servers of shard `i` (of the cluster when it is not sharded).
    pub(crate) fn shard_servers(&self, i: usize) -> &Arc<Servers> {
        self.shards.get(i).unwrap_or(&self.servers)
    }
}
