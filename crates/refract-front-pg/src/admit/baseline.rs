//! [`Baselines`]: one server's no-load time per kind of statement (a statement fingerprint,
//! `refract_pg::classify::fingerprint`), which its adaptive limit reads samples against
//! (`Admission::learn`). A single no-load latency cannot serve PostgreSQL: a `SELECT 1` and a
//! 20 ms report share a server, and against the minimum of all, every slower kind of statement
//! looks queued (measured: the limit fell to 1; docs/overload.md).
//!
//! The table is bounded ([`CAPACITY`] kinds; when full, the kind used least recently makes
//! room), and each kind's baseline is re-learned every [`RELEARN_EVERY`] of its samples from the
//! fastest of them taken under light load, if any: a server that became slower for good (a
//! table that grew, a cold cache) is not read as queued forever, one that became faster is
//! read against its new time.

use super::lru::Lru;
use std::time::Duration;

/// How loaded a server was when a sample was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Load {
    /// Few units were in flight (under half the limit): the sample may re-learn a baseline.
    Light,
    Heavy,
}

/// Kinds of statement kept per server.
pub(crate) const CAPACITY: usize = 1024;

/// A kind's baseline is re-learned after this many of its samples.
pub(crate) const RELEARN_EVERY: u32 = 128;

/// One kind of statement.
#[derive(Debug, Clone, Copy)]
struct Kind {
    /// The fastest time seen (since the last re-learning).
    min: Duration,
    /// The fastest time taken under light load since the last re-learning.
    light_min: Option<Duration>,
    /// Samples since the last re-learning.
    seen: u32,
}

/// The kinds of statement of one server.
#[derive(Debug)]
pub(crate) struct Baselines {
    kinds: Lru<Kind>,
}

impl Default for Baselines {
    fn default() -> Baselines {
        Baselines { kinds: Lru::new(CAPACITY) }
    }
}

impl Baselines {
    /// Notes that a statement of kind `key` took `took` under `load` (light: few units were in
    /// flight);
    /// returns the kind's baseline to read it against, or `None` for a kind's first sample
    /// (which only sets its baseline: it says nothing about queueing).
    pub(crate) fn observe(&mut self, key: u64, took: Duration, load: Load) -> Option<Duration> {
        let light = load == Load::Light;
        let Some(k) = self.kinds.get_mut(key) else {
            self.kinds.insert(key, Kind { min: took, light_min: light.then_some(took), seen: 1 });
            return None;
        };
        k.seen += 1;
        k.min = k.min.min(took);
        if light {
            k.light_min = Some(k.light_min.map_or(took, |m| m.min(took)));
        }
        let baseline = k.min;
        if k.seen >= RELEARN_EVERY {
            if let Some(m) = k.light_min.take() {
                k.min = m;
            }
            k.seen = 0;
        }
        Some(baseline)
    }

    /// How many kinds are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.kinds.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_kind_is_read_against_its_own_fastest_time() {
        let mut b = Baselines::default();
        assert_eq!(b.observe(1, 20 * MS, Load::Heavy), None, "the first sample only sets the baseline");
        assert_eq!(b.observe(2, MS / 10, Load::Heavy), None);
        assert_eq!(b.observe(1, 80 * MS, Load::Heavy), Some(20 * MS), "not against the other kind's 0.1 ms");
        assert_eq!(b.observe(1, 18 * MS, Load::Heavy), Some(18 * MS));
        assert_eq!(b.observe(2, MS, Load::Heavy), Some(MS / 10));
    }

    #[test]
    fn the_table_is_bounded_and_forgets_the_kind_used_least_recently() {
        let mut b = Baselines::default();
        for key in 0..CAPACITY as u64 {
            b.observe(key, MS, Load::Heavy);
        }
        b.observe(0, MS, Load::Heavy); // kind 0 is in use: kind 1 is now the least recent
        for key in CAPACITY as u64..3 * CAPACITY as u64 {
            b.observe(key, MS, Load::Heavy);
            assert!(b.len() <= CAPACITY);
        }
        assert_eq!(b.len(), CAPACITY);
        let mut b2 = Baselines::default();
        for key in 0..CAPACITY as u64 {
            b2.observe(key, MS, Load::Heavy);
        }
        b2.observe(0, MS, Load::Heavy);
        b2.observe(CAPACITY as u64, MS, Load::Heavy);
        assert!(b2.observe(0, MS, Load::Heavy).is_some(), "the kind in use was kept");
        assert_eq!(b2.observe(1, MS, Load::Heavy), None, "the least recent one was forgotten");
    }

    #[test]
    fn a_slower_server_is_relearnt_from_lightly_loaded_samples() {
        let mut b = Baselines::default();
        b.observe(7, 10 * MS, Load::Light);
        // The server became 3× slower for good: under load nothing is re-learnt.
        for _ in 0..2 * RELEARN_EVERY {
            assert_eq!(b.observe(7, 30 * MS, Load::Heavy), Some(10 * MS));
        }
        // Under light load, a period later, 30 ms is the new baseline.
        for _ in 0..RELEARN_EVERY {
            b.observe(7, 30 * MS, Load::Light);
        }
        assert_eq!(b.observe(7, 30 * MS, Load::Heavy), Some(30 * MS));
        // And a faster time is taken at once.
        b.observe(7, 12 * MS, Load::Heavy);
        assert_eq!(b.observe(7, 30 * MS, Load::Heavy), Some(12 * MS));
    }
}
