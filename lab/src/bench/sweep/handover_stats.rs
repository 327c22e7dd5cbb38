//! `HandoverStats`: a dispatcher's hand-over figures read from its admin `/metrics`
//! (docs/handover.md, "Observability") — hand-overs by result, hand-backs, bytes sent directly,
//! and the hand-over latency histograms with their quantiles. Scrapes of several processes (one
//! is restarted for every swap) add up; a scrape taken before a run is subtracted.

use std::collections::BTreeMap;

/// The hand-over histogram from FREEZE to `HandOffOk` (the whole move, agent included).
const LATENCY: &str = "refract_handover_seconds";
/// The hand-over latency as defined here: FREEZE → STEER, in the dispatcher.
const FROZEN: &str = "refract_handover_frozen_seconds";

/// One latency histogram of the dispatcher's `/metrics`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    /// `(upper bound in seconds, cumulative count)`, ascending; the last bound is infinite.
    pub buckets: Vec<(f64, f64)>,
    /// `_count`.
    pub count: f64,
    /// `_sum`, seconds.
    pub sum: f64,
}

impl Histogram {
    /// Takes the sample `name` if it is one of the series of `family`.
    fn take(&mut self, family: &str, name: &str, labels: &str, value: f64) -> bool {
        match name.strip_prefix(family) {
            Some("_count") => self.count += value,
            Some("_sum") => self.sum += value,
            Some("_bucket") => {
                if let Some(le) = label(labels, "le").and_then(bound) {
                    self.buckets.push((le, value));
                }
            }
            _ => return false,
        }
        true
    }

    fn combine(&mut self, other: &Histogram, sign: f64) {
        self.count += sign * other.count;
        self.sum += sign * other.sum;
        for &(le, v) in &other.buckets {
            match self.buckets.iter_mut().find(|(b, _)| *b == le) {
                Some((_, c)) => *c += sign * v,
                None => self.buckets.push((le, sign * v)),
            }
        }
        self.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    }

    /// The quantile `q` (0–1) in seconds, interpolated linearly inside its bucket as
    /// Prometheus' `histogram_quantile` does; `None` without samples.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.buckets.last().map(|b| b.1).filter(|t| *t > 0.0)?;
        let rank = q * total;
        let (mut lower, mut below) = (0.0, 0.0);
        for &(le, cum) in &self.buckets {
            if cum >= rank {
                if le.is_infinite() {
                    return Some(lower);
                }
                let within = cum - below;
                let frac = if within > 0.0 { (rank - below) / within } else { 1.0 };
                return Some(lower + (le - lower) * frac);
            }
            (lower, below) = (le, cum);
        }
        None
    }

    /// The mean in seconds.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count)
    }
}

/// The figures of one or more scrapes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HandoverStats {
    /// `refract_handover_total` by `result` (`ok`, `not_quiescent`, `map_full`, …), summed over
    /// backends.
    pub results: BTreeMap<String, f64>,
    /// `refract_handback_total`, all backends.
    pub handbacks: f64,
    /// `refract_bytes_direct_total`, all backends.
    pub bytes_direct: f64,
    /// `refract_handover_seconds`: FREEZE → `HandOffOk`.
    pub latency: Histogram,
    /// `refract_handover_frozen_seconds`: FREEZE → STEER (the hand-over latency).
    pub frozen: Histogram,
}

impl HandoverStats {
    /// Parse a Prometheus text exposition (lines it does not know are skipped).
    pub fn parse(text: &str) -> Self {
        let mut s = HandoverStats::default();
        for (name, labels, value) in text.lines().filter_map(sample) {
            match name {
                "refract_handover_total" => {
                    *s.results.entry(label(labels, "result").unwrap_or_default().to_string()).or_default() += value
                }
                "refract_handback_total" => s.handbacks += value,
                "refract_bytes_direct_total" => s.bytes_direct += value,
                n => {
                    let _ = s.frozen.take(FROZEN, n, labels, value) || s.latency.take(LATENCY, n, labels, value);
                }
            }
        }
        s.latency.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        s.frozen.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        s
    }

    /// Accepted hand-overs (`result="ok"`).
    pub fn handovers(&self) -> f64 {
        self.results.get("ok").copied().unwrap_or(0.0)
    }

    /// Attempts that ended in relaying instead, by reason (non-zero only).
    pub fn declined(&self) -> Vec<(&str, f64)> {
        self.results.iter().filter(|(r, v)| r.as_str() != "ok" && **v > 0.0).map(|(r, v)| (r.as_str(), *v)).collect()
    }

    /// Add another process's figures.
    pub fn add(&mut self, other: &HandoverStats) {
        self.combine(other, 1.0);
    }

    /// These figures minus an earlier scrape of the same process (counters only grow).
    pub fn since(&self, earlier: &HandoverStats) -> HandoverStats {
        let mut d = self.clone();
        d.combine(earlier, -1.0);
        d
    }

    fn combine(&mut self, other: &HandoverStats, sign: f64) {
        for (r, v) in &other.results {
            *self.results.entry(r.clone()).or_default() += sign * v;
        }
        self.handbacks += sign * other.handbacks;
        self.bytes_direct += sign * other.bytes_direct;
        self.latency.combine(&other.latency, sign);
        self.frozen.combine(&other.frozen, sign);
    }
}

/// `name{labels} value` → `(name, labels, value)`; comments and malformed lines → `None`.
fn sample(line: &str) -> Option<(&str, &str, f64)> {
    if line.starts_with('#') {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value = value.trim().parse().ok()?;
    match series.split_once('{') {
        Some((name, labels)) => Some((name, labels.trim_end_matches('}'), value)),
        None => Some((series, "", value)),
    }
}

/// The value of `key` in `a="x",b="y"`.
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    labels.split(',').find_map(|kv| kv.strip_prefix(key)?.strip_prefix("=\"")?.strip_suffix('"'))
}

/// A bucket bound: a number or `+Inf`.
fn bound(s: &str) -> Option<f64> {
    if s == "+Inf" {
        Some(f64::INFINITY)
    } else {
        s.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = "# HELP refract_handover_total Hand-over attempts.\n\
        # TYPE refract_handover_total counter\n\
        refract_handover_total{backend=\"b1\",result=\"ok\"} 30\n\
        refract_handover_total{backend=\"b2\",result=\"ok\"} 10\n\
        refract_handover_total{backend=\"b2\",result=\"map_full\"} 2\n\
        refract_handback_total{backend=\"b1\"} 29\n\
        refract_bytes_direct_total{backend=\"b1\"} 1000\n\
        refract_handover_seconds_sum 0.004\n\
        refract_handover_seconds_count 40\n\
        refract_handover_seconds_bucket{le=\"1e-5\"} 0\n\
        refract_handover_seconds_bucket{le=\"2e-5\"} 0\n\
        refract_handover_seconds_bucket{le=\"4e-5\"} 10\n\
        refract_handover_seconds_bucket{le=\"8e-5\"} 30\n\
        refract_handover_seconds_bucket{le=\"+Inf\"} 40\n\
        refract_handover_frozen_seconds_sum 0.0008\n\
        refract_handover_frozen_seconds_count 40\n\
        refract_handover_frozen_seconds_bucket{le=\"1e-5\"} 20\n\
        refract_handover_frozen_seconds_bucket{le=\"2e-5\"} 40\n\
        refract_handover_frozen_seconds_bucket{le=\"+Inf\"} 40\n";

    #[test]
    fn parses_a_scrape() {
        let s = HandoverStats::parse(SCRAPE);
        assert_eq!((s.handovers(), s.handbacks, s.bytes_direct, s.latency.count), (40.0, 29.0, 1000.0, 40.0));
        assert_eq!(s.declined(), vec![("map_full", 2.0)]);
        assert_eq!(s.latency.buckets.len(), 5);
        assert_eq!(s.latency.mean(), Some(0.0001));
        assert_eq!((s.frozen.buckets.len(), s.frozen.mean()), (3, Some(0.00002)));
        assert_eq!(s.frozen.quantile(0.5), Some(10e-6));
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket() {
        let s = HandoverStats::parse(SCRAPE);
        // Rank 20 of 40 lies halfway through the (40 µs, 80 µs] bucket (10 → 30).
        let p50 = s.latency.quantile(0.5).expect("p50");
        assert!((p50 - 60e-6).abs() < 1e-12, "{p50}");
        // Rank 10 is the top of the (20 µs, 40 µs] bucket.
        assert!((s.latency.quantile(0.25).expect("p25") - 40e-6).abs() < 1e-12);
        // Above the last finite bound: that bound.
        assert_eq!(s.latency.quantile(0.99), Some(80e-6));
        assert_eq!(HandoverStats::default().latency.quantile(0.5), None);
    }

    #[test]
    fn scrapes_add_and_subtract() {
        let s = HandoverStats::parse(SCRAPE);
        let mut total = s.clone();
        total.add(&s);
        assert_eq!((total.handovers(), total.latency.buckets[3].1), (80.0, 60.0));
        let d = total.since(&s);
        assert_eq!(d, s);
        assert_eq!(s.since(&s).latency.quantile(0.5), None);
    }
}
