//! Per-user token buckets (fairness): a user named by `x-refract-user` may start `rate`
//! requests per second with bursts of `burst`; beyond that the request is refused with 429
//! before it takes a backend slot, so one noisy tenant cannot crowd out the others.

use std::collections::HashMap;
use std::sync::Mutex;
use tokio::time::Instant;

/// One user's bucket.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A full bucket refilling at `rate` per second up to `burst`.
    pub fn new(rate: f64, burst: f64) -> Self {
        TokenBucket { rate, burst, state: Mutex::new((burst, Instant::now())) }
    }

    /// Takes a token if there is one.
    pub fn try_take(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        s.0 = (s.0 + (now - s.1).as_secs_f64() * self.rate).min(self.burst);
        s.1 = now;
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The configured users' buckets.
#[derive(Debug, Default)]
pub struct UserLimits {
    buckets: HashMap<String, TokenBucket>,
}

impl UserLimits {
    /// Buckets for `(name, rate, burst)` triples.
    pub fn new<'a>(users: impl IntoIterator<Item = (&'a str, f64, f64)>) -> Self {
        UserLimits { buckets: users.into_iter().map(|(n, r, b)| (n.to_string(), TokenBucket::new(r, b))).collect() }
    }

    /// Whether `user` may start a request now (users without a bucket always may).
    pub fn admit(&self, user: &str) -> bool {
        self.buckets.get(user).is_none_or(TokenBucket::try_take)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn bursts_then_rate() {
        let limits = UserLimits::new([("alice", 10.0, 5.0)]);
        let burst = (0..20).filter(|_| limits.admit("alice")).count();
        assert_eq!(burst, 5);
        tokio::time::advance(Duration::from_millis(300)).await;
        let refill = (0..20).filter(|_| limits.admit("alice")).count();
        assert_eq!(refill, 3);
        assert!((0..100).all(|_| limits.admit("bob")), "unlisted users are not limited");
    }
}
