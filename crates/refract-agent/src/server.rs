//! The control listener: accepts dispatcher connections, authenticates them, answers them.

use std::net::SocketAddr;
use std::sync::Arc;

use refract_handover::control::{ChannelOptions, ControlChannel, ControlKey, EpochTracker, Msg, NonceCache};
use tokio::net::{TcpListener, TcpStream};

use crate::backend::BackendStream;
use crate::hybrid::{self, Forwarded};
use crate::options::LocalOptions;
use crate::remote;

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
/// and serving it from that backend (`remote.rs`), and `Forward` (hybrid) by sending the request
/// to that backend (`hybrid.rs`); without, `HandOff` by [`NOT_YET`] and `Forward` ends the channel.
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
    // Dispatchers keep a channel per client session: connecting, closing and going quiet between
    // requests (the dispatcher reconnects after `dead_after`) are routine.
    tracing::debug!(%peer, "dispatcher connected");
    match session(ch, backend).await {
        Err(refract_handover::Error::Closed) => tracing::debug!(%peer, "dispatcher disconnected"),
        Err(refract_handover::Error::PeerDead(_)) => tracing::debug!(%peer, "dispatcher quiet, channel closed"),
        Err(e) => tracing::warn!(%peer, "control connection ended: {e}"),
        Ok(()) => {}
    }
}

/// One authenticated dispatcher: answers until the channel ends (closed, dead or malformed).
async fn session(mut ch: ControlChannel, backend: Option<LocalOptions>) -> refract_handover::Result<()> {
    let mut epochs = EpochTracker::new();
    // The backend connection of forwarded requests (hybrid), kept across them.
    let mut pooled: Option<BackendStream> = None;
    loop {
        let msg = ch.recv().await?;
        match msg {
            Msg::HandOff(t) => {
                if let Err(e) = epochs.observe(t.conn, t.epoch) {
                    tracing::warn!(conn = t.conn, "HandOff ignored: {e}");
                    continue;
                }
                match &backend {
                    Some(b) => remote::adopt(&mut ch, &mut epochs, *t, b, None).await?,
                    None => {
                        let reply = Msg::HandOffErr { conn: t.conn, epoch: t.epoch, reason: NOT_YET.into() };
                        ch.send(&reply).await?;
                    }
                }
            }
            Msg::Forward { conn, request, threshold, bytes } => {
                // Without a backend nothing can answer: ending the channel makes the dispatcher relay.
                let opts = backend.as_ref().ok_or(refract_handover::Error::Codec("Forward, but no backend"))?;
                let fw = Forwarded { conn, request, threshold, bytes };
                let mut via = remote::HybridLink { ch: &mut ch, opts, epochs: &mut epochs };
                hybrid::forward(&mut via, opts, &mut pooled, fw).await?;
            }
            Msg::HandBackOk { conn, epoch } => {
                if let Err(e) = epochs.check(conn, epoch) {
                    tracing::warn!(conn, "HandBackOk ignored: {e}");
                }
            }
            Msg::RelayInstead { conn, request, reason } => {
                tracing::debug!(conn, request, "relay instead (nothing held): {reason}");
            }
            other => tracing::warn!("unexpected {} from the dispatcher, ignored", other.name()),
        }
    }
}
