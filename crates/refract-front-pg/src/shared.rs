//! What every PostgreSQL session shares ([`Shared`]): the configuration, the servers and their
//! pools and admission control, the classifier, cancel keys, the greetings, the clients, the LISTEN channels. Kept by the
//! dispatcher's shared state (`ctx`) for the admin views, so it imports neither.

use super::sharding::Sharding;
use crate::client::cancel::Cancels;
use crate::client::clients::Clients;
use crate::client::startup::Greetings;
use crate::config::PgConfig;
use crate::server::servers::Servers;
use crate::session::notify::Notifier;
use crate::status::metrics::PgMetrics;
use refract_core::config::{Balance, Overload};
use refract_core::metrics::Metrics;
use refract_handover::config::HandoverConfig;
use refract_handover::metrics::HandoverMetrics;
use refract_pg::classify::{Classifier, ClassifierConfig};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// What every PostgreSQL session shares.
pub(crate) struct Shared {
    pub(super) cfg: PgConfig,
    /// The servers of an unsharded cluster, or of shard 0 (`shards[0]`).
    pub(super) servers: Arc<Servers>,
    /// Each shard's servers (one entry, `servers`, when the cluster is not sharded).
    pub(super) shards: Vec<Arc<Servers>>,
    /// The sharding rules when `[[postgres.shard]]` is configured.
    pub(super) sharding: Option<Arc<Sharding>>,
    pub(super) classifier: Classifier,
    pub(super) cancels: Arc<Cancels>,
    /// The ParameterStatus values of the last server login refract read (its server version,
    /// and the greeting when the primary cannot be asked).
    pub(super) server_params: RwLock<Vec<(String, String)>>,
    /// The greeting per set of startup settings, learnt from the primary.
    pub(super) greetings: Greetings,
    pub(super) metrics: Arc<Metrics>,
    /// The front end's own metric families (`refract_pg_*`).
    pub(super) pg_metrics: Arc<PgMetrics>,
    /// The hand-over's metric families, shared with the HTTP front end.
    pub(super) handover_metrics: Arc<HandoverMetrics>,
    pub(super) next_client: AtomicU64,
    pub(super) stop: CancellationToken,
    /// Present when `tls_cert`/`tls_key` are configured: SSLRequest is answered `S`.
    pub(super) tls: Option<TlsAcceptor>,
    /// The logged-in clients (admin views).
    pub(super) clients: Arc<Clients>,
    /// LISTEN channels of transaction-mode clients.
    pub(super) notifier: Arc<Notifier>,
    /// `[overload] default_timeout_ms`: the deadline of a statement whose session set no
    /// `statement_timeout` (0 = none).
    pub(super) default_timeout_ms: u64,
    /// Advanced by DDL run through refract, and again when its transaction ends: a client's
    /// Parse after it never reuses a server statement prepared before it
    /// (`PreparedRegistry::follow_epoch`).
    pub(super) schema_epoch: Arc<AtomicU64>,
}

impl Shared {
    /// The state for `cfg` under the engine's `[overload]` and `[balance]`; `stop` ends its
    /// background work.
    pub(super) fn new(
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
            cfg: cfg.clone(),
        }
    }

    /// The schema may have changed (DDL ran, its transaction ended, a server said a plan is
    /// stale): Parses from now on do not share server statements prepared before.
    pub(super) fn new_schema_epoch(&self) {
        self.schema_epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// The servers of shard `i` (of the cluster when it is not sharded).
    pub(super) fn shard_servers(&self, i: usize) -> &Arc<Servers> {
        self.shards.get(i).unwrap_or(&self.servers)
    }
}
