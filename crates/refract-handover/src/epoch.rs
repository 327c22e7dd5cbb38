//! `EpochTracker`: the current transfer epoch of each connection; stale messages are refused.
//!
//! Each transfer of a flow (hand-off or hand-back) increments its epoch (docs/handover.md). The
//! side that starts a transfer calls [`EpochTracker::advance`]; the side that receives one calls
//! [`EpochTracker::observe`], which accepts only a newer epoch; replies are checked with
//! [`EpochTracker::check`]. A duplicate or delayed message then fails with
//! [`Error::StaleEpoch`]: ignore it, log it, count it.

use std::collections::HashMap;

use crate::error::{Error, Result};

/// Epochs by connection id.
#[derive(Debug, Default)]
pub struct EpochTracker {
    current: HashMap<u64, u64>,
}

impl EpochTracker {
    /// An empty tracker (every connection at epoch 0).
    pub fn new() -> Self {
        Self::default()
    }

    /// The connection's current epoch (0 if it never moved).
    pub fn current(&self, conn: u64) -> u64 {
        self.current.get(&conn).copied().unwrap_or(0)
    }

    /// Starts a transfer of `conn`: its epoch goes up by one; returns the new epoch.
    pub fn advance(&mut self, conn: u64) -> u64 {
        let e = self.current.entry(conn).or_insert(0);
        *e += 1;
        *e
    }

    /// Accepts a transfer started by the peer at `epoch`, which must be newer than the current.
    pub fn observe(&mut self, conn: u64, epoch: u64) -> Result<()> {
        let cur = self.current(conn);
        if epoch <= cur {
            return Err(Error::StaleEpoch { expected: cur + 1, got: epoch });
        }
        self.current.insert(conn, epoch);
        Ok(())
    }

    /// Checks that a reply belongs to the current transfer of `conn`.
    pub fn check(&self, conn: u64, epoch: u64) -> Result<()> {
        let cur = self.current(conn);
        if epoch != cur || cur == 0 {
            return Err(Error::StaleEpoch { expected: cur, got: epoch });
        }
        Ok(())
    }

    /// Forgets a closed connection; a later message about it is stale.
    pub fn remove(&mut self, conn: u64) {
        self.current.remove(&conn);
    }

    /// How many connections are tracked.
    pub fn len(&self) -> usize {
        self.current.len()
    }

    /// Whether no connection is tracked.
    pub fn is_empty(&self) -> bool {
        self.current.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_off_and_back_and_stale_replies() {
        let (mut d, mut a) = (EpochTracker::new(), EpochTracker::new());
        assert!(d.check(5, 0).is_err(), "nothing in flight yet");
        let e1 = d.advance(5); // hand-off
        assert_eq!(e1, 1);
        assert!(a.observe(5, e1).is_ok());
        assert!(a.observe(5, e1).is_err(), "a duplicate HandOff is stale");
        assert!(d.check(5, e1).is_ok()); // HandOffOk
        let e2 = a.advance(5); // hand-back
        assert!(d.observe(5, e2).is_ok());
        assert!(a.check(5, e2).is_ok()); // HandBackOk
        assert!(matches!(d.check(5, e1), Err(Error::StaleEpoch { expected: 2, got: 1 })));
        assert!(d.observe(5, e1).is_err(), "an old HandBack is stale");
        assert_eq!(d.advance(5), 3);
        d.remove(5);
        assert!(d.check(5, 3).is_err());
        assert!(d.is_empty() && a.len() == 1);
    }
}
