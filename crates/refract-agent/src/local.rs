//! The same-host listener: a dispatcher on this host hands client sockets over a Unix socket
//! (SCM_RIGHTS); the agent serves the request from its backend, asks the dispatcher (`Next`)
//! about each further one, and hands the socket back when told to (`Return`) or when the client
//! stays idle. Every transfer carries an epoch; stale ones are refused.

use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use refract_handover::control::EpochTracker;
use refract_handover::local::{LocalLink, LocalMsg};
use tokio::net::{TcpStream, UnixListener};

use crate::backend::BackendStream;
use crate::exchange::{Adopted, Ask, Held, Served};
use crate::peer::PeerPolicy;

/// What the same-host listener needs.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    /// The backend this agent fronts.
    pub backend: SocketAddr,
    /// Connect to the backend over this Unix socket instead (`backend_socket`).
    pub backend_socket: Option<std::path::PathBuf>,
    /// Pass the client's socket to the backend for large results (`pass_socket`).
    pub pass_socket: bool,
    /// Bound on connecting to the backend and on each of its reads.
    pub backend_timeout: Duration,
    /// Bound on a write to an adopted client making no progress (`write_stall_ms`).
    pub write_stall: Duration,
    /// The guard on this host's NIC (cross host): a flow being handed back is tombstoned in it.
    pub guard: Option<Arc<Mutex<refract_handover::Guard>>>,
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
        tokio::spawn(async move {
            match link(LocalLink::new(stream), &opts, &epochs).await {
                Err(refract_handover::Error::Closed) | Ok(()) => {}
                Err(e) => tracing::warn!("same-host link ended: {e}"),
            }
        });
    }
}

/// One link: any number of hand-offs and forwarded requests in turn, each finished on it.
async fn link(mut link: LocalLink, opts: &LocalOptions, epochs: &Mutex<EpochTracker>) -> refract_handover::Result<()> {
    // The backend connection of forwarded requests (hybrid), kept across them.
    let mut backend: Option<BackendStream> = None;
    loop {
        match link.recv().await? {
            (LocalMsg::Adopt { conn, epoch, backend: b, idle_ms, pending }, Some(fd)) => {
                let offer = Offer { conn, epoch, backend: b, idle_ms, pending };
                adopt(&mut link, opts, epochs, offer, fd, None).await?;
            }
            (LocalMsg::Forward { conn, request, threshold, bytes }, None) => {
                let fw = Forwarded { conn, request, threshold, bytes };
                let mut via = crate::hybrid::Local { link: &mut link, opts, epochs };
                crate::hybrid::forward(&mut via, opts, &mut backend, fw).await?;
            }
            (other, _) => {
                tracing::warn!("unexpected {} from the dispatcher on a same-host link, ignored", other.name())
            }
        }
    }
}

/// A request forwarded by the dispatcher (hybrid).
pub(crate) struct Forwarded {
    pub conn: u64,
    pub request: u64,
    pub threshold: u64,
    pub bytes: Vec<u8>,
}

/// A hand-off as received.
pub(crate) struct Offer {
    pub conn: u64,
    pub epoch: u64,
    pub backend: SocketAddr,
    pub idle_ms: u32,
    pub pending: Vec<u8>,
}

/// Adopts the client socket `fd` (refusing a stale epoch or a foreign backend), finishes the
/// `held` response if any (else serves the first pending request), serves further requests the
/// dispatcher lets it serve, then hands the socket back or ends.
/// With `held`, `link_backend` is the backend connection that response comes from.
pub(crate) async fn adopt(
    link: &mut LocalLink,
    opts: &LocalOptions,
    epochs: &Mutex<EpochTracker>,
    offer: Offer,
    fd: OwnedFd,
    held: Option<(Held, &mut BackendStream)>,
) -> refract_handover::Result<()> {
    let Offer { conn, epoch, .. } = offer;
    let (mut client, mut own) = match accept(opts, epochs, &offer, fd, held.is_none()).await {
        Ok(x) => x,
        Err(reason) => {
            tracing::debug!(conn, epoch, "hand-off refused: {reason}");
            return link.send(&LocalMsg::AdoptErr { conn, epoch, reason }, None).await;
        }
    };
    link.send(&LocalMsg::AdoptOk { conn, epoch }, None).await?;
    let pending = BytesMut::from(&offer.pending[..]);
    let (held, backend) = match (held, own.as_mut()) {
        (Some((h, b)), _) => (Some(h), b),
        (None, Some(b)) => (None, b),
        (None, None) => return Err(refract_handover::Error::Codec("no backend connection")),
    };
    let idle = Duration::from_millis(offer.idle_ms.into());
    let adopted = Adopted::new(&mut client, backend, pending, opts.backend_timeout, idle, epoch, opts.pass_socket)
        .with_write_stall(opts.write_stall);
    let served = adopted.run(held, &mut AskLink { link: &mut *link, conn }).await?;
    match served {
        (Served::Boundary(pending), sent) => {
            let back = lock(epochs).advance(conn);
            let msg = LocalMsg::HandBack { conn, epoch: back, sent, pending };
            link.send(&msg, Some(client.as_fd())).await
        }
        (Served::Close(reason), sent) => {
            lock(epochs).remove(conn);
            link.send(&LocalMsg::Closed { conn, epoch, sent, reason }, None).await
        }
    }
}

/// The same-host link, asked about each further request of an adopted connection.
struct AskLink<'a> {
    link: &'a mut LocalLink,
    conn: u64,
}

impl Ask for AskLink<'_> {
    async fn next(&mut self, request: u64, bytes: &[u8]) -> refract_handover::Result<bool> {
        let conn = self.conn;
        self.link.send(&LocalMsg::Next { conn, request, bytes: bytes.to_vec() }, None).await?;
        match self.link.recv().await? {
            (LocalMsg::Serve { conn: c, request: r }, None) if (c, r) == (conn, request) => Ok(true),
            (LocalMsg::Return { conn: c, request: r }, None) if (c, r) == (conn, request) => Ok(false),
            (other, _) => {
                tracing::warn!(conn, "expected Serve or Return, got {}", other.name());
                Err(refract_handover::Error::Codec("unexpected answer to Next"))
            }
        }
    }

    async fn idle(&mut self, request: u64) -> refract_handover::Result<()> {
        self.link.send(&LocalMsg::Idle { conn: self.conn, request }, None).await
    }

    async fn beat(&mut self) -> refract_handover::Result<std::convert::Infallible> {
        std::future::pending().await // a Unix link has no dead-peer bound
    }
}

/// Checks the offer (epoch, backend) and gets the sockets ready; `Err` is the refusal reason.
async fn accept(
    opts: &LocalOptions,
    epochs: &Mutex<EpochTracker>,
    offer: &Offer,
    fd: OwnedFd,
    connect: bool,
) -> Result<(TcpStream, Option<BackendStream>), String> {
    lock(epochs).observe(offer.conn, offer.epoch).map_err(|e| e.to_string())?;
    if offer.backend != opts.backend {
        return Err(format!("this agent fronts {}, not {}", opts.backend, offer.backend));
    }
    let std = std::net::TcpStream::from(fd);
    std.set_nonblocking(true).map_err(|e| format!("client socket: {e}"))?;
    let client = TcpStream::from_std(std).map_err(|e| format!("client socket: {e}"))?;
    if !connect {
        return Ok((client, None));
    }
    Ok((client, Some(connect_backend(opts).await?)))
}

/// A new connection to the backend (over its Unix socket when configured); `Err` says why not.
pub(crate) async fn connect_backend(opts: &LocalOptions) -> Result<BackendStream, String> {
    let bound = opts.backend_timeout.min(Duration::from_secs(1));
    let (r, name) = match &opts.backend_socket {
        Some(path) => {
            let r = tokio::time::timeout(bound, tokio::net::UnixStream::connect(path)).await;
            (r.map(|c| c.map(BackendStream::Unix)), path.display().to_string())
        }
        None => {
            let r = tokio::time::timeout(bound, TcpStream::connect(opts.backend)).await;
            let r = r.map(|c| {
                c.map(|s| {
                    let _ = s.set_nodelay(true);
                    BackendStream::Tcp(s)
                })
            });
            (r, opts.backend.to_string())
        }
    };
    match r {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(format!("backend {name}: {e}")),
        Err(_) => Err(format!("backend {name}: connect timed out")),
    }
}

pub(crate) fn lock(epochs: &Mutex<EpochTracker>) -> std::sync::MutexGuard<'_, EpochTracker> {
    epochs.lock().unwrap_or_else(|p| p.into_inner())
}
