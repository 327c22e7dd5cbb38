//! The PostgreSQL result hand-over, refract's side (docs/handover.md, "PostgreSQL").
//!
//! A server with an agent is reached through it, and the agent watches each result. When the
//! next row would bring one to the threshold the agent stops at a boundary before it (and before
//! what came with it) and says `WANT` (`refract_pg::hybrid`); the session, which has relayed
//! everything before it, flushes that to
//! the client and decides: the client's socket goes to the agent over the hand-over link
//! (`refract_handover::seam`; same host: the descriptor by SCM_RIGHTS), or the session says
//! `RELAY` in-band and relays the rest as usual. The agent writes the rest of the result to
//! the client, hands the socket back at ReadyForQuery and sends `DELIVERED`: the messages it
//! wrote other than rows, copy data, notices and notifications. The session reads them as if
//! relayed, with its output to the client muted ([`Session::replay`]), so its transaction,
//! statement and SET tracking see what the client saw.
//!
//! The cut is taken only when everything from it to the ReadyForQuery would be relayed
//! verbatim (no answer refract swallows or stands in for: the batch's `Expect`s say so) and the
//! client is on plain TCP (a TLS session cannot move: this kernel has no kTLS). Nothing of the
//! client's travels: the agent never reads from the client, so what it pipelined stays in the
//! session's buffer and in the socket.

use super::Session;
use crate::error::PgError;
use refract_handover::across::{self, Why};
use refract_handover::config::AgentAddr;
use refract_handover::local::LocalLink;
use refract_handover::metrics::HandoverMetrics;
use refract_handover::seam::{self, Back, Offer, Refusal, Seam};
use refract_handover::{Serving, Socket};
use refract_pg::hybrid;
use refract_pg::Side;
use refract_vocab::MemberName;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

/// Bound on reaching the agent's socket.
const CONNECT: Duration = Duration::from_millis(200);
/// Bound on the agent's answer to a hand-off.
const ANSWER: Duration = Duration::from_secs(5);

/// PostgreSQL's side of the seam: the client's socket; nothing travels, nothing more is served.
struct Cut<'a> {
    socket: BorrowedFd<'a>,
}

impl Seam for Cut<'_> {
    fn socket(&self) -> BorrowedFd<'_> {
        self.socket
    }

    fn travelling(&self) -> Vec<u8> {
        Vec::new() // the agent writes the rest of one result and reads nothing
    }

    fn moved(&mut self) {}

    fn may_serve(&mut self, _: &[u8]) -> bool {
        false // the agent never asks: it hands back at ReadyForQuery
    }
}

/// How an attempt ended.
enum Attempt {
    /// The agent wrote the rest (`sent` bytes) and gave the socket back.
    Back { sent: u64 },
    /// Not handed over (the agent holds the rest for `RELAY` unless it refused itself).
    Declined { why: Why, detail: String, tell_agent: bool },
}

/// Not offered: the agent waits for `RELAY`.
fn declined(why: Why, detail: &str) -> Attempt {
    Attempt::Declined { why, detail: detail.into(), tell_agent: true }
}

/// The agent refused (it forwards the rest itself).
fn refused(reason: &str) -> Attempt {
    Attempt::Declined { why: Why::of_refusal(reason), detail: reason.into(), tell_agent: false }
}

/// The bound server connection.
fn bound_conn(bound: &mut Option<super::Bound>) -> Result<&mut crate::server::pool::Guard, PgError> {
    bound.as_mut().map(|b| &mut b.guard).ok_or_else(|| PgError::Unavailable("internal: no server bound".into()))
}

/// Where an attempt's end is counted (`refract_handover_ended_total{backend, front, end}`).
struct Count<'a> {
    metrics: &'a HandoverMetrics,
    name: MemberName<'a>,
}

impl Count<'_> {
    /// The agent accepted the offer (as for HTTP: `result="ok"` and the latency until then,
    /// whether the connection comes back or ends at the agent).
    fn accepted(&self, since: Duration) {
        self.metrics.handover(self.name, "ok");
        self.metrics.handover_latency(since.as_secs_f64());
    }
}

/// The agent may have written part of the result: the client and the server connection end.
fn lost(c: &Count<'_>, conn: &mut crate::server::pool::Guard, detail: &str) -> PgError {
    c.metrics.handover_ended(c.name, "lost");
    conn.broken = true;
    tracing::warn!("PostgreSQL hand-over failed after the offer ({detail}); closing the client");
    PgError::Closed(Side::Client)
}

/// The agent's ownership ended without a hand-back.
fn ended(c: &Count<'_>, conn: &mut crate::server::pool::Guard, back: Back) -> PgError {
    match back {
        Back::Closed { sent, reason } => {
            c.metrics.handover_ended(c.name, "closed");
            c.metrics.bytes_direct(c.name, sent);
            conn.broken = true;
            tracing::debug!(sent, "the agent closed the client connection: {reason}");
            PgError::Closed(Side::Client)
        }
        other => lost(c, conn, &format!("{other:?}")),
    }
}

/// What the rest of an answer, up to its ReadyForQuery, is to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rest {
    /// Relayed as the server sends it: the agent may write it itself.
    Verbatim,
    /// refract swallows, stands in for or rewrites part of it.
    Edited,
}

impl Session {
    /// The agent holds a large result (`WANT`). `rest`: whether everything from here to the
    /// ReadyForQuery would be relayed as the server sends it. Either the agent writes the rest
    /// (its digest is then replayed, muted), or the session relays it.
    pub(crate) async fn at_want(&mut self, rest: Rest) -> Result<(), PgError> {
        self.flush().await?;
        let name = self.bound_name();
        match self.attempt(rest).await? {
            Attempt::Back { sent } => {
                // The client received them: the answer counts as large (no limit sample).
                self.io.wire.count_sent_elsewhere(sent);
                let m = &self.shared.handover_metrics;
                m.handback(MemberName::postgres(&name));
                m.bytes_direct(MemberName::postgres(&name), sent);
                let (tag, frame) = self.conn()?.wire.recv().await?;
                if tag != hybrid::DELIVERED {
                    self.conn()?.broken = true;
                    return Err(PgError::Unavailable("the agent sent no digest after the hand-back".into()));
                }
                self.io.replay_delivered(frame.slice(5..));
                Ok(())
            }
            Attempt::Declined { why, detail, tell_agent } => {
                tracing::debug!(server = %name, "large result relayed: {detail}");
                self.shared.handover_metrics.handover(MemberName::postgres(&name), why.as_str());
                if tell_agent {
                    let mut relay = bytes::BytesMut::new();
                    hybrid::encode_marker(hybrid::RELAY, &[], &mut relay);
                    self.conn()?.wire.send(&relay).await?;
                }
                Ok(())
            }
        }
    }

    /// The bound server's name (its metrics carry `front="postgres"` too).
    fn bound_name(&self) -> String {
        self.bound.as_ref().map_or_else(String::new, |b| b.server.name.clone())
    }

    /// Offers the client's socket to the agent and waits until it comes back. `Err`: the agent
    /// may have written part of the result: the client connection and the server connection end.
    async fn attempt(&mut self, rest: Rest) -> Result<Attempt, PgError> {
        if rest == Rest::Edited {
            return Ok(declined(Why::Unsupported, "refract answers part of the rest itself"));
        }
        if self.io.wire.plain_fd().is_none() {
            return Ok(declined(Why::Unsupported, "the client is on TLS"));
        }
        let Some(agent) = self.bound.as_ref().and_then(|b| b.server.agent.clone()) else {
            return Ok(declined(Why::Unsupported, "the server has no agent"));
        };
        match &agent.addr {
            AgentAddr::Unix(path) => self.same_host(path).await,
            AgentAddr::Tcp(addr) => {
                let Some(key_file) = agent.key_file.as_deref() else {
                    return Ok(declined(Why::Unsupported, "no [handover] key_file"));
                };
                let steer = agent.steer.as_ref().map(|(i, c)| (i.as_str(), *c));
                self.across(&across::Agent { addr: *addr, key_file, steer }).await
            }
        }
    }

    /// Same host: the descriptor goes beside the `HandOff`; this session keeps its own.
    async fn same_host(&mut self, path: &std::path::Path) -> Result<Attempt, PgError> {
        let started = Instant::now();
        let (shared, name) = (self.shared.clone(), self.bound_name());
        let count = Count { metrics: &shared.handover_metrics, name: MemberName::postgres(&name) };
        let mut link = match tokio::time::timeout(CONNECT, LocalLink::connect(path)).await {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => return Ok(declined(Why::Unreachable, &format!("agent {}: {e}", path.display()))),
            Err(_) => return Ok(declined(Why::Unreachable, "agent: connect timed out")),
        };
        // Disjoint fields: the client's socket (kept here, untouched until it comes back; the
        // agent's descriptor is a duplicate) and the bound server connection.
        let (wire, bound) = (&self.io.wire, &mut self.bound);
        let Some(socket) = wire.plain_fd() else { return Ok(declined(Why::Unsupported, "the client is on TLS")) };
        let conn = bound_conn(bound)?;
        let Some(id) = conn.hybrid_id else { return Ok(declined(Why::Unsupported, "not through the agent")) };
        let mut cut = Cut { socket };
        let epoch = conn.epochs.advance(id);
        let offer = Offer { conn: id, epoch, socket: Socket::Passed, serving: Serving::default(), answer: ANSWER };
        match seam::hand_off(&mut link, &mut cut, &conn.epochs, offer).await {
            Ok(()) => {}
            // The agent refused and forwards the rest itself.
            Err(Refusal::Refused(reason)) => return Ok(refused(&reason)),
            Err(r) => return Err(lost(&count, conn, &r.to_string())),
        }
        count.accepted(started.elapsed());
        match seam::take_back(&mut link, &mut cut, &mut conn.epochs, id).await {
            Back::Here(t, _theirs) => Ok(Attempt::Back { sent: t.sent }),
            other => Err(ended(&count, conn, other)),
        }
    }

    /// Across hosts: quiesce, FREEZE, snapshot, STEER, `HandOff` over the control channel; the
    /// socket is restored here from the `HandBack` (`refract_handover::across`).
    async fn across(&mut self, agent: &across::Agent<'_>) -> Result<Attempt, PgError> {
        let (shared, name) = (self.shared.clone(), self.bound_name());
        let count = Count { metrics: &shared.handover_metrics, name: MemberName::postgres(&name) };
        let mut ch = match across::channel(None, agent).await {
            Ok(ch) => ch,
            Err(d) => return Ok(Attempt::Declined { why: d.why, detail: d.detail, tell_agent: true }),
        };
        let (wire, bound) = (&mut self.io.wire, &mut self.bound);
        let Some(stream) = wire.plain_stream() else { return Ok(declined(Why::Unsupported, "the client is on TLS")) };
        let conn = bound_conn(bound)?;
        let Some(id) = conn.hybrid_id else { return Ok(declined(Why::Unsupported, "not through the agent")) };
        let frozen = match across::freeze(stream, agent).await {
            Ok(f) => f,
            Err(d) => return Ok(Attempt::Declined { why: d.why, detail: d.detail, tell_agent: true }),
        };
        let offered = {
            let mut cut = Cut { socket: stream.as_fd() };
            across::offer(&mut ch, &mut cut, &mut conn.epochs, id, &frozen, Serving::default(), |_| {}).await
        };
        if let Err((d, _)) = offered {
            // Nothing reached the client: the socket lives here again. The agent forwards the
            // rest itself after a refusal; otherwise it may not have heard the offer at all.
            frozen.restore_here(stream).map_err(|e| lost(&count, conn, &e.to_string()))?;
            let tell_agent = d.why != Why::Refused && d.why != Why::StaleEpoch;
            return Ok(Attempt::Declined { why: d.why, detail: d.detail, tell_agent });
        }
        count.accepted(frozen.started.elapsed());
        let back = {
            let mut cut = Cut { socket: stream.as_fd() };
            seam::take_back(&mut ch, &mut cut, &mut conn.epochs, id).await
        };
        match back {
            Back::Here(t, _) => {
                let landed = across::land(&mut ch, stream, &t).await;
                frozen.release();
                landed.map_err(|e| lost(&count, conn, &e))?;
                Ok(Attempt::Back { sent: t.sent })
            }
            other => {
                if matches!(other, Back::Closed { .. }) {
                    frozen.linger();
                } else {
                    frozen.release();
                }
                Err(ended(&count, conn, other))
            }
        }
    }
}
