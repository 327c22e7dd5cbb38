//! Where an extended batch runs in a sharded cluster ([`Placed`]): bound on the one shard its
//! statements name, run by refract over several shards, or refused with the reason.

use super::route::{route, Target};
use super::{tx, Sharding};
use crate::error::PgError;
use crate::session::phase::{BatchEnd, Event};
use crate::session::Session;
use refract_pg::classify::{Route, Statement};
use refract_pg::notice::sqlstate;
use refract_pg::session::Origin;
use refract_pg::{reply, FrontendMessage, TxStatus};
use refract_shard::keyparam::Params;
use std::collections::HashMap;

/// What [`Session::shard_of_batch`] found.
pub(super) enum BatchShard {
    /// Run the batch on this shard.
    At(usize),
    /// No one shard runs it: refract does (`several.rs`).
    Several,
    /// Refused: SQLSTATE and message.
    Refused(&'static str, String),
}

/// Where [`Session::place_batch`] put an extended batch.
pub(crate) enum Placed {
    /// Bound on its shard (or the binding's error): the caller runs it there.
    Bound(Result<(), PgError>),
    /// refract runs it over several shards (`Session::run_several`).
    Several,
    /// Answered here (refused).
    Answered(Result<(), PgError>),
}

impl Session {
    /// Where an extended batch runs in a sharded cluster: bound on the one shard its
    /// statements name (moving an open transaction there when two-phase commit allows it, as
    /// a simple query's would), run by refract over several shards outside a transaction (or to end
    /// a transaction open on several), or refused with the reason.
    pub(crate) async fn place_batch(
        &mut self,
        sh: &Sharding,
        msgs: &[FrontendMessage],
        route_class: Route,
        key: u64,
        tables: &[String],
        end: BatchEnd,
    ) -> Placed {
        let in_tx = self.phase().in_transaction();
        if !in_tx {
            self.shard_tx_on(tx::Event::OutsideTx);
        }
        let binds = msgs.iter().any(|m| matches!(m, FrontendMessage::Bind(_) | FrontendMessage::Execute { .. }));
        if self.bound.is_none() && self.phase().tx() == TxStatus::Failed && end == BatchEnd::Sync {
            // A transaction refract failed (and rolled back): answered here up to its end.
            return Placed::Several;
        }
        if !binds && self.bound.is_none() {
            // Only Parse, Describe, Close: answered without binding a shard, so that a
            // statement prepared ahead (asyncpg, pgx) or inside a transaction not yet on a
            // shard does not tie the session to one.
            return Placed::Several;
        }
        if !self.parked.is_empty() && self.batch_sets_savepoints(msgs) {
            let why = "savepoints are not supported in a transaction on several shards";
            return Placed::Answered(self.refuse_batch(sh, sqlstate::FEATURE_NOT_SUPPORTED, why, end).await);
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
                if let Err(why) = self.follow_to(sh, shard, self.phase().in_tx(), "batch").await {
                    return Placed::Answered(self.refuse_batch(sh, sqlstate::FEATURE_NOT_SUPPORTED, &why, end).await);
                }
                if !in_tx {
                    self.note_begin(msgs);
                }
                sh.count_statement(&[shard]);
                return Placed::Bound(self.bind_shard(shard, route_class, Some(key), tables).await);
            }
            BatchShard::Several if end == BatchEnd::Flush => (
                sqlstate::FEATURE_NOT_SUPPORTED,
                "this batch needs several shards, and refract runs such a batch when it ends with Sync (not Flush)"
                    .to_owned(),
            ),
            BatchShard::Several => return Placed::Several,
            BatchShard::Refused(code, why) => (code, why),
        };
        Placed::Answered(self.refuse_batch(sh, refused.0, &refused.1, end).await)
    }

    /// Refuses a batch with `code` and `why` (a transaction fails, as with
    /// [`Session::refuse_sharded`]); the rest of an unsynced batch is dropped up to its Sync.
    pub(super) async fn refuse_batch(
        &mut self,
        sh: &Sharding,
        code: &str,
        why: &str,
        end: BatchEnd,
    ) -> Result<(), PgError> {
        sh.count_refused();
        if self.phase().in_transaction() {
            self.abort_on_shard().await;
            self.advance(Event::QueryError);
            self.advance(Event::Ready(TxStatus::Failed));
        }
        self.io.out.extend_from_slice(&reply::error(code, &format!("refract: {why}")));
        self.advance(Event::Refused { end });
        if end == BatchEnd::Sync {
            self.io.out.extend_from_slice(&reply::ready_for_query(self.phase().tx()));
        }
        self.flush().await
    }

    /// Whether a statement the batch parses or binds is SAVEPOINT, RELEASE or ROLLBACK TO.
    pub(super) fn batch_sets_savepoints(&self, msgs: &[FrontendMessage]) -> bool {
        let texts = self.statement_texts(msgs);
        texts
            .into_iter()
            .flatten()
            .any(|t| self.classify_text(t).0.statements.iter().any(|s| matches!(s, Statement::Savepoint)))
    }

    /// Remembers the BEGIN a batch starting a transaction binds (each further shard the
    /// transaction reaches begins it the same way).
    pub(super) fn note_begin(&mut self, msgs: &[FrontendMessage]) {
        let texts = self.statement_texts(msgs);
        let begin = texts
            .into_iter()
            .flatten()
            .find(|t| matches!(self.classify_text(t).0.statements.as_slice(), [Statement::Begin { .. }]));
        if let Some(b) = begin.map(str::to_owned) {
            self.shard_tx_on(tx::Event::BatchBegins(&b));
        }
    }

    /// Extended protocol: the one shard every statement the batch binds runs on (a batch that
    /// only parses or describes, or binds session statements, runs where the session is, or on
    /// any shard); `Several` when they need several shards, or different ones, or end a
    /// transaction open on several.
    pub(super) fn shard_of_batch(&self, sh: &Sharding, msgs: &[FrontendMessage], read: bool) -> BatchShard {
        if let Some(refused) = self.batch_setting(msgs) {
            return refused;
        }
        let mut parsed: HashMap<&str, &str> = HashMap::new();
        let mut at: Option<usize> = None;
        let mut several = false;
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
                    several |= !self.parked.is_empty()
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
                        several = true;
                        continue;
                    }
                };
                several |= at.is_some_and(|a| a != shard);
                at = Some(shard);
                continue;
            };
            parsed.insert(name, query);
        }
        if several {
            return BatchShard::Several;
        }
        let here = self.bound.as_ref().map(|_| self.shard);
        BatchShard::At(at.or(here).or(self.shard_override).unwrap_or_else(|| sh.any_shard()))
    }
}
