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
//! - `cluster`: the handle ([`Cluster`]): the view, shared writes.
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
