//! [`adopt`]: the agent's one adoption, over either carrier. It checks the offer (epoch, backend),
//! takes the client socket the way its carrier brings it ([`Move::arrive`]), serves the request
//! from the backend straight to the client, asks the dispatcher (`Next`) about each further one,
//! and hands the socket back ([`Move::leave`]) at a request boundary, or reports `Closed`.
//!
//! Only the socket's way in and out differs by carrier (`local.rs`: the descriptor beside the
//! frame; `remote.rs`: TCP_REPAIR restore and snapshot); the sequence is this file's.
//! The same adoption serves `always` (a `HandOff` out of the blue) and hybrid (a `HandOff`
//! answering this agent's `WantConnection`, with the result it holds; `hybrid.rs` asks).

use std::future::Future;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;
use std::time::Duration;

use bytes::BytesMut;
use refract_handover::{Carrier, EpochTracker, Error, Msg, Result, Serving, Socket, Transfer};
use tokio::net::TcpStream;

use crate::ask::AskOver;
use crate::backend::{connect_backend, BackendStream};
use crate::exchange::{Adopted, Held, Served};
use crate::options::LocalOptions;

/// The one step of an adoption that differs by carrier: how the client socket arrives with a
/// `HandOff` and how it leaves with the `HandBack`.
pub(crate) trait Move: Carrier {
    /// The client socket of `t`, from `fd` (the descriptor that came beside the frame) or
    /// rebuilt from `t`'s state. `Err` is the refusal reason (nothing was written to the client).
    fn arrive(t: &Transfer, fd: Option<OwnedFd>, opts: &LocalOptions) -> std::result::Result<TcpStream, String>;

    /// Readies `client` (adopted as `t` said) to go back: the socket the `HandBack` names and
    /// the descriptor that goes beside it. `Err`: it cannot go back; the connection is closed.
    fn leave(
        client: TcpStream,
        t: &Transfer,
        opts: &LocalOptions,
    ) -> impl Future<Output = Result<(Socket, Option<OwnedFd>)>> + Send;
}

/// Adopts the client connection of `t` (`fd`: the descriptor beside it, same host), refusing a
/// stale epoch, a foreign backend or a socket that cannot be taken (`HandOffErr`); finishes the
/// `held` response if any (read from its backend connection), else serves the first pending
/// request from a new one; serves further requests the dispatcher lets it serve, then hands the
/// socket back or ends (`Closed`).
pub(crate) async fn adopt<C: Move>(
    link: &mut C,
    opts: &LocalOptions,
    epochs: &Mutex<EpochTracker>,
    t: Transfer,
    fd: Option<OwnedFd>,
    held: Option<(Held, &mut BackendStream)>,
) -> Result<()> {
    let (conn, epoch) = (t.conn, t.epoch);
    let (mut client, mut own) = match accept::<C>(opts, epochs, &t, fd, held.is_none()).await {
        Ok(x) => x,
        Err(reason) => {
            tracing::debug!(conn, epoch, "hand-off refused: {reason}");
            return link.send(&Msg::HandOffErr { conn, epoch, reason }, None).await;
        }
    };
    link.send(&Msg::HandOffOk { conn, epoch }, None).await?;
    let (held, backend) = match (held, own.as_mut()) {
        (Some((h, b)), _) => (Some(h), b),
        (None, Some(b)) => (None, b),
        (None, None) => return Err(Error::Codec("no backend connection")),
    };
    let pending = BytesMut::from(&t.pending[..]);
    let idle = Duration::from_millis(t.serving.idle_ms.into());
    let adopted = Adopted::new(&mut client, backend, pending, opts.backend_timeout, idle, epoch, opts.pass_socket)
        .with_write_stall(opts.write_stall);
    // Heartbeats go on while serving and waiting (`AskOver::beat`): a dispatcher across hosts
    // waits for the hand-back with a dead bound.
    let (served, sent) = adopted.run(held, &mut AskOver { link: &mut *link, conn }).await?;
    match served {
        Served::Boundary(pending) => hand_back(link, opts, epochs, client, &t, pending, sent).await,
        Served::Close(reason) => closed(link, epochs, (conn, epoch), sent, reason).await,
    }
}

/// Hands `client`, adopted as `t` said, back at a message boundary (`pending`: what the agent
/// read behind it; `sent`: what it wrote), or reports `Closed` if it cannot go back.
pub(crate) async fn hand_back<C: Move>(
    link: &mut C,
    opts: &LocalOptions,
    epochs: &Mutex<EpochTracker>,
    client: TcpStream,
    t: &Transfer,
    pending: Vec<u8>,
    sent: u64,
) -> Result<()> {
    let conn = t.conn;
    match C::leave(client, t, opts).await {
        Ok((socket, fd)) => {
            let back = lock(epochs).advance(conn);
            let t = Transfer { conn, epoch: back, socket, pending, serving: Serving::default(), sent };
            link.send(&Msg::HandBack(Box::new(t)), fd.as_ref().map(|f| f.as_fd())).await
        }
        Err(e) => {
            tracing::warn!(conn, "hand-back impossible ({e}); closing the connection");
            closed(link, epochs, (conn, t.epoch), sent, format!("no hand-back: {e}")).await
        }
    }
}

/// Reports that connection `(conn, epoch)` ends here, `sent` bytes written to it.
pub(crate) async fn closed<C: Move>(
    link: &mut C,
    epochs: &Mutex<EpochTracker>,
    (conn, epoch): (u64, u64),
    sent: u64,
    reason: String,
) -> Result<()> {
    tracing::debug!(conn, "connection ends at the agent: {reason}");
    lock(epochs).remove(conn);
    link.send(&Msg::Closed { conn, epoch, sent, reason }, None).await
}

/// Checks the offer (epoch, backend) and gets the sockets ready before answering: the backend
/// first when `connect` (refusing after a restore would need the socket discarded unseen),
/// then the client socket. `Err` is the refusal reason.
async fn accept<C: Move>(
    opts: &LocalOptions,
    epochs: &Mutex<EpochTracker>,
    t: &Transfer,
    fd: Option<OwnedFd>,
    connect: bool,
) -> std::result::Result<(TcpStream, Option<BackendStream>), String> {
    lock(epochs).observe(t.conn, t.epoch).map_err(|e| e.to_string())?;
    opts.fronts(t.serving.backend)?;
    let backend = if connect { Some(connect_backend(opts).await?) } else { None };
    Ok((C::arrive(t, fd, opts)?, backend))
}

/// A client socket as tokio drives it.
pub(crate) fn to_tokio(fd: OwnedFd) -> std::io::Result<TcpStream> {
    let std = std::net::TcpStream::from(fd);
    std.set_nonblocking(true)?;
    TcpStream::from_std(std)
}

/// The epochs of this agent's connections (a poisoned lock is still the right state).
pub(crate) fn lock(epochs: &Mutex<EpochTracker>) -> std::sync::MutexGuard<'_, EpochTracker> {
    epochs.lock().unwrap_or_else(|p| p.into_inner())
}
