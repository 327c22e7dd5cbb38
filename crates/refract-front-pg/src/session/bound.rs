//! [`Bound`]: the server connection a session is bound to, and binding one: the route of a
//! statement, the server and kind of connection it takes, the SETs replayed before it, and
//! the end of a failed server conversation. A binding's own state ([`Wrote`], [`ParamSync`],
//! what changed its parameters) changes only through [`Bound`]'s methods.

use super::phase::{BatchEnd, Event};
use super::Session;
use crate::admit::permit::Admitted;
use crate::config::{PgRole, PoolMode};
use crate::error::PgError;
use crate::server::pool::Guard;
use crate::server::servers::Server;
use crate::server::sizes::Path;
use crate::sharding::tx;
use bytes::BytesMut;
use refract_pg::classify::{Classification, Route, Statement};
use refract_pg::notice::{field, sqlstate, ErrorFields};
use refract_pg::session::ParamTracker;
use refract_pg::{reply, BackendMessage, FrontendMessage, Side, TxStatus};
use refract_vocab::RouteClass;
use std::sync::Arc;

/// A server connection bound to the session.
#[derive(Debug)]
pub(crate) struct Bound {
    pub guard: Guard,
    pub server: Arc<Server>,
    /// Whether a write ran on the primary during this binding (read-your-writes needs its LSN).
    pub(crate) wrote: Wrote,
    /// Whether the connection has been given this session's SET state (done once, at the first
    /// statement of the binding; after that only the session itself changes it).
    params: ParamSync,
    /// What ran during this binding that changed the connection's parameters.
    changes: ParamChanges,
    /// The admission permit of the unit of work running on it (`admit.rs`); `None` between
    /// units of a session that keeps its connection (session mode, pinned).
    pub(crate) admitted: Option<Admitted>,
}

/// Whether a statement (or the binding) wrote: a fact, for read-your-writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wrote {
    No,
    Yes,
}

/// Whether a binding's connection carries the session's SET state yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ParamSync {
    /// Not yet: the first statement of the binding sends the SETs that differ first.
    Pending,
    /// Given (or under way in the write of the client's message).
    Done,
}

/// What ran on a binding's connection that changed its parameters; it only ever goes up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ParamChanges {
    /// Nothing: the connection's applied state is what it was.
    None,
    /// A tracked SET/RESET/DISCARD: the connection's applied state is the session's when the
    /// binding ends.
    Tracked,
    /// Something changed parameters refract does not track (an extended-protocol SET, a
    /// ParameterStatus after a non-SET statement): the next client starts with `RESET ALL`.
    Untracked,
}

impl Bound {
    /// A binding of `guard` on `server`; `params`: whether the connection already carries the
    /// session's SET state.
    pub(crate) fn new(guard: Guard, server: Arc<Server>, admitted: Option<Admitted>, params: ParamSync) -> Bound {
        Bound { guard, server, wrote: Wrote::No, params, changes: ParamChanges::None, admitted }
    }

    /// The binding in a session's `bound`, which the caller knows is there.
    pub(crate) fn of(bound: &mut Option<Bound>) -> Result<&mut Bound, PgError> {
        bound.as_mut().ok_or_else(|| PgError::Unavailable("internal: no server bound".into()))
    }

    /// A statement that `wrote` ran: noted when it ran on the primary.
    pub(crate) fn note_write(&mut self, wrote: Wrote) {
        if wrote == Wrote::Yes && self.server.role == PgRole::Primary {
            self.wrote = Wrote::Yes;
        }
    }

    /// A tracked SET/RESET/DISCARD ran on the connection.
    pub(crate) fn touch(&mut self) {
        self.changes = self.changes.max(ParamChanges::Tracked);
    }

    /// Something changed the connection's parameters that refract does not track.
    pub(crate) fn untrack(&mut self) {
        self.changes = ParamChanges::Untracked;
    }

    /// A RESET of a startup parameter ran on the connection: the server went back to the
    /// connection's own startup value, so the client's SETs are applied again (`RESET ALL` and
    /// them) before its next statement on it, and its next client starts with `RESET ALL` too.
    pub(crate) fn resync_startup(&mut self) {
        self.params = ParamSync::Pending;
        self.changes = ParamChanges::Untracked;
        self.guard.applied = None;
    }

    /// At the first statement of the binding: appends to `out` a Query with the SET/RESET
    /// statements that give the connection the parameters `params` (only those that differ from
    /// what it carries); returns whether it did.
    fn params_prefix(&mut self, params: &ParamTracker, out: &mut BytesMut) -> bool {
        if self.params == ParamSync::Done {
            return false;
        }
        self.params = ParamSync::Done;
        let Some(sql) = self.guard.params_sql(params) else { return false };
        self.guard.unnamed = None; // dropped by the SET query
        self.guard.applied = Some(applied(params));
        FrontendMessage::Query(sql).encode(out);
        true
    }

    /// Gives the connection the session's SETs now, as their own round trip, before the first
    /// statement of the binding is sent: for a session whose replay may fail there
    /// ([`ParamTracker::replay_may_fail`]), so that its statement never runs without them.
    /// When the server refuses them, each is tried on its own (from the defaults) and the
    /// refused ones leave the session: a custom parameter whose prefix a library reserved in
    /// that server process with PostgreSQL's own warning (added to `notices`), as loading the
    /// library drops it on PostgreSQL; any other with the server's error, the statement's
    /// answer ([`PgError::Settings`]).
    async fn give_params(&mut self, params: &mut ParamTracker, notices: &mut BytesMut) -> Result<(), PgError> {
        self.params = ParamSync::Done;
        let Some(sql) = self.guard.params_sql(params) else { return Ok(()) };
        match self.guard.query(&sql).await {
            Ok(_) => {
                self.guard.applied = Some(applied(params));
                return Ok(());
            }
            Err(PgError::Server(_)) => self.guard.applied = None,
            Err(e) => return Err(e),
        }
        self.guard.query(refract_pg::session::BACK_TO_DEFAULTS).await?;
        let mut refused = None;
        for (name, text) in applied(params) {
            match self.guard.query(&text).await {
                Ok(_) => {}
                Err(PgError::Server(e)) => {
                    if params.reserved_placeholder(&e).is_some() {
                        notices.extend_from_slice(&placeholder_removed(&name));
                    } else {
                        refused.get_or_insert(e);
                    }
                    params.forget(&name);
                }
                Err(e) => return Err(e),
            }
        }
        self.guard.applied = Some(applied(params));
        refused.map_or(Ok(()), |e| Err(PgError::Settings(e)))
    }

    /// After a statement `c` succeeded: what it did to the connection (`params`: the session's
    /// SET state, which knows the RESETs that bring back a startup value).
    pub(crate) fn note_effects(&mut self, c: &Classification, params: &ParamTracker) {
        if c.statements.iter().any(|st| params.resets_startup(st)) {
            self.resync_startup();
        }
        for st in &c.statements {
            match st {
                Statement::Set { .. } | Statement::Reset { .. } | Statement::Discard { all: false } => self.touch(),
                Statement::Discard { all: true } | Statement::Deallocate { name: None } => {
                    self.touch();
                    let conn = &mut *self.guard;
                    conn.prepared.clear();
                    conn.sql_prepared.clear();
                }
                _ => {}
            }
        }
    }

    /// The binding ends: the connection goes back to its pool, noted with the SET state it
    /// carries now (`params`: the session's SET state, as for `note_applied`).
    pub(crate) fn release(mut self, params: &ParamTracker) {
        self.note_applied(params);
        self.guard.release();
    }

    /// At the binding's end: notes on the connection the SET state it carries now, `params`
    /// being the session's (not known after an untracked change).
    fn note_applied(&mut self, params: &ParamTracker) {
        match self.changes {
            ParamChanges::Untracked => self.guard.applied = None,
            ParamChanges::Tracked => self.guard.applied = Some(applied(params)),
            ParamChanges::None => {}
        }
    }
}

/// PostgreSQL's warning when a library reserves the prefix of a custom parameter the session
/// has set (`MarkGUCPrefixReserved`): the parameter is removed.
fn placeholder_removed(name: &str) -> bytes::Bytes {
    let prefix = name.split('.').next().unwrap_or(name);
    let warning =
        ErrorFields::new("WARNING", "42602", format!("invalid configuration parameter name \"{name}\", removing it"))
            .with(field::DETAIL, format!("\"{prefix}\" is now a reserved prefix."));
    BackendMessage::NoticeResponse(warning).to_bytes()
}

/// The parameters of `params` as a connection's record of what it carries.
fn applied(params: &ParamTracker) -> Vec<(String, String)> {
    params.params().map(|(n, t)| (n.to_owned(), t.to_owned())).collect()
}

/// Read-your-writes on one shard (or the one cluster).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Floor {
    /// Reads need a replica past this WAL position.
    pub min_lsn: Option<u64>,
    /// A write committed and the primary's WAL position has not been polled since; its
    /// position is that of the first poll with this sequence number or later.
    pub pending_write: Option<u64>,
}

impl Session {
    /// Ends a server conversation: a server failure costs the client its statement (and
    /// transaction), not its session; a client failure ends the session. The server stays up:
    /// one connection ending (`pg_terminate_backend`, `idle_in_transaction_session_timeout`, a
    /// broken socket) says nothing of the others, and a server that is really gone fails the
    /// next connect or probe, which mark it down. A connection the server ended with a FATAL
    /// of its own is not a failure of the server either (for ejection).
    pub(crate) async fn settle(&mut self, result: Result<(), PgError>) -> Result<(), PgError> {
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
        self.shard_tx_on(tx::Event::ServerLost);
        self.client.info.set_bound(None);
        self.key.set(None);
        if self.pool_mode == PoolMode::Session || self.held.pinned() {
            // The session's server-side state (temp tables, locks, cursors) is gone with the
            // connection: end the client session too, as PostgreSQL would, not silently go on.
            let message = format!("refract: the server connection of this session failed: {e}");
            let _ = self.flush().await;
            let _ = self.io.wire.send(&reply::fatal(sqlstate::CONNECTION_FAILURE, &message)).await;
            return Err(PgError::Closed(Side::Backend));
        }
        self.advance(Event::ServerLost);
        self.state.params.end_transaction(false);
        self.io.out.extend_from_slice(&reply::error(sqlstate::CONNECTION_FAILURE, &format!("refract: {e}")));
        self.io.out.extend_from_slice(&reply::ready_for_query(TxStatus::Idle));
        self.flush().await
    }

    /// Where a classified query goes: `EXECUTE` of a prepared write makes it a write.
    pub(crate) fn route(&self, c: &Classification) -> Route {
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
    pub(crate) async fn bind(
        &mut self,
        route: Route,
        key: Option<u64>,
        tables: &[String],
        affinity: Option<u64>,
    ) -> Result<(), PgError> {
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
                Some(min) => servers.replicas_for_read(min, tables, affinity),
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
        // A cancel while the statement waits (admission, a free connection) ends the wait.
        let waiter = self.key.waiter();
        match waiter.unless_cancelled(self.bind_one_of(candidates, path, route)).await {
            Some(bound) => bound,
            None => {
                self.client.info.set_bound(None);
                self.key.set(None);
                Err(PgError::Cancelled)
            }
        }
    }

    /// Binds the first of `candidates` that admits the statement and has a connection of kind
    /// `path`, giving it the session's SETs first when they may be refused there.
    async fn bind_one_of(&mut self, candidates: Vec<Arc<Server>>, path: Path, route: Route) -> Result<(), PgError> {
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
                    let mut b = Bound::new(guard, server, Some(admitted), ParamSync::Pending);
                    if self.state.params.replay_may_fail() {
                        if let Err(e) = b.give_params(&mut self.state.params, &mut self.io.out).await {
                            self.client.info.set_bound(None);
                            self.key.set(None);
                            if matches!(e, PgError::Settings(_)) {
                                b.release(&self.state.params); // at ReadyForQuery, parameters unknown
                            }
                            return Err(e);
                        }
                    }
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
    /// ReadyForQuery if it synced: `end`).
    pub(crate) async fn refuse(&mut self, e: PgError, end: BatchEnd) -> Result<(), PgError> {
        let (code, kind) = match e {
            PgError::Timeout(_) => (sqlstate::TOO_MANY_CONNECTIONS, "pg_unavailable"),
            // Counted as the HTTP path counts its refusals.
            PgError::Cancelled => (sqlstate::QUERY_CANCELED, "cancelled"),
            PgError::Refused { sqlstate, .. } => (sqlstate, "overloaded"),
            // The server refused the session's SETs on the connection bound for the statement
            // (`Bound::give_params`): its own error, which names what it refused.
            PgError::Settings(fields) => {
                self.shared.metrics.error("pg_settings");
                let context = "refract: the server connection for this statement refused a setting of this \
                               session; the statement did not run, and the setting is no longer the session's";
                let fields = fields.with(b'W', context);
                self.io.out.extend_from_slice(&BackendMessage::ErrorResponse(fields).to_bytes());
                return self.refused(end).await;
            }
            _ => (sqlstate::CONNECTION_FAILURE, "pg_unavailable"),
        };
        self.shared.metrics.error(kind);
        self.io.out.extend_from_slice(&reply::error(code, &e.to_string()));
        self.refused(end).await
    }

    /// After the refusal's ErrorResponse: the phase, and ReadyForQuery if the client synced.
    async fn refused(&mut self, end: BatchEnd) -> Result<(), PgError> {
        self.advance(Event::Refused { end });
        if end == BatchEnd::Sync {
            self.io.out.extend_from_slice(&reply::ready_for_query(self.phase.tx()));
        }
        self.flush().await
    }

    /// The bound server connection.
    pub(crate) fn conn(&mut self) -> Result<&mut Guard, PgError> {
        match self.bound.as_mut() {
            Some(b) => Ok(&mut b.guard),
            None => Err(PgError::Unavailable("internal: no server bound".into())),
        }
    }

    /// At the first statement of a binding: appends to `out` a Query with the SET/RESET
    /// statements that give the bound connection this session's parameters (only those that
    /// differ from what it carries), to be sent in the same write as the client's message;
    /// returns whether it did (then [`Session::drain_prefix`] must consume the answers).
    pub(crate) fn params_prefix(&mut self, out: &mut BytesMut) -> Result<bool, PgError> {
        let Some(b) = self.bound.as_mut() else {
            return Err(PgError::Unavailable("internal: no server bound".into()));
        };
        Ok(b.params_prefix(&self.state.params, out))
    }

    /// Consumes (and drops) the answers to a [`Session::params_prefix`] Query, up to its
    /// ReadyForQuery. A failure leaves the connection's parameters unknown.
    pub(crate) async fn drain_prefix(&mut self) -> Result<(), PgError> {
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
}
