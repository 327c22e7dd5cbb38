//! The client session in a sharded cluster: each simple Query or extended batch is routed
//! (`route`) and runs on one shard through the session's usual path (binding, SET replay,
//! prepared statements, hand-over), or on several (`fanout`), or is refused with the reason.
//! A transaction's BEGIN is held until its first statement names the shard; the transaction
//! then stays there (a statement needing another shard is refused and the transaction fails,
//! as two-phase commit is not implemented yet).

use super::route::{route, Target};
use super::tx::End;
use super::{tx, Sharding};
use crate::error::PgError;
use crate::session::phase::{BatchEnd, Event};
use crate::session::Session;
use bytes::{Bytes, BytesMut};
use refract_pg::classify::{fingerprint, Classification, Route, Statement};
use refract_pg::notice::sqlstate;
use refract_pg::{reply, BackendMessage, FrontendMessage, TxStatus};
use refract_shard::scatter::Plan;
use std::sync::Arc;

/// SQLSTATE `in_failed_sql_transaction`.
pub(super) const IN_FAILED_TX: &str = "25P02";

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
            self.shard_tx_on(tx::Event::OutsideTx);
        }
        if !self.parked.is_empty() {
            match c.statements.as_slice() {
                [Statement::Commit] => return self.end_on_shards(sh, End::Commit).await,
                [Statement::Rollback] => return self.end_on_shards(sh, End::Rollback).await,
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
            Target::Statements if !in_tx && self.bound.is_none() => return self.run_several_simple(sh, sql).await,
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
        if let Err(why) = self.follow_to(sh, shard, self.phase().in_tx(), "statement").await {
            return self.refuse_sharded(sh, sqlstate::FEATURE_NOT_SUPPORTED, &why).await;
        }
        sh.count_statement(&[shard]);
        let key = fingerprint(sql);
        if let Err(e) = self.bind_shard(shard, route_class, Some(key), &c.tables).await {
            return self.refuse(e, BatchEnd::Sync).await;
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
                self.io.out.extend_from_slice(&reply::ready_for_query(status));
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
    pub(super) async fn learn_key_positions(&mut self, sh: &Sharding, tables: &[String]) {
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
        let starts_tx = self.shard_tx().pending().is_some_and(|b| !self.read_only_begin(b));
        let route_class = if starts_tx { Route::Write } else { route_class };
        self.bind(route_class, key, tables, None).await?;
        let Some(begin) = self.shard_tx().pending().map(str::to_owned) else { return Ok(()) };
        self.shard_tx_on(tx::Event::Sent);
        let mut head = BytesMut::new();
        if self.params_prefix(&mut head)? {
            self.conn()?.wire.send(&head).await?;
            self.drain_prefix().await?;
        }
        self.conn()?.query(&begin).await?;
        Ok(())
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
        self.io.out.extend_from_slice(&reply::error(code, &format!("refract: {why}")));
        let status = if in_tx { TxStatus::Failed } else { TxStatus::Idle };
        self.advance(Event::QueryError);
        self.advance(Event::Ready(status));
        self.io.out.extend_from_slice(&reply::ready_for_query(status));
        self.flush().await
    }

    /// `/* refract: explain */`: where the statement would run and why, as rows of one text
    /// column `route`; the statement does not run.
    async fn explain(&mut self, sh: &Sharding, sql: &str, c: &Classification) -> Result<(), PgError> {
        let read = self.route(c) == Route::Read;
        let target = self.target(sh, sql, c, read);
        let lines = self.explain_override(sh, sql, read).unwrap_or_else(|| explain_lines(sh, &target, read));
        self.io.out.extend_from_slice(&reply::text_rows("route", &lines));
        let tag = format!("SELECT {}", lines.len());
        self.io.out.extend_from_slice(&BackendMessage::CommandComplete(tag).to_bytes());
        self.io.out.extend_from_slice(&reply::ready_for_query(self.phase().tx()));
        self.flush().await
    }
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
