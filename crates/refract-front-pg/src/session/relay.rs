//! Relaying a server's answers to the client up to ReadyForQuery: each message observed for
//! the session state it changes, COPY in both directions, flushing, and the sample of the
//! statement's time booked for its server's limit.

use super::client_io::Replay;
use super::handover::Rest;
use super::held::{CatchUp, Outcome};
use super::phase::{CopyDir, Event};
use super::{Bound, Session, Wrote, FLUSH_AT};
use crate::client::wire::Frame;
use crate::config::PoolMode;
use crate::error::PgError;
use crate::server::sizes::Path;
use bytes::BytesMut;
use refract_pg::classify::Classification;
use refract_pg::hybrid;
use refract_pg::{BackendMessage, TxStatus};
use std::time::Instant;

/// When a statement (or batch) went to its server, for its sample at ReadyForQuery.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sent {
    at: Instant,
    /// The client wire's byte count then.
    relayed: u64,
    /// Its kind (`refract_pg::classify::fingerprint`).
    key: u64,
}

/// What a ParameterStatus from the server means while a statement runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ParamStatus {
    /// The statement's own tracked SETs explain it.
    Tracked,
    /// An untracked parameter change.
    Untracked,
}

/// What a ReadyForQuery answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadyFor {
    /// A simple Query.
    Query,
    /// A Sync.
    Sync,
}

impl Session {
    /// Relays the server's answers until ReadyForQuery; returns whether an error came.
    /// `status`: what a ParameterStatus means.
    pub(super) async fn relay_until_ready(&mut self, status: ParamStatus) -> Result<Outcome, PgError> {
        let mut outcome = Outcome::Ok;
        loop {
            let (tag, frame) = self.server_frame().await?;
            self.note_copy(tag);
            match tag {
                hybrid::WANT => {
                    let rest = if self.held.failed_prepares.is_empty() { Rest::Verbatim } else { Rest::Edited };
                    self.at_want(rest).await?;
                    continue;
                }
                b'E' => {
                    outcome = Outcome::Failed;
                    self.advance(Event::QueryError);
                    if let Some(error) = self.prepare_error_for(&frame) {
                        self.io.out.extend_from_slice(&error);
                        continue;
                    }
                }
                b'S' if status == ParamStatus::Untracked => self.bound.iter_mut().for_each(Bound::untrack),
                b'N' => self.note_notice(&frame),
                b'C' | b'Z' => self.observe(tag, &frame, ReadyFor::Query)?,
                b'G' => {
                    self.io.out.extend_from_slice(&frame);
                    self.flush().await?;
                    self.copy_in().await?;
                    continue;
                }
                _ => {}
            }
            self.io.out.extend_from_slice(&frame);
            if tag == b'Z' {
                self.flush().await?;
                return Ok(outcome);
            }
            if self.io.out.len() >= FLUSH_AT {
                self.flush().await?;
            }
        }
    }

    /// A NoticeResponse from the server: PostgreSQL's warning that a library it loaded reserved
    /// the prefix of a custom parameter the session set, which it removed (`42602`), drops the
    /// parameter from what the session carries to its next connections.
    pub(crate) fn note_notice(&mut self, frame: &[u8]) {
        let Ok(BackendMessage::NoticeResponse(n)) = BackendMessage::decode(b'N', &frame[5..]) else { return };
        if let Some(name) = self.state.params.reserved_placeholder(&n) {
            self.state.params.forget(&name);
            self.bound.iter_mut().for_each(Bound::touch);
        }
    }

    /// Feeds CommandComplete / ReadyForQuery to the phase; `ready`: what a ReadyForQuery
    /// answers. Called before the message is added to `out`.
    pub(crate) fn observe(&mut self, tag: u8, frame: &[u8], ready: ReadyFor) -> Result<(), PgError> {
        match BackendMessage::decode(tag, &frame[5..])? {
            BackendMessage::CommandComplete(tag) => self.advance(Event::Completed(&tag)),
            BackendMessage::ReadyForQuery(status) if ready == ReadyFor::Sync => self.advance(Event::Synced(status)),
            BackendMessage::ReadyForQuery(status) => self.advance(Event::Ready(status)),
            _ => {}
        }
        if tag == b'Z' {
            self.key.finished();
            self.client.info.set_state(self.ready_state());
            if self.phase.tx() == TxStatus::Idle && self.held.take_schema_change() {
                // Its transaction ended: Parses from now on see what it committed (or not).
                self.shared.new_schema_epoch();
            }
            let role = self.bound.as_ref().map(|b| b.server.role);
            self.held.note_ready(self.phase.tx(), CatchUp::after(role), self.io.out.len());
        }
        Ok(())
    }

    /// A statement ran (or tried to) that may have changed the schema: server statements
    /// prepared before it are not reused for Parses after it, nor after its transaction ends.
    pub(crate) fn note_schema(&mut self, c: &Classification) {
        if c.changes_schema {
            self.shared.new_schema_epoch();
            self.held.note_schema_change();
        }
    }

    /// Feeds the server's COPY OUT / COPY BOTH start and its CopyDone to the phase (COPY IN
    /// is `copy_in`'s).
    pub(crate) fn note_copy(&mut self, tag: u8) {
        match tag {
            b'H' => self.advance(Event::CopyStart(CopyDir::Out)),
            b'W' => self.advance(Event::CopyStart(CopyDir::Both)),
            b'c' => self.advance(Event::CopyEnd),
            _ => {}
        }
    }

    /// The next message from the bound server; flushes to the client before waiting.
    pub(crate) async fn server_frame(&mut self) -> Result<Frame, PgError> {
        if let Some(f) = self.io.next_replayed()? {
            return Ok(f);
        }
        loop {
            let conn = self.conn()?;
            if let Some(f) = conn.wire.next_frame()? {
                if f.0 == b'E' && is_fatal(&f.1) {
                    conn.ended_by_server = true;
                }
                return Ok(f);
            }
            self.flush().await?;
            if !Bound::of(&mut self.bound)?.stream_to_client(&mut self.io.wire).await? {
                self.conn()?.wire.fill().await?;
            }
        }
    }

    /// COPY FROM STDIN: the client's CopyData go to the server until CopyDone or CopyFail.
    pub(crate) async fn copy_in(&mut self) -> Result<(), PgError> {
        self.advance(Event::CopyStart(CopyDir::In));
        let mut buf = BytesMut::new();
        loop {
            let Some((tag, frame)) = self.io.wire.next_frame()? else {
                if !buf.is_empty() {
                    self.conn()?.wire.send(&buf).await?;
                    buf.clear();
                }
                if !Bound::of(&mut self.bound)?.stream_from_client(&mut self.io.wire).await? {
                    self.io.wire.fill().await?;
                }
                continue;
            };
            buf.extend_from_slice(&frame);
            if tag == b'c' || tag == b'f' {
                self.advance(Event::CopyEnd);
                return self.conn()?.wire.send(&buf).await;
            }
            if buf.len() >= FLUSH_AT {
                self.conn()?.wire.send(&buf).await?;
                buf.clear();
            }
        }
    }

    /// Writes pending bytes to the client (a listening client's notifications put before the
    /// ReadyForQuery that ends a transaction first).
    pub(crate) async fn flush(&mut self) -> Result<(), PgError> {
        if self.io.mute_replayed() == Replay::Muted {
            self.held.ready_at = None; // its notifications stay queued for later
            return Ok(());
        }
        self.held.notifications_before_ready(&mut self.io.out).await;
        self.io.write_out().await
    }

    /// Marks a statement (or batch) of kind `key` about to go to the server.
    pub(crate) fn sent(&self, key: u64) -> Sent {
        Sent { at: Instant::now(), relayed: self.io.sent(), key }
    }

    /// Books a statement (or batch) `sent` whose ReadyForQuery came: the server answered,
    /// whatever the answer (an SQL error is the client's), so it counts as served, with its
    /// latency, for the engine's balancing and outlier check. Its time is also a sample for the
    /// server's adaptive limit (`Server::learn`), unless it `failed` (an error or a cancel
    /// ends a statement at any time: its time says nothing about the server's queue) or its
    /// answer was too large to have left without the client reading it.
    pub(crate) fn book(&self, sent: Sent, outcome: Outcome) {
        if let Some(b) = &self.bound {
            let took = sent.at.elapsed();
            b.server.book(took, true);
            let answered = self.io.sent() - sent.relayed;
            if outcome == Outcome::Ok && answered <= SAMPLE_MAX_RELAYED {
                b.server.learn(sent.key, took);
            }
            self.servers().observe_size(sent.key, answered, self.phase.tx(), outcome);
            if b.guard.path() == Path::Agent && b.server.agent.is_some() {
                self.shared.handover_metrics.handover_forwarded(b.server.member.member());
            }
        }
    }

    /// After ReadyForQuery: note a write, and in transaction mode release the connection when
    /// no transaction is open.
    pub(crate) async fn after_ready(&mut self, wrote: Wrote) -> Result<(), PgError> {
        if let Some(b) = self.bound.as_mut() {
            b.note_write(wrote);
        }
        if self.phase.tx() == TxStatus::Idle {
            self.unit_done();
        }
        if self.phase.tx() == TxStatus::Idle && self.pool_mode == PoolMode::Transaction && !self.keep_pinned().await {
            self.release().await;
        }
        Ok(())
    }
}

/// A statement whose answer to the client was larger than this (about a socket buffer) is no
/// sample for its server's limit: its time includes the client's reading of it.
const SAMPLE_MAX_RELAYED: u64 = 64 * 1024;

/// Whether an ErrorResponse frame is a FATAL or PANIC: the server ends the connection after it.
fn is_fatal(frame: &[u8]) -> bool {
    match BackendMessage::decode(b'E', frame.get(5..).unwrap_or_default()) {
        Ok(BackendMessage::ErrorResponse(e)) => matches!(e.severity(), Some("FATAL" | "PANIC")),
        _ => false,
    }
}
