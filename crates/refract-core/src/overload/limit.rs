//! An adaptive concurrency limit in the style of TCP Vegas (as in Netflix's
//! concurrency-limits): the latency with no queueing (`no_load`, the minimum seen, re-probed
//! now and then) tells how many requests of the current limit are merely waiting inside the
//! backend: `queue = limit × (1 − no_load / latency)`. Few waiting → grow; many → shrink.
//! Little's law does the rest: past capacity, fewer requests in flight means less queueing
//! delay for the same throughput.
//!
//! As in Vegas, the limit moves at most one step per round trip: one decision per window of
//! `limit` samples, on their mean latency. Deciding on every sample overshoots: the requests
//! admitted under the old limit keep reporting its queueing for a whole round, and each of
//! them would push the limit further (measured in `sim.rs`: the limit swung between 4 and 26
//! around a capacity of 8, and p99 at 3× load was 5× the p99 at 0.5×).
//!
//! [`AdaptiveLimit::sample_relative`] feeds the same decision with samples that each come with
//! their own no-load time (a baseline per kind of request, kept by the caller): the window's
//! ratio of time taken to baseline stands for `latency / no_load`. A backend whose requests
//! differ in cost (a PostgreSQL server running 0.1 ms and 20 ms statements) has no single
//! no-load latency: against the minimum of all, every slower kind looks queued.

/// Tuning of the limit.
#[derive(Debug, Clone)]
pub struct LimitConfig {
    /// Starting limit.
    pub initial: f64,
    /// Never below this.
    pub min: f64,
    /// Never above this (the hard cap from the configuration).
    pub max: f64,
    /// Grow while at most `alpha × max(1, log10(limit))` requests wait inside the backend. Small
    /// (1 and 2.5 by default, where Netflix's Vegas uses 3 and 6): every request kept waiting
    /// inside the backend adds a whole service time of latency to everyone behind it, and
    /// refract's own queue absorbs bursts instead.
    pub alpha: f64,
    /// Shrink while at least `beta × max(1, log10(limit))` wait.
    pub beta: f64,
    /// Every this many samples, re-learn the no-load latency from the lightly loaded samples
    /// of the last window (if any): the backend may have become slower or faster.
    pub probe_every: u64,
}

impl Default for LimitConfig {
    fn default() -> Self {
        LimitConfig { initial: 4.0, min: 1.0, max: 200.0, alpha: 1.0, beta: 2.5, probe_every: 1000 }
    }
}

/// The limit's state.
#[derive(Debug, Clone)]
pub struct AdaptiveLimit {
    cfg: LimitConfig,
    limit: f64,
    no_load: f64,
    recent: f64,
    samples: u64,
    light_min: f64,
    /// The current window: samples taken and the sum of their latencies.
    window: (u64, f64),
    /// The current window of relative samples: samples taken, the sum of their latencies and
    /// the sum of their baselines.
    relative: (u64, f64, f64),
}

/// Latencies below this are treated as this (a zero would divide by zero).
const MIN_RTT: f64 = 1e-6;

impl AdaptiveLimit {
    /// A limit at `cfg.initial`.
    pub fn new(cfg: LimitConfig) -> Self {
        let limit = cfg.initial.clamp(cfg.min, cfg.max);
        AdaptiveLimit {
            cfg,
            limit,
            no_load: f64::INFINITY,
            recent: 0.0,
            samples: 0,
            light_min: f64::INFINITY,
            window: (0, 0.0),
            relative: (0, 0.0, 0.0),
        }
    }

    /// The current limit (at least 1).
    pub fn limit(&self) -> usize {
        self.limit.floor().max(1.0) as usize
    }

    /// Recent latency in seconds (0 before any sample).
    pub fn recent_latency(&self) -> f64 {
        self.recent
    }

    /// A request timed out or was refused as overloaded: shrink multiplicatively.
    pub fn back_off(&mut self) {
        self.limit = (self.limit * 0.9).clamp(self.cfg.min, self.cfg.max);
    }

    /// Learns from one completed request: its latency and how many were in flight with it.
    pub fn sample(&mut self, rtt_secs: f64, inflight: usize) {
        let rtt = if rtt_secs.is_finite() { rtt_secs.max(MIN_RTT) } else { return };
        self.recent = if self.samples == 0 { rtt } else { self.recent + (rtt - self.recent) * 0.2 };
        self.samples += 1;
        self.no_load = self.no_load.min(rtt);
        let light = (inflight as f64) * 2.0 < self.limit;
        if light {
            self.light_min = self.light_min.min(rtt);
        }
        if self.samples.is_multiple_of(self.cfg.probe_every.max(1)) {
            if self.light_min.is_finite() {
                self.no_load = self.light_min;
            }
            self.light_min = f64::INFINITY;
        }
        // An application-limited sample (few in flight) says nothing about capacity.
        if light {
            return;
        }
        // One decision per window of about `limit` samples (one round of the requests in
        // flight), on the window's mean latency: the samples of requests admitted under the
        // previous limit must not push the limit again and again (it would overshoot, down to
        // far below the capacity, and then back up).
        self.window.0 += 1;
        self.window.1 += rtt;
        if (self.window.0 as f64) < self.limit.floor() {
            return;
        }
        let rtt = self.window.1 / self.window.0 as f64;
        self.window = (0, 0.0);
        self.decide(self.no_load / rtt);
    }

    /// Learns from one completed request measured against its own `baseline_secs` (the no-load
    /// time of its kind of request), with `inflight` in flight. The window's ratio is
    /// `Σ latency ÷ Σ baseline`, a mean weighted by cost: a cheap request delayed by a few
    /// milliseconds of scheduling noise (a ratio of 20 on its own) weighs what it costs, not as
    /// much as a 20 ms one. Lightly loaded samples are skipped, as in [`AdaptiveLimit::sample`];
    /// the recent latency is left alone (samples of mixed costs say nothing about the next
    /// request's).
    pub fn sample_relative(&mut self, rtt_secs: f64, baseline_secs: f64, inflight: usize) {
        if !(rtt_secs.is_finite() && baseline_secs.is_finite()) || (inflight as f64) * 2.0 < self.limit {
            return;
        }
        let w = &mut self.relative;
        *w = (w.0 + 1, w.1 + rtt_secs.max(MIN_RTT), w.2 + baseline_secs.max(MIN_RTT));
        if (w.0 as f64) < self.limit.floor() {
            return;
        }
        let unqueued = w.2 / w.1;
        self.relative = (0, 0.0, 0.0);
        self.decide(unqueued);
    }

    /// One decision on a window whose share of time not spent queued is `unqueued` (no-load
    /// latency ÷ latency): `limit × (1 − unqueued)` requests of the limit wait inside the backend.
    fn decide(&mut self, unqueued: f64) {
        let queue = self.limit * (1.0 - unqueued);
        let step = self.limit.log10().max(1.0);
        if queue <= self.cfg.alpha * step {
            self.limit += step;
        } else if queue >= self.cfg.beta * step {
            // Far above capacity (a limit that starts high, a backend that slowed down), one
            // step per round would keep requests queued inside the backend for many rounds:
            // jump to the concurrency the backend actually works on (limit × no_load / rtt)
            // plus the queue it may grow on, if that is lower.
            let working = self.limit * unqueued + self.cfg.alpha * step;
            self.limit = (self.limit - step).min(working);
        }
        self.limit = self.limit.clamp(self.cfg.min, self.cfg.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(limit: &mut AdaptiveLimit, rtt: impl Fn(usize) -> f64, rounds: usize) {
        for _ in 0..rounds {
            let inflight = limit.limit();
            limit.sample(rtt(inflight), inflight);
        }
    }

    #[test]
    fn grows_while_latency_is_flat() {
        let mut l = AdaptiveLimit::new(LimitConfig::default());
        run(&mut l, |_| 0.010, 20_000);
        assert_eq!(l.limit(), 200, "flat latency: the limit climbs to the cap");
    }

    #[test]
    fn decides_once_per_window_of_limit_samples() {
        let mut l = AdaptiveLimit::new(LimitConfig { initial: 10.0, ..LimitConfig::default() });
        l.sample(0.010, 10); // the no-load latency
        for _ in 0..8 {
            l.sample(0.040, 10);
        }
        assert_eq!(l.limit(), 10, "no decision before a window of 10 samples");
        l.sample(0.040, 10);
        assert_eq!(l.limit(), 3, "one decision for the window: the working concurrency (10 × 10/40) plus alpha");
        for _ in 0..2 {
            l.sample(0.040, 10);
        }
        assert_eq!(l.limit(), 3, "no second decision before a window of 3 samples");
    }

    #[test]
    fn settles_near_capacity_when_latency_follows_littles_law() {
        // A backend with 8 workers and 10 ms per request: past 8 in flight, requests queue.
        let capacity = 8.0;
        // Load ramps up from below capacity, so the no-load latency is seen first.
        let mut l = AdaptiveLimit::new(LimitConfig { initial: 4.0, ..LimitConfig::default() });
        run(&mut l, |n| 0.010 * (n as f64 / capacity).max(1.0), 5000);
        let settled = l.limit();
        assert!((9..=20).contains(&settled), "limit {settled} should sit a little above capacity 8");
    }

    #[test]
    fn a_limit_far_above_capacity_comes_down_within_a_few_rounds() {
        // Starts at 16 over a backend of 4 workers × 20 ms (examples/loopback.toml's default
        // over `blob-server --concurrency 4 --delay-ms 20`): requests queue inside it.
        let mut l = AdaptiveLimit::new(LimitConfig { initial: 16.0, ..LimitConfig::default() });
        l.sample(0.020, 1);
        let mut samples = 0;
        while l.limit() > 7 {
            let n = l.limit();
            l.sample(0.020 * (n as f64 / 4.0).max(1.0), n);
            samples += 1;
            assert!(samples < 60, "still at {} after {samples} samples", l.limit());
        }
    }

    #[test]
    fn ignores_application_limited_samples() {
        let mut l = AdaptiveLimit::new(LimitConfig { initial: 50.0, ..LimitConfig::default() });
        for _ in 0..100 {
            l.sample(1.0, 2);
        }
        assert_eq!(l.limit(), 50);
    }

    #[test]
    fn zero_latency_samples_are_harmless() {
        let mut l = AdaptiveLimit::new(LimitConfig::default());
        for _ in 0..100 {
            l.sample(0.0, 20);
        }
        assert!(l.limit() >= 4, "{}", l.limit());
    }

    #[test]
    fn relearns_a_slower_no_load_latency() {
        let mut l = AdaptiveLimit::new(LimitConfig { initial: 4.0, probe_every: 100, ..LimitConfig::default() });
        run(&mut l, |n| 0.001 * (n as f64 / 8.0).max(1.0), 2000);
        // The backend becomes 10x slower; light load reveals the new floor.
        for _ in 0..300 {
            l.sample(0.010, 1);
        }
        run(&mut l, |n| 0.010 * (n as f64 / 8.0).max(1.0), 2000);
        assert!((9..=20).contains(&l.limit()), "{}", l.limit());
    }

    #[test]
    fn respects_min_and_max() {
        let mut l = AdaptiveLimit::new(LimitConfig { initial: 4.0, min: 2.0, max: 10.0, ..LimitConfig::default() });
        run(&mut l, |n| 0.001 * (n as f64).powi(3), 2000);
        assert!(l.limit() >= 2);
        let mut l = AdaptiveLimit::new(LimitConfig { initial: 4.0, min: 2.0, max: 10.0, ..LimitConfig::default() });
        run(&mut l, |_| 0.001, 2000);
        assert_eq!(l.limit(), 10);
    }

    /// Relative samples of two kinds of request, 0.1 ms and 20 ms without queueing, on a
    /// backend of `capacity` workers: past it, each takes `n / capacity` times its baseline.
    fn run_mixed(l: &mut AdaptiveLimit, capacity: f64, rounds: usize) {
        for i in 0..rounds {
            let n = l.limit();
            let base = if i % 2 == 0 { 0.0001 } else { 0.020 };
            l.sample_relative(base * (n as f64 / capacity).max(1.0), base, n);
        }
    }

    #[test]
    fn relative_samples_of_mixed_costs_without_queueing_grow_to_the_cap() {
        // Against one minimum (0.1 ms), the 20 ms samples would read as 200× queueing.
        let mut l = AdaptiveLimit::new(LimitConfig { initial: 8.0, max: 20.0, ..LimitConfig::default() });
        run_mixed(&mut l, 1000.0, 2000);
        assert_eq!(l.limit(), 20);
    }

    #[test]
    fn relative_samples_that_show_queueing_settle_near_capacity() {
        let mut l = AdaptiveLimit::new(LimitConfig { initial: 40.0, max: 40.0, ..LimitConfig::default() });
        run_mixed(&mut l, 8.0, 5000);
        let settled = l.limit();
        assert!((8..=20).contains(&settled), "limit {settled} should sit a little above capacity 8");
    }

    #[test]
    fn relative_samples_decide_once_per_window_by_the_cost_weighted_ratio() {
        let mut l = AdaptiveLimit::new(LimitConfig { initial: 10.0, ..LimitConfig::default() });
        for _ in 0..9 {
            l.sample_relative(0.080, 0.020, 10);
        }
        assert_eq!(l.limit(), 10, "no decision before a window of 10 samples");
        l.sample_relative(0.080, 0.020, 10);
        assert_eq!(l.limit(), 3, "4× its baseline: the working concurrency (10 ÷ 4) plus alpha");
        // A cheap sample 20× its baseline among 20 ms ones at theirs: weighted by cost, no queue.
        let mut l = AdaptiveLimit::new(LimitConfig { initial: 10.0, max: 10.0, ..LimitConfig::default() });
        l.sample_relative(0.002, 0.0001, 10);
        for _ in 0..9 {
            l.sample_relative(0.020, 0.020, 10);
        }
        assert_eq!(l.limit(), 10);
    }

    #[test]
    fn relative_samples_under_light_load_or_not_finite_are_ignored() {
        let mut l = AdaptiveLimit::new(LimitConfig { initial: 50.0, ..LimitConfig::default() });
        for _ in 0..100 {
            l.sample_relative(1.0, 0.001, 2);
            l.sample_relative(f64::NAN, 0.001, 50);
            l.sample_relative(1.0, f64::INFINITY, 50);
        }
        assert_eq!(l.limit(), 50);
        assert_eq!(l.recent_latency(), 0.0, "relative samples leave the recent latency alone");
    }
}
