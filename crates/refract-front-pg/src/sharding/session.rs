//! The client session in a sharded cluster: each simple Query or extended batch is routed
//! (`route`) and runs on one shard through the session's usual path (binding, SET replay,
//! prepared statements, hand-over), or on several (`fanout`), or is refused with the reason.
//! A transaction's BEGIN is held until its first statement names the shard; the transaction
//! then stays there (a statement needing another shard is refused and the transaction fails,
//! as two-phase commit is not implemented yet).

use super::route::{route, Target};
use super::{twophase, Sharding};
use crate::error::PgError;
use crate::session::phase::Event;
use crate::session::Bound;
use crate::session::Session;
use bytes::{Bytes, BytesMut};
use refract_pg::classify::{fingerprint, Classification, Route, Statement};
use refract_pg::notice::sqlstate;
use refract_pg::session::Origin;
use refract_pg::{reply, BackendMessage, FrontendMessage, TxStatus};
use refract_shard::keyparam::Params;
use refract_shard::scatter::Plan;
use std::collections::HashMap;
use std::sync::Arc;

/// SQLSTATE `in_failed_sql_transaction`.
pub(super) const IN_FAILED_TX: &str = "25P02";

/// What [`Session::shard_of_batch`] found.
pub(super) enum BatchShard {
    /// Run the batch on this shard.
    At(usize),
    /// No one shard runs it: refract does (`across.rs`).
    Across,
    /// Refused: SQLSTATE and message.
    Refused(&'static str, String),
}

/// Where [`Session::place_batch`] put an extended batch.
pub(crate) enum Placed {
    /// Bound on its shard (or the binding's error): the caller runs it there.
    Bound(Result<(), PgError>),
    /// refract runs it across shards (`Session::run_across`).
    Across,
    /// Answered here (refused).
    Answered(Result<(), PgError>),
}

impl Session {
    /// A simple Query in a sharded cluster.
    pub(crate) async fn simple_sharded(
        &mut self,
        sh: &Arc<Sharding>,
        sql: &str,
        frame: Bytes,
        c: &Classification,
    ) -> Result<(), PgError> {
        if refract_pg::classify::wants_explain(sql) {
            return self.explain(sh, sql, c).await;
        }
        if !self.phase().in_transaction() {
            self.tx_begin = None;
        }
        if !self.parked.is_empty() {
            match c.statements.as_slice() {
                [Statement::Commit] => return self.end_on_shards(sh, true).await,
                [Statement::Rollback] => return self.end_on_shards(sh, false).await,
                _ => {}
            }
        }
        if self.tx_control_locally(sql, c).await? || self.shard_setting(sh, sql, c).await? {
            return Ok(());
        }
        if !self.parked.is_empty() && c.statements.iter().any(|s| matches!(s, Statement::Savepoint)) {
            // A savepoint lives on the one shard it was set on; rolling back to it there
            // would leave the other shards' work in place.
            let why = "savepoints are not supported in a transaction on several shards";
            return self.refuse_sharded(sh, sqlstate::FEATURE_NOT_SUPPORTED, why).await;
        }
        let route_class = self.route(c);
        if route_class == Route::Write {
            // A COPY's own table is not among the classifier's relations.
            let copy = sql.trim_start().get(..4).is_some_and(|w| w.eq_ignore_ascii_case("copy"));
            let tables = if copy { sh.table_names() } else { c.tables.clone() };
            self.learn_key_positions(sh, &tables).await;
        }
        let target = self.target(sh, sql, c, route_class == Route::Read);
        let in_tx = self.phase().in_transaction();
        let shard = match target {
            Target::Any => self.bound.as_ref().map_or_else(|| sh.any_shard(), |_| self.shard),
            Target::Shards(s) if s.len() == 1 => s[0],
            Target::Refuse(why) => return self.refuse_sharded(sh, sqlstate::FEATURE_NOT_SUPPORTED, &why).await,
            Target::Fail(code, why) => return self.refuse_sharded(sh, code, &why).await,
            Target::Scatter(shards, plan) if in_tx => return self.scatter_tx_simple(sh, &shards, &plan).await,
            Target::Statements if !in_tx && self.bound.is_none() => return self.run_across_simple(sh, sql).await,
            Target::Statements => {
                let why = "a query of several statements on several shards runs outside a transaction only: send them one at a time";
                return self.refuse_sharded(sh, sqlstate::FEATURE_NOT_SUPPORTED, why).await;
            }
            multi if in_tx => {
                let why = format!(
                    "inside a transaction a write runs on one shard at a time, and this one needs several ({}): name the key",
                    describe(sh, &multi)
                );
                return self.refuse_sharded(sh, sqlstate::FEATURE_NOT_SUPPORTED, &why).await;
            }
            multi => return self.fan_out(sh, multi, sql, route_class == Route::Read, c).await,
        };
        if let Err(why) = self.follow_to(sh, shard, in_tx, "statement").await {
            return self.refuse_sharded(sh, sqlstate::FEATURE_NOT_SUPPORTED, &why).await;
        }
        sh.count_statement(&[shard]);
        let key = fingerprint(sql);
        if let Err(e) = self.bind_shard(shard, route_class, Some(key), &c.tables).await {
            return self.refuse(e, true).await;
        }
        let result = self.run_simple(c, frame, route_class, key).await;
        self.settle(result).await
    }

    /// A simple Query's read over several shards inside a transaction (`txread.rs`).
    async fn scatter_tx_simple(&mut self, sh: &Sharding, shards: &[usize], plan: &Plan) -> Result<(), PgError> {
        let mut request = BytesMut::new();
        FrontendMessage::Query(plan.sql.clone()).encode(&mut request);
        match self.scatter_in_tx(sh, shards, plan, &request, true).await {
            Ok(Err(why)) => self.refuse_sharded(sh, sqlstate::FEATURE_NOT_SUPPORTED, &why).await,
            Ok(Ok(failed)) => {
                sh.count_statement(shards);
                let status = if failed { TxStatus::Failed } else { TxStatus::InTransaction };
                self.advance(Event::Ready(status));
                self.out.extend_from_slice(&reply::ready_for_query(status));
                self.flush().await
            }
            Err(e) => self.server_lost(e).await,
        }
    }

    /// The statement's target: a shard override (`overrides.rs`) first; session statements
    /// (SET, SAVEPOINT, ...) go where the session is, an SQL PREPARE of a statement over
    /// sharded tables is refused (its EXECUTEs could not be routed by key).
    fn target(&self, sh: &Sharding, sql: &str, c: &Classification, read: bool) -> Target {
        if let Some(forced) = self.forced_target(sh, sql) {
            return forced;
        }
        let sharded = |t: &String| refract_shard::shardkey::Schema::key_of(sh, t).is_some();
        for st in &c.statements {
            if let Statement::Prepare { .. } | Statement::Execute { .. } = st {
                if c.tables.iter().any(sharded) || matches!(st, Statement::Execute { .. }) {
                    return Target::Refuse(
                        "SQL PREPARE/EXECUTE is not routed by key in a sharded cluster: use the extended protocol (Parse/Bind)".into(),
                    );
                }
            }
        }
        if c.statements.iter().all(|s| !matches!(s, Statement::Read | Statement::Write)) {
            return Target::Any;
        }
        route(sh, sql, read, None)
    }

    /// Reads the key column position of sharded `tables` not known yet from shard 0's catalog
    /// (an INSERT without a column list gives its values in column order). A table that does
    /// not exist yet stays unknown: such an INSERT is refused with the reason.
    async fn learn_key_positions(&mut self, sh: &Sharding, tables: &[String]) {
        let unknown = sh.unknown_positions(tables);
        if unknown.is_empty() {
            return;
        }
        let Some(server) = self.shared.shard_servers(0).primary() else { return };
        let Ok(mut guard) = server.pool.get(crate::server::sizes::Path::Direct).await else { return };
        for t in unknown {
            let Some(key) = refract_shard::shardkey::Schema::key_of(sh, t) else { continue };
            let q = format!(
                "select count(*) from pg_attribute a where a.attrelid = to_regclass({}) and a.attnum > 0 \
                 and not a.attisdropped and a.attnum <= (select attnum from pg_attribute where attrelid = to_regclass({}) and attname = {})",
                literal(t),
                literal(t),
                literal(key)
            );
            match guard.query_one(&q).await {
                Ok(Some(n)) => {
                    if let Some(n) = n.parse::<usize>().ok().filter(|n| *n > 0) {
                        sh.set_position(t, n - 1);
                    }
                }
                _ => return, // dropped, not released: its state is not known
            }
        }
        guard.release();
    }

    /// Binds a connection on `shard` (the session stays there while bound); a held BEGIN is
    /// sent first, after the session's SETs.
    pub(crate) async fn bind_shard(
        &mut self,
        shard: usize,
        route_class: Route,
        key: Option<u64>,
        tables: &[String],
    ) -> Result<(), PgError> {
        if self.bound.is_none() {
            self.shard = shard;
        }
        // A transaction runs on the primary unless it began READ ONLY.
        let starts_tx = self.held_begin.as_deref().is_some_and(|b| !self.read_only_begin(b));
        let route_class = if starts_tx { Route::Write } else { route_class };
        self.bind(route_class, key, tables).await?;
        let Some(begin) = self.held_begin.take() else { return Ok(()) };
        let mut head = BytesMut::new();
        if self.params_prefix(&mut head)? {
            self.conn()?.wire.send(&head).await?;
            self.drain_prefix().await?;
        }
        self.conn()?.query(&begin).await?;
        Ok(())
    }

    /// BEGIN is held (answered here); COMMIT or ROLLBACK of a transaction that never reached a
    /// shard, and any statement of a transaction failed here, are answered here too.
    async fn tx_control_locally(&mut self, sql: &str, c: &Classification) -> Result<bool, PgError> {
        let ends = |s: &Statement| matches!(s, Statement::Commit | Statement::Rollback);
        let (tag, status) = match c.statements.as_slice() {
            [Statement::Begin { .. }] if self.bound.is_none() && !self.phase().in_transaction() => {
                // The client's own text keeps its options (ISOLATION LEVEL, READ ONLY).
                self.held_begin = Some(sql.to_owned());
                self.tx_begin = Some(sql.to_owned());
                (begin_tag(sql), TxStatus::InTransaction)
            }
            [st] if ends(st) && self.bound.is_none() && self.phase().in_transaction() => {
                self.held_begin = None;
                let failed = self.phase().tx() == TxStatus::Failed;
                (if failed || matches!(st, Statement::Rollback) { "ROLLBACK" } else { "COMMIT" }, TxStatus::Idle)
            }
            _ if self.bound.is_none() && self.phase().tx() == TxStatus::Failed => {
                let msg = "current transaction is aborted, commands ignored until end of transaction block";
                self.out.extend_from_slice(&reply::error(IN_FAILED_TX, msg));
                self.out.extend_from_slice(&reply::ready_for_query(TxStatus::Failed));
                self.flush().await?;
                return Ok(true);
            }
            _ => return Ok(false),
        };
        self.advance(Event::Completed(tag));
        self.advance(Event::Ready(status));
        self.out.extend_from_slice(&BackendMessage::CommandComplete(tag.into()).to_bytes());
        self.out.extend_from_slice(&reply::ready_for_query(status));
        self.flush().await?;
        Ok(true)
    }

    /// Refuses a statement with `code` and `why`. Inside a transaction the transaction fails,
    /// as it would on one PostgreSQL: its shard's part is rolled back now and the client's
    /// ROLLBACK (or COMMIT) is answered here.
    pub(crate) async fn refuse_sharded(&mut self, sh: &Sharding, code: &str, why: &str) -> Result<(), PgError> {
        sh.count_refused();
        let in_tx = self.phase().in_transaction();
        if in_tx {
            self.abort_on_shard().await;
        }
        self.out.extend_from_slice(&reply::error(code, &format!("refract: {why}")));
        let status = if in_tx { TxStatus::Failed } else { TxStatus::Idle };
        self.advance(Event::QueryError);
        self.advance(Event::Ready(status));
        self.out.extend_from_slice(&reply::ready_for_query(status));
        self.flush().await
    }

    /// Rolls back the transaction on each of its shards and gives the connections back
    /// (dropped where the rollback fails).
    pub(super) async fn abort_on_shard(&mut self) {
        self.held_begin = None;
        self.tx_begin = None;
        let timeout = std::time::Duration::from_millis(self.shared.cfg.connect_timeout_ms);
        for (shard, mut b) in self.take_tx_bindings() {
            if let Some(a) = b.admitted.take() {
                a.finish();
            }
            if let Ok(Ok(Ok(_))) = tokio::time::timeout(timeout, twophase::exec(&mut b.guard, "ROLLBACK")).await {
                self.release_on(shard, b).await;
            }
        }
    }

    /// Every connection of the open transaction (the bound one last), taken from the session.
    pub(super) fn take_tx_bindings(&mut self) -> Vec<(usize, Bound)> {
        let mut all: Vec<(usize, Bound)> = self.parked.drain(..).collect();
        if let Some(b) = self.bound.take() {
            all.push((self.shard, b));
        }
        self.client.info.set_bound(None);
        self.key.set(None);
        all
    }

    /// Gives back `b`, a connection on `shard` whose transaction ended.
    async fn release_on(&mut self, shard: usize, b: Bound) {
        let here = std::mem::replace(&mut self.shard, shard);
        self.bound = Some(b);
        self.release().await;
        self.shard = here;
    }

    /// Takes a bound session to `shard` when the `what` (statement or batch) runs there: an
    /// open transaction moves under the two-phase rules; a pinned connection stays. `Err`: the
    /// refusal's reason.
    async fn follow_to(&mut self, sh: &Sharding, shard: usize, in_tx: bool, what: &str) -> Result<(), String> {
        if self.bound.is_none() || shard == self.shard {
            return Ok(());
        }
        let second = if in_tx {
            self.second_shard(sh, shard).await
        } else {
            Err("a pinned connection stays on its shard".into())
        };
        if let Err(why) = second {
            return Err(format!(
                "this {what}'s rows are on shard {}, and this session's transaction (or pinned connection) is on shard {}: {why}",
                sh.names[shard], sh.names[self.shard]
            ));
        }
        self.move_to_shard(shard);
        Ok(())
    }

    /// Whether the open transaction may reach shard `to` too: it then commits with two-phase
    /// commit, which needs the decision log and every shard's `max_prepared_transactions > 0`.
    async fn second_shard(&mut self, sh: &Sharding, to: usize) -> Result<(), String> {
        self.two_phase_possible(sh, &[self.shard, to]).await
    }

    /// Whether a transaction on `shards` can commit with two-phase commit: the decision log is
    /// configured and each shard's `max_prepared_transactions > 0`, asked once per shard (on
    /// the transaction's own connection there when it has one, so that a session holding its
    /// shard's last pooled connection does not wait for another).
    pub(super) async fn two_phase_possible(&mut self, sh: &Sharding, shards: &[usize]) -> Result<(), String> {
        if let Err(why) = &sh.log {
            return Err(format!("a transaction reaches a second shard only with two-phase commit, and {why}"));
        }
        for &i in shards {
            if sh.prepared_ok[i].get().is_none() {
                let here = self.bound.is_some() && i == self.shard;
                let mpt = match self.parked.iter_mut().find(|(s, _)| *s == i) {
                    Some((_, b)) => b.guard.query_one("show max_prepared_transactions").await,
                    None if here => {
                        self.conn().map_err(|e| e.to_string())?.query_one("show max_prepared_transactions").await
                    }
                    None => ask_prepared(self.shared.shard_servers(i)).await,
                };
                let mpt =
                    mpt.map_err(|e| format!("cannot ask shard {} about prepared transactions: {e}", sh.names[i]))?;
                sh.prepared_ok[i].set(mpt.is_some_and(|v| v != "0"));
            }
            if sh.prepared_ok[i].get() == Some(false) {
                return Err(format!(
                    "shard {} has max_prepared_transactions = 0, so a transaction cannot commit on several shards (two-phase commit)",
                    sh.names[i]
                ));
            }
        }
        Ok(())
    }

    /// Parks the bound connection and takes the transaction's connection on `to` (if it has
    /// one; else the next binding there sends its BEGIN).
    pub(super) fn move_to_shard(&mut self, to: usize) {
        if let Some(b) = self.bound.take() {
            self.parked.push((self.shard, b));
        }
        self.shard = to;
        if let Some(at) = self.parked.iter().position(|(s, _)| *s == to) {
            let (_, b) = self.parked.remove(at);
            self.key.set(Some(b.guard.key.clone()));
            self.client.info.set_bound(Some(b.server.index));
            self.bound = Some(b);
        } else {
            self.held_begin = Some(self.tx_begin.clone().unwrap_or_else(|| "BEGIN".into()));
        }
    }

    /// COMMIT (two-phase, over every shard of the transaction) or ROLLBACK of a transaction
    /// on several shards, for a simple Query.
    async fn end_on_shards(&mut self, sh: &Sharding, commit: bool) -> Result<(), PgError> {
        self.end_tx(sh, commit).await?;
        self.advance(Event::Ready(TxStatus::Idle));
        self.out.extend_from_slice(&reply::ready_for_query(TxStatus::Idle));
        self.flush().await
    }

    /// Ends the open transaction on each of its shards (see [`Session::end_on_shards`]): the
    /// client gets its CommandComplete or error; ReadyForQuery is the caller's.
    pub(crate) async fn end_tx(&mut self, sh: &Sharding, commit: bool) -> Result<(), PgError> {
        let failed = self.phase().tx() == TxStatus::Failed;
        let commit = commit && !failed;
        let mut all = self.take_tx_bindings();
        for (_, b) in all.iter_mut() {
            if let Some(a) = b.admitted.take() {
                a.finish();
            }
        }
        let outcome = match (&sh.log, commit) {
            (Ok(log), true) => {
                let mut conns: Vec<&mut crate::server::pool::Guard> =
                    all.iter_mut().map(|(_, b)| &mut b.guard).collect();
                twophase::commit(log, &mut conns).await
            }
            _ => rollback_all(&mut all).await,
        };
        self.held_begin = None;
        self.tx_begin = None;
        let tag = if commit { "COMMIT" } else { "ROLLBACK" };
        match outcome {
            Ok(result) => {
                for (shard, b) in all {
                    self.release_on(shard, b).await;
                }
                match result {
                    Ok(()) => {
                        self.advance(Event::Completed(tag));
                        self.out.extend_from_slice(&BackendMessage::CommandComplete(tag.into()).to_bytes());
                    }
                    Err(e) => {
                        self.advance(Event::QueryError);
                        self.out.extend_from_slice(&BackendMessage::ErrorResponse(e).to_bytes());
                    }
                }
            }
            Err(e) => {
                for (shard, b) in &all {
                    self.shared.shard_servers(*shard).failed(&b.server);
                }
                drop(all);
                self.advance(Event::QueryError);
                let msg = format!("refract: a shard was lost while ending the transaction: {e}");
                self.out.extend_from_slice(&reply::error(sqlstate::CONNECTION_FAILURE, &msg));
            }
        }
        Ok(())
    }

    /// Whether `begin` (a BEGIN / START TRANSACTION text) asks for a read-only transaction.
    fn read_only_begin(&self, begin: &str) -> bool {
        matches!(self.shared.classifier.classify(begin).statements.as_slice(), [Statement::Begin { read_only: true }])
    }

    /// Where an extended batch runs in a sharded cluster: bound on the one shard its
    /// statements name (moving an open transaction there when two-phase commit allows it, as
    /// a simple query's would), run by refract across shards outside a transaction (or to end
    /// a transaction open on several), or refused with the reason.
    pub(crate) async fn place_batch(
        &mut self,
        sh: &Sharding,
        msgs: &[FrontendMessage],
        route_class: Route,
        key: u64,
        tables: &[String],
        synced: bool,
    ) -> Placed {
        let in_tx = self.phase().in_transaction();
        if !in_tx {
            self.tx_begin = None;
        }
        let binds = msgs.iter().any(|m| matches!(m, FrontendMessage::Bind(_) | FrontendMessage::Execute { .. }));
        if self.bound.is_none() && self.phase().tx() == TxStatus::Failed && synced {
            // A transaction refract failed (and rolled back): answered here up to its end.
            return Placed::Across;
        }
        if !binds && self.bound.is_none() {
            // Only Parse, Describe, Close: answered without binding a shard, so that a
            // statement prepared ahead (asyncpg, pgx) or inside a transaction not yet on a
            // shard does not tie the session to one.
            return Placed::Across;
        }
        if !self.parked.is_empty() && self.batch_sets_savepoints(msgs) {
            let why = "savepoints are not supported in a transaction on several shards";
            return Placed::Answered(self.refuse_batch(sh, sqlstate::FEATURE_NOT_SUPPORTED, why, synced).await);
        }
        if route_class == Route::Write {
            // An INSERT without a column list names its key by position.
            let mut written: Vec<String> = vec![];
            for text in self.statement_texts(msgs).into_iter().flatten() {
                written.extend(self.classify_text(text).0.tables.iter().cloned());
            }
            self.learn_key_positions(sh, &written).await;
        }
        let refused = match self.shard_of_batch(sh, msgs, route_class == Route::Read) {
            BatchShard::At(shard) => {
                if let Err(why) = self.follow_to(sh, shard, in_tx, "batch").await {
                    return Placed::Answered(
                        self.refuse_batch(sh, sqlstate::FEATURE_NOT_SUPPORTED, &why, synced).await,
                    );
                }
                if !in_tx {
                    self.note_begin(msgs);
                }
                sh.count_statement(&[shard]);
                return Placed::Bound(self.bind_shard(shard, route_class, Some(key), tables).await);
            }
            BatchShard::Across if !synced => (
                sqlstate::FEATURE_NOT_SUPPORTED,
                "this batch needs several shards, and refract runs such a batch when it ends with Sync (not Flush)"
                    .to_owned(),
            ),
            BatchShard::Across => return Placed::Across,
            BatchShard::Refused(code, why) => (code, why),
        };
        Placed::Answered(self.refuse_batch(sh, refused.0, &refused.1, synced).await)
    }

    /// Refuses a batch with `code` and `why` (a transaction fails, as with
    /// [`Session::refuse_sharded`]); the rest of an unsynced batch is dropped up to its Sync.
    async fn refuse_batch(&mut self, sh: &Sharding, code: &str, why: &str, synced: bool) -> Result<(), PgError> {
        sh.count_refused();
        if self.phase().in_transaction() {
            self.abort_on_shard().await;
            self.advance(Event::QueryError);
            self.advance(Event::Ready(TxStatus::Failed));
        }
        self.out.extend_from_slice(&reply::error(code, &format!("refract: {why}")));
        self.advance(Event::Refused { synced });
        if synced {
            self.out.extend_from_slice(&reply::ready_for_query(self.phase().tx()));
        }
        self.flush().await
    }

    /// Whether a statement the batch parses or binds is SAVEPOINT, RELEASE or ROLLBACK TO.
    fn batch_sets_savepoints(&self, msgs: &[FrontendMessage]) -> bool {
        let texts = self.statement_texts(msgs);
        texts
            .into_iter()
            .flatten()
            .any(|t| self.classify_text(t).0.statements.iter().any(|s| matches!(s, Statement::Savepoint)))
    }

    /// Remembers the BEGIN a batch starting a transaction binds (each further shard the
    /// transaction reaches begins it the same way).
    fn note_begin(&mut self, msgs: &[FrontendMessage]) {
        let texts = self.statement_texts(msgs);
        let begin = texts
            .into_iter()
            .flatten()
            .find(|t| matches!(self.classify_text(t).0.statements.as_slice(), [Statement::Begin { .. }]));
        if let Some(b) = begin.map(str::to_owned) {
            self.tx_begin = Some(b);
        }
    }

    /// Extended protocol: the one shard every statement the batch binds runs on (a batch that
    /// only parses or describes, or binds session statements, runs where the session is, or on
    /// any shard); `Across` when they need several shards, or different ones, or end a
    /// transaction open on several.
    fn shard_of_batch(&self, sh: &Sharding, msgs: &[FrontendMessage], read: bool) -> BatchShard {
        if let Some(refused) = self.batch_setting(msgs) {
            return refused;
        }
        let mut parsed: HashMap<&str, &str> = HashMap::new();
        let mut at: Option<usize> = None;
        let mut across = false;
        for m in msgs {
            let FrontendMessage::Parse { name, query, .. } = m else {
                let FrontendMessage::Bind(b) = m else { continue };
                let prepared = || match &self.state.prepared.get(&b.statement)?.origin {
                    Origin::Protocol { query, .. } => Some(query.as_str()),
                    Origin::Sql { .. } => None,
                };
                let text = parsed.get(b.statement.as_str()).copied().or_else(prepared);
                let Some(text) = text else { continue };
                let c = self.classify_text(text).0;
                if c.statements.iter().all(|s| !matches!(s, Statement::Read | Statement::Write)) {
                    // A session statement runs where the session is; the end of a transaction
                    // on several shards is refract's.
                    across |= !self.parked.is_empty()
                        && matches!(c.statements.as_slice(), [Statement::Commit | Statement::Rollback]);
                    continue;
                }
                let values: Vec<Option<&[u8]>> = b.params.iter().map(|p| p.as_deref()).collect();
                let params = Params { formats: &b.param_formats, values: &values };
                let target = self.forced_target(sh, text).unwrap_or_else(|| route(sh, text, read, Some(params)));
                let shard = match target {
                    Target::Any => continue,
                    Target::Shards(s) if s.len() == 1 => s[0],
                    Target::Refuse(why) => return BatchShard::Refused(sqlstate::FEATURE_NOT_SUPPORTED, why),
                    Target::Fail(code, why) => return BatchShard::Refused(code, why),
                    _ => {
                        across = true;
                        continue;
                    }
                };
                across |= at.is_some_and(|a| a != shard);
                at = Some(shard);
                continue;
            };
            parsed.insert(name, query);
        }
        if across {
            return BatchShard::Across;
        }
        let here = self.bound.as_ref().map(|_| self.shard);
        BatchShard::At(at.or(here).or(self.shard_override).unwrap_or_else(|| sh.any_shard()))
    }

    /// `/* refract: explain */`: where the statement would run and why, as rows of one text
    /// column `route`; the statement does not run.
    async fn explain(&mut self, sh: &Sharding, sql: &str, c: &Classification) -> Result<(), PgError> {
        let read = self.route(c) == Route::Read;
        let target = self.target(sh, sql, c, read);
        let lines = self.explain_override(sh, sql, read).unwrap_or_else(|| explain_lines(sh, &target, read));
        self.out.extend_from_slice(&reply::text_rows("route", &lines));
        let tag = format!("SELECT {}", lines.len());
        self.out.extend_from_slice(&BackendMessage::CommandComplete(tag).to_bytes());
        self.out.extend_from_slice(&reply::ready_for_query(self.phase().tx()));
        self.flush().await
    }
}

/// The CommandComplete PostgreSQL gives `sql` (BEGIN or START TRANSACTION).
fn begin_tag(sql: &str) -> &'static str {
    let start = pg_query::parse(sql, 0).ok().is_some_and(|p| {
        p.protobuf.stmts.iter().filter_map(|r| r.stmt.as_ref()?.node.as_ref()).any(|n| {
            matches!(n, pg_query::NodeEnum::TransactionStmt(t) if t.kind == pg_query::protobuf::TransactionStmtKind::TransStmtStart as i32)
        })
    });
    if start {
        "START TRANSACTION"
    } else {
        "BEGIN"
    }
}

/// ROLLBACK on every connection (`Err`: one was lost).
async fn rollback_all(all: &mut [(usize, Bound)]) -> Result<Result<(), refract_pg::ErrorFields>, PgError> {
    for (_, b) in all.iter_mut() {
        if let Err(e) = twophase::exec(&mut b.guard, "ROLLBACK").await? {
            tracing::debug!(error = ?e.message(), "ROLLBACK on a shard failed");
        }
    }
    Ok(Ok(()))
}

/// `SHOW max_prepared_transactions` on a primary of `servers`.
async fn ask_prepared(servers: &crate::server::servers::Servers) -> Result<Option<String>, PgError> {
    let primary = servers.primary().ok_or_else(|| PgError::Unavailable("no primary".into()))?;
    let mut g = primary.pool.get(crate::server::sizes::Path::Direct).await?;
    let v = g.query_one("show max_prepared_transactions").await?;
    g.release();
    Ok(v)
}

/// `s` as an SQL string literal.
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The shards a multi-shard target names, for messages.
fn describe(sh: &Sharding, t: &Target) -> String {
    let names = |s: &[usize]| s.iter().map(|&i| sh.names[i].as_str()).collect::<Vec<_>>().join(", ");
    match t {
        Target::Shards(s) | Target::Scatter(s, _) => names(s),
        Target::Split(parts) => names(&parts.iter().map(|(i, _)| *i).collect::<Vec<_>>()),
        _ => "every shard".into(),
    }
}

/// The explain rows for `t`.
fn explain_lines(sh: &Sharding, t: &Target, read: bool) -> Vec<String> {
    let kind = if read { "read" } else { "write" };
    match t {
        Target::Any => vec![format!("{kind} on one shard (any): it names no sharded table")],
        Target::Shards(s) if s.len() == 1 => {
            vec![format!("{kind} on shard {}: the key values it names are there", sh.names[s[0]])]
        }
        Target::Shards(s) => {
            vec![format!("{kind} on shards {} (row counts summed)", describe(sh, &Target::Shards(s.clone())))]
        }
        Target::Scatter(_, plan) => vec![
            format!("scatter-gather read on shards {}", describe(sh, t)),
            format!("each shard runs: {}", plan.sql),
            format!("merge: {:?}, order {:?}, offset {}, limit {:?}", plan.shape, plan.order, plan.offset, plan.limit),
        ],
        Target::Split(parts) => {
            parts.iter().map(|(i, sql)| format!("insert on shard {}: {sql}", sh.names[*i])).collect()
        }
        Target::Copies => vec![format!("{kind} on every shard (replicated tables or DDL: the answer of one copy)")],
        Target::CopyIn(Some((table, _))) => {
            vec![format!("COPY FROM on every shard, each row to the shard its {table} key names")]
        }
        Target::CopyIn(None) => vec!["COPY FROM on every shard, every row to each (a replicated table)".into()],
        Target::CopyOut => vec!["COPY TO from every shard, one after the other".into()],
        Target::Statements => {
            vec!["several statements, each on the shards it needs, in one transaction per shard committed together"
                .into()]
        }
        Target::Refuse(why) => vec![format!("refused (0A000): {why}")],
        Target::Fail(code, why) => vec![format!("refused ({code}): {why}")],
    }
}
