//! What can go wrong sharing state through etcd, and whose fault it is.

use std::time::Duration;

/// An error from the cluster layer.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// etcd cannot be reached now: a change that must be shared is refused rather than made
    /// on this dispatcher alone.
    #[error("etcd is unreachable ({0}): the change cannot be shared with the other dispatchers")]
    Unavailable(String),
    /// etcd did not answer in time.
    #[error("etcd did not answer within {0:?}")]
    Timeout(Duration),
    /// etcd answered with an error.
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    /// Another live dispatcher is registered under this node id.
    #[error("node_id {0:?} is registered by another live dispatcher")]
    Taken(String),
    /// A file named by `[cluster]` (password, certificate) could not be read.
    #[error("{0}: {1}")]
    File(String, std::io::Error),
    /// The lease lapsed: etcd has forgotten this dispatcher (its keys are gone).
    #[error("the lease lapsed")]
    LeaseLost,
    /// The watch ended (etcd restarted, compacted past it, or cut the stream).
    #[error("the watch ended: {0}")]
    WatchEnded(String),
}

impl ClusterError {
    /// Whether trying again later may succeed (everything but a misconfiguration).
    pub fn is_retryable(&self) -> bool {
        !matches!(self, ClusterError::File(..))
    }
}
