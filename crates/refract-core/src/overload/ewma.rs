//! Peak-EWMA latency: jumps up to a slow sample at once, decays toward fast samples over
//! `decay`. Balancing weighs a backend by this cost × (in-flight + 1), so a backend that
//! turns slow loses traffic immediately and regains it gradually.

use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// A peak-sensitive moving average of latency.
#[derive(Debug)]
pub struct PeakEwma {
    decay: f64,
    state: Mutex<(f64, Instant)>,
}

impl PeakEwma {
    /// Starts at `initial` and forgets with time constant `decay`.
    pub fn new(initial: Duration, decay: Duration) -> Self {
        PeakEwma { decay: decay.as_secs_f64().max(1e-6), state: Mutex::new((initial.as_secs_f64(), Instant::now())) }
    }

    /// Adds a latency sample.
    pub fn observe(&self, rtt: Duration) {
        let rtt = rtt.as_secs_f64();
        let now = Instant::now();
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if rtt > s.0 {
            s.0 = rtt;
        } else {
            let w = (-(now - s.1).as_secs_f64() / self.decay).exp();
            s.0 = s.0 * w + rtt * (1.0 - w);
        }
        s.1 = now;
    }

    /// The current estimate, in seconds. It fades with time since the last sample, so a
    /// backend that once looked slow is tried again instead of being starved forever.
    pub fn get(&self) -> f64 {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.0 * (-(Instant::now() - s.1).as_secs_f64() / self.decay).exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn jumps_to_peaks_and_decays_slowly() {
        let e = PeakEwma::new(Duration::from_millis(1), Duration::from_secs(1));
        e.observe(Duration::from_millis(100));
        assert!((e.get() - 0.1).abs() < 1e-9, "a peak is taken at once");
        tokio::time::advance(Duration::from_millis(100)).await;
        e.observe(Duration::from_millis(1));
        let after_short = e.get();
        assert!(after_short > 0.08, "one fast sample soon after barely moves it: {after_short}");
        tokio::time::advance(Duration::from_secs(5)).await;
        e.observe(Duration::from_millis(1));
        assert!(e.get() < 0.003, "long after, fast samples dominate: {}", e.get());
    }

    #[tokio::test(start_paused = true)]
    async fn an_unsampled_estimate_fades() {
        let e = PeakEwma::new(Duration::ZERO, Duration::from_secs(1));
        assert_eq!(e.get(), 0.0, "a new backend costs nothing: it is tried first");
        e.observe(Duration::from_millis(100));
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(e.get() < 0.006, "without samples the cost fades: {}", e.get());
    }
}
