//! [`Cut`]: HTTP's side of the hand-over seam (`refract_handover::seam`), and the one way the
//! session settles what the agent's ownership ended with ([`settle`]), over either carrier.
//! The cut happens at a request boundary; what travels is the request the agent is to serve
//! (in `always`; in hybrid the agent holds it already) and every byte read behind it; a further
//! request the agent reads is judged by `keep.rs`.

use super::keep::{self, Verdict};
use super::{Rec, Session};
use crate::conn::ClientConn;
use refract_handover::seam::{self, Back, Seam};
use refract_handover::{Carrier, Transfer};
use std::future::Future;
use std::os::fd::{AsFd, BorrowedFd};

/// One client connection at the cut, as the hand-over client sees it.
pub(super) struct Cut<'a, 'c> {
    pub rec: Rec<'a>,
    pub conn: &'c mut ClientConn,
    /// The request the agent is to serve, when it has not seen it (`always`).
    pub ahead: Vec<u8>,
}

impl Seam for Cut<'_, '_> {
    fn socket(&self) -> BorrowedFd<'_> {
        self.conn.stream.as_fd()
    }

    fn travelling(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.ahead.len() + self.conn.buf.len());
        bytes.extend_from_slice(&self.ahead);
        bytes.extend_from_slice(&self.conn.buf);
        bytes
    }

    fn moved(&mut self) {
        self.ahead.clear();
        self.conn.buf.clear(); // those bytes now travel with the agent
    }

    fn may_serve(&mut self, bytes: &[u8]) -> bool {
        match keep::judge(self.rec, bytes) {
            Verdict::Serve => true,
            Verdict::Return(why) => {
                tracing::debug!("the agent hands the connection back: {why}");
                false
            }
        }
    }
}

/// What differs when the connection comes back: how the socket becomes the session's again.
pub(super) trait Land: Carrier {
    /// Makes the socket handed back in `t` the session's (`conn.stream`) and acknowledges it
    /// as this carrier's protocol asks. `Err`: the connection cannot go on.
    fn land(&mut self, conn: &mut ClientConn, t: &Transfer) -> impl Future<Output = Result<(), String>>;
}

/// How the agent's ownership ended, for the session.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Landed {
    /// The connection is back here, with the bytes the agent read behind its last response.
    Here,
    /// The agent closed the connection.
    Closed,
    /// The agent or the link failed, or the connection could not come back: it ends.
    Lost,
}

/// Waits until the agent gives the connection back (answering its `Next`s), lands it, and
/// counts the end.
pub(super) async fn settle<C: Land>(cut: &mut Cut<'_, '_>, link: &mut C, s: &mut Session) -> Landed {
    let rec = cut.rec;
    match seam::take_back(link, cut, &mut s.epochs, s.id).await {
        Back::Here(t, _theirs) => match link.land(cut.conn, &t).await {
            Ok(()) => {
                rec.handed_back(t.sent);
                cut.conn.buf.extend_from_slice(&t.pending);
                Landed::Here
            }
            Err(e) => lost(rec, Some(t.sent), &e),
        },
        // Only a same-host agent says `Idle`: our descriptor is the same socket.
        Back::TakenBack(e) => {
            rec.taken_back();
            tracing::info!(conn = s.id, "agent lost while the client was idle ({e}); the connection is back");
            Landed::Here
        }
        Back::Closed { sent, reason } => {
            rec.ended(Some(sent));
            tracing::debug!(conn = s.id, "agent closed the connection: {reason}");
            Landed::Closed
        }
        Back::Lost { sent, detail } => lost(rec, sent, &detail),
    }
}

/// The agent may have written part of a response: the connection cannot go on (across hosts,
/// the client's next segment meets this stack and is reset).
fn lost(rec: Rec<'_>, sent: Option<u64>, why: &str) -> Landed {
    rec.ended(sent);
    tracing::warn!("hand-over failed after the agent adopted the connection ({why}); closing it");
    Landed::Lost
}
