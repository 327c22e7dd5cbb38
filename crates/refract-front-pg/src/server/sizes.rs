//! [`Sizes`]: which kinds of statement are known to answer small, so that hybrid sends them
//! straight to their server instead of through its agent. The agent's hop
//! costs every statement it carries a little (measured: `pgbench -S` at 0.78× relay when every
//! statement crossed it), and only a result that may grow past the hand-over threshold needs
//! the agent.
//!
//! A kind (the statement's or synced batch's fingerprint, as the adaptive limit keys it) is
//! known small after [`SMALL_AFTER`] answers in a row, each at most half the threshold, that
//! ended outside a transaction. One larger answer, or one that leaves a transaction open (its
//! connection stays bound, and the transaction's later statements may be large), makes it
//! unknown again. A kind that grows is thus relayed once on a direct connection (correct, only
//! not handed over), then goes through the agent again. The table is bounded ([`CAPACITY`]).

use crate::admit::lru::Lru;
use refract_pg::TxStatus;

/// Kinds of statement kept.
pub(crate) const CAPACITY: usize = 4096;

/// Answers in a row, all small, before a kind is known small.
pub(crate) const SMALL_AFTER: u32 = 4;

/// The path a statement takes to its server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Through the server's agent, which may hand a large result over.
    Agent,
    /// Straight to the server: the result is relayed.
    Direct,
}

/// The kinds of statement of one front end, by the size of their answers.
#[derive(Debug)]
pub(crate) struct Sizes {
    /// Small answers in a row, per kind.
    kinds: Lru<u32>,
    /// The largest answer that counts as small.
    small_max: u64,
}

impl Sizes {
    /// A table for hand-overs from `threshold` bytes on.
    pub(crate) fn new(threshold: u64) -> Sizes {
        Sizes { kinds: Lru::new(CAPACITY), small_max: threshold / 2 }
    }

    /// The path for a statement of kind `key`.
    pub(crate) fn path(&mut self, key: u64) -> Path {
        match self.kinds.get_mut(key) {
            Some(run) if *run >= SMALL_AFTER => Path::Direct,
            _ => Path::Agent,
        }
    }

    /// Notes that a statement of kind `key` answered `bytes` (relayed or handed over) and left
    /// the session `tx` (a transaction left open makes it no small one). A failed one
    /// (`outcome`: an error or a cancel ends a result at any row) only counts when it was large.
    pub(crate) fn observe(&mut self, key: u64, bytes: u64, tx: TxStatus, outcome: Outcome) {
        let small = bytes <= self.small_max && tx == TxStatus::Idle;
        match self.kinds.get_mut(key) {
            _ if small && outcome == Outcome::Failed => {}
            Some(run) if small => *run = run.saturating_add(1),
            Some(run) => *run = 0,
            None if small => self.kinds.insert(key, 1),
            None => {}
        }
    }
}

/// How a unit of work (a statement, a batch, a Sync's run) ended for the client.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    #[default]
    Ok,
    /// An error came.
    Failed,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_goes_direct_only_after_small_answers_in_a_row() {
        let mut s = Sizes::new(1000);
        for _ in 0..SMALL_AFTER {
            assert_eq!(s.path(1), Path::Agent);
            s.observe(1, 500, TxStatus::Idle, Outcome::Ok);
        }
        assert_eq!(s.path(1), Path::Direct);
        s.observe(1, 501, TxStatus::Idle, Outcome::Ok);
        assert_eq!(s.path(1), Path::Agent, "one answer over half the threshold: unknown again");
        for _ in 0..SMALL_AFTER {
            s.observe(1, 10, TxStatus::Idle, Outcome::Ok);
        }
        assert_eq!(s.path(1), Path::Direct);
        assert_eq!(s.path(2), Path::Agent, "another kind knows nothing yet");
    }

    #[test]
    fn a_kind_that_leaves_a_transaction_open_stays_with_the_agent() {
        let mut s = Sizes::new(1000);
        for _ in 0..2 * SMALL_AFTER {
            s.observe(7, 10, TxStatus::InTransaction, Outcome::Ok);
        }
        assert_eq!(s.path(7), Path::Agent);
    }

    #[test]
    fn a_failed_statement_counts_only_when_large() {
        let mut s = Sizes::new(1000);
        for _ in 0..2 * SMALL_AFTER {
            s.observe(3, 10, TxStatus::Idle, Outcome::Failed);
        }
        assert_eq!(s.path(3), Path::Agent, "errors before any row say nothing of the kind's size");
        for _ in 0..SMALL_AFTER {
            s.observe(3, 10, TxStatus::Idle, Outcome::Ok);
        }
        s.observe(3, 5000, TxStatus::Idle, Outcome::Failed);
        assert_eq!(s.path(3), Path::Agent, "a result cancelled after 5000 bytes was large");
    }
}
