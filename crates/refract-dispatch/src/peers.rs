//! CancelRequests across dispatchers (`[cluster] cancel_listen`). A client's cancel opens a new
//! connection, which the network may send to any dispatcher behind the address; the one that
//! gets a key it did not hand out passes it to the peers whose id slot the key is in (the slot
//! is a hash of the node id, so normally one peer), which cancel the statement if the session
//! is theirs. Peers prove themselves with an HMAC-SHA256 over the request and its time under
//! the key every dispatcher shares (`peer_key_file`); a forged, altered or stale request (more
//! than 30 s off) is dropped without effect, and nothing is ever answered, as PostgreSQL does.

use crate::cluster::ClusterMetrics;
use refract_cluster::Cluster;
use refract_front_pg::{slot_of, CancelRelay, PgFront, SLOTS};
use refract_pg::peer_cancel::{open, seal, FRAME};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The least key length.
pub(crate) const MIN_KEY: usize = 16;
/// How long after a failed forward the second try starts.
const RETRY_AFTER: Duration = Duration::from_millis(100);
/// How long forwarding or reading one request may take.
const IO_TIMEOUT: Duration = Duration::from_secs(1);

/// The id slot of the dispatcher called `node_id` (FNV-1a of the name, modulo [`SLOTS`]).
pub(crate) fn slot(node_id: &str) -> u32 {
    let hash = node_id.bytes().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    hash % SLOTS
}

/// Reads the shared key: the file's bytes without a trailing newline, at least [`MIN_KEY`].
pub(crate) fn read_key(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    let mut key = std::fs::read(path)?;
    while key.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        key.pop();
    }
    if key.len() < MIN_KEY {
        let e = format!("[cluster] peer_key_file {}: at least {MIN_KEY} bytes", path.display());
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e));
    }
    Ok(key)
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Reads one forwarded request, [`FRAME`] bytes, off `r` and [`open`]s it at the time `now_ms`
/// gives once it is read; `None` for a connection closed short, or a request `open` refuses.
pub(crate) async fn receive<R: AsyncRead + Unpin>(
    r: &mut R,
    key: &[u8],
    now_ms: impl FnOnce() -> u64,
) -> Option<(i32, [u8; 4])> {
    let mut f = [0u8; FRAME];
    r.read_exact(&mut f).await.ok()?;
    open(key, &f, now_ms())
}

/// Forwards CancelRequests for keys this dispatcher did not hand out to the peers of their slot.
pub(crate) struct PeerCancels {
    pub cluster: Arc<Cluster>,
    pub key: Arc<Vec<u8>>,
    pub metrics: Arc<ClusterMetrics>,
}

impl CancelRelay for PeerCancels {
    fn relay(&self, pid: i32, secret: [u8; 4]) {
        let view = self.cluster.view();
        let me = self.cluster.node_id();
        let want = slot_of(pid);
        let targets: Vec<SocketAddr> = view
            .peers
            .values()
            .filter(|p| p.node_id != me && Some(slot(&p.node_id)) == want)
            .filter_map(|p| p.info["cancel"].as_str()?.parse().ok())
            .collect();
        if targets.is_empty() {
            tracing::debug!(pid, "cancel request for a key no dispatcher's slot holds: dropped");
            self.metrics.cancel("unroutable");
        }
        let frame = seal(&self.key, pid, secret, now_ms());
        for peer in targets {
            let metrics = self.metrics.clone();
            tokio::spawn(async move {
                // Once more after a moment if the first try fails (a peer restarting, a SYN lost).
                for attempt in 0..2 {
                    if attempt > 0 {
                        tokio::time::sleep(RETRY_AFTER).await;
                    }
                    let sent = tokio::time::timeout(IO_TIMEOUT, async {
                        TcpStream::connect(peer).await?.write_all(&frame).await
                    });
                    match sent.await.map_err(std::io::Error::from).and_then(|r| r) {
                        Ok(()) => return metrics.cancel("forwarded"),
                        Err(e) => tracing::debug!(%peer, error = %e, attempt, "cancel request not forwarded"),
                    }
                }
                metrics.cancel("forward_failed");
            });
        }
    }
}

/// Takes forwarded CancelRequests until `stop`.
pub(crate) async fn serve(
    listener: TcpListener,
    key: Arc<Vec<u8>>,
    pg: Arc<PgFront>,
    metrics: Arc<ClusterMetrics>,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.cancelled() => return,
        };
        let Ok((mut s, peer)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (key, pg, metrics) = (key.clone(), pg.clone(), metrics.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(IO_TIMEOUT, receive(&mut s, &key, now_ms)).await.ok().flatten() {
                Some((pid, secret)) => {
                    metrics.cancel("received");
                    pg.cancel_forwarded(pid, secret).await
                }
                None => {
                    metrics.cancel("refused");
                    tracing::warn!(%peer, "a forwarded cancel request failed authentication: dropped")
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_pg::peer_cancel::WINDOW_MS;

    #[test]
    fn sealed_requests_open_only_with_the_key_unaltered_and_in_time() {
        let key = b"0123456789abcdef";
        let f = seal(key, 4_194_305, *b"wxyz", 1_000_000);
        assert_eq!(open(key, &f, 1_000_000 + WINDOW_MS), Some((4_194_305, *b"wxyz")));
        assert_eq!(open(b"another key of 16", &f, 1_000_000), None, "wrong key");
        assert_eq!(open(key, &f, 1_000_000 + WINDOW_MS + 1), None, "stale");
        for i in [0, 5, 9, 13, 25] {
            let mut bad = f;
            bad[i] ^= 1;
            assert_eq!(open(key, &bad, 1_000_000), None, "byte {i} altered");
        }
    }

    #[tokio::test]
    async fn a_request_is_read_whole_and_opened_once_read() {
        let key = b"0123456789abcdef";
        let f = seal(key, 7, *b"abcd", 5_000);
        let mut sent = [&f[..], b"more"].concat();
        assert_eq!(receive(&mut &sent[..], key, || 5_000).await, Some((7, *b"abcd")), "bytes after it unread");
        assert_eq!(receive(&mut &f[..FRAME - 1], key, || panic!("opened a short read")).await, None);
        sent[FRAME - 1] ^= 1;
        assert_eq!(receive(&mut &sent[..], key, || 5_000).await, None, "altered");
    }

    #[test]
    fn slots_are_stable_and_in_range() {
        assert_eq!(slot("d1"), slot("d1"));
        assert_ne!(slot("d1"), slot("d2"));
        assert!(["a", "d1", "node-7", ""].iter().all(|n| slot(n) < SLOTS));
    }
}
