//! The same-host listener: a dispatcher on this host hands client sockets over a Unix socket
//! (SCM_RIGHTS); the agent serves the request from its backend, asks the dispatcher (`Next`)
//! about each further one, and hands the socket back when told to (`Return`) or when the client
//! stays idle. Every transfer carries an epoch; stale ones are refused. [`HybridLink`] is this
//! link as a forwarded request (`hybrid.rs`) uses it to ask for the client's socket.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use refract_handover::control::EpochTracker;
use refract_handover::local::{LocalLink, LocalMsg};
use tokio::net::{TcpStream, UnixListener};

use crate::backend::{connect_backend, BackendStream};
use crate::exchange::{Adopted, Ask, Held, Served};
use crate::hybrid::{self, unexpected_after_want, Forwarded, Link};
use crate::options::LocalOptions;
use crate::peer::PeerPolicy;

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
                let mut via = HybridLink { link: &mut link, opts, epochs };
                hybrid::forward(&mut via, opts, &mut backend, fw).await?;
            }
            (other, _) => {
                tracing::warn!("unexpected {} from the dispatcher on a same-host link, ignored", other.name())
            }
        }
    }
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

/// The same-host link as forwarded requests use it (hybrid): `Want`, then `Adopt` with the
/// client socket.
pub(crate) struct HybridLink<'a> {
    pub link: &'a mut LocalLink,
    pub opts: &'a LocalOptions,
    pub epochs: &'a Mutex<EpochTracker>,
}

impl Link for HybridLink<'_> {
    async fn respond(
        &mut self,
        fw: &Forwarded,
        last: bool,
        keep: bool,
        bytes: Vec<u8>,
    ) -> refract_handover::Result<()> {
        let (conn, request) = (fw.conn, fw.request);
        self.link.send(&LocalMsg::Response { conn, request, last, keep, bytes }, None).await
    }

    async fn want(
        &mut self,
        fw: &Forwarded,
        held: Held,
        be: &mut BackendStream,
    ) -> refract_handover::Result<Option<Held>> {
        self.link.send(&LocalMsg::Want { conn: fw.conn, request: fw.request }, None).await?;
        match self.link.recv().await? {
            (LocalMsg::Adopt { conn, epoch, backend, idle_ms, pending }, Some(fd)) if conn == fw.conn => {
                let offer = Offer { conn, epoch, backend, idle_ms, pending };
                self.adopt(offer, fd, held, be).await.map(|()| None)
            }
            (LocalMsg::RelayInstead { conn, .. }, None) if conn == fw.conn => Ok(Some(held)),
            (other, _) => Err(unexpected_after_want(other.name())),
        }
    }

    async fn beat(&mut self) -> refract_handover::Result<Infallible> {
        std::future::pending().await // a Unix link has no dead-peer bound
    }
}

impl HybridLink<'_> {
    async fn adopt(
        &mut self,
        offer: Offer,
        fd: OwnedFd,
        held: Held,
        be: &mut BackendStream,
    ) -> refract_handover::Result<()> {
        adopt(self.link, self.opts, self.epochs, offer, fd, Some((held, be))).await
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

pub(crate) fn lock(epochs: &Mutex<EpochTracker>) -> std::sync::MutexGuard<'_, EpochTracker> {
    epochs.lock().unwrap_or_else(|p| p.into_inner())
}
