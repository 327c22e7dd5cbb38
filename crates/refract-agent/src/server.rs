//! The control listener: accepts dispatcher connections, authenticates them, answers them.

use std::net::SocketAddr;
use std::sync::Arc;

use refract_handover::control::{ChannelOptions, ControlChannel, ControlKey, EpochTracker, Msg, NonceCache};
use tokio::net::{TcpListener, TcpStream};

use crate::local::LocalOptions;

/// What `HandOffErr` says while this agent cannot adopt cross-host connections (issue 3: the
/// TCP_REPAIR restore is not wired to the serving code yet; same-host adoption is `local.rs`).
pub const NOT_YET: &str = "this agent does not adopt connections yet";

/// Serves control connections on `listener` until it fails. Each connection is authenticated
/// with `key` (a replayed handshake is refused across connections) and then served on its own
/// task; heartbeats flow while it waits.
pub async fn serve(listener: TcpListener, key: ControlKey, opts: ChannelOptions) -> std::io::Result<()> {
    serve_with(listener, key, opts, None).await
}

/// Like [`serve`], and with `backend` set, `HandOff` is answered by restoring the connection
/// and serving it from that backend (`remote.rs`); without, by [`NOT_YET`].
pub async fn serve_with(
    listener: TcpListener,
    key: ControlKey,
    opts: ChannelOptions,
    backend: Option<LocalOptions>,
) -> std::io::Result<()> {
    let nonces = Arc::new(NonceCache::default());
    loop {
        let (stream, peer) = listener.accept().await?;
        let (key, nonces, backend) = (key.clone(), nonces.clone(), backend.clone());
        tokio::spawn(async move { connection(stream, peer, key, nonces, opts, backend).await });
    }
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    key: ControlKey,
    nonces: Arc<NonceCache>,
    opts: ChannelOptions,
    backend: Option<LocalOptions>,
) {
    let ch = match ControlChannel::accept(stream, &key, &nonces, opts).await {
        Ok(ch) => ch,
        Err(e) => {
            tracing::warn!(%peer, "control connection refused: {e}");
            return;
        }
    };
    tracing::info!(%peer, "dispatcher connected");
    match session(ch, backend).await {
        Err(refract_handover::Error::Closed) => tracing::info!(%peer, "dispatcher disconnected"),
        Err(e) => tracing::warn!(%peer, "control connection ended: {e}"),
        Ok(()) => {}
    }
}

/// One authenticated dispatcher: answers until the channel ends (closed, dead or malformed).
async fn session(mut ch: ControlChannel, backend: Option<LocalOptions>) -> refract_handover::Result<()> {
    let mut epochs = EpochTracker::new();
    loop {
        let msg = ch.recv().await?;
        match msg {
            Msg::HandOff(t) => {
                if let Err(e) = epochs.observe(t.conn, t.epoch) {
                    tracing::warn!(conn = t.conn, "HandOff ignored: {e}");
                    continue;
                }
                match &backend {
                    Some(b) => crate::remote::adopt(&mut ch, &mut epochs, *t, b).await?,
                    None => {
                        let reply = Msg::HandOffErr { conn: t.conn, epoch: t.epoch, reason: NOT_YET.into() };
                        ch.send(&reply).await?;
                    }
                }
            }
            Msg::HandBackOk { conn, epoch } => {
                if let Err(e) = epochs.check(conn, epoch) {
                    tracing::warn!(conn, "HandBackOk ignored: {e}");
                }
            }
            Msg::RelayInstead { conn, request, reason } => {
                tracing::debug!(conn, request, "relay instead: {reason}");
            }
            other => tracing::warn!("unexpected {} from the dispatcher, ignored", other.name()),
        }
    }
}
