//! The listeners: the control listener accepts dispatcher connections from other hosts,
//! authenticates them and answers them; the same-host listener answers dispatchers on this host
//! over a Unix socket. Both answer the same messages through the same code (`hybrid.rs`,
//! `adopt.rs`); only the way the client socket moves differs (`local.rs`, `remote.rs`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use refract_handover::control::{ChannelOptions, ControlChannel, ControlKey, NonceCache};
use refract_handover::local::LocalLink;
use refract_handover::{EpochTracker, Msg};
use tokio::net::{TcpListener, TcpStream, UnixListener};

use crate::adopt::{adopt, lock};
use crate::backend::BackendStream;
use crate::hybrid::{self, Forwarded, Over};
use crate::options::LocalOptions;
use crate::peer::PeerPolicy;
use crate::pg;

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
        let serve = async move { connection(stream, peer, key, nonces, opts, backend).await };
        tokio::spawn(refract_process::contain("control connection", serve));
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
    let epochs = Mutex::new(EpochTracker::new());
    // The backend connection of forwarded requests (hybrid), kept across them.
    let mut pooled: Option<BackendStream> = None;
    loop {
        let msg = ch.recv().await?;
        match msg {
            Msg::HandOff(t) => match &backend {
                // `adopt` checks the epoch: a stale one is refused (`HandOffErr`). A PostgreSQL
                // connection waiting at a large result has its own adoption.
                Some(b) => match b.pg.take(t.conn) {
                    Some(w) => pg::adopt(&mut ch, b, &epochs, *t, None, w).await?,
                    None => adopt(&mut ch, b, &epochs, *t, None, None).await?,
                },
                None => {
                    let observed = lock(&epochs).observe(t.conn, t.epoch);
                    if let Err(e) = observed {
                        tracing::warn!(conn = t.conn, "HandOff ignored: {e}");
                        continue;
                    }
                    let reply = Msg::HandOffErr { conn: t.conn, epoch: t.epoch, reason: NOT_YET.into() };
                    ch.send(&reply).await?;
                }
            },
            Msg::Forward { conn, request, threshold, bytes } => {
                // Without a backend nothing can answer: ending the channel makes the dispatcher relay.
                let opts = backend.as_ref().ok_or(refract_handover::Error::Codec("Forward, but no backend"))?;
                let fw = Forwarded { conn, request, threshold, bytes };
                let mut via = Over { link: &mut ch, opts, epochs: &epochs };
                hybrid::forward(&mut via, opts, &mut pooled, fw).await?;
            }
            Msg::HandBackOk { conn, epoch } => {
                if let Err(e) = lock(&epochs).check(conn, epoch) {
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

/// Serves same-host dispatcher links on `listener` until it fails, to peers running as the
/// agent's own uid only; one task per link.
pub async fn serve_local(listener: UnixListener, opts: LocalOptions) -> std::io::Result<()> {
    serve_local_for(listener, opts, PeerPolicy::default()).await
}

/// Like [`serve_local`], to the peers `peers` allows: any other is refused (logged) and its
/// link closed before a message is read.
pub async fn serve_local_for(listener: UnixListener, opts: LocalOptions, peers: PeerPolicy) -> std::io::Result<()> {
    let epochs = Arc::new(Mutex::new(EpochTracker::new()));
    loop {
        let (stream, _) = listener.accept().await?;
        if let Err(reason) = peers.check(&stream) {
            tracing::warn!("same-host link refused: {reason}");
            continue; // dropping the stream closes it
        }
        let (opts, epochs) = (opts.clone(), epochs.clone());
        tokio::spawn(refract_process::contain("same-host link", async move {
            match same_host_link(LocalLink::new(stream), &opts, &epochs).await {
                Err(refract_handover::Error::Closed) | Ok(()) => {}
                Err(e) => tracing::warn!("same-host link ended: {e}"),
            }
        }));
    }
}

/// One same-host link: any number of hand-offs and forwarded requests in turn, each finished
/// on it.
async fn same_host_link(
    mut link: LocalLink,
    opts: &LocalOptions,
    epochs: &Mutex<EpochTracker>,
) -> refract_handover::Result<()> {
    // The backend connection of forwarded requests (hybrid), kept across them.
    let mut backend: Option<BackendStream> = None;
    loop {
        match link.recv().await? {
            (Msg::HandOff(t), fd) => match opts.pg.take(t.conn) {
                // A PostgreSQL connection waiting at a large result.
                Some(w) => pg::adopt(&mut link, opts, epochs, *t, fd, w).await?,
                None => adopt(&mut link, opts, epochs, *t, fd, None).await?,
            },
            (Msg::Forward { conn, request, threshold, bytes }, None) => {
                let fw = Forwarded { conn, request, threshold, bytes };
                let mut via = Over { link: &mut link, opts, epochs };
                hybrid::forward(&mut via, opts, &mut backend, fw).await?;
            }
            (other, _) => {
                tracing::warn!("unexpected {} from the dispatcher on a same-host link, ignored", other.name())
            }
        }
    }
}
