//! One client session: reads its messages, routes each statement (or extended batch) to a
//! server connection bound for the statement or transaction, relays the answers verbatim,
//! and tracks the session state that has to follow the client from server to server.

pub(crate) mod batch;
pub(crate) mod bind;
pub(crate) mod extended;
pub(crate) mod handover;
pub(crate) mod held;
pub(crate) mod large;
pub(crate) mod listen;
pub(crate) mod names;
pub(crate) mod notify;
pub(crate) mod phase;
pub(crate) mod pin;
pub(crate) mod reset;
pub(crate) mod unreadable;

use self::held::Held;
use self::phase::{CopyDir, Event, Phase};
use super::error::PgError;
use super::shared::Shared;
use crate::admit::permit::Admitted;
use crate::client::cancel::CancelKey;
use crate::client::clients::{ClientInfo, ClientState, Registration};
use crate::client::login;
use crate::client::startup::startup_sets;
use crate::client::wire::{Frame, Incoming, Wire};
use crate::config::{PgRole, PoolMode};
use crate::server::pool::Guard;
use crate::server::servers::{metrics_name, Server};
use crate::server::sizes::Path;
use bytes::BytesMut;
use refract_pg::classify::{fingerprint, Classification, Route, Statement};
use refract_pg::frame::{self, Limits};
use refract_pg::hybrid;
use refract_pg::notice::sqlstate;
use refract_pg::session::SessionState;
use refract_pg::{reply, text, BackendMessage, FrontendMessage, Side, TxStatus};
use refract_vocab::RouteClass;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::net::TcpStream;

/// Flush relayed bytes to the client once this much is pending.
pub(super) const FLUSH_AT: usize = 64 * 1024;

/// A statement whose answer to the client was larger than this (about a socket buffer) is no
/// sample for its server's limit: its time includes the client's reading of it.
const SAMPLE_MAX_RELAYED: u64 = 64 * 1024;

/// When a statement (or batch) went to its server, for its sample at ReadyForQuery.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sent {
    at: Instant,
    /// The client wire's byte count then.
    relayed: u64,
    /// Its kind (`refract_pg::classify::fingerprint`).
    key: u64,
}

/// A server connection bound to the session.
#[derive(Debug)]
pub(super) struct Bound {
    pub guard: Guard,
    pub server: Arc<Server>,
    /// A write ran on the primary during this binding (read-your-writes needs its LSN).
    pub wrote: bool,
    /// The connection has been given this session's SET state (done once, at the first
    /// statement of the binding; after that only the session itself changes it).
    pub synced: bool,
    /// A tracked SET/RESET/DISCARD ran during this binding: the connection's applied state is
    /// the session's when the binding ends.
    pub touched: bool,
    /// Something changed parameters refract does not track (an extended-protocol SET, a
    /// ParameterStatus after a non-SET statement): the next client starts with `RESET ALL`.
    pub untracked: bool,
    /// The admission permit of the unit of work running on it (`admit.rs`); `None` between
    /// units of a session that keeps its connection (session mode, pinned).
    pub(super) admitted: Option<Admitted>,
}

/// Read-your-writes on one shard (or the one cluster).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Floor {
    /// Reads need a replica past this WAL position.
    pub min_lsn: Option<u64>,
    /// A write committed and the primary's WAL position has not been polled since; its
    /// position is that of the first poll with this sequence number or later.
    pub pending_write: Option<u64>,
}

/// A client session.
pub(super) struct Session {
    pub shared: Arc<Shared>,
    pub wire: Wire,
    /// Bytes to the client not yet written.
    pub out: BytesMut,
    pub state: SessionState,
    pub(super) key: CancelKey,
    pub bound: Option<Bound>,
    /// Read-your-writes, per shard (one entry when the cluster is not sharded).
    pub(super) floors: Vec<Floor>,
    /// The shard the bound connection (or the next binding) is on; 0 when not sharded.
    pub(super) shard: usize,
    /// Sharded: the client's BEGIN, held until its first statement names the shard.
    pub(super) held_begin: Option<String>,
    /// Sharded: the BEGIN of the open transaction, for each further shard it reaches.
    pub(super) tx_begin: Option<String>,
    /// Sharded: the transaction's connections on its other shards (two-phase commit).
    pub(super) parked: Vec<(usize, Bound)>,
    /// Sharded: `SET refract.shard`, the shard every statement goes to (`sharding/overrides.rs`).
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
    /// After a hand-over: the messages the agent delivered to the client itself (rows left
    /// out), read before the server's next ones; while it is set, nothing goes to the client
    /// (`handover.rs`).
    replay: Option<BytesMut>,
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
        wire,
        out: BytesMut::new(),
        state,
        key: logged.key,
        bound: None,
        floors,
        shard: 0,
        held_begin: None,
        tx_begin: None,
        parked: vec![],
        shard_override: None,
        batch: vec![],
        phase: Phase::default(),
        pool_mode,
        client,
        held: Held::default(),
        replay: None,
    };
    match s.serve().await {
        Ok(()) => s.give_back().await,
        Err(PgError::Closed(Side::Client)) => {}
        Err(e) => {
            tracing::debug!(error = %e, "postgres session ended");
            if e.side() == Side::Client {
                let _ = s.wire.send(&login::protocol_error(&e.to_string())).await;
            }
        }
    }
    s.wire.close().await;
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
                    self.large_bind(h).await?;
                    continue;
                }
                Err(PgError::Closed(Side::Client)) => return Ok(()),
                Err(e) => return Err(e),
            };
            if matches!(tag, b'Q' | b'S' | b'H') {
                self.client.info.set_state(ClientState::Active);
            }
            let msg = FrontendMessage::decode(tag, &frame[5..])?;
            if self.phase.discarding() {
                if tag == b'S' {
                    self.advance(Event::ClientSync);
                    self.wire.send(&reply::ready_for_query(self.phase.tx())).await?;
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
                    self.client.info.set_state(ClientState::Active);
                    self.function_call(frame).await?
                }
                _ => {
                    let code = sqlstate::FEATURE_NOT_SUPPORTED;
                    let text = format!("refract does not relay message type '{}'", char::from(tag));
                    self.wire.send(&reply::error(code, &text)).await?;
                    self.wire.send(&reply::ready_for_query(self.phase.tx())).await?;
                }
            }
        }
    }

    /// Pipelined messages without a Sync or Flush, and the client sends nothing more: it may be
    /// waiting for an error, which PostgreSQL sends at once (it runs each message as it
    /// arrives and flushes errors). refract runs what it holds with a Flush of its own, on the
    /// primary (the rest of the pipeline, a write perhaps, must find its transaction there).
    async fn pipeline_flush(&mut self) -> Result<(), PgError> {
        self.batch.push(FrontendMessage::Flush);
        self.held.quiet_flush = true;
        let result = self.run_batch().await;
        self.held.quiet_flush = false;
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

    /// A simple Query: classify, maybe answer locally, else bind, prepare the server, relay.
    async fn simple(&mut self, sql: &str, frame: bytes::Bytes) -> Result<(), PgError> {
        let c = self.shared.classifier.classify(sql);
        self.state.prepared.close(""); // a simple query drops the unnamed statement
        if self.answer_locally(&c).await? || self.answer_listen(&c.statements).await? {
            return Ok(());
        }
        self.note_state(&c);
        if let Some(sh) = self.shared.sharding.clone() {
            return self.simple_sharded(&sh, sql, frame, &c).await;
        }
        let route = self.route(&c);
        let key = fingerprint(sql);
        if let Err(e) = self.bind(route, Some(key), &c.tables).await {
            return self.refuse(e, true).await;
        }
        let result = self.run_simple(&c, frame, route, key).await;
        self.settle(result).await
    }

    /// A FunctionCall (`F`: libpq's fast path, as its large-object API and `PQfn` use it):
    /// relayed to the primary as a statement that writes, answered by its FunctionCallResponse
    /// and ReadyForQuery. The function may leave session state (a large-object descriptor
    /// lives until its transaction ends, a function may set a parameter): the connection is
    /// checked when the transaction ends, as after `DO`, and pins the client while state lasts.
    async fn function_call(&mut self, frame: bytes::Bytes) -> Result<(), PgError> {
        let c = Classification {
            route: Route::Write,
            statements: vec![Statement::Write],
            hint: None,
            parse_error: None,
            stateful: true,
            set_config: false,
            nested_executes: vec![],
            changes_schema: false,
            tables: vec![],
        };
        self.note_state(&c);
        let key = fingerprint("refract: FunctionCall");
        if let Err(e) = self.bind(Route::Write, Some(key), &[]).await {
            return self.refuse(e, true).await;
        }
        let result = self.run_simple(&c, frame, Route::Write, key).await;
        self.settle(result).await
    }

    /// Runs a simple Query of kind `key` (its fingerprint) on the bound connection.
    pub(super) async fn run_simple(
        &mut self,
        c: &Classification,
        frame: bytes::Bytes,
        route: Route,
        key: u64,
    ) -> Result<(), PgError> {
        let in_tx_before = self.phase.in_transaction();
        let started = self.sent(key);
        let mut head = BytesMut::new();
        let mut prefixed = self.params_prefix(&mut head)?;
        let prepares =
            c.statements.iter().any(|s| {
                matches!(s, Statement::Prepare { .. } | Statement::Execute { .. } | Statement::Deallocate { .. })
            }) || !c.nested_executes.is_empty()
                || c.reads_prepared_statements()
                || self.state.prepared.has_sql()
                || !self.conn()?.sql_prepared.is_empty();
        if prefixed && prepares {
            // PREPARE resolves names with the session's search_path: SET first (also before
            // the client's SQL-level statements are put on the connection, `names`).
            self.conn()?.wire.send(&head).await?;
            self.drain_prefix().await?;
            head.clear();
            prefixed = false;
        }
        self.before_query(c).await?;
        if prefixed {
            head.extend_from_slice(&frame);
            self.conn()?.wire.send(&head).await?;
            self.drain_prefix().await?;
        } else {
            self.conn()?.wire.send(&frame).await?;
        }
        let sets = c
            .statements
            .iter()
            .any(|s| matches!(s, Statement::Set { .. } | Statement::Reset { .. } | Statement::Discard { .. }));
        let failed = self.relay_until_ready(!sets).await?;
        self.note_schema(c);
        if failed && sets {
            // Part of a multi-statement query may have committed its SETs: not tracked.
            self.note_untracked();
        }
        if !failed {
            self.statements_done(c, in_tx_before);
            self.note_effects(c)?;
        }
        self.sql_names_done(c, failed)?;
        let wrote = c.statements.iter().any(|s| matches!(s, Statement::Write | Statement::Execute { .. }));
        self.book(started, failed);
        self.after_ready(route == Route::Write && wrote).await
    }

    /// Records the statements of a query that succeeded. The transaction tracker only sees the
    /// query's final ReadyForQuery, so in a multi-statement query that opens or ends
    /// transactions (`BEGIN; SET ...; ROLLBACK`) the SETs are staged and committed or dropped
    /// here, statement by statement.
    fn statements_done(&mut self, c: &Classification, in_tx_before: bool) {
        let tx_control =
            c.statements.iter().any(|s| matches!(s, Statement::Begin { .. } | Statement::Commit | Statement::Rollback));
        if c.statements.len() < 2 || !tx_control {
            for st in &c.statements {
                self.state.statement_done(st, self.phase.in_transaction());
            }
            return;
        }
        let mut in_tx = in_tx_before;
        for st in &c.statements {
            match st {
                Statement::Begin { .. } => in_tx = true,
                Statement::Commit | Statement::Rollback => {
                    self.state.params.end_transaction(matches!(st, Statement::Commit));
                    in_tx = false;
                }
                Statement::Set { .. } | Statement::Reset { .. } => self.state.params.apply(st, in_tx),
                Statement::Discard { all: true } => {
                    self.state.prepared.clear();
                    self.state.params.apply(st, in_tx);
                }
                _ => self.state.statement_done(st, self.phase.in_transaction()),
            }
        }
    }

    /// Ends a server conversation: a server failure costs the client its statement (and
    /// transaction), not its session; a client failure ends the session. The server stays up:
    /// one connection ending (`pg_terminate_backend`, `idle_in_transaction_session_timeout`, a
    /// broken socket) says nothing of the others, and a server that is really gone fails the
    /// next connect or probe, which mark it down. A connection the server ended with a FATAL
    /// of its own is not a failure of the server either (for ejection).
    pub(super) async fn settle(&mut self, result: Result<(), PgError>) -> Result<(), PgError> {
        let Err(e) = result else { return Ok(()) };
        if e.side() == Side::Client {
            return Err(e);
        }
        tracing::warn!(error = %e, "postgres server conversation failed");
        self.shared.metrics.error("pg_server");
        if let Some(b) = self.bound.take() {
            if !b.guard.ended_by_server {
                self.servers().failed(&b.server);
            }
            drop(b.guard); // not released: its state is unknown
        }
        // A transaction's other shards: dropped, so their servers roll back.
        self.parked.clear();
        self.tx_begin = None;
        self.client.info.set_bound(None);
        self.key.set(None);
        if self.pool_mode == PoolMode::Session || self.held.pinned() {
            // The session's server-side state (temp tables, locks, cursors) is gone with the
            // connection: end the client session too, as PostgreSQL would, not silently go on.
            let message = format!("refract: the server connection of this session failed: {e}");
            let _ = self.flush().await;
            let _ = self.wire.send(&reply::fatal(sqlstate::CONNECTION_FAILURE, &message)).await;
            return Err(PgError::Closed(Side::Backend));
        }
        self.advance(Event::ServerLost);
        self.state.params.end_transaction(false);
        self.out.extend_from_slice(&reply::error(sqlstate::CONNECTION_FAILURE, &format!("refract: {e}")));
        self.out.extend_from_slice(&reply::ready_for_query(TxStatus::Idle));
        self.flush().await
    }

    /// `SET refract.route` and a lone `DEALLOCATE` are answered without a server.
    async fn answer_locally(&mut self, c: &Classification) -> Result<bool, PgError> {
        let tag = match c.statements.as_slice() {
            [Statement::RouteSetting(_)] => "SET",
            [Statement::Deallocate { name: Some(n) }]
                if self.bound.is_none() && self.state.prepared.get(n).is_some() =>
            {
                "DEALLOCATE"
            }
            [Statement::Deallocate { name: None }] if self.bound.is_none() => "DEALLOCATE ALL",
            _ => return Ok(false),
        };
        self.state.statement_done(&c.statements[0], self.phase.in_transaction());
        self.out.extend_from_slice(&BackendMessage::CommandComplete(tag.into()).to_bytes());
        self.out.extend_from_slice(&reply::ready_for_query(self.phase.tx()));
        self.flush().await?;
        Ok(true)
    }

    /// Where a classified query goes: `EXECUTE` of a prepared write makes it a write.
    pub(super) fn route(&self, c: &Classification) -> Route {
        let mut route = c.target(self.state.route);
        for name in c.executes() {
            if !self.state.prepared.get(name).is_some_and(|p| p.read) && c.hint.is_none() {
                route = Route::Write;
            }
        }
        route
    }

    /// Binds a server connection for `route` unless one is bound already; the statement or
    /// batch it is for is of kind `key` (a fingerprint; `None`: not known), which chooses the
    /// connection's kind ([`Session::path_for`]), and names `tables` (a read goes to a server
    /// that holds them all: `partial.rs`; none or not known: a server that holds everything).
    pub(super) async fn bind(&mut self, route: Route, key: Option<u64>, tables: &[String]) -> Result<(), PgError> {
        if self.bound.is_some() {
            if route != Route::Write || !self.may_leave_replica() {
                return self.admit_bound().await;
            }
            self.leave_replica().await?;
        }
        let path = self.path_for(key);
        let servers = self.servers().clone();
        let session_mode = self.pool_mode == PoolMode::Session;
        let candidates: Vec<Arc<Server>> = if session_mode || route == Route::Write {
            servers.primary().into_iter().collect()
        } else {
            let mut v = match self.replica_floor() {
                Some(min) => servers.replicas_for_read(min, tables),
                None => vec![],
            };
            v.extend(servers.primary());
            v
        };
        if candidates.is_empty() {
            let what = if route == Route::Write || session_mode {
                "no primary server is available: writes are refused (reads go on on replicas)"
            } else {
                "no server is available"
            };
            return Err(PgError::Unavailable(format!("refract: {what}")));
        }
        let mut last = None;
        let mut rest = candidates;
        while !rest.is_empty() {
            // Admission first: a unit that is refused or must wait holds no connection.
            let (server, admitted) = self.admit(&rest).await?;
            rest.retain(|s| !Arc::ptr_eq(s, &server));
            match server.pool.get(path).await {
                Ok(guard) => {
                    self.key.set(Some(guard.key.clone()));
                    let class = if route == Route::Read { RouteClass::Read } else { RouteClass::Write };
                    server.member.counters.request(class);
                    self.client.info.set_bound(Some(server.index));
                    let admitted = Some(admitted);
                    let b = Bound {
                        guard,
                        server,
                        wrote: false,
                        synced: false,
                        touched: false,
                        untracked: false,
                        admitted,
                    };
                    self.bound = Some(b);
                    return Ok(());
                }
                Err(e) => {
                    if matches!(e, PgError::Io { .. } | PgError::Closed(_) | PgError::Server(_)) {
                        server.mark_down();
                    }
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| PgError::Unavailable("refract: no server is available".into())))
    }

    /// The kind of connection a statement of kind `key` binds: straight to the server when
    /// hybrid knows the kind answers small, else through the server's agent (if it has one).
    /// In session mode the connection serves the whole session: through the agent.
    fn path_for(&self, key: Option<u64>) -> Path {
        match key {
            Some(key) if self.pool_mode == PoolMode::Transaction => self.servers().path_for(key),
            _ => Path::Agent,
        }
    }

    /// Read-your-writes: the WAL position a replica must have replayed to serve this session's
    /// reads (`Some(None)`: any replica); `None` while the position of its last write is not
    /// known yet (no primary poll since it committed): the primary serves.
    fn replica_floor(&mut self) -> Option<Option<u64>> {
        if !self.shared.cfg.read_your_writes {
            return Some(None);
        }
        let servers = self.servers().clone();
        let floor = &mut self.floors[self.shard];
        if let Some(seq) = floor.pending_write {
            let lsn = servers.primary_lsn_since(seq);
            if lsn.is_none() {
                servers.want_fresh_lsn();
                return None;
            }
            floor.min_lsn = floor.min_lsn.max(lsn);
            floor.pending_write = None;
        }
        Some(floor.min_lsn)
    }

    /// Tells the client refract could not run its statement (ErrorResponse, then
    /// ReadyForQuery if it synced).
    pub(super) async fn refuse(&mut self, e: PgError, synced: bool) -> Result<(), PgError> {
        let (code, kind) = match e {
            PgError::Timeout(_) => (sqlstate::TOO_MANY_CONNECTIONS, "pg_unavailable"),
            // Counted as the HTTP path counts its refusals.
            PgError::Refused { sqlstate, .. } => (sqlstate, "overloaded"),
            _ => (sqlstate::CONNECTION_FAILURE, "pg_unavailable"),
        };
        self.shared.metrics.error(kind);
        self.out.extend_from_slice(&reply::error(code, &e.to_string()));
        self.advance(Event::Refused { synced });
        if synced {
            self.out.extend_from_slice(&reply::ready_for_query(self.phase.tx()));
        }
        self.flush().await
    }

    /// The bound server connection.
    pub(super) fn conn(&mut self) -> Result<&mut Guard, PgError> {
        match self.bound.as_mut() {
            Some(b) => Ok(&mut b.guard),
            None => Err(PgError::Unavailable("internal: no server bound".into())),
        }
    }

    /// At the first statement of a binding: appends to `out` a Query with the SET/RESET
    /// statements that give the bound connection this session's parameters (only those that
    /// differ from what it carries), to be sent in the same write as the client's message;
    /// returns whether it did (then [`Session::drain_prefix`] must consume the answers).
    pub(super) fn params_prefix(&mut self, out: &mut BytesMut) -> Result<bool, PgError> {
        let Some(b) = self.bound.as_mut() else {
            return Err(PgError::Unavailable("internal: no server bound".into()));
        };
        if b.synced {
            return Ok(false);
        }
        b.synced = true;
        let params = &self.state.params;
        let Some(sql) = b.guard.params_sql(params) else { return Ok(false) };
        b.guard.unnamed = None; // dropped by the SET query
        b.guard.applied = Some(params.params().map(|(n, t)| (n.to_owned(), t.to_owned())).collect());
        FrontendMessage::Query(sql).encode(out);
        Ok(true)
    }

    /// Consumes (and drops) the answers to a [`Session::params_prefix`] Query, up to its
    /// ReadyForQuery. A failure leaves the connection's parameters unknown.
    pub(super) async fn drain_prefix(&mut self) -> Result<(), PgError> {
        loop {
            let (tag, frame) = self.server_frame().await?;
            match tag {
                b'Z' => return Ok(()),
                b'E' => {
                    let e = BackendMessage::decode(tag, &frame[5..]).ok();
                    tracing::debug!(error = ?e, "replaying SET state failed");
                    self.conn()?.applied = None;
                }
                _ => {}
            }
        }
    }

    /// After a statement succeeded: what it did to the server connection.
    fn note_effects(&mut self, c: &Classification) -> Result<(), PgError> {
        let Some(b) = self.bound.as_mut() else {
            return Err(PgError::Unavailable("internal: no server bound".into()));
        };
        if c.statements.iter().any(|st| self.state.params.resets_startup(st)) {
            resync_startup(b);
        }
        let conn = &mut *b.guard;
        for st in &c.statements {
            match st {
                Statement::Set { .. } | Statement::Reset { .. } | Statement::Discard { all: false } => b.touched = true,
                Statement::Discard { all: true } | Statement::Deallocate { name: None } => {
                    b.touched = true;
                    conn.prepared.clear();
                    conn.sql_prepared.clear();
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// A ParameterStatus came that no tracked SET explains: the connection's parameters are
    /// not (only) what refract knows of.
    pub(super) fn note_untracked(&mut self) {
        if let Some(b) = self.bound.as_mut() {
            b.untracked = true;
        }
    }

    /// Relays the server's answers until ReadyForQuery; returns whether an error came.
    /// `untracked_status`: a ParameterStatus means an untracked parameter change.
    async fn relay_until_ready(&mut self, untracked_status: bool) -> Result<bool, PgError> {
        let mut failed = false;
        loop {
            let (tag, frame) = self.server_frame().await?;
            self.note_copy(tag);
            match tag {
                hybrid::WANT => {
                    self.at_want(self.held.failed_prepares.is_empty()).await?;
                    continue;
                }
                b'E' => {
                    failed = true;
                    self.advance(Event::QueryError);
                    if let Some(error) = self.prepare_error_for(&frame) {
                        self.out.extend_from_slice(&error);
                        continue;
                    }
                }
                b'S' if untracked_status => self.note_untracked(),
                b'C' | b'Z' => self.observe(tag, &frame, false)?,
                b'G' => {
                    self.out.extend_from_slice(&frame);
                    self.flush().await?;
                    self.copy_in().await?;
                    continue;
                }
                _ => {}
            }
            self.out.extend_from_slice(&frame);
            if tag == b'Z' {
                self.flush().await?;
                return Ok(failed);
            }
            if self.out.len() >= FLUSH_AT {
                self.flush().await?;
            }
        }
    }

    /// Feeds CommandComplete / ReadyForQuery to the phase; `sync`: a ReadyForQuery answers
    /// a Sync (else a simple Query). Called before the message is added to `out`.
    pub(super) fn observe(&mut self, tag: u8, frame: &[u8], sync: bool) -> Result<(), PgError> {
        match BackendMessage::decode(tag, &frame[5..])? {
            BackendMessage::CommandComplete(tag) => self.advance(Event::Completed(&tag)),
            BackendMessage::ReadyForQuery(status) if sync => self.advance(Event::Synced(status)),
            BackendMessage::ReadyForQuery(status) => self.advance(Event::Ready(status)),
            _ => {}
        }
        if tag == b'Z' {
            self.client.info.set_state(self.ready_state());
            if self.held.schema_changed && self.phase.tx() == TxStatus::Idle {
                // Its transaction ended: Parses from now on see what it committed (or not).
                self.held.schema_changed = false;
                self.shared.new_schema_epoch();
            }
            self.note_ready();
        }
        Ok(())
    }

    /// A statement ran (or tried to) that may have changed the schema: server statements
    /// prepared before it are not reused for Parses after it, nor after its transaction ends.
    pub(super) fn note_schema(&mut self, c: &Classification) {
        if c.changes_schema {
            self.shared.new_schema_epoch();
            self.held.schema_changed = true;
        }
    }

    /// Feeds the server's COPY OUT / COPY BOTH start and its CopyDone to the phase (COPY IN
    /// is `copy_in`'s).
    pub(super) fn note_copy(&mut self, tag: u8) {
        match tag {
            b'H' => self.advance(Event::CopyStart(CopyDir::Out)),
            b'W' => self.advance(Event::CopyStart(CopyDir::Both)),
            b'c' => self.advance(Event::CopyEnd),
            _ => {}
        }
    }

    /// After a hand-over: what the agent delivered is read next, muted.
    pub(super) fn replay_delivered(&mut self, delivered: bytes::Bytes) {
        self.replay = Some(BytesMut::from(&delivered[..]));
    }

    /// The next message from the bound server; flushes to the client before waiting.
    pub(super) async fn server_frame(&mut self) -> Result<Frame, PgError> {
        if let Some(r) = self.replay.as_mut() {
            if let Some(h) = frame::peek(r, Side::Backend, &Limits::default())? {
                return Ok((h.tag, r.split_to(h.total).freeze()));
            }
            // What was gathered for the client meanwhile, it has from the agent.
            self.replay = None;
            self.out.clear();
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
            if !self.stream_from_server().await? {
                self.conn()?.wire.fill().await?;
            }
        }
    }

    /// COPY FROM STDIN: the client's CopyData go to the server until CopyDone or CopyFail.
    pub(super) async fn copy_in(&mut self) -> Result<(), PgError> {
        self.advance(Event::CopyStart(CopyDir::In));
        let mut buf = BytesMut::new();
        loop {
            let Some((tag, frame)) = self.wire.next_frame()? else {
                if !buf.is_empty() {
                    self.conn()?.wire.send(&buf).await?;
                    buf.clear();
                }
                if !self.stream_to_server().await? {
                    self.wire.fill().await?;
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
    pub(super) async fn flush(&mut self) -> Result<(), PgError> {
        if let Some(r) = &self.replay {
            // Replaying what the agent delivered: the client has it.
            if r.is_empty() {
                self.replay = None;
            }
            self.out.clear();
            self.held.ready_at = None; // its notifications stay queued for later
            return Ok(());
        }
        self.notifications_before_ready().await;
        if !self.out.is_empty() {
            self.wire.send(&self.out).await?;
            self.out.clear();
            if self.out.capacity() > crate::client::wire::KEEP_CAPACITY {
                self.out = BytesMut::new(); // grown for one large message: give it back
            }
        }
        Ok(())
    }

    /// Marks a statement (or batch) of kind `key` about to go to the server.
    pub(super) fn sent(&self, key: u64) -> Sent {
        Sent { at: Instant::now(), relayed: self.wire.sent(), key }
    }

    /// Books a statement (or batch) `sent` whose ReadyForQuery came: the server answered,
    /// whatever the answer (an SQL error is the client's), so it counts as served, with its
    /// latency, for the engine's balancing and outlier check. Its time is also a sample for the
    /// server's adaptive limit (`Server::learn`), unless it `failed` (an error or a cancel
    /// ends a statement at any time: its time says nothing about the server's queue) or its
    /// answer was too large to have left without the client reading it.
    pub(super) fn book(&self, sent: Sent, failed: bool) {
        if let Some(b) = &self.bound {
            let took = sent.at.elapsed();
            b.server.book(took, true);
            let answered = self.wire.sent() - sent.relayed;
            if !failed && answered <= SAMPLE_MAX_RELAYED {
                b.server.learn(sent.key, took);
            }
            let left_open = self.phase.tx() != TxStatus::Idle;
            self.servers().observe_size(sent.key, answered, left_open, failed);
            if b.guard.path() == Path::Agent && b.server.agent.is_some() {
                self.shared.handover_metrics.handover_forwarded(&metrics_name(&b.server.name));
            }
        }
    }

    /// After ReadyForQuery: note a write, and in transaction mode release the connection when
    /// no transaction is open.
    pub(super) async fn after_ready(&mut self, wrote: bool) -> Result<(), PgError> {
        if let Some(b) = self.bound.as_mut() {
            b.wrote |= wrote && b.server.role == PgRole::Primary;
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

/// Whether an ErrorResponse frame is a FATAL or PANIC: the server ends the connection after it.
fn is_fatal(frame: &[u8]) -> bool {
    match BackendMessage::decode(b'E', frame.get(5..).unwrap_or_default()) {
        Ok(BackendMessage::ErrorResponse(e)) => matches!(e.severity(), Some("FATAL" | "PANIC")),
        _ => false,
    }
}

/// A RESET of a startup parameter ran on the connection: the server went back to the
/// connection's own startup value, so the client's SETs are applied again (`RESET ALL` and
/// them) before its next statement on it, and its next client starts with `RESET ALL` too.
pub(super) fn resync_startup(b: &mut Bound) {
    b.synced = false;
    b.untracked = true;
    b.guard.applied = None;
}
