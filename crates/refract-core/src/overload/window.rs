//! Latencies of one backend between two outlier checks, kept as a log2 histogram (lock-free,
//! one atomic add per exchange): their median, and how many checks in a row found the backend
//! slow. Read by `membership::eject_slow`. The median, not the mean: a replica that happens to
//! get a few long statements (an analytics query among short ones) is not slow.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Buckets: bucket `k` counts latencies in [2^(k-1), 2^k) microseconds (bucket 0: under 1 µs);
/// the last one everything from about 9 minutes up.
const BUCKETS: usize = 30;

/// The exchanges since the last check, and the slow streak.
#[derive(Debug, Default)]
pub struct LatencyWindow {
    buckets: [AtomicU64; BUCKETS],
    slow_streak: AtomicU32,
}

impl LatencyWindow {
    /// Adds one exchange's latency.
    pub fn add(&self, rtt: Duration) {
        let us = rtt.as_micros().min(u64::MAX as u128) as u64;
        let k = (64 - us.leading_zeros() as usize).min(BUCKETS - 1);
        self.buckets[k].fetch_add(1, Relaxed);
    }

    /// The median latency since the last call, to within a factor of two (the upper bound of
    /// its bucket; `None`: no exchange), and starts a new window.
    pub fn take_median(&self) -> Option<Duration> {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.swap(0, Relaxed)).collect();
        let n: u64 = counts.iter().sum();
        let mut seen = 0;
        for (k, c) in counts.iter().enumerate() {
            seen += c;
            if n > 0 && seen * 2 >= n {
                return Some(Duration::from_micros(1u64 << k));
            }
        }
        None
    }

    /// Notes one check's verdict; returns how many checks in a row found it slow.
    pub fn note_slow(&self, slow: bool) -> u32 {
        match slow {
            true => self.slow_streak.fetch_add(1, Relaxed) + 1,
            false => {
                self.slow_streak.store(0, Relaxed);
                0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_covers_one_window_and_ignores_a_few_long_exchanges() {
        let w = LatencyWindow::default();
        assert_eq!(w.take_median(), None);
        for _ in 0..10 {
            w.add(Duration::from_millis(3));
        }
        w.add(Duration::from_secs(30));
        w.add(Duration::from_secs(30));
        let m = w.take_median().unwrap();
        assert!(m >= Duration::from_millis(3) && m < Duration::from_millis(6), "{m:?}");
        assert_eq!(w.take_median(), None, "a new window");
    }

    #[test]
    fn the_streak_counts_checks_in_a_row() {
        let w = LatencyWindow::default();
        assert_eq!((w.note_slow(true), w.note_slow(true)), (1, 2));
        assert_eq!((w.note_slow(false), w.note_slow(true)), (0, 1));
    }
}
