//! The same-host move: the client socket goes to the agent's Unix socket with the pending
//! bytes (SCM_RIGHTS), the agent answers, and the socket comes back at a request boundary.
//!
//! The dispatcher keeps its own descriptor of the socket all along (SCM_RIGHTS duplicates it)
//! and does not touch the socket while the agent owns it, so an agent that dies never takes
//! the client's connection with it. Its ordering — `HandOffOk` before any byte to the client —
//! is what makes "no answer yet" safe to relay.

use super::keep::{self, Verdict};
use super::{Declined, Rec, Session, Why};
use crate::conn::ClientConn;
use refract_handover::local::LocalLink;
use refract_handover::{Msg, Serving, Socket, Transfer};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::time::timeout;

/// Bound on reaching the agent's socket.
const CONNECT: Duration = Duration::from_millis(200);
/// Bound on the agent's answer to a hand-off (it only checks and connects to its backend).
const ANSWER: Duration = Duration::from_secs(5);

/// Moves the connection to the agent at `path` for the requests in `pending` and waits until it
/// comes back. `Err`: the agent did not adopt it and wrote nothing (relay instead).
/// `Ok(go_on)`: the agent served; `go_on` is false when the connection must close.
pub(super) async fn hand_over(
    rec: Rec<'_>,
    conn: &mut ClientConn,
    s: &mut Session,
    path: &Path,
    backend: SocketAddr,
    pending: Vec<u8>,
) -> Result<bool, Declined> {
    let mut link = connect(path).await?;
    adopt(rec, &mut link, conn, s, backend, pending).await
}

/// Connects to the agent's socket at `path`.
pub(super) async fn connect(path: &Path) -> Result<LocalLink, Declined> {
    match timeout(CONNECT, LocalLink::connect(path)).await {
        Ok(Ok(l)) => Ok(l),
        Ok(Err(e)) => Err(Declined::new(Why::Unreachable, format!("agent {}: {e}", path.display()))),
        Err(_) => Err(Declined::new(Why::Unreachable, format!("agent {}: connect timed out", path.display()))),
    }
}

/// Moves the connection over `link` and waits until it comes back (see [`hand_over`]).
pub(super) async fn adopt(
    rec: Rec<'_>,
    link: &mut LocalLink,
    conn: &mut ClientConn,
    s: &mut Session,
    backend: SocketAddr,
    pending: Vec<u8>,
) -> Result<bool, Declined> {
    let started = Instant::now();
    let epoch = s.epochs.advance(s.id);
    let serving = Serving { idle_ms: rec.idle_ms(), backend: Some(backend) };
    let t = Transfer { conn: s.id, epoch, socket: Socket::Passed, pending, serving, sent: 0 };
    let sent = link.send(&Msg::HandOff(Box::new(t)), Some(conn.stream.as_fd())).await;
    sent.map_err(|e| Declined::new(Why::AgentLost, format!("agent: {e}")))?;
    match timeout(ANSWER, link.recv()).await {
        Ok(Ok((Msg::HandOffOk { conn: c, epoch: e }, _))) if c == s.id => {
            if let Err(e) = s.epochs.check(c, e) {
                rec.failed(Why::StaleEpoch);
                return Ok(lost(&format!("HandOffOk: {e}")));
            }
        }
        Ok(Ok((Msg::HandOffErr { reason, .. }, _))) => return Err(Declined::new(Why::of_refusal(&reason), reason)),
        // Gone before adopting: by the agent's ordering, nothing reached the client.
        Ok(Err(e)) => return Err(Declined::new(Why::AgentLost, format!("agent: {e}"))),
        Ok(Ok((other, _))) => {
            rec.failed(Why::Protocol);
            return Ok(lost(&format!("unexpected {}", other.name())));
        }
        Err(_) => {
            rec.failed(Why::Timeout);
            return Ok(lost("no answer to the hand-off"));
        }
    }
    rec.accepted(started);
    conn.buf.clear(); // those bytes now travel with the agent
    Ok(take_back(rec, link, conn, s).await)
}

/// Answers the agent's `Next`s (`keep.rs`) until the connection comes back; returns whether
/// the session goes on. A link that ends while the agent waits for the client (`Idle`, no
/// request since) gives the connection back to the session: our descriptor is the same socket,
/// nothing of a response is in flight, and the client's next request is read here.
async fn take_back(rec: Rec<'_>, link: &mut LocalLink, conn: &mut ClientConn, s: &mut Session) -> bool {
    let mut idle = false;
    loop {
        match link.recv().await {
            Ok((Msg::Idle { conn: c, .. }, None)) if c == s.id => idle = true,
            Ok((Msg::Next { conn: c, request, bytes }, None)) if c == s.id => {
                idle = false;
                let answer = match keep::judge(rec, &bytes) {
                    Verdict::Serve => Msg::Serve { conn: c, request },
                    Verdict::Return(why) => {
                        tracing::debug!(conn = c, request, "the agent hands the connection back: {why}");
                        Msg::Return { conn: c, request }
                    }
                };
                if let Err(e) = link.send(&answer, None).await {
                    rec.ended(None);
                    return lost(&format!("agent lost while it owned the connection: {e}"));
                }
            }
            Err(e) if idle => return taken_back(rec, s, &e),
            other => return came_back(rec, other, conn, s),
        }
    }
}

/// The agent's link ended while the client was idle at the agent: the session goes on with the
/// connection (the agent's descriptor died with it).
fn taken_back(rec: Rec<'_>, s: &Session, e: &refract_handover::Error) -> bool {
    rec.taken_back();
    tracing::info!(conn = s.id, "agent lost while the client was idle ({e}); the connection is back");
    true
}

/// The agent's last word on a connection it owned: `HandBack` (the session goes on) or not.
fn came_back(
    rec: Rec<'_>,
    msg: refract_handover::Result<(Msg, Option<std::os::fd::OwnedFd>)>,
    conn: &mut ClientConn,
    s: &mut Session,
) -> bool {
    match msg {
        Ok((Msg::HandBack(t), Some(_theirs))) if t.conn == s.id => {
            if let Err(e) = s.epochs.observe(t.conn, t.epoch) {
                rec.ended(Some(t.sent));
                return lost(&format!("hand-back: {e}"));
            }
            rec.handed_back(t.sent);
            // Our own descriptor is the same socket; theirs is closed here.
            conn.buf.extend_from_slice(&t.pending);
            true
        }
        Ok((Msg::Closed { sent, reason, .. }, _)) => {
            rec.ended(Some(sent));
            tracing::debug!(conn = s.id, "agent closed the connection: {reason}");
            false
        }
        Ok((other, _)) => {
            rec.ended(None);
            lost(&format!("unexpected {}", other.name()))
        }
        Err(e) => {
            rec.ended(None);
            lost(&format!("agent lost while it owned the connection: {e}"))
        }
    }
}

/// The agent may have written part of a response: the connection cannot go on.
fn lost(why: &str) -> bool {
    tracing::warn!("hand-over failed after the agent adopted the connection ({why}); closing it");
    false
}
