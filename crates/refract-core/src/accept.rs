//! Accepting client connections, for every front end: the accept loop, the open connection
//! gauge per event loop, and bind errors that name their listener.

use crate::metrics::Metrics;
use prometheus_client::metrics::gauge::Gauge;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A client connection counted as open on its event loop (`refract_client_connections_open`)
/// until dropped.
pub struct OpenConnection(Gauge);

impl OpenConnection {
    /// Counts a new connection on `gauge`.
    pub fn count(gauge: Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }

    /// A connection already counted on `gauge` (when it was placed on its worker).
    pub fn counted(gauge: Gauge) -> Self {
        Self(gauge)
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Accepts client connections (HTTP or PostgreSQL, `what`) until `stop`, counting each and
/// handing it (with `TCP_NODELAY`) and its peer address to `place`.
pub async fn accept_each(
    stop: &CancellationToken,
    metrics: &Metrics,
    what: &'static str,
    listener: TcpListener,
    mut place: impl FnMut(TcpStream, SocketAddr),
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.cancelled() => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                metrics.connections.inc();
                place(stream, peer);
            }
            Err(e) => {
                // Out of descriptors or similar: back off instead of spinning.
                tracing::warn!(error = %e, listener = what, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Turns a bind error into one that names the config key and the address: "Address already
/// in use" alone does not say which listener.
pub fn named(key: &'static str, addr: SocketAddr) -> impl FnOnce(std::io::Error) -> std::io::Error {
    move |e| std::io::Error::new(e.kind(), format!("{key} {addr}: {e}"))
}
