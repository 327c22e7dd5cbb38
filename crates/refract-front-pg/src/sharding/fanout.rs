//! A statement on several shards, outside a transaction: a connection per shard (admitted
//! and checked out as any statement's, straight to the server), the session's SETs, then
//! - a read: the plan's SQL on each, the rows combined by `refract_pg::scatter::Gather` as they
//!   stream (one pending row per shard; memory does not grow with the result);
//! - a write: `BEGIN`, the statement (or each shard's own INSERT), then, when all succeeded,
//!   two-phase commit (`twophase`) where the shards and the configuration allow it, else
//!   `COMMIT` on each; `ROLLBACK` on every shard when one failed (the client gets that error);
//!   row counts summed (a sharded table) or one copy's (replicated tables, DDL). Commands
//!   PostgreSQL refuses inside a transaction block (VACUUM, CREATE INDEX CONCURRENTLY, ...)
//!   run without one. Without two-phase commit a COMMIT that fails on one shard after another
//!   committed is reported, not undone (docs/sharding.md).

use super::route::Target;
use super::Sharding;
use crate::error::PgError;
use crate::phase::Event;
use crate::pool::Guard;
use crate::servers::Server;
use crate::session::{Session, FLUSH_AT};
use crate::sizes::Path;
use bytes::Bytes;
use pg_query::NodeEnum;
use refract_pg::backend::FieldDescription;
use refract_pg::classify::Classification;
use refract_pg::notice::sqlstate;
use refract_pg::scatter::{self, Gather, GatherError, Placement, Plan, Step};
use refract_pg::{reply, BackendMessage, ErrorFields, FrontendMessage, TxStatus};
use std::sync::Arc;

/// One shard's connection for the statement.
pub(crate) struct Leg {
    pub(crate) shard: usize,
    pub(crate) guard: Guard,
    server: Arc<Server>,
    admitted: crate::permit::Admitted,
}

impl Session {
    /// Runs `target` (several shards) for the simple Query `sql`.
    pub(crate) async fn fan_out(
        &mut self,
        sh: &Sharding,
        target: Target,
        sql: &str,
        read: bool,
        c: &Classification,
    ) -> Result<(), PgError> {
        let (shards, placement): (Vec<usize>, Placement) = match &target {
            Target::Shards(s) | Target::Scatter(s, _) => (s.clone(), Placement::Sharded),
            Target::CopyIn(Some(_)) | Target::CopyOut => ((0..sh.count()).collect(), Placement::Sharded),
            Target::Split(parts) => (parts.iter().map(|(i, _)| *i).collect(), Placement::Sharded),
            _ => ((0..sh.count()).collect(), Placement::Replicated),
        };
        let mut legs = match self.legs(&shards, read, &c.tables).await {
            Ok(l) => l,
            Err(e) => return self.refuse(e, true).await,
        };
        sh.count_statement(&shards);
        if target == Target::Copies {
            sh.forget_positions();
        }
        let result = match &target {
            Target::Scatter(_, plan) => self.scatter_read(sh, &mut legs, plan).await,
            Target::CopyOut => match self.copy_out_shards(&mut legs, sql).await {
                Ok(Some(e)) => {
                    self.advance(Event::QueryError);
                    self.out.extend_from_slice(&BackendMessage::ErrorResponse(e).to_bytes());
                    Ok(())
                }
                other => other.map(|_| ()),
            },
            Target::CopyIn(key) => self.copy_write(sh, &mut legs, sql, key.as_ref()).await,
            Target::Split(parts) => {
                let sqls: Vec<&str> = parts.iter().map(|(_, s)| s.as_str()).collect();
                self.write_on(sh, &mut legs, &sqls, placement).await
            }
            _ => {
                let sqls = vec![sql; legs.len()];
                self.write_on(sh, &mut legs, &sqls, placement).await
            }
        };
        match result {
            Ok(()) => {
                for l in legs {
                    l.admitted.finish();
                    l.guard.release();
                }
                self.advance(Event::Ready(TxStatus::Idle));
                self.out.extend_from_slice(&reply::ready_for_query(TxStatus::Idle));
                self.flush().await
            }
            Err(e) => {
                // Their state is not known: the connections are dropped, not released.
                for l in &legs {
                    self.shared.shard_servers(l.shard).failed(&l.server);
                }
                drop(legs);
                if e.side() == refract_pg::Side::Client {
                    return Err(e);
                }
                self.advance(Event::ServerLost);
                self.out.extend_from_slice(&reply::error(sqlstate::CONNECTION_FAILURE, &format!("refract: {e}")));
                self.out.extend_from_slice(&reply::ready_for_query(TxStatus::Idle));
                self.flush().await
            }
        }
    }

    /// A connection on each of `shards` (a replica when `read` allows), with the session's SETs.
    async fn legs(&mut self, shards: &[usize], read: bool, tables: &[String]) -> Result<Vec<Leg>, PgError> {
        let mut legs = Vec::with_capacity(shards.len());
        for &i in shards {
            let servers = self.shared.shard_servers(i).clone();
            let mut candidates = if read && self.floors[i].pending_write.is_none() {
                servers.replicas_for_read(self.floors[i].min_lsn, tables)
            } else {
                vec![]
            };
            candidates.extend(servers.primary());
            if candidates.is_empty() {
                return Err(PgError::Unavailable(format!("refract: shard {i} has no server available")));
            }
            let (server, admitted) = self.admit(&candidates).await?;
            let mut guard = server.pool.get(Path::Direct).await?;
            if let Some(sql) = guard.params_sql(&self.state.params) {
                guard.query(&sql).await?;
                guard.applied = Some(self.state.params.params().map(|(n, t)| (n.to_owned(), t.to_owned())).collect());
            }
            legs.push(Leg { shard: i, guard, server, admitted });
        }
        Ok(legs)
    }

    /// A write on every leg (`sqls[i]` on leg i) in a transaction per shard, committed on all
    /// or rolled back on all; the client gets one answer.
    async fn write_on(
        &mut self,
        sh: &Sharding,
        legs: &mut [Leg],
        sqls: &[&str],
        placement: Placement,
    ) -> Result<(), PgError> {
        let in_block = sqls.first().is_none_or(|s| runs_in_a_block(s));
        if in_block {
            for l in legs.iter_mut() {
                l.guard.query("BEGIN").await?;
            }
        }
        let mut tags = vec![];
        let mut rows = vec![];
        let mut description = None;
        let mut error = None;
        for (l, sql) in legs.iter_mut().zip(sqls) {
            let mut out = bytes::BytesMut::new();
            FrontendMessage::Query((*sql).to_owned()).encode(&mut out);
            l.guard.wire.send(&out).await?;
            loop {
                let (tag, frame) = l.guard.wire.recv().await?;
                match BackendMessage::decode(tag, &frame[5..])? {
                    BackendMessage::RowDescription(_) if description.is_none() => description = Some(frame),
                    BackendMessage::DataRow(_) => rows.push(frame),
                    BackendMessage::CommandComplete(t) => tags.push(t),
                    BackendMessage::ErrorResponse(e) if error.is_none() => error = Some(e),
                    BackendMessage::ReadyForQuery(_) => break,
                    _ => {}
                }
            }
        }
        if !in_block {
            return self.written(error, tags, description, rows, placement, legs.len());
        }
        self.finish_write(sh, legs, tags, description, rows, error, placement).await
    }

    /// Ends the transaction a write opened on every leg: two-phase commit where possible,
    /// else COMMIT on each; ROLLBACK on each after an error. Then the client's answer.
    #[allow(clippy::too_many_arguments)]
    async fn finish_write(
        &mut self,
        sh: &Sharding,
        legs: &mut [Leg],
        tags: Vec<String>,
        description: Option<Bytes>,
        rows: Vec<Bytes>,
        mut error: Option<ErrorFields>,
        placement: Placement,
    ) -> Result<(), PgError> {
        if error.is_none() && atomic_commit_possible(sh, legs).await? {
            if let Ok(log) = &sh.log {
                let mut conns: Vec<&mut Guard> = legs.iter_mut().map(|l| &mut l.guard).collect();
                error = super::twophase::commit(log, &mut conns).await?.err();
                return self.written(error, tags, description, rows, placement, legs.len());
            }
        }
        let end = if error.is_none() { "COMMIT" } else { "ROLLBACK" };
        for l in legs.iter_mut() {
            if let Err(e) = l.guard.query(end).await {
                error.get_or_insert(match e {
                    PgError::Server(f) => f,
                    other => return Err(other),
                });
            }
        }
        self.written(error, tags, description, rows, placement, legs.len())
    }

    /// The client's answer to a write on `legs` shards: the error, or the rows (RETURNING) and
    /// the combined CommandComplete.
    fn written(
        &mut self,
        error: Option<ErrorFields>,
        tags: Vec<String>,
        description: Option<Bytes>,
        rows: Vec<Bytes>,
        placement: Placement,
        legs: usize,
    ) -> Result<(), PgError> {
        if let Some(e) = error {
            self.out.extend_from_slice(&BackendMessage::ErrorResponse(e).to_bytes());
            self.advance(Event::QueryError);
            return Ok(());
        }
        let tag = combined_tag(&tags, placement);
        let tag = match tag {
            Ok(t) => t,
            Err(why) => {
                self.out.extend_from_slice(&reply::error(sqlstate::INTERNAL_ERROR, &format!("refract: {why}")));
                return Ok(());
            }
        };
        if let Some(d) = description {
            self.out.extend_from_slice(&d);
            // RETURNING of a replicated table: one copy's rows.
            let keep = if placement == Placement::Replicated { rows.len() / legs.max(1) } else { rows.len() };
            rows.iter().take(keep).for_each(|r| self.out.extend_from_slice(r));
        }
        self.advance(Event::Completed(&tag));
        self.out.extend_from_slice(&BackendMessage::CommandComplete(tag).to_bytes());
        Ok(())
    }

    /// `COPY ... FROM STDIN` on every leg in a transaction each, committed together.
    async fn copy_write(
        &mut self,
        sh: &Sharding,
        legs: &mut [Leg],
        sql: &str,
        key: Option<&(String, usize)>,
    ) -> Result<(), PgError> {
        for l in legs.iter_mut() {
            l.guard.query("BEGIN").await?;
        }
        let placement = if key.is_some() { Placement::Sharded } else { Placement::Replicated };
        let (tags, error) = self.copy_in_shards(sh, legs, sql, key).await?;
        self.finish_write(sh, legs, tags, None, vec![], error, placement).await
    }

    /// A read over every leg, combined by `plan` as the rows stream.
    async fn scatter_read(&mut self, sh: &Sharding, legs: &mut [Leg], plan: &Plan) -> Result<(), PgError> {
        let c_collation = match sh.c_collation.get() {
            Some(c) => c,
            None => {
                let q = "select datcollate in ('C', 'POSIX') from pg_database where datname = current_database()";
                let c = legs[0].guard.query_one(q).await?.as_deref() == Some("t");
                sh.c_collation.set(c);
                c
            }
        };
        let mut out = bytes::BytesMut::new();
        FrontendMessage::Query(plan.sql.clone()).encode(&mut out);
        for l in legs.iter_mut() {
            l.guard.wire.send(&out).await?;
        }
        // Each shard's RowDescription (or its error).
        let mut descs: Vec<Vec<FieldDescription>> = vec![];
        let mut first_error = None;
        for l in legs.iter_mut() {
            match first_answer(&mut l.guard).await? {
                Ok(d) => descs.push(d),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            return self.scatter_failed(legs, BackendMessage::ErrorResponse(e).to_bytes().to_vec()).await;
        }
        let mut gather = match Gather::new(plan, &descs, c_collation) {
            Ok(g) => g,
            Err(e) => return self.scatter_failed(legs, gather_error(&e)).await,
        };
        self.out.extend_from_slice(&BackendMessage::RowDescription(gather.description().to_vec()).to_bytes());
        loop {
            let step = match gather.step() {
                Ok(s) => s,
                Err(e) => return self.scatter_failed(legs, gather_error(&e)).await,
            };
            match step {
                Step::Row(row) => {
                    self.out.extend_from_slice(&BackendMessage::DataRow(row).to_bytes());
                    if self.out.len() >= FLUSH_AT {
                        self.flush().await?;
                    }
                }
                Step::Need(i) => match next_row(&mut legs[i].guard).await? {
                    Ok(row) => {
                        if let Err(e) = gather.push(i, row) {
                            return self.scatter_failed(legs, gather_error(&e)).await;
                        }
                    }
                    Err(e) => {
                        return self.scatter_failed(legs, BackendMessage::ErrorResponse(e).to_bytes().to_vec()).await
                    }
                },
                Step::Done(tag) => {
                    self.advance(Event::Completed(&tag));
                    self.out.extend_from_slice(&BackendMessage::CommandComplete(tag).to_bytes());
                    for l in legs.iter_mut() {
                        drain(&mut l.guard).await?;
                    }
                    return Ok(());
                }
            }
        }
    }

    /// Ends a failed scatter: the error to the client, every leg read to its ReadyForQuery.
    async fn scatter_failed(&mut self, legs: &mut [Leg], error: Vec<u8>) -> Result<(), PgError> {
        self.out.extend_from_slice(&error);
        self.advance(Event::QueryError);
        for l in legs.iter_mut() {
            drain(&mut l.guard).await?;
        }
        Ok(())
    }
}

/// Whether the write's shards can commit with two-phase commit (a decision log, and every
/// shard's `max_prepared_transactions > 0`, asked on the leg's connection the first time).
async fn atomic_commit_possible(sh: &Sharding, legs: &mut [Leg]) -> Result<bool, PgError> {
    if sh.log.is_err() {
        return Ok(false);
    }
    for l in legs.iter_mut() {
        let ok = &sh.prepared_ok[l.shard];
        if ok.get().is_none() {
            let v = l.guard.query_one("show max_prepared_transactions").await?;
            ok.set(v.is_some_and(|v| v != "0"));
        }
        if ok.get() != Some(true) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A shard's first answer to a read: its RowDescription, or its error (read to the end).
async fn first_answer(g: &mut Guard) -> Result<Result<Vec<FieldDescription>, ErrorFields>, PgError> {
    loop {
        let (tag, frame) = g.wire.recv().await?;
        match BackendMessage::decode(tag, &frame[5..])? {
            BackendMessage::RowDescription(d) => return Ok(Ok(d)),
            BackendMessage::ErrorResponse(e) => return Ok(Err(e)),
            BackendMessage::CommandComplete(t) => {
                let e = ErrorFields::new(
                    "ERROR",
                    sqlstate::INTERNAL_ERROR,
                    format!("refract: a shard answered {t:?} without rows"),
                );
                return Ok(Err(e));
            }
            _ => {}
        }
    }
}

/// A shard's next row (`None` at its CommandComplete), or its error.
async fn next_row(g: &mut Guard) -> Result<Result<Option<Vec<Option<Bytes>>>, ErrorFields>, PgError> {
    loop {
        let (tag, frame) = g.wire.recv().await?;
        match BackendMessage::decode(tag, &frame[5..])? {
            BackendMessage::DataRow(row) => return Ok(Ok(Some(row))),
            BackendMessage::CommandComplete(_) => return Ok(Ok(None)),
            BackendMessage::ErrorResponse(e) => return Ok(Err(e)),
            _ => {}
        }
    }
}

/// Reads a shard's answer up to its ReadyForQuery (rows past a LIMIT, an error's end).
async fn drain(g: &mut Guard) -> Result<(), PgError> {
    loop {
        let (tag, _) = g.wire.recv().await?;
        if tag == b'Z' {
            return Ok(());
        }
    }
}

/// A gather error as the client's ErrorResponse.
fn gather_error(e: &GatherError) -> Vec<u8> {
    reply::error(e.sqlstate(), &format!("refract: {e}")).to_vec()
}

/// The CommandComplete of a write on several shards: counts summed (sharded) or one copy's
/// (replicated); a command without a count (DDL) must have answered alike everywhere.
fn combined_tag(tags: &[String], placement: Placement) -> Result<String, String> {
    let refs: Vec<&str> = tags.iter().map(String::as_str).collect();
    match scatter::write_tag(&refs, placement) {
        Ok(t) => Ok(t),
        Err(scatter::TagError::NotCounted(_)) if refs.windows(2).all(|w| w[0] == w[1]) && !refs.is_empty() => {
            Ok(refs[0].to_owned())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Whether PostgreSQL runs `sql` inside a transaction block (VACUUM, CREATE DATABASE, CREATE
/// INDEX CONCURRENTLY and the like refuse to).
fn runs_in_a_block(sql: &str) -> bool {
    let Ok(parsed) = pg_query::parse(sql, 0) else { return true };
    !parsed.protobuf.stmts.iter().filter_map(|r| r.stmt.as_ref()?.node.as_ref()).any(|n| match n {
        NodeEnum::VacuumStmt(_)
        | NodeEnum::CreatedbStmt(_)
        | NodeEnum::DropdbStmt(_)
        | NodeEnum::ReindexStmt(_)
        | NodeEnum::AlterSystemStmt(_)
        | NodeEnum::CreateTableSpaceStmt(_)
        | NodeEnum::DropTableSpaceStmt(_)
        | NodeEnum::CreateSubscriptionStmt(_)
        | NodeEnum::DropSubscriptionStmt(_) => true,
        NodeEnum::IndexStmt(i) => i.concurrent,
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_combine_by_placement_and_ddl_must_agree() {
        let t = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(combined_tag(&t(&["UPDATE 2", "UPDATE 3"]), Placement::Sharded), Ok("UPDATE 5".into()));
        assert_eq!(combined_tag(&t(&["INSERT 0 1", "INSERT 0 1"]), Placement::Replicated), Ok("INSERT 0 1".into()));
        assert_eq!(
            combined_tag(&t(&["CREATE TABLE", "CREATE TABLE"]), Placement::Replicated),
            Ok("CREATE TABLE".into())
        );
        assert!(combined_tag(&t(&["CREATE TABLE", "DROP TABLE"]), Placement::Replicated).is_err());
        assert!(runs_in_a_block("create table t (a int)"));
        assert!(!runs_in_a_block("vacuum t"));
        assert!(!runs_in_a_block("create index concurrently i on t (a)"));
    }
}
