//! [`adopt`]: a `HandOff` that answers a waiting PostgreSQL connection's `WANT`, over either
//! carrier ([`Move`]): check the epoch, take the client's socket, let the pump write the rest of
//! the result, and hand the socket back (`HandBack`, no pending bytes: the agent never reads
//! from the client, so what the client sent meanwhile waits in the socket for refract), or
//! report `Closed`.

use std::os::fd::OwnedFd;
use std::sync::Mutex;

use refract_handover::{EpochTracker, Msg, Result, Transfer};
use tokio::sync::oneshot;

use super::{Served, Verdict};
use crate::adopt::{closed, hand_back, lock, Move};
use crate::options::LocalOptions;

/// Adopts the client connection of `t` for the pump waiting on `waiter`.
pub(crate) async fn adopt<C: Move>(
    link: &mut C,
    opts: &LocalOptions,
    epochs: &Mutex<EpochTracker>,
    t: Transfer,
    fd: Option<OwnedFd>,
    waiter: oneshot::Sender<Verdict>,
) -> Result<()> {
    let (conn, epoch) = (t.conn, t.epoch);
    let arrived = lock(epochs).observe(conn, epoch).map_err(|e| e.to_string()).and_then(|()| C::arrive(&t, fd, opts));
    let client = match arrived {
        Ok(c) => c,
        Err(reason) => {
            tracing::debug!(conn, epoch, "hand-off refused: {reason}");
            let _ = waiter.send(Verdict::Relay); // refract relays the rest
            return link.send(&Msg::HandOffErr { conn, epoch, reason }, None).await;
        }
    };
    if let Err(e) = link.send(&Msg::HandOffOk { conn, epoch }, None).await {
        // refract did not hear the acceptance: it relays (same host: it kept the socket).
        let _ = waiter.send(Verdict::Relay);
        return Err(e);
    }
    let (done, served) = oneshot::channel();
    if waiter.send(Verdict::Serve { client, done }).is_err() {
        return closed(link, epochs, (conn, epoch), 0, "the server connection ended".into()).await;
    }
    let served = tokio::select! {
        s = served => s,
        r = link.beat() => match r {
            Err(e) => return Err(e),
            Ok(never) => match never {},
        },
    };
    match served {
        Ok(Served::Boundary { client, sent }) => hand_back(link, opts, epochs, client, &t, Vec::new(), sent).await,
        Ok(Served::Close { sent, reason }) => closed(link, epochs, (conn, epoch), sent, reason).await,
        Err(_) => closed(link, epochs, (conn, epoch), 0, "the server connection ended".into()).await,
    }
}
