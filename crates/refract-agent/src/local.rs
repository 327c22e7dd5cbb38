//! Same-host adoption: a dispatcher on this host hands the client socket beside a `HandOff`
//! (SCM_RIGHTS); the agent serves the request from its backend, asks the dispatcher (`Next`)
//! about each further one, and hands the socket back when told to (`Return`) or when the client
//! stays idle. Every transfer carries an epoch; stale ones are refused.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;
use std::time::Duration;

use bytes::BytesMut;
use refract_handover::{Carrier, EpochTracker, Msg, Serving, Socket, Transfer};
use tokio::net::TcpStream;

use crate::ask::AskOver;
use crate::backend::{connect_backend, BackendStream};
use crate::exchange::{Adopted, Held, Served};
use crate::options::LocalOptions;

/// Adopts the client socket `fd` of `t` (refusing a stale epoch or a foreign backend), finishes
/// the `held` response if any (else serves the first pending request), serves further requests
/// the dispatcher lets it serve, then hands the socket back or ends.
/// With `held`, `link_backend` is the backend connection that response comes from.
pub(crate) async fn adopt<C: Carrier>(
    link: &mut C,
    opts: &LocalOptions,
    epochs: &Mutex<EpochTracker>,
    t: Transfer,
    fd: OwnedFd,
    held: Option<(Held, &mut BackendStream)>,
) -> refract_handover::Result<()> {
    let (conn, epoch) = (t.conn, t.epoch);
    let (mut client, mut own) = match accept(opts, epochs, &t, fd, held.is_none()).await {
        Ok(x) => x,
        Err(reason) => {
            tracing::debug!(conn, epoch, "hand-off refused: {reason}");
            return link.send(&Msg::HandOffErr { conn, epoch, reason }, None).await;
        }
    };
    link.send(&Msg::HandOffOk { conn, epoch }, None).await?;
    let pending = BytesMut::from(&t.pending[..]);
    let (held, backend) = match (held, own.as_mut()) {
        (Some((h, b)), _) => (Some(h), b),
        (None, Some(b)) => (None, b),
        (None, None) => return Err(refract_handover::Error::Codec("no backend connection")),
    };
    let idle = Duration::from_millis(t.serving.idle_ms.into());
    let adopted = Adopted::new(&mut client, backend, pending, opts.backend_timeout, idle, epoch, opts.pass_socket)
        .with_write_stall(opts.write_stall);
    let served = adopted.run(held, &mut AskOver { link: &mut *link, conn }).await?;
    match served {
        (Served::Boundary(pending), sent) => {
            let back = lock(epochs).advance(conn);
            let serving = Serving::default();
            let t = Transfer { conn, epoch: back, socket: Socket::Passed, pending, serving, sent };
            link.send(&Msg::HandBack(Box::new(t)), Some(client.as_fd())).await
        }
        (Served::Close(reason), sent) => {
            lock(epochs).remove(conn);
            link.send(&Msg::Closed { conn, epoch, sent, reason }, None).await
        }
    }
}

/// Checks the offer (epoch, backend) and gets the sockets ready; `Err` is the refusal reason.
async fn accept(
    opts: &LocalOptions,
    epochs: &Mutex<EpochTracker>,
    t: &Transfer,
    fd: OwnedFd,
    connect: bool,
) -> Result<(TcpStream, Option<BackendStream>), String> {
    lock(epochs).observe(t.conn, t.epoch).map_err(|e| e.to_string())?;
    opts.fronts(t.serving.backend)?;
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
