//! `Schedule`: the arrival times of an open-loop run, a Poisson process drawn from a seeded RNG
//! so that every target of a sweep sees the very same arrivals.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;

/// Arrival offsets from the start of a run, in increasing order.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// When each request is due, relative to the run's start.
    pub arrivals: Vec<Duration>,
}

impl Schedule {
    /// Poisson arrivals at `rate` per second over `duration`: exponential gaps with mean
    /// `1 / rate`, drawn by inversion (`-ln(U) / rate`).
    pub fn poisson(rate: f64, duration: Duration, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let end = duration.as_secs_f64();
        let mut arrivals = Vec::with_capacity((rate * end * 1.1) as usize + 16);
        if rate <= 0.0 {
            return Schedule { arrivals };
        }
        let mut t = 0.0;
        loop {
            t += exponential(&mut rng, rate);
            if t >= end {
                break;
            }
            arrivals.push(Duration::from_secs_f64(t));
        }
        Schedule { arrivals }
    }

    /// How many requests the schedule holds.
    pub fn len(&self) -> usize {
        self.arrivals.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.arrivals.is_empty()
    }
}

/// One exponential draw with the given rate; `1 - U` keeps the log's argument in (0, 1].
fn exponential(rng: &mut StdRng, rate: f64) -> f64 {
    let u: f64 = rng.gen();
    -(1.0 - u).ln() / rate
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_rate_is_close_to_the_target() {
        // 200 000 arrivals: the count's relative standard deviation is about 0.2 %.
        let s = Schedule::poisson(4000.0, Duration::from_secs(50), 7);
        let rate = s.len() as f64 / 50.0;
        assert!((rate - 4000.0).abs() / 4000.0 < 0.01, "rate {rate}");
    }

    #[test]
    fn gaps_are_exponential() {
        let s = Schedule::poisson(1000.0, Duration::from_secs(100), 11);
        let gaps: Vec<f64> = s.arrivals.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        assert!((mean - 0.001).abs() < 0.00002, "mean gap {mean}");
        // For an exponential, P(gap > mean) = 1/e.
        let above = gaps.iter().filter(|&&g| g > 0.001).count() as f64 / gaps.len() as f64;
        assert!((above - (-1.0f64).exp()).abs() < 0.01, "share above the mean {above}");
        assert!(s.arrivals.windows(2).all(|w| w[0] <= w[1]), "sorted");
    }

    #[test]
    fn seeded_and_bounded() {
        let a = Schedule::poisson(500.0, Duration::from_secs(2), 3);
        assert_eq!(a, Schedule::poisson(500.0, Duration::from_secs(2), 3));
        assert_ne!(a, Schedule::poisson(500.0, Duration::from_secs(2), 4));
        assert!(a.arrivals.iter().all(|t| *t < Duration::from_secs(2)));
        assert!(Schedule::poisson(0.0, Duration::from_secs(1), 1).is_empty());
    }
}
