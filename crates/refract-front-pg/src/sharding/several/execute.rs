//! Running an Execute of a batch over several shards: its statement on each of its shards as
//! the unnamed statement and portal, the answers combined (one relayed, rows merged by the
//! plan, row counts summed), the legs kept to the batch's Sync.

use super::{error, Runs, Several, NO_PORTAL};
use crate::error::PgError;
use crate::server::pool::Guard;
use crate::session::phase::Event;
use crate::session::{Session, FLUSH_AT};
use crate::sharding::fanout::{written_on, Leg};
use crate::sharding::route::Target;
use crate::sharding::Sharding;
use bytes::{Bytes, BytesMut};
use refract_pg::frontend::{Bind, Target as Of};
use refract_pg::notice::sqlstate;
use refract_pg::{BackendMessage, FrontendMessage, TxStatus};
use refract_shard::scatter::Placement;

/// Which description messages of a shard's answer reach the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shown {
    /// None: refract answered the client's Describe itself, or the client sent none.
    Nothing,
    /// ParameterDescription and RowDescription, not NoData (a simple Query's answer has none).
    Rows,
    /// Every description message, NoData too.
    All,
}

impl Session {
    /// Execute: the portal's statement on its shards.
    pub(super) async fn execute_here(
        &mut self,
        sh: &Sharding,
        run: &mut Several,
        name: &str,
        max_rows: i32,
    ) -> Result<(), PgError> {
        let Some(portal) = run.portals.get(name) else {
            self.fail_here(run, error(NO_PORTAL, format!("portal \"{name}\" does not exist")));
            return Ok(());
        };
        let target = match &portal.runs {
            Runs::End(end) => {
                let end = *end;
                if portal.describe && run.owes() {
                    self.io.out.extend_from_slice(&BackendMessage::NoData.to_bytes());
                }
                self.end_tx(sh, end).await?;
                run.status = TxStatus::Idle;
                return Ok(());
            }
            Runs::Data(t) => t.clone(),
        };
        if max_rows > 0 {
            let why = "refract: fetching part of a portal (Execute with a row limit) is not supported for a batch over several shards";
            self.fail_here(run, error(sqlstate::FEATURE_NOT_SUPPORTED, why.into()));
            return Ok(());
        }
        let (describe, read) = (portal.describe, !run.block);
        let (query, types, bind) = (portal.query.clone(), portal.param_types.clone(), portal.bind.clone());
        let in_tx = self.phase().in_transaction();
        match target {
            Target::Scatter(shards, plan) if in_tx => {
                let formats = shard_formats(&bind.result_formats, plan.hidden);
                let request = unit(&plan.sql, &types, &bind, &formats, true);
                match self.scatter_in_tx(sh, &shards, &plan, &request, describe).await? {
                    Err(why) => self.fail_tx_here(sh, run, why).await,
                    Ok(failed) => {
                        sh.count_statement(&shards);
                        run.failed |= failed;
                    }
                }
            }
            _ if in_tx => {
                let why = "inside a transaction, a batch refract runs across shards holds reads over several shards only: send statements that name their keys in batches of their own".to_owned();
                self.fail_tx_here(sh, run, why).await;
            }
            Target::Scatter(shards, plan) => {
                let formats = shard_formats(&bind.result_formats, plan.hidden);
                sh.count_statement(&shards);
                let request = unit(&plan.sql, &types, &bind, &formats, true);
                let mut legs = self.legs_here(run, &shards, read).await?;
                let mut guards: Vec<&mut Guard> = legs.iter_mut().map(|l| &mut l.guard).collect();
                let failed = self.scatter_read(sh, &mut guards, &plan, &request, describe).await;
                drop(guards);
                run.legs.append(&mut legs);
                run.failed |= failed?;
            }
            Target::Shards(shards) if shards.len() > 1 => {
                self.write_here(
                    sh,
                    run,
                    &shards,
                    Placement::Sharded,
                    unit(&query, &types, &bind, &bind.result_formats, true),
                    describe,
                )
                .await?;
            }
            Target::Copies => {
                let shards: Vec<usize> = (0..sh.count()).collect();
                self.write_here(
                    sh,
                    run,
                    &shards,
                    Placement::Replicated,
                    unit(&query, &types, &bind, &bind.result_formats, true),
                    describe,
                )
                .await?;
            }
            Target::Shards(shards) => {
                sh.count_statement(&shards);
                let request = unit(&query, &types, &bind, &bind.result_formats, describe);
                self.relay_on(run, shards[0], read, &request, false).await?;
            }
            _ => {
                // Any shard: one the batch holds, if any.
                let shard = run.legs.first().map_or_else(|| sh.any_shard(), |l| l.shard);
                sh.count_statement(&[shard]);
                let request = unit(&query, &types, &bind, &bind.result_formats, describe);
                self.relay_on(run, shard, read, &request, false).await?;
            }
        }
        Ok(())
    }

    /// A write on `shards`, answered once (counts summed, or one copy's).
    pub(super) async fn write_here(
        &mut self,
        sh: &Sharding,
        run: &mut Several,
        shards: &[usize],
        placement: Placement,
        request: Bytes,
        describe: bool,
    ) -> Result<(), PgError> {
        sh.count_statement(shards);
        let mut legs = self.legs_here(run, shards, false).await?;
        let requests = vec![request; legs.len()];
        let got = written_on(&mut legs, &requests).await;
        let n = legs.len();
        run.legs.append(&mut legs);
        let got = got?;
        if describe && got.description.is_none() && got.error.is_none() && run.owes() {
            self.io.out.extend_from_slice(&BackendMessage::NoData.to_bytes());
        }
        run.failed |= self.written(got, placement, n, describe);
        Ok(())
    }

    /// The batch's connections on `shards` (opened where missing: admitted, the session's SETs,
    /// BEGIN when the batch writes), taken out of `run` in shard order.
    pub(super) async fn legs_here(
        &mut self,
        run: &mut Several,
        shards: &[usize],
        read: bool,
    ) -> Result<Vec<Leg>, PgError> {
        let mut out = Vec::with_capacity(shards.len());
        for &s in shards {
            match run.legs.iter().position(|l| l.shard == s) {
                Some(at) => out.push(run.legs.remove(at)),
                None => {
                    let mut leg = self.legs(&[s], read, &[]).await?;
                    if run.block {
                        for l in leg.iter_mut() {
                            l.guard.query("BEGIN").await?;
                        }
                    }
                    out.append(&mut leg);
                }
            }
        }
        for l in out.iter_mut() {
            l.guard.unnamed = None; // each request parses the unnamed statement
        }
        Ok(out)
    }

    /// Sends `request` (ending with Sync) to the batch's connection on `shard` and relays its
    /// answer to the client up to ReadyForQuery, leaving out ParseComplete and BindComplete
    /// (refract answered the client's own), and the description unless the request asked for
    /// it (`described`: every description message is relayed).
    pub(super) async fn relay_on(
        &mut self,
        run: &mut Several,
        shard: usize,
        read: bool,
        request: &Bytes,
        described: bool,
    ) -> Result<(), PgError> {
        let mut legs = self.legs_here(run, &[shard], read).await?;
        let shown = match (described, run.owes()) {
            (false, _) => Shown::Nothing,
            (true, false) => Shown::Rows,
            (true, true) => Shown::All,
        };
        let relayed = self.relay_leg(&mut legs[0], request, shown).await;
        run.legs.append(&mut legs);
        run.failed |= relayed?;
        Ok(())
    }

    /// See [`Session::relay_on`] (`shown`: which description messages reach the client);
    /// returns whether the client got an error.
    pub(super) async fn relay_leg(&mut self, leg: &mut Leg, request: &Bytes, shown: Shown) -> Result<bool, PgError> {
        leg.guard.wire.send(request).await?;
        let mut failed = false;
        loop {
            let (tag, frame) = leg.guard.wire.recv().await?;
            match tag {
                b'1' | b'2' => {}
                b'Z' => return Ok(failed),
                b't' | b'T' | b'n' if shown == Shown::Nothing => {}
                b'n' if shown == Shown::Rows => {}
                b'C' => {
                    if let BackendMessage::CommandComplete(t) = BackendMessage::decode(tag, &frame[5..])? {
                        self.advance(Event::Completed(&t));
                    }
                    self.io.out.extend_from_slice(&frame);
                }
                b'E' => {
                    failed = true;
                    self.advance(Event::QueryError);
                    self.io.out.extend_from_slice(&frame);
                }
                _ => self.io.out.extend_from_slice(&frame),
            }
            if self.io.out.len() >= FLUSH_AT {
                self.flush().await?;
            }
        }
    }
}

/// The result formats to ask the shards for: the client's (none: all text; one: all in it),
/// and when it gives one per column, the plan's hidden columns after them in text.
pub(super) fn shard_formats(client: &[i16], hidden: usize) -> Vec<i16> {
    match client {
        [] | [_] => client.to_vec(),
        per_column => per_column.iter().copied().chain(std::iter::repeat_n(0, hidden)).collect(),
    }
}

/// The messages that run `query` as the unnamed statement and portal with `bind`'s values
/// (and `result_formats`), describing the portal when `describe`, then Sync.
pub(super) fn unit(query: &str, param_types: &[u32], bind: &Bind, result_formats: &[i16], describe: bool) -> Bytes {
    let mut out = BytesMut::new();
    FrontendMessage::Parse { name: String::new(), query: query.to_owned(), param_types: param_types.to_vec() }
        .encode(&mut out);
    let b = Bind {
        portal: String::new(),
        statement: String::new(),
        param_formats: bind.param_formats.clone(),
        params: bind.params.clone(),
        result_formats: result_formats.to_vec(),
    };
    FrontendMessage::Bind(b).encode(&mut out);
    if describe {
        FrontendMessage::Describe(Of::Portal, String::new()).encode(&mut out);
    }
    FrontendMessage::Execute { portal: String::new(), max_rows: 0 }.encode(&mut out);
    FrontendMessage::Sync.encode(&mut out);
    out.freeze()
}
