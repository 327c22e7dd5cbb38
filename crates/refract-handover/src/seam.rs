//! The dispatcher's hand-over client, protocol-neutral: ask the agent about a message
//! ([`forward`], [`next`], [`relay_instead`]; hybrid), offer the connection to it
//! ([`hand_off`]), answer its questions while it owns the connection and wait until it comes
//! back ([`take_back`]), over either [`Carrier`]. What only a protocol knows sits behind
//! [`Seam`]: what travels with the connection at the cut, and whether the agent may serve a
//! further message it read. A front end (HTTP today, PostgreSQL next) implements [`Seam`] and
//! keeps its own policy (when to offer, relay on any failure, metrics); docs/handover.md,
//! "The seam".
//!
//! What the cut needs of the socket differs by carrier and stays with the caller: the same-host
//! dispatcher passes its descriptor beside the `HandOff` and keeps it; across hosts it quiesces,
//! snapshots and steers first, and restores the `HandBack`'s state.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

use crate::{Carrier, EpochTracker, Error, Msg, Serving, Socket, Transfer};

/// What a protocol tells the hand-over client (implemented by each front end).
pub trait Seam {
    /// The client connection's socket (passed beside a same-host `HandOff`; the dispatcher
    /// keeps it).
    fn socket(&self) -> BorrowedFd<'_>;

    /// The bytes that travel with the connection at the cut (made at a message boundary):
    /// the message the agent is to serve, if it has not seen it yet, and whatever the
    /// dispatcher read behind it. The agent serves them in order.
    fn travelling(&self) -> Vec<u8>;

    /// The agent took the connection: the travelling bytes are its now, not to be served here.
    fn moved(&mut self);

    /// The agent read a further message at a boundary of the connection it owns (`bytes`: it
    /// and what it read behind it): whether it may serve it there (`Serve`); else it hands the
    /// connection back with `bytes` pending (`Return`), which the dispatcher then serves.
    fn may_serve(&mut self, bytes: &[u8]) -> bool;
}

/// What the agent said about a forwarded message (hybrid).
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// A piece of a small result, to be relayed to the client.
    Response { conn: u64, request: u64, last: bool, keep: bool, bytes: Vec<u8> },
    /// The result is large: the agent wants the connection (it holds the result).
    Want { conn: u64, request: u64 },
    /// Anything else (named for the log).
    Other(&'static str),
}

/// Asks the agent (hybrid): forwards message number `request` of `conn` (`bytes`, whole); the
/// agent answers with [`next`]: the result in `Response` frames when it is below `threshold`,
/// else `WantConnection`.
pub async fn forward<C: Carrier>(
    link: &mut C,
    conn: u64,
    request: u64,
    threshold: u64,
    bytes: Vec<u8>,
) -> Result<(), Error> {
    link.send(&Msg::Forward { conn, request, threshold, bytes }, None).await
}

/// The agent's next word about a forwarded message.
pub async fn next<C: Carrier>(link: &mut C) -> Result<Answer, Error> {
    Ok(match link.recv().await? {
        (Msg::Response { conn, request, last, keep, bytes }, None) => {
            Answer::Response { conn, request, last, keep, bytes }
        }
        (Msg::WantConnection { conn, request }, None) => Answer::Want { conn, request },
        (m, None) => Answer::Other(m.name()),
        (_, Some(_)) => Answer::Other("a message with a descriptor"),
    })
}

/// Tells the agent to relay the result it holds after all (the connection cannot move): the
/// rest comes as `Response` frames.
pub async fn relay_instead<C: Carrier>(link: &mut C, conn: u64, request: u64, reason: String) -> Result<(), Error> {
    link.send(&Msg::RelayInstead { conn, request, reason }, None).await
}

/// Why an offered connection was not taken (nothing reached the client).
#[derive(Debug)]
pub enum Refusal {
    /// The agent answered `HandOffErr` with this reason; the link is in step.
    Refused(String),
    /// The link failed before an answer.
    Lost(Error),
    /// The agent accepted another epoch than the one offered.
    Stale(Error),
    /// The agent answered something else (its name).
    Unexpected(&'static str),
    /// No answer within the bound.
    Timeout,
}

impl Refusal {
    /// Whether the agent is sure not to hold the connection: it refused, or the link was gone
    /// before the offer left. Otherwise it may own the socket now (same host: then the
    /// connection cannot go on here).
    pub fn is_clean(&self) -> bool {
        matches!(self, Refusal::Refused(_) | Refusal::Lost(_))
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Refused(reason) => write!(f, "{reason}"),
            Refusal::Lost(e) => write!(f, "agent: {e}"),
            Refusal::Stale(e) => write!(f, "HandOffOk: {e}"),
            Refusal::Unexpected(name) => write!(f, "agent: unexpected {name}"),
            Refusal::Timeout => write!(f, "no answer to HandOff"),
        }
    }
}

/// One offer of connection `conn` at `epoch` (already advanced by the caller, who may need it
/// before the offer leaves: steering), its socket as it travels, what the agent is to serve.
pub struct Offer {
    /// The connection's id, as the agent knows it.
    pub conn: u64,
    /// The transfer's epoch ([`EpochTracker::advance`]).
    pub epoch: u64,
    /// [`Socket::Passed`]: the [`Seam::socket`] goes beside the frame (same host).
    pub socket: Socket,
    /// What the agent is to serve (its idle wait, the backend).
    pub serving: Serving,
    /// Bound on the agent's answer.
    pub answer: Duration,
}

/// Sends `HandOff` (with the [`Seam::travelling`] bytes) and waits for the agent's answer; on
/// `HandOffOk` at `offer.epoch` the bytes are the agent's ([`Seam::moved`]).
pub async fn hand_off<C: Carrier, S: Seam>(
    link: &mut C,
    seam: &mut S,
    epochs: &EpochTracker,
    offer: Offer,
) -> Result<(), Refusal> {
    let conn = offer.conn;
    let passed = offer.socket == Socket::Passed;
    let t = Transfer {
        conn,
        epoch: offer.epoch,
        socket: offer.socket,
        pending: seam.travelling(),
        serving: offer.serving,
        sent: 0,
    };
    let fd = passed.then(|| seam.socket());
    link.send(&Msg::HandOff(Box::new(t)), fd).await.map_err(Refusal::Lost)?;
    match tokio::time::timeout(offer.answer, link.recv()).await {
        Ok(Ok((Msg::HandOffOk { conn: c, epoch: e }, _))) if c == conn => {
            epochs.check(c, e).map_err(Refusal::Stale)?;
            seam.moved();
            Ok(())
        }
        Ok(Ok((Msg::HandOffErr { reason, .. }, _))) => Err(Refusal::Refused(reason)),
        Ok(Ok((other, _))) => Err(Refusal::Unexpected(other.name())),
        // Gone before adopting: by the agent's ordering (`HandOffOk` before any byte to the
        // client), nothing reached the client.
        Ok(Err(e)) => Err(Refusal::Lost(e)),
        Err(_) => Err(Refusal::Timeout),
    }
}

/// How the agent's ownership of a connection ended.
#[derive(Debug)]
pub enum Back {
    /// `HandBack` at this epoch: the socket comes back as its [`Transfer`] says (with the
    /// descriptor beside it on the same host); its `pending` bytes are served here first.
    Here(Box<Transfer>, Option<OwnedFd>),
    /// The link ended while the client was idle at a same-host agent: the dispatcher's own
    /// descriptor is the connection, nothing of a response is in flight.
    TakenBack(Error),
    /// The agent closed the connection, having written `sent` bytes.
    Closed { sent: u64, reason: String },
    /// The agent or the link failed while it owned the connection (`sent`, if it said): the
    /// client may have part of a response; the connection cannot go on.
    Lost { sent: Option<u64>, detail: String },
}

/// Answers the agent's `Next`s ([`Seam::may_serve`]) until it hands the connection back or ends
/// it. `Idle` (same host only) marks the client idle at the agent: a link that ends then gives
/// the connection back.
pub async fn take_back<C: Carrier, S: Seam>(link: &mut C, seam: &mut S, epochs: &mut EpochTracker, conn: u64) -> Back {
    let mut idle = false;
    loop {
        let msg = link.recv().await;
        match msg {
            Ok((Msg::Idle { conn: c, .. }, None)) if c == conn => idle = C::SAME_HOST,
            Ok((Msg::Next { conn: c, request, bytes }, None)) if c == conn => {
                idle = false;
                let answer = if seam.may_serve(&bytes) {
                    Msg::Serve { conn: c, request }
                } else {
                    Msg::Return { conn: c, request }
                };
                if let Err(e) = link.send(&answer, None).await {
                    return Back::Lost { sent: None, detail: format!("agent lost while it owned the connection: {e}") };
                }
            }
            Ok((Msg::HandBack(t), fd)) if t.conn == conn => return handed_back(epochs, t, fd),
            Ok((Msg::Closed { sent, reason, .. }, _)) => return Back::Closed { sent, reason },
            Ok((other, _)) => return Back::Lost { sent: None, detail: format!("unexpected {}", other.name()) },
            Err(e) if idle => return Back::TakenBack(e),
            Err(e) => {
                return Back::Lost { sent: None, detail: format!("agent lost while it owned the connection: {e}") }
            }
        }
    }
}

/// A `HandBack` at a stale epoch is refused: the connection cannot go on.
fn handed_back(epochs: &mut EpochTracker, t: Box<Transfer>, fd: Option<OwnedFd>) -> Back {
    match epochs.observe(t.conn, t.epoch) {
        Ok(()) => Back::Here(t, fd),
        Err(e) => Back::Lost { sent: Some(t.sent), detail: format!("hand-back: {e}") },
    }
}
