//! Several refract dispatchers behind one address share their state through etcd. Each
//! registers under a lease (`PREFIX/nodes/NODE_ID`) and so sees its peers; the state they all
//! follow is a set of shared entries (`PREFIX/shared/NAME`) that any of them writes and every
//! one watches. A dispatcher that loses etcd keeps the last state it read and serves with it;
//! it refuses writes it cannot share, and re-reads everything when etcd is back. Without a
//! `[cluster]` section none of this runs: a dispatcher alone needs no etcd.
//!
//! What an entry means (a member joined, drained, removed; a reload) is the dispatcher's
//! business, not this crate's.
//!
//! # Layout
//! - `config`: `[cluster]` ([`ClusterConfig`]).
//! - this file: starting a [`Cluster`]; `cluster`: the handle: the view, shared writes,
//!   two-phase decisions.
//! - `session`: the etcd session: connect, register, read, renew, watch; start again.
//! - `view`: what a dispatcher knows ([`View`], [`Link`], [`Peer`]), folded from etcd's events.
//! - `keys`: where the keys live under the prefix ([`Keys`]).
//! - `error`: [`ClusterError`].

mod cluster;
mod config;
mod error;
mod keys;
mod session;
mod view;

pub use cluster::{Cluster, WRITE_TIMEOUT};
pub use config::{ClusterConfig, MAX_LEASE_TTL_S};
pub use error::ClusterError;
pub use keys::{Key, Keys};
pub use view::{Change, Link, Peer, View};

use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

impl Cluster {
    /// Starts the etcd session on the current runtime: it registers this dispatcher, reads
    /// and watches the shared state, and keeps trying while etcd is away. `stop` ends it and
    /// revokes the lease, so peers see this dispatcher leave at once rather than at expiry.
    pub fn start(cfg: ClusterConfig, me: serde_json::Value, stop: CancellationToken) -> Arc<Cluster> {
        let keys = Keys::new(&cfg.prefix);
        let (view, _) = tokio::sync::watch::channel(Arc::new(View::new()));
        let cluster = Arc::new(Cluster { cfg, keys, me, view, client: Mutex::new(None) });
        tokio::spawn(session::run(cluster.clone(), stop));
        cluster
    }
}
