//! A retry budget: every request deposits `ratio` of a token, a retry withdraws one, and a
//! small floor refills per second so that a quiet dispatcher can still retry. Retries can
//! therefore never add more than about `ratio` to the load, which is what stops retry storms.

use std::sync::Mutex;
use tokio::time::Instant;

/// Shared retry budget.
#[derive(Debug)]
pub struct RetryBudget {
    ratio: f64,
    floor_per_sec: f64,
    cap: f64,
    state: Mutex<(f64, Instant)>,
}

impl RetryBudget {
    /// `ratio` tokens per request, `floor_per_sec` tokens per second, at most `cap` saved.
    pub fn new(ratio: f64, floor_per_sec: f64, cap: f64) -> Self {
        RetryBudget { ratio, floor_per_sec, cap, state: Mutex::new((cap.min(floor_per_sec), Instant::now())) }
    }

    fn refill(&self, s: &mut (f64, Instant)) {
        let now = Instant::now();
        s.0 = (s.0 + (now - s.1).as_secs_f64() * self.floor_per_sec).min(self.cap);
        s.1 = now;
    }

    /// Counts a first attempt.
    pub fn deposit(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.refill(&mut s);
        s.0 = (s.0 + self.ratio).min(self.cap);
    }

    /// Takes a token for a retry; false when the budget is spent.
    pub fn try_withdraw(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.refill(&mut s);
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn retries_stay_within_the_ratio() {
        let b = RetryBudget::new(0.2, 0.0, 100.0);
        let mut retries = 0;
        for _ in 0..1000 {
            b.deposit();
            if b.try_withdraw() {
                retries += 1;
            }
        }
        assert!((195..=200).contains(&retries), "{retries}");
    }

    #[tokio::test(start_paused = true)]
    async fn floor_refills_with_time_and_cap_bounds_savings() {
        let b = RetryBudget::new(0.2, 10.0, 20.0);
        while b.try_withdraw() {}
        assert!(!b.try_withdraw());
        tokio::time::advance(Duration::from_millis(500)).await;
        let mut n = 0;
        while b.try_withdraw() {
            n += 1;
        }
        assert_eq!(n, 5);
        tokio::time::advance(Duration::from_secs(60)).await;
        let mut n = 0;
        while b.try_withdraw() {
            n += 1;
        }
        assert_eq!(n, 20, "savings are capped");
    }
}
