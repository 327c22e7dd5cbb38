//! Prepared-statement names on shared server connections. A client's unnamed statement and
//! its SQL-level names (PREPARE) are put on, or taken off, the server connection it runs on
//! before they are used, so the server answers exactly as on a connection of the client's own
//! (PostgreSQL's errors, `26000` and `42P05`, with their transaction effects) and never runs
//! another client's statement.
//!
//! PostgreSQL's rules mirrored here: the unnamed statement lives until the next Parse of it, a
//! Close of it or any simple Query (`exec_simple_query` drops it); a failed Parse of it leaves
//! none. Protocol-level named statements live on the servers under content names
//! ([`PreparedStatement::global_name`], with the `search_path` in force) and are prepared
//! again wherever needed (`batch`); SQL-level ones keep the client's name on the server.

use super::batch::{Expect, Kind, Made, Plan, Whose};
use super::held::Outcome;
use super::Session;
use crate::config::PoolMode;
use crate::error::PgError;
use crate::server::ServerConn;
use bytes::{Bytes, BytesMut};
use refract_pg::classify::{Classification, Statement};
use refract_pg::frontend::Target;
use refract_pg::session::{Origin, PreparedStatement};
use refract_pg::{reply, BackendMessage, FrontendMessage, TxStatus};
use std::sync::Arc;

/// PostgreSQL's `duplicate_prepared_statement`.
const DUPLICATE_PSTATEMENT: &str = "42P05";

/// The identity of a name a connection may hold a statement under, not known which: it matches
/// no statement, so the name is closed (and the client's prepared) before it is used.
const UNKNOWN: &str = "";

/// PostgreSQL's `undefined_pstatement`.
const UNDEFINED_PSTATEMENT: &str = "26000";

impl Session {
    /// The `SET search_path` in force for this session (part of a statement's identity).
    fn search_path(&self) -> Option<&str> {
        self.state.params.current("search_path")
    }

    /// The server-side identity of a client statement under the session's current settings:
    /// the `search_path`, and for non-ASCII text the `client_encoding` too (the same bytes are
    /// other characters in another encoding, so the server would hold another statement).
    pub(crate) fn identity(&self, ps: &PreparedStatement) -> String {
        let text = match &ps.origin {
            Origin::Protocol { query, .. } => query,
            Origin::Sql { text } => text,
        };
        if text.is_ascii() {
            return ps.global_name(self.search_path());
        }
        let encoding = self.state.params.current("client_encoding");
        ps.global_name(Some(&format!("{:?} {encoding:?}", self.search_path())))
    }

    /// The client's Parse of the unnamed statement, sent as is.
    pub(crate) fn parse_unnamed(
        &mut self,
        plan: &mut Plan,
        ps: Arc<PreparedStatement>,
        previous: Option<Arc<PreparedStatement>>,
    ) -> Result<(), PgError> {
        if plan.skip {
            // The server ignores it (an earlier error, no Sync yet): the old one stays.
            self.state.prepared.close("");
            previous.into_iter().for_each(|p| self.state.prepared.restore(p));
            return Ok(());
        }
        self.send_unnamed_parse(plan, ps, Whose::Client, previous)
    }

    fn send_unnamed_parse(
        &mut self,
        plan: &mut Plan,
        ps: Arc<PreparedStatement>,
        whose: Whose,
        previous: Option<Arc<PreparedStatement>>,
    ) -> Result<(), PgError> {
        // The server drops its unnamed statement as the Parse starts, even if the Parse fails.
        self.conn()?.unnamed = None;
        plan.out.extend_from_slice(&ps.prepare_message(""));
        plan.unnamed = Some(ps.clone());
        if !plan.skip {
            let own = whose == Whose::Client;
            let made = if own { Made::Parse { global: None, ps, previous } } else { Made::Unnamed(ps) };
            plan.expect.push_back(Expect::Server { kind: Kind::Parse, relay: own, prepares: Some(made), runs: None });
        }
        Ok(())
    }

    /// A Close of the unnamed statement: the client's (answered) or refract's (silent).
    pub(crate) fn close_unnamed(&mut self, plan: &mut Plan, whose: Whose) -> Result<(), PgError> {
        if whose == Whose::Client {
            self.state.prepared.close("");
        }
        self.conn()?.unnamed = None;
        plan.unnamed = None;
        plan.send(&FrontendMessage::Close(Target::Statement, String::new()), whose, None);
        Ok(())
    }

    /// Before a Bind or Describe of the unnamed statement: the server's must be the client's,
    /// parsed again if the server holds another (or none), or none if the client has none.
    pub(crate) fn use_unnamed(&mut self, plan: &mut Plan) -> Result<(), PgError> {
        match self.state.prepared.get("").cloned() {
            Some(ps) if plan.unnamed.as_ref().is_some_and(|u| Arc::ptr_eq(u, &ps)) => Ok(()),
            Some(ps) => self.send_unnamed_parse(plan, ps, Whose::Refract, None),
            None => self.close_unnamed(plan, Whose::Refract),
        }
    }

    /// Before a Bind or Describe of a name the client has no statement under: whatever the
    /// server connection holds under that name (another client's SQL PREPARE) is closed first.
    pub(crate) fn close_missing(&mut self, plan: &mut Plan, name: &str) -> Result<(), PgError> {
        let conn = self.conn()?;
        conn.prepared.remove(name);
        conn.sql_prepared.remove(name);
        plan.preparing.remove(name);
        plan.send(&FrontendMessage::Close(Target::Statement, name.to_owned()), Whose::Refract, None);
        Ok(())
    }

    /// A ParseComplete came for a message that prepares something.
    pub(crate) fn made(&mut self, made: Made) -> Result<(), PgError> {
        let conn = self.conn()?;
        match made {
            Made::Global(g) | Made::Parse { global: Some(g), .. } => {
                conn.prepared.insert(g);
            }
            Made::Unnamed(ps) | Made::Parse { global: None, ps, .. } => conn.unnamed = Some(ps),
            Made::Refused(_) => {}
        }
        Ok(())
    }

    /// An ErrorResponse came while `expect` was pending: the message at its front failed and
    /// the server skips the rest up to Sync. A client's Parse that failed or was skipped did
    /// not create its statement: the client keeps the one it had under that name, except that
    /// a failed Parse of the unnamed statement leaves none (the server dropped it first).
    /// Returns the error to relay in place of the server's, if refract owes its own.
    pub(crate) fn parse_failed(&mut self, expect: &std::collections::VecDeque<Expect>) -> Option<Bytes> {
        let mut replacement = None;
        for (i, e) in expect.iter().enumerate() {
            let made = match e {
                Expect::Server { kind: Kind::Sync, .. } => break,
                Expect::Server { prepares, .. } => prepares,
                Expect::Local(_, made) => made,
            };
            match made {
                Some(Made::Refused(error)) if i == 0 => replacement = error.clone(),
                Some(Made::Parse { global, ps, previous }) => {
                    self.undo_parse(ps, previous.clone().filter(|_| i > 0 || global.is_some()));
                }
                _ => {}
            }
        }
        replacement
    }

    /// The client's statement `ps` was not created after all: `previous` is its again.
    fn undo_parse(&mut self, ps: &Arc<PreparedStatement>, previous: Option<Arc<PreparedStatement>>) {
        if self.state.prepared.get(&ps.name).is_some_and(|cur| Arc::ptr_eq(cur, ps)) {
            self.state.prepared.close(&ps.name);
            previous.into_iter().for_each(|p| self.state.prepared.restore(p));
        }
    }

    /// A Parse of a name the client already has a statement under: PostgreSQL refuses it with
    /// `42P05` and keeps the old one. A Parse that fails on the server stands in for it, so the
    /// server skips to Sync and fails an open transaction as PostgreSQL would, and the client
    /// gets PostgreSQL's error in place of the server's. In a failed transaction PostgreSQL
    /// answers `25P02` before it looks at the name; so does the stand-in, relayed as is.
    pub(crate) fn parse_duplicate(&mut self, plan: &mut Plan, name: &str) {
        let failed_tx = self.phase().tx() == TxStatus::Failed;
        let query = if failed_tx { "SELECT 1" } else { "refract: duplicate prepared statement" };
        let text = format!("prepared statement \"{name}\" already exists");
        let error = (!failed_tx).then(|| reply::error(DUPLICATE_PSTATEMENT, &text));
        let msg = FrontendMessage::Parse { name: "refract_duplicate".into(), query: query.into(), param_types: vec![] };
        plan.send(&msg, Whose::Client, Some(Made::Refused(error)));
    }

    /// Before a batch: SQL-prepared statements it binds or describes are put on the bound
    /// connection (a round trip each, after the session's SETs, which PREPARE resolves names
    /// with).
    pub(crate) async fn mirror_batch_names(&mut self, msgs: &[FrontendMessage]) -> Result<(), PgError> {
        self.held.failed_prepares.clear();
        if self.pool_mode == PoolMode::Session {
            return Ok(()); // the client's own connection holds exactly its statements
        }
        self.sync_sql_names().await?;
        if self.statement_texts(msgs).into_iter().flatten().any(|t| t.contains("pg_prepared_statements")) {
            return self.no_shared_statements().await;
        }
        let sql_named = |name: &str| self.state.prepared.get(name).is_some_and(|p| p.is_sql());
        let mut names: Vec<String> = msgs
            .iter()
            .filter_map(|m| match m {
                FrontendMessage::Bind(b) => Some(b.statement.as_str()),
                FrontendMessage::Describe(Target::Statement, n) => Some(n.as_str()),
                _ => None,
            })
            .filter(|n| sql_named(n))
            .map(str::to_owned)
            .collect();
        // Names a text EXECUTEs are mirrored even when the client has none: whatever another
        // client left under that name on the connection is closed, and the server says 26000.
        names.extend(self.executed_sql_names(msgs));
        names.sort();
        names.dedup();
        if names.is_empty() || self.phase().skipping() {
            return Ok(()); // the server skips the batch's messages anyway
        }
        self.params_first().await?;
        for name in names {
            self.mirror_name(&name).await?;
        }
        Ok(())
    }

    /// The SQL-prepared names that the batch's query texts `PREPARE`, `EXECUTE` or
    /// `DEALLOCATE` (a driver's Parse of `EXECUTE q(1)` or `PREPARE q AS ...`, as asyncpg and
    /// pgjdbc send them, or a Bind of a statement parsed earlier with such a text): the server
    /// looks `q` up when it runs them, so it must be this client's `q` there too (or none).
    fn executed_sql_names(&self, msgs: &[FrontendMessage]) -> Vec<String> {
        let text_of = |m: &FrontendMessage| match m {
            FrontendMessage::Parse { query, .. } => Some(query.clone()),
            FrontendMessage::Bind(b) => match self.state.prepared.get(&b.statement).map(|p| &p.origin) {
                Some(Origin::Protocol { query, .. }) => Some(query.clone()),
                _ => None,
            },
            _ => None,
        };
        let texts = msgs.iter().filter_map(text_of).filter(|q| mentions_execute(q));
        let names_in = |q: &str| -> Vec<String> {
            let (c, _) = self.classify_text(q);
            let nested = c.nested_executes.iter().cloned();
            c.statements.iter().filter_map(sql_name).map(str::to_owned).chain(nested).collect()
        };
        texts.flat_map(|q| names_in(&q)).collect()
    }

    /// Sends the session's SETs to the bound connection now if they are due, as their own
    /// round trip.
    async fn params_first(&mut self) -> Result<(), PgError> {
        let mut head = BytesMut::new();
        if self.params_prefix(&mut head)? {
            self.conn()?.unnamed = None;
            self.conn()?.wire.send(&head).await?;
            self.drain_prefix().await?;
        }
        Ok(())
    }

    /// Before a simple query (the session's SETs already applied): mirrors the names it
    /// PREPAREs, EXECUTEs (also inside `CREATE TABLE AS` or `EXPLAIN`) or DEALLOCATEs, so PREPARE of a name the client has fails with
    /// `42P05` and EXECUTE or DEALLOCATE of one it has not with `26000`, on the server itself.
    /// Also notes that the query will drop the connection's unnamed statement.
    pub(crate) async fn before_query(&mut self, c: &Classification) -> Result<(), PgError> {
        self.conn()?.unnamed = None;
        self.held.failed_prepares.clear();
        if self.pool_mode == PoolMode::Session {
            return Ok(()); // the client's own connection holds exactly its statements
        }
        self.sync_sql_names().await?;
        if c.reads_prepared_statements() {
            return self.no_shared_statements().await;
        }
        let mut names: Vec<&str> = c.statements.iter().filter_map(sql_name).collect();
        names.extend(c.nested_executes.iter().map(String::as_str));
        names.sort_unstable();
        names.dedup();
        for name in names {
            self.mirror_name(name).await?;
        }
        Ok(())
    }

    /// Before any statement: the bound connection holds exactly the client's SQL-level
    /// statements under their names (another client's are closed, the client's missing ones
    /// prepared), so that a name used where refract cannot see it (`EXECUTE` in a function's
    /// dynamic SQL) is the client's own or none, as on its own connection. A connection that
    /// already holds them costs nothing.
    async fn sync_sql_names(&mut self) -> Result<(), PgError> {
        if !self.state.prepared.has_sql() && self.conn()?.sql_prepared.is_empty() {
            return Ok(()); // the common case, on every statement: nothing to compare
        }
        let own: Vec<(String, String)> = self
            .state
            .prepared
            .sql_names()
            .into_iter()
            .filter_map(|n| self.state.prepared.get(&n).map(|ps| (n, self.identity(ps))))
            .collect();
        let conn = self.conn()?;
        let mut names: Vec<String> = conn
            .sql_prepared
            .iter()
            .filter(|(name, id)| !own.iter().any(|(n, i)| n == *name && i == *id))
            .map(|(name, _)| name.clone())
            .collect();
        names.extend(own.iter().filter(|(n, i)| conn.sql_prepared.get(n) != Some(i)).map(|(n, _)| n.clone()));
        if names.is_empty() {
            return Ok(());
        }
        names.sort();
        names.dedup();
        self.params_first().await?; // PREPARE resolves names with the session's search_path
        for name in names {
            self.mirror_name(&name).await?;
        }
        Ok(())
    }

    /// Before a statement that reads `pg_prepared_statements` (the server process's prepared
    /// statements): the protocol-level statements refract shares between clients are
    /// deallocated on the connection (prepared again wherever next used), so the view shows
    /// the client's own SQL-level statements (`sync_sql_names`) and nothing of another's.
    async fn no_shared_statements(&mut self) -> Result<(), PgError> {
        let conn = self.conn()?;
        if conn.prepared.is_empty() {
            return Ok(());
        }
        let sql: Vec<String> =
            conn.prepared.drain().map(|g| format!("DEALLOCATE \"{}\"", g.replace('"', "\"\""))).collect();
        let mut out = BytesMut::new();
        FrontendMessage::Query(sql.join("; ")).encode(&mut out);
        if conn.silently(&out, 1).await?.is_some() {
            conn.broken = true; // not known what it holds: never reused
        }
        Ok(())
    }

    /// Gives the bound connection the client's statement called `name`, or none.
    async fn mirror_name(&mut self, name: &str) -> Result<(), PgError> {
        let want = self.state.prepared.get(name).cloned();
        let id = want.as_ref().map(|ps| self.identity(ps));
        let conn = self.conn()?;
        if id.is_some() && conn.sql_prepared.get(name) == id.as_ref() {
            return Ok(());
        }
        conn.prepared.remove(name);
        conn.sql_prepared.remove(name);
        let mut out = BytesMut::new();
        FrontendMessage::Close(Target::Statement, name.to_owned()).encode(&mut out);
        let mut readies = 1;
        match want.as_deref().map(|ps| &ps.origin) {
            Some(Origin::Protocol { .. }) => out.extend_from_slice(&want_message(&want, name)),
            Some(Origin::Sql { .. }) => readies += 1,
            None => {}
        }
        FrontendMessage::Sync.encode(&mut out);
        if readies > 1 {
            out.extend_from_slice(&want_message(&want, name));
            conn.unnamed = None;
        }
        match conn.silently(&out, readies).await? {
            None => drop(id.map(|id| conn.sql_prepared.insert(name.to_owned(), id))),
            // The client's PREPARE no longer prepares (a table it reads was dropped): on a
            // connection of its own, the EXECUTE would re-plan and fail with this error, so the
            // server's `26000` for the missing name is answered with it instead.
            Some(error) if want.is_some() => self.held.failed_prepares.push((name.to_owned(), error.to_bytes())),
            Some(_) => {}
        }
        Ok(())
    }

    /// The error to relay in place of a server's `frame`: a `26000` for a name whose
    /// statement refract could not prepare again is answered with the reason it could not.
    pub(crate) fn prepare_error_for(&self, frame: &Bytes) -> Option<Bytes> {
        if self.held.failed_prepares.is_empty() {
            return None;
        }
        let Ok(BackendMessage::ErrorResponse(e)) = BackendMessage::decode(b'E', frame.get(5..)?) else { return None };
        if e.code() != Some(UNDEFINED_PSTATEMENT) {
            return None;
        }
        let message = e.message()?;
        self.held
            .failed_prepares
            .iter()
            .find(|(name, _)| message == format!("prepared statement \"{name}\" does not exist"))
            .map(|(_, error)| error.clone())
    }

    /// An Execute (extended protocol) completed `st`: a SQL `PREPARE` or `DEALLOCATE` changes
    /// the client's statements and the connection's, as the same statement by simple query does.
    pub(crate) fn sql_name_executed(&mut self, st: &Statement) -> Result<(), PgError> {
        if !matches!(st, Statement::Prepare { .. } | Statement::Deallocate { .. }) {
            return Ok(());
        }
        self.state.statement_done(st, self.phase().in_transaction());
        let id = match st {
            Statement::Prepare { name, .. } => self.state.prepared.get(name).map(|ps| self.identity(ps)),
            _ => None,
        };
        let conn = self.conn()?;
        match st {
            Statement::Prepare { name, .. } => drop(id.map(|id| conn.sql_prepared.insert(name.clone(), id))),
            Statement::Deallocate { name: Some(n) } => drop(conn.sql_prepared.remove(n)),
            _ => {
                conn.prepared.clear();
                conn.sql_prepared.clear();
            }
        }
        Ok(())
    }

    /// After a simple query: what it did to the SQL-level names of the connection. After a
    /// failure, names it touched are no longer known (they are closed and prepared again
    /// before the next statement); a failed `DEALLOCATE ALL` / `DISCARD ALL` may or may not
    /// have run, so the connection is not reused.
    pub(crate) fn sql_names_done(&mut self, c: &Classification, outcome: Outcome) -> Result<(), PgError> {
        let failed = outcome == Outcome::Failed;
        let ids: Vec<Option<String>> = c
            .statements
            .iter()
            .map(|st| match st {
                Statement::Prepare { name, .. } => self.state.prepared.get(name).map(|ps| self.identity(ps)),
                _ => None,
            })
            .collect();
        let conn = self.conn()?;
        for (st, id) in c.statements.iter().zip(ids) {
            match (st, failed) {
                (Statement::Deallocate { name: None } | Statement::Discard { all: true }, true) => conn.broken = true,
                // A failed EXECUTE leaves its statement as it was.
                (Statement::Execute { .. }, true) => {}
                // What the server holds under the name is not known (a PREPARE refused as a
                // duplicate keeps the old one): closed and prepared again when next synced.
                (st, true) => drop(sql_name(st).map(|n| conn.sql_prepared.insert(n.to_owned(), UNKNOWN.into()))),
                (Statement::Prepare { name, .. }, false) => {
                    drop(id.map(|id| conn.sql_prepared.insert(name.clone(), id)))
                }
                (Statement::Deallocate { name: Some(n) }, false) => drop(conn.sql_prepared.remove(n)),
                _ => {}
            }
        }
        Ok(())
    }
}

/// The name a statement PREPAREs, EXECUTEs or DEALLOCATEs.
fn sql_name(st: &Statement) -> Option<&str> {
    match st {
        Statement::Prepare { name, .. } | Statement::Execute { name } => Some(name),
        Statement::Deallocate { name: Some(name) } => Some(name),
        _ => None,
    }
}

fn want_message(want: &Option<Arc<PreparedStatement>>, name: &str) -> bytes::Bytes {
    want.as_ref().map(|ps| ps.prepare_message(name)).unwrap_or_default()
}

impl ServerConn {
    /// Runs refract's own messages, ending in `readies` ReadyForQuery, dropping the answers;
    /// returns the first error that came, if any.
    pub(crate) async fn silently(&mut self, out: &[u8], readies: usize) -> Result<Option<BackendMessage>, PgError> {
        self.wire.send(out).await?;
        let (mut left, mut error) = (readies, None);
        while left > 0 {
            match self.recv_msg().await? {
                e @ BackendMessage::ErrorResponse(_) => {
                    tracing::debug!(error = ?e, "preparing a statement name on a server connection failed");
                    error = error.or(Some(e));
                }
                BackendMessage::ReadyForQuery(_) => left -= 1,
                _ => {}
            }
        }
        Ok(error)
    }
}

/// A cheap test before classifying a query text: whether it may hold a `PREPARE`, `EXECUTE`
/// or `DEALLOCATE` statement.
fn mentions_execute(query: &str) -> bool {
    let has = |word: &[u8]| query.as_bytes().windows(word.len()).any(|w| w.eq_ignore_ascii_case(word));
    has(b"execute") || has(b"prepare") || has(b"deallocate")
}
