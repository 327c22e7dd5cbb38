//! A statement on several shards, outside a transaction: a connection per shard (admitted
//! and checked out as any statement's, straight to the server), the session's SETs, then
//! - a read: the plan's SQL on each, the rows combined by `refract_shard::scatter::Gather` as they
//!   stream (one pending row per shard; memory does not grow with the result);
//! - a write: `BEGIN`, the statement (or each shard's own INSERT), then, when all succeeded,
//!   two-phase commit (`twophase`) where the shards and the configuration allow it, else
//!   `COMMIT` on each; `ROLLBACK` on every shard when one failed (the client gets that error);
//!   row counts summed (a sharded table) or one copy's (replicated tables, DDL). Commands
//!   PostgreSQL refuses inside a transaction block (VACUUM, CREATE INDEX CONCURRENTLY, ...)
//!   run without one. Without two-phase commit a COMMIT that fails on one shard after another
//!   committed is reported, not undone (docs/sharding.md).

use super::route::Target;
use super::transaction::End;
use super::Sharding;
use crate::error::PgError;
use crate::server::pool::Guard;
use crate::server::servers::Server;
use crate::server::sizes::Path;
use crate::session::phase::{BatchEnd, Event};
use crate::session::{Session, FLUSH_AT};
use bytes::Bytes;
use pg_query::NodeEnum;
use refract_pg::backend::FieldDescription;
use refract_pg::classify::Classification;
use refract_pg::notice::sqlstate;
use refract_pg::{reply, BackendMessage, ErrorFields, FrontendMessage, TxStatus};
use refract_shard::scatter::{self, Gather, GatherError, Placement, Plan, Step};
use std::sync::Arc;

/// One shard's connection for the statement.
pub(crate) struct Leg {
    pub(crate) shard: usize,
    pub(crate) guard: Guard,
    server: Arc<Server>,
    admitted: crate::admit::permit::Admitted,
}

impl Leg {
    /// Gives the connection back after a unit of work that ended well.
    pub(super) fn finish(self) {
        self.admitted.finish();
        self.guard.release();
    }

    /// The connection as a transaction's binding on its shard.
    pub(super) fn into_bound(self) -> crate::session::Bound {
        let synced = crate::session::ParamSync::Done;
        crate::session::Bound::new(self.guard, self.server, Some(self.admitted), synced)
    }

    /// Marks the connection's server failed (its state is not known; it is dropped).
    pub(super) fn failed(&self, shared: &crate::Shared) {
        shared.shard_servers(self.shard).failed(&self.server);
    }
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
            Err(e) => return self.refuse(e, BatchEnd::Sync).await,
        };
        sh.count_statement(&shards);
        if target == Target::Copies {
            sh.forget_positions();
        }
        let result = match &target {
            Target::Scatter(_, plan) => {
                let request = query_message(&plan.sql);
                let mut guards: Vec<&mut Guard> = legs.iter_mut().map(|l| &mut l.guard).collect();
                self.scatter_read(sh, &mut guards, plan, &request, true).await.map(|_| ())
            }
            Target::CopyOut => match self.copy_out_shards(&mut legs, sql).await {
                Ok(Some(e)) => {
                    self.advance(Event::QueryError);
                    self.io.out.extend_from_slice(&BackendMessage::ErrorResponse(e).to_bytes());
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
                    l.finish();
                }
                self.advance(Event::Ready(TxStatus::Idle));
                self.io.out.extend_from_slice(&reply::ready_for_query(TxStatus::Idle));
                self.flush().await
            }
            Err(e) => self.legs_lost(legs, e).await,
        }
    }

    /// Ends a unit of work on `legs` that failed with `e`: their state is not known, so the
    /// connections are dropped, not released; then [`Session::server_lost`].
    pub(super) async fn legs_lost(&mut self, legs: Vec<Leg>, e: PgError) -> Result<(), PgError> {
        for l in &legs {
            l.failed(&self.shared);
        }
        drop(legs);
        self.server_lost(e).await
    }

    /// The client's answer when a shard's connection was lost mid-statement (08006 and
    /// ReadyForQuery, outside any transaction now); an error on the client's side is returned.
    pub(super) async fn server_lost(&mut self, e: PgError) -> Result<(), PgError> {
        if e.side() == refract_pg::Side::Client {
            return Err(e);
        }
        self.advance(Event::ServerLost);
        self.io.out.extend_from_slice(&reply::error(sqlstate::CONNECTION_FAILURE, &format!("refract: {e}")));
        self.io.out.extend_from_slice(&reply::ready_for_query(TxStatus::Idle));
        self.flush().await
    }

    /// A connection on each of `shards` (a replica when `read` allows), with the session's SETs.
    pub(super) async fn legs(&mut self, shards: &[usize], read: bool, tables: &[String]) -> Result<Vec<Leg>, PgError> {
        let mut legs = Vec::with_capacity(shards.len());
        for &i in shards {
            let servers = self.shared.shard_servers(i).clone();
            let mut candidates = if read && self.floors[i].pending_write.is_none() {
                servers.replicas_for_read(self.floors[i].min_lsn, tables, None)
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
        let requests: Vec<Bytes> = sqls.iter().map(|s| query_message(s)).collect();
        let mut got = written_on(legs, &requests).await?;
        if in_block {
            let end = if got.error.is_none() { End::Commit } else { End::Rollback };
            if let Some(e) = end_block(sh, legs, end).await? {
                got.error.get_or_insert(e);
            }
        }
        self.written(got, placement, legs.len(), true);
        Ok(())
    }

    /// The client's answer to a write on `legs` shards: the error, or the rows (RETURNING, with
    /// their description when `describe`) and the combined CommandComplete. Returns whether the
    /// client got an error.
    pub(super) fn written(&mut self, got: Written, placement: Placement, legs: usize, describe: bool) -> bool {
        let Written { error, tags, description, rows } = got;
        if let Some(e) = error {
            self.io.out.extend_from_slice(&BackendMessage::ErrorResponse(e).to_bytes());
            self.advance(Event::QueryError);
            return true;
        }
        let tag = combined_tag(&tags, placement);
        let tag = match tag {
            Ok(t) => t,
            Err(why) => {
                self.io.out.extend_from_slice(&reply::error(sqlstate::INTERNAL_ERROR, &format!("refract: {why}")));
                return true;
            }
        };
        if let Some(d) = description {
            if describe {
                self.io.out.extend_from_slice(&d);
            }
            // RETURNING of a replicated table: one copy's rows.
            let keep = if placement == Placement::Replicated { rows.len() / legs.max(1) } else { rows.len() };
            rows.iter().take(keep).for_each(|r| self.io.out.extend_from_slice(r));
        }
        self.advance(Event::Completed(&tag));
        self.io.out.extend_from_slice(&BackendMessage::CommandComplete(tag).to_bytes());
        false
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
        let (tags, mut error) = self.copy_in_shards(sh, legs, sql, key).await?;
        let end = if error.is_none() { End::Commit } else { End::Rollback };
        if let Some(e) = end_block(sh, legs, end).await? {
            error.get_or_insert(e);
        }
        self.written(Written { error, tags, description: None, rows: vec![] }, placement, legs.len(), true);
        Ok(())
    }

    /// A read over every leg, combined by `plan` as the rows stream: `request` (a Query of the
    /// plan's SQL, or its Parse/Bind/Describe/Execute/Sync) is sent to each; the client gets the
    /// combined RowDescription when `describe`. Returns whether the client got an error.
    pub(super) async fn scatter_read(
        &mut self,
        sh: &Sharding,
        legs: &mut [&mut Guard],
        plan: &Plan,
        request: &[u8],
        describe: bool,
    ) -> Result<bool, PgError> {
        let c_collation = match sh.c_collation.get() {
            Some(c) => c,
            None => {
                let q = "select datcollate in ('C', 'POSIX') from pg_database where datname = current_database()";
                let c = legs[0].query_one(q).await?.as_deref() == Some("t");
                sh.c_collation.set(c);
                c
            }
        };
        for l in legs.iter_mut() {
            l.wire.send(request).await?;
        }
        // Each shard's RowDescription (or its error).
        let mut descs: Vec<Vec<FieldDescription>> = vec![];
        let mut first_error = None;
        for l in legs.iter_mut() {
            match first_answer(l).await? {
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
        if describe {
            self.io.out.extend_from_slice(&BackendMessage::RowDescription(gather.description().to_vec()).to_bytes());
        }
        loop {
            let step = match gather.step() {
                Ok(s) => s,
                Err(e) => return self.scatter_failed(legs, gather_error(&e)).await,
            };
            match step {
                Step::Row(row) => {
                    self.io.out.extend_from_slice(&BackendMessage::DataRow(row).to_bytes());
                    if self.io.out.len() >= FLUSH_AT {
                        self.flush().await?;
                    }
                }
                Step::Need(i) => match next_row(legs[i]).await? {
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
                    self.io.out.extend_from_slice(&BackendMessage::CommandComplete(tag).to_bytes());
                    for l in legs.iter_mut() {
                        drain(l).await?;
                    }
                    return Ok(false);
                }
            }
        }
    }

    /// Ends a failed scatter: the error to the client, every leg read to its ReadyForQuery.
    async fn scatter_failed(&mut self, legs: &mut [&mut Guard], error: Vec<u8>) -> Result<bool, PgError> {
        self.io.out.extend_from_slice(&error);
        self.advance(Event::QueryError);
        for l in legs.iter_mut() {
            drain(l).await?;
        }
        Ok(true)
    }
}

/// What a write on several shards answered, before it is combined for the client.
#[derive(Default)]
pub(super) struct Written {
    /// The first shard's error.
    pub(super) error: Option<ErrorFields>,
    /// Each shard's CommandComplete tag.
    pub(super) tags: Vec<String>,
    /// The first RowDescription (RETURNING) frame.
    pub(super) description: Option<Bytes>,
    /// Every shard's DataRow frames.
    pub(super) rows: Vec<Bytes>,
}

/// Sends `requests[i]` to leg i and reads each answer to its ReadyForQuery.
pub(super) async fn written_on(legs: &mut [Leg], requests: &[Bytes]) -> Result<Written, PgError> {
    let mut got = Written::default();
    for (l, request) in legs.iter_mut().zip(requests) {
        l.guard.wire.send(request).await?;
        loop {
            let (tag, frame) = l.guard.wire.recv().await?;
            match BackendMessage::decode(tag, &frame[5..])? {
                BackendMessage::RowDescription(_) if got.description.is_none() => got.description = Some(frame),
                BackendMessage::DataRow(_) => got.rows.push(frame),
                BackendMessage::CommandComplete(t) => got.tags.push(t),
                BackendMessage::ErrorResponse(e) if got.error.is_none() => got.error = Some(e),
                BackendMessage::ReadyForQuery(_) => break,
                _ => {}
            }
        }
    }
    Ok(got)
}

/// Ends the transaction block open on every leg: [`End::Commit`], two-phase commit where the
/// shards and the configuration allow it, else COMMIT on each; ROLLBACK on each otherwise.
/// `Some`: the error the client gets (a commit that failed).
pub(super) async fn end_block(sh: &Sharding, legs: &mut [Leg], end: End) -> Result<Option<ErrorFields>, PgError> {
    let commit = end == End::Commit;
    if commit && legs.len() > 1 && atomic_commit_possible(sh, legs).await? {
        if let Ok(log) = &sh.log {
            let mut conns: Vec<&mut Guard> = legs.iter_mut().map(|l| &mut l.guard).collect();
            return Ok(super::twophase::commit(log, &mut conns).await?.err());
        }
    }
    let end = if commit { "COMMIT" } else { "ROLLBACK" };
    let mut error = None;
    for l in legs.iter_mut() {
        if let Err(e) = l.guard.query(end).await {
            error.get_or_insert(match e {
                PgError::Server(f) => f,
                other => return Err(other),
            });
        }
    }
    Ok(error)
}

/// A simple Query message of `sql`.
fn query_message(sql: &str) -> Bytes {
    let mut out = bytes::BytesMut::new();
    FrontendMessage::Query(sql.to_owned()).encode(&mut out);
    out.freeze()
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
