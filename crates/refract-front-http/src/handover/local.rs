//! The same-host move: the client socket goes to the agent's Unix socket with the pending
//! bytes (SCM_RIGHTS), the agent answers, and the socket comes back at a request boundary.
//!
//! The dispatcher keeps its own descriptor of the socket all along (SCM_RIGHTS duplicates it)
//! and does not touch the socket while the agent owns it, so an agent that dies never takes
//! the client's connection with it. Its ordering — `HandOffOk` before any byte to the client —
//! is what makes "no answer yet" safe to relay.

use super::cut::{settle, Cut, Land, Landed};
use super::{Declined, Rec, Session, Why};
use crate::conn::ClientConn;
use refract_handover::local::LocalLink;
use refract_handover::seam::{self, Offer};
use refract_handover::{Serving, Socket, Transfer};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::time::timeout;

/// Bound on reaching the agent's socket.
const CONNECT: Duration = Duration::from_millis(200);
/// Bound on the agent's answer to a hand-off (it only checks and connects to its backend).
const ANSWER: Duration = Duration::from_secs(5);

/// Moves the connection to the agent at `path` for the request `ahead` (and any read behind it) and waits until it
/// comes back. `Err`: the agent did not adopt it and wrote nothing (relay instead).
/// `Ok(go_on)`: the agent served; `go_on` is false when the connection must close.
pub(super) async fn hand_over(
    rec: Rec<'_>,
    conn: &mut ClientConn,
    s: &mut Session,
    path: &Path,
    backend: SocketAddr,
    ahead: Vec<u8>,
) -> Result<bool, Declined> {
    let mut link = connect(path).await?;
    adopt(rec, &mut link, conn, s, backend, ahead).await
}

/// Connects to the agent's socket at `path`.
pub(super) async fn connect(path: &Path) -> Result<LocalLink, Declined> {
    match timeout(CONNECT, LocalLink::connect(path)).await {
        Ok(Ok(l)) => Ok(l),
        Ok(Err(e)) => Err(Declined::new(Why::Unreachable, format!("agent {}: {e}", path.display()))),
        Err(_) => Err(Declined::new(Why::Unreachable, format!("agent {}: connect timed out", path.display()))),
    }
}

/// Moves the connection over `link` (with `ahead`, the request the agent has not seen, if any,
/// and every byte read behind it) and waits until it comes back (see [`hand_over`]).
pub(super) async fn adopt(
    rec: Rec<'_>,
    link: &mut LocalLink,
    conn: &mut ClientConn,
    s: &mut Session,
    backend: SocketAddr,
    ahead: Vec<u8>,
) -> Result<bool, Declined> {
    let started = Instant::now();
    let serving = Serving { idle_ms: rec.idle_ms(), backend: Some(backend) };
    let offer = Offer { conn: s.id, epoch: s.epochs.advance(s.id), socket: Socket::Passed, serving, answer: ANSWER };
    let mut cut = Cut { rec, conn, ahead };
    if let Err(r) = seam::hand_off(link, &mut cut, &s.epochs, offer).await {
        let declined = Declined::of(&r);
        if r.is_clean() {
            return Err(declined);
        }
        // The agent may own the socket now: it cannot go on here.
        rec.failed(declined.why);
        tracing::warn!("hand-over failed after the agent adopted the connection ({declined}); closing it");
        return Ok(false);
    }
    rec.accepted(started);
    Ok(settle(&mut cut, link, s).await == Landed::Here)
}

impl Land for LocalLink {
    /// Our own descriptor is the same socket all along; the agent's (beside the `HandBack`) is
    /// closed here.
    async fn land(&mut self, _: &mut ClientConn, _: &Transfer) -> Result<(), String> {
        Ok(())
    }
}
