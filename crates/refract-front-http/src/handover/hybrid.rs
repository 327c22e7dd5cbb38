//! Hybrid (docs/handover.md, "Hand-off D → A"): a read for a backend with an agent goes to the
//! agent with the connection id, hand-over allowed. The agent sees the result's head first: a small
//! result comes back as `Response` frames and is relayed here; for a large one it asks for the
//! connection and holds the result, and the dispatcher moves the connection there (with any
//! pipelined bytes) at once — the request boundary is already quiescent, nothing else was written.
//!
//! The relay logic is one ([`forward`], over any [`Carrier`]; the messages are
//! `refract_handover::seam`'s); the move differs: same host,
//! `WantConnection` → a `HandOff` with the socket beside it ([`exchange`]); across hosts, the
//! TCP_REPAIR `HandOff` of `remote.rs` ([`exchange_remote`]), or `RelayInstead` when the
//! connection cannot move (not quiescent, map full, …), after which the result is relayed.

use super::remote::{self, Agent};
use super::{local, Declined, Rec, Session, Why};
use crate::conn::ClientConn;
use refract_handover::control::ControlChannel;
use refract_handover::seam::{self, Answer};
use refract_handover::{Carrier, MAX_FRAME};
use std::net::SocketAddr;
use std::path::Path;

/// Room in a control frame beside a forwarded request (kind, ids, threshold, length).
const FORWARD_OVERHEAD: usize = 64;

/// How a forwarded request ended (errors before any byte reached the client are `Declined`).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Relayed; whether the session goes on. The link is in step: keep it.
    Relayed(bool),
    /// The agent wants the connection; nothing was relayed.
    Want,
    /// Failed after bytes reached the client (or the client left): close; drop the link.
    Broken,
}

/// Forwards `request` as the session's next one and relays the agent's answer.
pub(super) async fn forward<C: Carrier>(
    rec: Rec<'_>,
    conn: &mut ClientConn,
    s: &mut Session,
    link: &mut C,
    threshold: u64,
    request: Vec<u8>,
) -> Result<Step, Declined> {
    s.requests += 1;
    let n = s.requests;
    let sent = seam::forward(link, s.id, n, threshold, request).await;
    sent.map_err(|e| Declined::new(Why::AgentLost, format!("agent: {e}")))?;
    rec.metrics().handover_forwarded(rec.backend());
    relay(rec, conn, link, (s.id, n), true).await
}

/// Relays `Response` frames of request `id = (conn, request)` to the client until the last one.
/// With `may_want`, a `Want` before any frame ends it instead.
pub(super) async fn relay<C: Carrier>(
    rec: Rec<'_>,
    conn: &mut ClientConn,
    link: &mut C,
    id: (u64, u64),
    may_want: bool,
) -> Result<Step, Declined> {
    let mut touched = false;
    loop {
        match seam::next(link).await {
            Ok(Answer::Response { conn: c, request: r, last, keep, bytes }) if (c, r) == id => {
                touched = true;
                if conn.reply(&bytes).await.is_err() {
                    return Ok(Step::Broken); // the client is gone; the link is dropped mid-response
                }
                rec.relayed(bytes.len());
                if last {
                    return Ok(Step::Relayed(keep));
                }
            }
            Ok(Answer::Want { conn: c, request: r }) if (c, r) == id && may_want && !touched => {
                rec.wanted();
                return Ok(Step::Want);
            }
            Ok(Answer::Response { .. }) => return fail(touched, Why::Protocol, "a response to another request".into()),
            Ok(Answer::Want { .. }) => return fail(touched, Why::Protocol, "unexpected Want".into()),
            Ok(Answer::Other(name)) => return fail(touched, Why::Protocol, format!("unexpected {name}")),
            Err(e) => return fail(touched, Why::AgentLost, format!("agent: {e}")),
        }
    }
}

/// Ends an exchange that went wrong: relay if nothing reached the client, else close.
fn fail(touched: bool, why: Why, detail: String) -> Result<Step, Declined> {
    if touched {
        tracing::warn!("agent exchange failed mid-response ({detail}); closing the client connection");
        return Ok(Step::Broken);
    }
    Err(Declined::new(why, detail))
}

/// Same host: forwards `request` through the agent at `path`. `Err`: nothing reached the
/// client (relay as usual); `Ok(go_on)`: answered, by relay or by hand-over.
pub(super) async fn exchange(
    rec: Rec<'_>,
    conn: &mut ClientConn,
    s: &mut Session,
    path: &Path,
    backend: SocketAddr,
    threshold: u64,
    request: Vec<u8>,
) -> Result<bool, Declined> {
    let mut link = match s.link.take() {
        Some((p, l)) if p == path => l,
        _ => local::connect(path).await?,
    };
    match forward(rec, conn, s, &mut link, threshold, request).await? {
        Step::Relayed(go_on) => {
            s.link = Some((path.to_path_buf(), link));
            Ok(go_on)
        }
        Step::Broken => Ok(false),
        Step::Want => {
            // The agent holds the request: only the bytes read behind it travel.
            let r = local::adopt(rec, &mut link, conn, s, backend, Vec::new()).await;
            s.link = Some((path.to_path_buf(), link));
            r
        }
    }
}

/// Across hosts: forwards `request` over the session's control channel to `agent`; a large
/// result moves the connection there by TCP_REPAIR (pending bytes: the pipelined ones).
pub(super) async fn exchange_remote(
    rec: Rec<'_>,
    conn: &mut ClientConn,
    s: &mut Session,
    agent: &Agent<'_>,
    threshold: u64,
    request: Vec<u8>,
) -> Result<bool, Declined> {
    if request.len() > MAX_FRAME - FORWARD_OVERHEAD {
        return Err(Declined::new(Why::Unsupported, "request too large to forward"));
    }
    let mut ch = remote::channel(s, agent).await?;
    match forward(rec, conn, s, &mut ch, threshold, request).await? {
        Step::Relayed(go_on) => {
            remote::keep(s, agent, ch);
            Ok(go_on)
        }
        Step::Broken => Ok(false),
        Step::Want => match remote::freeze(conn, agent).await {
            Ok(frozen) => remote::hand_off(rec, ch, conn, s, agent, frozen, Vec::new()).await,
            Err(declined) => relay_instead(rec, ch, conn, s, agent, declined).await,
        },
    }
}

/// The connection cannot move (`declined` says why; the socket is untouched): tells the agent
/// to relay the result it holds, and relays it. The attempt counts as declined.
async fn relay_instead(
    rec: Rec<'_>,
    mut ch: ControlChannel,
    conn: &mut ClientConn,
    s: &mut Session,
    agent: &Agent<'_>,
    declined: Declined,
) -> Result<bool, Declined> {
    tracing::debug!(conn = s.id, "hand-over impossible, the agent relays: {declined}");
    let told = seam::relay_instead(&mut ch, s.id, s.requests, declined.to_string()).await;
    told.map_err(|e| Declined::new(Why::AgentLost, format!("agent: {e}")))?;
    let step = relay(rec, conn, &mut ch, (s.id, s.requests), false).await?;
    rec.declined(declined.why);
    match step {
        Step::Relayed(go_on) => {
            remote::keep(s, agent, ch);
            Ok(go_on)
        }
        Step::Want | Step::Broken => Ok(false),
    }
}
