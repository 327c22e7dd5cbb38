//! A transaction in a sharded cluster: its BEGIN and COMMIT / ROLLBACK answered or run by
//! refract, its moves from shard to shard (under the two-phase rules), and its end on each
//! of its shards (two-phase commit, or a rollback everywhere).

use super::session::IN_FAILED_TX;
use super::{twophase, tx, Sharding};
use crate::error::PgError;
use crate::session::phase::{Event, InTx};
use crate::session::Bound;
use crate::session::Session;
use refract_pg::classify::{Classification, Statement};
use refract_pg::notice::sqlstate;
use refract_pg::{reply, BackendMessage, TxStatus};

pub(crate) use super::tx::End;

impl Session {
    /// BEGIN is held (answered here); COMMIT or ROLLBACK of a transaction that never reached a
    /// shard, and any statement of a transaction failed here, are answered here too.
    pub(super) async fn tx_control_locally(&mut self, sql: &str, c: &Classification) -> Result<bool, PgError> {
        let ends = |s: &Statement| matches!(s, Statement::Commit | Statement::Rollback);
        let (tag, status) = match c.statements.as_slice() {
            [Statement::Begin { .. }] if self.bound.is_none() && !self.phase().in_transaction() => {
                // The client's own text keeps its options (ISOLATION LEVEL, READ ONLY).
                self.shard_tx_on(tx::Event::HeldBegin(sql));
                (begin_tag(sql), TxStatus::InTransaction)
            }
            [st] if ends(st) && self.bound.is_none() && self.phase().in_transaction() => {
                self.shard_tx_on(tx::Event::EndedHere);
                let failed = self.phase().tx() == TxStatus::Failed;
                (if failed || matches!(st, Statement::Rollback) { "ROLLBACK" } else { "COMMIT" }, TxStatus::Idle)
            }
            _ if self.bound.is_none() && self.phase().tx() == TxStatus::Failed => {
                let msg = "current transaction is aborted, commands ignored until end of transaction block";
                self.io.out.extend_from_slice(&reply::error(IN_FAILED_TX, msg));
                self.io.out.extend_from_slice(&reply::ready_for_query(TxStatus::Failed));
                self.flush().await?;
                return Ok(true);
            }
            _ => return Ok(false),
        };
        self.advance(Event::Completed(tag));
        self.advance(Event::Ready(status));
        self.io.out.extend_from_slice(&BackendMessage::CommandComplete(tag.into()).to_bytes());
        self.io.out.extend_from_slice(&reply::ready_for_query(status));
        self.flush().await?;
        Ok(true)
    }

    /// Rolls back the transaction on each of its shards and gives the connections back
    /// (dropped where the rollback fails).
    pub(super) async fn abort_on_shard(&mut self) {
        self.shard_tx_on(tx::Event::Ended);
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
    pub(super) async fn release_on(&mut self, shard: usize, b: Bound) {
        let here = std::mem::replace(&mut self.shard, shard);
        self.bound = Some(b);
        self.release().await;
        self.shard = here;
    }

    /// Takes a bound session to `shard` when the `what` (statement or batch) runs there: an
    /// open transaction moves under the two-phase rules; a pinned connection stays. `Err`: the
    /// refusal's reason.
    pub(super) async fn follow_to(
        &mut self,
        sh: &Sharding,
        shard: usize,
        in_tx: InTx,
        what: &str,
    ) -> Result<(), String> {
        if self.bound.is_none() || shard == self.shard {
            return Ok(());
        }
        let second = if in_tx == InTx::Yes {
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
    pub(super) async fn second_shard(&mut self, sh: &Sharding, to: usize) -> Result<(), String> {
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
            self.shard_tx_on(tx::Event::Moved);
        }
    }

    /// COMMIT (two-phase, over every shard of the transaction) or ROLLBACK of a transaction
    /// on several shards, for a simple Query.
    pub(super) async fn end_on_shards(&mut self, sh: &Sharding, end: End) -> Result<(), PgError> {
        self.end_tx(sh, end).await?;
        self.advance(Event::Ready(TxStatus::Idle));
        self.io.out.extend_from_slice(&reply::ready_for_query(TxStatus::Idle));
        self.flush().await
    }

    /// Ends the open transaction on each of its shards (see [`Session::end_on_shards`]): the
    /// client gets its CommandComplete or error; ReadyForQuery is the caller's.
    pub(crate) async fn end_tx(&mut self, sh: &Sharding, end: End) -> Result<(), PgError> {
        let failed = self.phase().tx() == TxStatus::Failed;
        let commit = end == End::Commit && !failed;
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
        self.shard_tx_on(tx::Event::Ended);
        let tag = if commit { "COMMIT" } else { "ROLLBACK" };
        match outcome {
            Ok(result) => {
                for (shard, b) in all {
                    self.release_on(shard, b).await;
                }
                match result {
                    Ok(()) => {
                        self.advance(Event::Completed(tag));
                        self.io.out.extend_from_slice(&BackendMessage::CommandComplete(tag.into()).to_bytes());
                    }
                    Err(e) => {
                        self.advance(Event::QueryError);
                        self.io.out.extend_from_slice(&BackendMessage::ErrorResponse(e).to_bytes());
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
                self.io.out.extend_from_slice(&reply::error(sqlstate::CONNECTION_FAILURE, &msg));
            }
        }
        Ok(())
    }

    /// Whether `begin` (a BEGIN / START TRANSACTION text) asks for a read-only transaction.
    pub(super) fn read_only_begin(&self, begin: &str) -> bool {
        matches!(self.shared.classifier.classify(begin).statements.as_slice(), [Statement::Begin { read_only: true }])
    }
}

/// The CommandComplete PostgreSQL gives `sql` (BEGIN or START TRANSACTION).
pub(super) fn begin_tag(sql: &str) -> &'static str {
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
pub(super) async fn rollback_all(all: &mut [(usize, Bound)]) -> Result<Result<(), refract_pg::ErrorFields>, PgError> {
    for (_, b) in all.iter_mut() {
        if let Err(e) = twophase::exec(&mut b.guard, "ROLLBACK").await? {
            tracing::debug!(error = ?e.message(), "ROLLBACK on a shard failed");
        }
    }
    Ok(Ok(()))
}

/// `SHOW max_prepared_transactions` on a primary of `servers`.
pub(super) async fn ask_prepared(servers: &crate::server::servers::Servers) -> Result<Option<String>, PgError> {
    let primary = servers.primary().ok_or_else(|| PgError::Unavailable("no primary".into()))?;
    let mut g = primary.pool.get(crate::server::sizes::Path::Direct).await?;
    let v = g.query_one("show max_prepared_transactions").await?;
    g.release();
    Ok(v)
}
