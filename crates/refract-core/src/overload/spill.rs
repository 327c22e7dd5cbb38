//! Memory for the rest of responses whose clients stopped reading while others waited for
//! their backend: a front end reads such a rest into memory (a spill) to give the backend
//! back at once, within `[limits] spill_bytes` per response and `spill_total_bytes` for all
//! together; past either bound it closes the client's connection instead. One budget for the
//! whole dispatcher, each spill's share held by a [`Spill`] and given back when it is dropped.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// Bytes spilled now, over every connection.
#[derive(Debug, Default)]
pub struct SpillBudget {
    used: AtomicUsize,
}

impl SpillBudget {
    /// Bytes held by spills now.
    pub fn used(&self) -> usize {
        self.used.load(Relaxed)
    }

    /// Takes `n` bytes if that keeps every spill together within `total`.
    fn take(&self, n: usize, total: usize) -> bool {
        self.used.fetch_update(Relaxed, Relaxed, |u| u.checked_add(n).filter(|&after| after <= total)).is_ok()
    }
}

/// One response's spill: its bytes, within its own bound and the shared budget.
#[derive(Debug)]
pub struct Spill {
    budget: Arc<SpillBudget>,
    /// Most this spill may hold (`spill_bytes`).
    max: usize,
    /// Most all spills may hold together (`spill_total_bytes`).
    total: usize,
    bytes: Vec<u8>,
}

impl Spill {
    /// An empty spill of at most `max` bytes, drawing on `budget` (at most `total` for all).
    pub fn new(budget: Arc<SpillBudget>, max: usize, total: usize) -> Self {
        Spill { budget, max, total, bytes: Vec::new() }
    }

    /// Whether `n` more bytes would fit this spill's own bound.
    pub fn fits(&self, n: u64) -> bool {
        (self.bytes.len() as u64).saturating_add(n) <= self.max as u64
    }

    /// Keeps `more`; false (nothing kept) when it would pass either bound.
    pub fn push(&mut self, more: &[u8]) -> bool {
        if !self.fits(more.len() as u64) || !self.budget.take(more.len(), self.total) {
            return false;
        }
        self.bytes.extend_from_slice(more);
        true
    }

    /// The bytes kept.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Spill {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes.len(), Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spills_stay_within_their_own_bound_and_the_shared_one() {
        let budget = Arc::new(SpillBudget::default());
        let mut a = Spill::new(budget.clone(), 10, 15);
        assert!(a.push(b"0123456") && a.fits(3) && !a.fits(4));
        assert!(!a.push(b"0123"), "past its own bound");
        let mut b = Spill::new(budget.clone(), 10, 15);
        assert!(b.push(b"01234567"));
        assert!(!b.push(b"0"), "past the shared bound: 7 + 8 of 15 held");
        assert_eq!((a.bytes(), budget.used()), (&b"0123456"[..], 15));
        drop(a);
        assert_eq!(budget.used(), 8, "a dropped spill gives its bytes back");
        assert!(b.push(b"01"));
        drop(b);
        assert_eq!(budget.used(), 0);
    }
}
