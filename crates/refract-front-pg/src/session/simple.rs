//! Simple queries (and the FunctionCall fast path): classified, maybe answered without a
//! server, bound, relayed to ReadyForQuery, and what they did to the session recorded.

use super::held::Outcome;
use super::phase::{BatchEnd, InTx};
use super::relay::ParamStatus;
use super::{Bound, Session, Wrote};
use crate::error::PgError;
use bytes::BytesMut;
use refract_pg::classify::{fingerprint, Classification, Route, Statement};
use refract_pg::{reply, BackendMessage};

impl Session {
    /// A simple Query: classify, maybe answer locally, else bind, prepare the server, relay.
    pub(super) async fn simple(&mut self, sql: &str, frame: bytes::Bytes) -> Result<(), PgError> {
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
        let affinity =
            self.shared.affinity.as_ref().filter(|_| route == Route::Read).and_then(|a| a.of_query(sql, &c.tables));
        if let Err(e) = self.bind(route, Some(key), &c.tables, affinity).await {
            return self.refuse(e, BatchEnd::Sync).await;
        }
        let result = self.run_simple(&c, frame, route, key).await;
        self.settle(result).await
    }

    /// A FunctionCall (`F`: libpq's fast path, as its large-object API and `PQfn` use it):
    /// relayed to the primary as a statement that writes, answered by its FunctionCallResponse
    /// and ReadyForQuery. The function may leave session state (a large-object descriptor
    /// lives until its transaction ends, a function may set a parameter): the connection is
    /// checked when the transaction ends, as after `DO`, and pins the client while state lasts.
    pub(super) async fn function_call(&mut self, frame: bytes::Bytes) -> Result<(), PgError> {
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
        if let Err(e) = self.bind(Route::Write, Some(key), &[], None).await {
            return self.refuse(e, BatchEnd::Sync).await;
        }
        let result = self.run_simple(&c, frame, Route::Write, key).await;
        self.settle(result).await
    }

    /// Runs a simple Query of kind `key` (its fingerprint) on the bound connection.
    pub(crate) async fn run_simple(
        &mut self,
        c: &Classification,
        frame: bytes::Bytes,
        route: Route,
        key: u64,
    ) -> Result<(), PgError> {
        let in_tx_before = self.phase.in_tx();
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
        let status = if sets { ParamStatus::Tracked } else { ParamStatus::Untracked };
        let outcome = self.relay_until_ready(status).await?;
        self.note_schema(c);
        if outcome == Outcome::Failed && sets {
            // Part of a multi-statement query may have committed its SETs: not tracked.
            self.bound.iter_mut().for_each(Bound::untrack);
        }
        if outcome == Outcome::Ok {
            self.statements_done(c, in_tx_before);
            Bound::of(&mut self.bound)?.note_effects(c, &self.state.params);
        }
        self.sql_names_done(c, outcome)?;
        let writes = c.statements.iter().any(|s| matches!(s, Statement::Write | Statement::Execute { .. }));
        self.book(started, outcome);
        self.after_ready(if route == Route::Write && writes { Wrote::Yes } else { Wrote::No }).await
    }

    /// Records the statements of a query that succeeded. The transaction tracker only sees the
    /// query's final ReadyForQuery, so in a multi-statement query that opens or ends
    /// transactions (`BEGIN; SET ...; ROLLBACK`) the SETs are staged and committed or dropped
    /// here, statement by statement.
    pub(super) fn statements_done(&mut self, c: &Classification, in_tx_before: InTx) {
        let tx_control =
            c.statements.iter().any(|s| matches!(s, Statement::Begin { .. } | Statement::Commit | Statement::Rollback));
        if c.statements.len() < 2 || !tx_control {
            for st in &c.statements {
                self.state.statement_done(st, self.phase.in_transaction());
            }
            return;
        }
        let mut in_tx = in_tx_before == InTx::Yes;
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

    /// `SET refract.route` and a lone `DEALLOCATE` are answered without a server.
    pub(super) async fn answer_locally(&mut self, c: &Classification) -> Result<bool, PgError> {
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
        self.io.out.extend_from_slice(&BackendMessage::CommandComplete(tag.into()).to_bytes());
        self.io.out.extend_from_slice(&reply::ready_for_query(self.phase.tx()));
        self.flush().await?;
        Ok(true)
    }
}
