//! [`Cluster`]: the handle a dispatcher holds (started in `lib.rs`): its view of the cluster
//! (kept by the etcd session in `session.rs`), and writes of shared entries that return once etcd has them
//! and this dispatcher's own view shows them.

use crate::config::ClusterConfig;
use crate::error::ClusterError;
use crate::keys::Keys;
use crate::view::View;
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::watch;

/// How long a shared write may take, etcd's answer and this view's catching up together.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// A dispatcher's membership in a cluster of dispatchers.
pub struct Cluster {
    pub(crate) cfg: ClusterConfig,
    pub(crate) keys: Keys,
    /// What this dispatcher publishes about itself (addresses), under its node key.
    pub(crate) me: serde_json::Value,
    pub(crate) view: watch::Sender<Arc<View>>,
    /// The connected client, for writes; `None` while the link is down.
    pub(crate) client: Mutex<Option<Client>>,
}

impl Cluster {
    /// This dispatcher's node id.
    pub fn node_id(&self) -> &str {
        &self.cfg.node_id
    }

    /// The view now.
    pub fn view(&self) -> Arc<View> {
        self.view.borrow().clone()
    }

    /// A receiver told of every change of the view (link, peers, shared entries).
    pub fn subscribe(&self) -> watch::Receiver<Arc<View>> {
        self.view.subscribe()
    }

    /// Writes shared entry `name`; returns once etcd has it and this view shows it (so a
    /// read on this dispatcher right after sees the write). Refused while etcd is away.
    pub async fn put(&self, name: &str, value: &str) -> Result<(), ClusterError> {
        let mut client = self.writer()?;
        let put = client.put(self.keys.shared(name), value, None);
        let resp =
            tokio::time::timeout(WRITE_TIMEOUT, put).await.map_err(|_| ClusterError::Timeout(WRITE_TIMEOUT))??;
        self.caught_up(resp.header().map_or(0, |h| h.revision())).await
    }

    /// Deletes shared entry `name`, as [`Cluster::put`] writes one.
    pub async fn delete(&self, name: &str) -> Result<(), ClusterError> {
        let mut client = self.writer()?;
        let delete = client.delete(self.keys.shared(name), None);
        let resp =
            tokio::time::timeout(WRITE_TIMEOUT, delete).await.map_err(|_| ClusterError::Timeout(WRITE_TIMEOUT))??;
        self.caught_up(resp.header().map_or(0, |h| h.revision())).await
    }

    /// Records `outcome` for two-phase transaction `gid` unless an outcome is recorded already
    /// (one etcd transaction: the first writer wins); returns the outcome in force.
    pub async fn decide(&self, gid: &str, outcome: &str) -> Result<String, ClusterError> {
        let mut client = self.writer()?;
        let key = self.keys.decision(gid);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), outcome, None)])
            .or_else([TxnOp::get(key, None)]);
        let resp = tokio::time::timeout(WRITE_TIMEOUT, client.txn(txn))
            .await
            .map_err(|_| ClusterError::Timeout(WRITE_TIMEOUT))??;
        if resp.succeeded() {
            return Ok(outcome.to_owned());
        }
        let recorded = resp.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
            _ => None,
        });
        recorded.ok_or_else(|| ClusterError::WatchEnded("the decision vanished while read".into()))
    }

    /// Forgets two-phase transaction `gid`'s outcome (carried out on every shard).
    pub async fn forget(&self, gid: &str) -> Result<(), ClusterError> {
        let mut client = self.writer()?;
        let delete = client.delete(self.keys.decision(gid), None);
        tokio::time::timeout(WRITE_TIMEOUT, delete).await.map_err(|_| ClusterError::Timeout(WRITE_TIMEOUT))??;
        Ok(())
    }

    fn writer(&self) -> Result<Client, ClusterError> {
        let view = self.view();
        let client = self.client.lock().unwrap_or_else(PoisonError::into_inner).clone();
        match (client, &view.link) {
            (Some(c), crate::view::Link::Up) => Ok(c),
            (_, crate::view::Link::Down { error, .. }) => Err(ClusterError::Unavailable(error.clone())),
            _ => Err(ClusterError::Unavailable("not connected yet".into())),
        }
    }

    /// Waits until this view reflects `revision`.
    async fn caught_up(&self, revision: i64) -> Result<(), ClusterError> {
        let mut rx = self.subscribe();
        let caught =
            tokio::time::timeout(WRITE_TIMEOUT, rx.wait_for(|v| v.revision >= revision)).await.map(|r| r.is_ok());
        match caught {
            Ok(true) => Ok(()),
            Ok(false) => Err(ClusterError::WatchEnded("the session stopped".into())),
            Err(_) => Err(ClusterError::Timeout(WRITE_TIMEOUT)),
        }
    }
}
