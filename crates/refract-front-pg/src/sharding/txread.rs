//! A read over several shards inside a transaction. It runs on the transaction's own
//! connections, so that it sees the transaction's writes; a shard the transaction has not
//! reached yet joins it first (BEGIN as the client began it), so that each shard's part of the
//! transaction keeps one snapshot whatever the isolation level. A transaction on several
//! shards ends with two-phase commit, so a read that brings in a second shard needs what
//! two-phase commit needs (the decision log, `max_prepared_transactions > 0`), or is refused
//! with that reason. A read that fails fails the transaction: it is rolled back on every shard
//! at once, and the client's ROLLBACK (or COMMIT) is answered here, as for any refusal.

use super::{tx, Sharding};
use crate::error::PgError;
use crate::server::pool::Guard;
use crate::session::{Bound, Session};
use refract_shard::scatter::Plan;

impl Session {
    /// Runs the scatter `plan` over `shards` in the open transaction (`request` and `describe`
    /// as for `scatter_read`). `Ok(Err(why))`: refused before anything ran; `Ok(Ok(failed))`:
    /// it ran, and the client got an error (the transaction is rolled back) when `failed`.
    pub(crate) async fn scatter_in_tx(
        &mut self,
        sh: &Sharding,
        shards: &[usize],
        plan: &Plan,
        request: &[u8],
        describe: bool,
    ) -> Result<Result<bool, String>, PgError> {
        let mut held: Vec<usize> = self.parked.iter().map(|(s, _)| *s).collect();
        held.extend(self.bound.as_ref().map(|_| self.shard));
        let joining: Vec<usize> = shards.iter().copied().filter(|s| !held.contains(s)).collect();
        if held.len() + joining.len() > 1 && !joining.is_empty() {
            let mut all = held;
            all.extend(&joining);
            if let Err(why) = self.two_phase_possible(sh, &all).await {
                return Ok(Err(format!(
                    "this read needs several shards, and inside a transaction it joins them to the transaction: {why}"
                )));
            }
        }
        let begin = self.shard_tx().join_text();
        for &s in &joining {
            let mut legs = self.legs(&[s], false, &[]).await?;
            for l in legs.iter_mut() {
                l.guard.query(&begin).await?;
            }
            self.parked.extend(legs.into_iter().map(|l| (s, l.into_bound())));
        }
        if self.bound.is_none() {
            // The held BEGIN went to every shard that joined: the first is the binding.
            self.shard_tx_on(tx::Event::Sent);
            self.move_to_shard(shards[0]);
        }
        let here = self.shard;
        let mut bound = self.bound.take();
        let mut parked = std::mem::take(&mut self.parked);
        let result = {
            let mut on: Vec<(usize, &mut Guard)> = parked.iter_mut().map(|(s, b)| (*s, &mut b.guard)).collect();
            on.extend(bound.as_mut().map(|b| (here, &mut b.guard)));
            on.retain(|(s, _)| shards.contains(s));
            on.sort_by_key(|(s, _)| *s);
            let mut guards: Vec<&mut Guard> = on.into_iter().map(|(_, g)| g).collect();
            self.scatter_read(sh, &mut guards, plan, request, describe).await
        };
        self.bound = bound;
        self.parked = parked;
        match result {
            Ok(true) => {
                self.abort_on_shard().await;
                Ok(Ok(true))
            }
            Ok(false) => Ok(Ok(false)),
            Err(e) => {
                // A connection was lost mid-read: every one of the transaction is dropped.
                let lost: Vec<(usize, Bound)> = self.take_tx_bindings();
                for (s, b) in &lost {
                    self.shared.shard_servers(*s).failed(&b.server);
                }
                self.shard_tx_on(tx::Event::Ended);
                Err(e)
            }
        }
    }
}
