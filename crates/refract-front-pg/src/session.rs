//! One client session: reads its messages, routes each statement (or extended batch) to a
//! server connection bound for the statement or transaction, relays the answers verbatim,
//! and tracks the session state that has to follow the client from server to server.
//!
//! # Layout
//! - this file: [`Session`] (what a client session holds) and its message loop.
//! - `simple`: simple queries and the FunctionCall fast path; `batch`: extended-protocol
//!   batches, rewritten for per-server prepared statements; `bind`: large Bind messages
//!   relayed in pieces; `extended`: SETs run through the extended protocol.
//! - `client_io`: the client side (its connection, the bytes gathered for it, a hand-over's
//!   replay).
//! - `bound`: the server connection the session is bound to, and binding one; `relay`: the
//!   server's answers relayed up to ReadyForQuery (COPY too), the sample booked.
//! - `phase`: where the session stands in the protocol (one transition function).
//! - `held`: the session state refract keeps (pins, LISTEN channels, SETs); `pin`: pinning a
//!   transaction-mode client while that state lasts; `reset`: giving the connection back.
//! - `names`: the unnamed statement and SQL-prepared names on shared connections.
//! - `listen`: a client's LISTEN/UNLISTEN answered by refract; `notify`: the one listener
//!   connection to the primary in transaction mode.
//! - `large`: large DataRow / CopyData relayed in pieces (by `Bound`); `unreadable`: text
//!   that is not UTF-8.
//! - `handover`: a large result written to the client by the server's agent.

pub(crate) mod batch;
pub(crate) mod bind;
mod bound;
pub(crate) mod client_io;
pub(crate) mod extended;
pub(crate) mod handover;
pub(crate) mod held;
pub(crate) mod large;
pub(crate) mod listen;
pub(crate) mod names;
pub(crate) mod notify;
pub(crate) mod phase;
pub(crate) mod pin;
mod relay;
pub(crate) mod reset;
mod simple;
pub(crate) mod unreadable;

pub(crate) use bound::{Bound, Floor, ParamSync, Wrote};

use self::client_io::ClientIo;
use self::held::{BatchStart, Held};
use self::phase::{Event, Phase};
use super::error::PgError;
use crate::client::cancel::CancelKey;
use crate::client::clients::{ClientInfo, ClientState, Registration};
use crate::client::login;
use crate::client::startup::startup_sets;
use crate::client::wire::{Incoming, Wire};
use crate::config::PoolMode;
use crate::sharding::tx::{self, ShardTx};
use crate::Shared;
use refract_pg::notice::sqlstate;
use refract_pg::session::SessionState;
use refract_pg::{reply, text, FrontendMessage, Side, TxStatus};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::net::TcpStream;

/// Flush relayed bytes to the client once this much is pending.
pub(super) const FLUSH_AT: usize = 64 * 1024;

/// A client session.
pub(super) struct Session {
    pub shared: Arc<Shared>,
    /// The client's connection and what goes to it.
    pub io: ClientIo,
    pub state: SessionState,
    pub(super) key: CancelKey,
    pub bound: Option<Bound>,
    /// Read-your-writes, per shard (one entry when the cluster is not sharded).
    pub(super) floors: Vec<Floor>,
    /// The shard the bound connection (or the next binding) is on; 0 when not sharded.
    pub(super) shard: usize,
    /// Sharded: the BEGIN held until a statement names the shard, and the one each further
    /// shard is begun with: changed only by [`Session::shard_tx_on`].
    shard_tx: ShardTx,
    /// Sharded: the transaction's connections on its other shards (two-phase commit). Beside
    /// `shard_tx`, not in it: connections the I/O borrows across awaits, whatever the BEGIN state.
    pub(super) parked: Vec<(usize, Bound)>,
    /// Sharded: `SET refract.shard`, the shard every statement goes to (`sharding/overrides.rs`).
    /// Not part of `shard_tx`: a session setting that outlives transactions (only `SET`,
    /// `RESET` and `DISCARD ALL` change it, never a BEGIN or a transaction's end).
    pub(super) shard_override: Option<usize>,
    /// Extended-protocol messages waiting for Sync or Flush.
    pub batch: Vec<FrontendMessage>,
    /// Where the session stands in the protocol: changed only by [`Session::advance`].
    phase: Phase,
    /// This client's pool mode (its user's, else `[postgres] pool_mode`).
    pub(super) pool_mode: PoolMode,
    /// Its entry in the admin views.
    pub(super) client: Registration,
    /// Session state refract keeps for it (pinning, LISTEN channels, extended-protocol SETs).
    pub(super) held: Held,
}

/// How long pipelined messages wait for the client's next one before refract runs them
/// (`Session::pipeline_flush`).
const PIPELINE_QUIET: std::time::Duration = std::time::Duration::from_millis(50);

/// Serves one client connection to its end.
pub async fn run(shared: Arc<Shared>, stream: TcpStream, peer: SocketAddr) {
    let mut wire = Wire::new(stream, Side::Client);
    let Some(logged) = login::login(&shared, &mut wire).await else {
        wire.close().await;
        return;
    };
    let mut state = SessionState::new();
    state.prepared.follow_epoch(shared.schema_epoch.clone());
    for (name, text) in startup_sets(&logged.startup) {
        state.params.set_startup(&name, &text);
    }
    let id = shared.next_client.fetch_add(1, Ordering::Relaxed);
    let user = logged.startup.user().unwrap_or_default();
    let pool_mode = shared.cfg.user(user).map_or(shared.cfg.pool_mode, |u| u.pool_mode);
    let database = logged.startup.database().unwrap_or_default();
    let info = ClientInfo::new(id, user, database, Some(peer), pool_mode, wire.is_tls());
    let client = shared.clients.register(info);
    let floors = vec![Floor::default(); shared.shards.len()];
    let mut s = Session {
        shared,
        io: ClientIo::new(wire),
        state,
        key: logged.key,
        bound: None,
        floors,
        shard: 0,
        shard_tx: ShardTx::Idle,
        parked: vec![],
        shard_override: None,
        batch: vec![],
        phase: Phase::default(),
        pool_mode,
        client,
        held: Held::default(),
    };
    match s.serve().await {
        Ok(()) => s.give_back().await,
        Err(PgError::Closed(Side::Client)) => {}
        Err(e) => {
            tracing::debug!(error = %e, "postgres session ended");
            if e.side() == Side::Client {
                let _ = s.io.wire.send(&login::protocol_error(&e.to_string())).await;
            }
        }
    }
    s.io.wire.close().await;
}

impl Session {
    /// The message loop; `Ok` when the client left between messages (Terminate or close), so
    /// that a session-mode connection is in a known state and may go back to the pool.
    async fn serve(&mut self) -> Result<(), PgError> {
        loop {
            self.client.info.set_state(self.ready_state());
            let incoming = if self.batch.is_empty() {
                self.recv_client().await
            } else {
                match tokio::time::timeout(PIPELINE_QUIET, self.recv_client()).await {
                    Ok(incoming) => incoming,
                    Err(_) => {
                        self.pipeline_flush().await?;
                        continue;
                    }
                }
            };
            let (tag, frame) = match incoming {
                Ok(Incoming::Whole(f)) => f,
                Ok(Incoming::Large(h)) => {
                    self.client.info.set_state(ClientState::Active);
                    self.key.started();
                    self.large_bind(h).await?;
                    continue;
                }
                Err(PgError::Closed(Side::Client)) => return Ok(()),
                Err(e) => return Err(e),
            };
            if matches!(tag, b'Q' | b'S' | b'H' | b'F') {
                self.client.info.set_state(ClientState::Active);
                self.key.started(); // a cancel from now on is for this request
            }
            let msg = FrontendMessage::decode(tag, &frame[5..])?;
            if self.phase.discarding() {
                if tag == b'S' {
                    self.advance(Event::ClientSync);
                    self.io.wire.send(&reply::ready_for_query(self.phase.tx())).await?;
                }
                continue;
            }
            match msg {
                FrontendMessage::Query(sql) if text::is_raw(&sql) => self.simple_unreadable(&sql, frame).await?,
                FrontendMessage::Query(sql) => self.simple(&sql, frame).await?,
                FrontendMessage::Sync | FrontendMessage::Flush => {
                    self.batch.push(msg);
                    self.run_batch().await?;
                }
                FrontendMessage::Parse { .. }
                | FrontendMessage::Bind(_)
                | FrontendMessage::Describe(..)
                | FrontendMessage::Execute { .. }
                | FrontendMessage::Close(..) => self.batch.push(msg),
                FrontendMessage::Terminate => return Ok(()),
                // Outside COPY, PostgreSQL ignores these too.
                FrontendMessage::CopyData(_) | FrontendMessage::CopyDone | FrontendMessage::CopyFail(_) => {}
                FrontendMessage::Unknown { tag: b'F', .. } if self.shared.sharding.is_none() => {
                    self.function_call(frame).await?
                }
                _ => {
                    let code = sqlstate::FEATURE_NOT_SUPPORTED;
                    let text = format!("refract does not relay message type '{}'", char::from(tag));
                    self.io.wire.send(&reply::error(code, &text)).await?;
                    self.io.wire.send(&reply::ready_for_query(self.phase.tx())).await?;
                }
            }
            if matches!(tag, b'Q' | b'S' | b'F') {
                self.key.finished(); // answered, by a server or by refract
            }
        }
    }

    /// Pipelined messages without a Sync or Flush, and the client sends nothing more: it may be
    /// waiting for an error, which PostgreSQL sends at once (it runs each message as it
    /// arrives and flushes errors). refract runs what it holds with a Flush of its own, on the
    /// primary (the rest of the pipeline, a write perhaps, must find its transaction there).
    async fn pipeline_flush(&mut self) -> Result<(), PgError> {
        self.batch.push(FrontendMessage::Flush);
        self.key.started();
        self.held.batch_start = BatchStart::QuietTime;
        let result = self.run_batch().await;
        self.held.batch_start = BatchStart::Client;
        result
    }

    /// The servers of the shard this session binds on (of the cluster when not sharded).
    pub(super) fn servers(&self) -> &Arc<crate::server::servers::Servers> {
        self.shared.shard_servers(self.shard)
    }

    /// Where the session stands in the protocol.
    pub(super) fn phase(&self) -> &Phase {
        &self.phase
    }

    /// A sharded session's transaction (what it begins where: `sharding/tx.rs`).
    pub(super) fn shard_tx(&self) -> &ShardTx {
        &self.shard_tx
    }

    /// The one place a sharded session's transaction changes: its transition for `event`.
    pub(super) fn shard_tx_on(&mut self, event: tx::Event) {
        self.shard_tx = std::mem::take(&mut self.shard_tx).on(event);
    }

    /// The one place the phase changes: its transition for `event`. A ReadyForQuery that
    /// ended a transaction commits or drops the SETs staged in it.
    pub(super) fn advance(&mut self, event: Event) {
        self.phase = self.phase.on(event);
        if let Some(ended) = self.phase.ended() {
            self.state.transaction(ended);
        }
    }

    /// What the admin views call this session between statements.
    fn ready_state(&self) -> ClientState {
        match self.phase.tx() {
            TxStatus::Idle => ClientState::Idle,
            TxStatus::InTransaction => ClientState::InTransaction,
            TxStatus::Failed => ClientState::FailedTransaction,
        }
    }
}
