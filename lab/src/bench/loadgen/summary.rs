//! `Summary`: what one load-generator run measured — per-request records in, goodput, latency
//! percentiles and counts out; plus a per-second timeline (which backend served what).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How a request ended, as the client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// 200 within the client timeout.
    Ok,
    /// 503: refused by the dispatcher (admission control or a proxy queue timeout).
    Refused,
    /// No complete answer within the client timeout.
    Timeout,
    /// Connection failure, a malformed answer or another status.
    Error,
}

/// One request (in retry mode: one logical request, however many attempts it took).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Its scheduled start, µs from the run's start.
    #[serde(rename = "t")]
    pub start_us: u64,
    /// From the scheduled start to the end of the last attempt, µs.
    #[serde(rename = "l")]
    pub latency_us: u64,
    /// The last HTTP status (0 when none).
    #[serde(rename = "s")]
    pub status: u16,
    /// How it ended.
    #[serde(rename = "o")]
    pub outcome: Outcome,
    /// Attempts sent (2 when it was retried).
    #[serde(rename = "a")]
    pub attempts: u8,
    /// How late the client started it (its own scheduling lag), µs.
    #[serde(rename = "g", default)]
    pub lag_us: u64,
    /// The backend that answered (`x-served-by`), if any.
    #[serde(rename = "b", default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
}

/// The figures of one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Seconds the schedule spanned.
    pub duration_s: f64,
    /// Requests scheduled.
    pub sent: u64,
    /// Attempts sent, retries included.
    pub attempts: u64,
    /// Per outcome.
    pub ok: u64,
    /// 503s.
    pub refused: u64,
    /// Client timeouts.
    pub timeouts: u64,
    /// Errors.
    pub errors: u64,
    /// `ok / duration`.
    pub goodput: f64,
    /// Latency of successful requests, ms.
    pub p50_ms: Option<f64>,
    /// Latency of successful requests, ms.
    pub p99_ms: Option<f64>,
    /// Latency of refused requests, ms.
    pub refused_p99_ms: Option<f64>,
    /// p99 of the client's own lag behind its schedule, ms: when large, the load generator was
    /// starved of CPU and the latencies include that.
    pub lag_p99_ms: Option<f64>,
}

impl Summary {
    /// Summarise a run whose schedule spanned `duration_s` seconds.
    pub fn of(records: &[Record], duration_s: f64) -> Self {
        let count = |o: Outcome| records.iter().filter(|r| r.outcome == o).count() as u64;
        let ok = count(Outcome::Ok);
        let ok_lat = latencies(records, Outcome::Ok);
        let refused_lat = latencies(records, Outcome::Refused);
        Summary {
            duration_s,
            sent: records.len() as u64,
            attempts: records.iter().map(|r| u64::from(r.attempts)).sum(),
            ok,
            refused: count(Outcome::Refused),
            timeouts: count(Outcome::Timeout),
            errors: count(Outcome::Error),
            goodput: if duration_s > 0.0 { ok as f64 / duration_s } else { 0.0 },
            p50_ms: percentile(&ok_lat, 50.0).map(ms),
            p99_ms: percentile(&ok_lat, 99.0).map(ms),
            refused_p99_ms: percentile(&refused_lat, 99.0).map(ms),
            lag_p99_ms: percentile(&sorted(records.iter().map(|r| r.lag_us)), 99.0).map(ms),
        }
    }

    /// Requests per second offered (scheduled).
    pub fn offered(&self) -> f64 {
        if self.duration_s > 0.0 {
            self.sent as f64 / self.duration_s
        } else {
            0.0
        }
    }
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn sorted(v: impl Iterator<Item = u64>) -> Vec<u64> {
    let mut v: Vec<u64> = v.collect();
    v.sort_unstable();
    v
}

/// Sorted latencies (µs) of the requests with one outcome.
fn latencies(records: &[Record], o: Outcome) -> Vec<u64> {
    let mut v: Vec<u64> = records.iter().filter(|r| r.outcome == o).map(|r| r.latency_us).collect();
    v.sort_unstable();
    v
}

/// Nearest-rank percentile of sorted values: the smallest value with at least `q` % of the
/// values at or below it. `None` for no values.
pub fn percentile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// One second (or bucket) of a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Bucket {
    /// Bucket start, seconds from the run's start.
    pub t_s: f64,
    /// Requests scheduled in it.
    pub sent: u64,
    /// Of those, successful.
    pub ok: u64,
    /// Answers per backend (`x-served-by`), any status.
    pub by_backend: BTreeMap<String, u64>,
    /// p99 of the successful ones, ms.
    pub p99_ms: Option<f64>,
}

impl Bucket {
    /// The share of answers that came from `backend` (0 when nothing was answered).
    pub fn share(&self, backend: &str) -> f64 {
        let total: u64 = self.by_backend.values().sum();
        match total {
            0 => 0.0,
            t => *self.by_backend.get(backend).unwrap_or(&0) as f64 / t as f64,
        }
    }
}

/// Records grouped by scheduled start into buckets of `width_s` seconds.
pub fn timeline(records: &[Record], width_s: f64) -> Vec<Bucket> {
    let width_us = (width_s * 1e6).max(1.0) as u64;
    let n = records.iter().map(|r| r.start_us / width_us + 1).max().unwrap_or(0) as usize;
    let mut buckets: Vec<(Bucket, Vec<u64>)> =
        (0..n).map(|i| (Bucket { t_s: i as f64 * width_s, ..Default::default() }, Vec::new())).collect();
    for r in records {
        let (b, lat) = &mut buckets[(r.start_us / width_us) as usize];
        b.sent += 1;
        if r.outcome == Outcome::Ok {
            b.ok += 1;
            lat.push(r.latency_us);
        }
        if let Some(name) = &r.backend {
            *b.by_backend.entry(name.clone()).or_default() += 1;
        }
    }
    buckets
        .into_iter()
        .map(|(mut b, mut lat)| {
            lat.sort_unstable();
            b.p99_ms = percentile(&lat, 99.0).map(ms);
            b
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(start_ms: u64, lat_ms: u64, outcome: Outcome, backend: &str) -> Record {
        let status = match outcome {
            Outcome::Ok => 200,
            Outcome::Refused => 503,
            _ => 0,
        };
        Record {
            start_us: start_ms * 1000,
            latency_us: lat_ms * 1000,
            status,
            outcome,
            attempts: 1,
            lag_us: 0,
            backend: (!backend.is_empty()).then(|| backend.to_string()),
        }
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), Some(50));
        assert_eq!(percentile(&v, 99.0), Some(99));
        assert_eq!(percentile(&v, 100.0), Some(100));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile(&[7], 99.0), Some(7));
        assert_eq!(percentile(&[], 50.0), None);
        // Ten values: p99 is the largest, p50 the fifth.
        let v: Vec<u64> = (1..=10).map(|x| x * 10).collect();
        assert_eq!((percentile(&v, 50.0), percentile(&v, 99.0)), (Some(50), Some(100)));
    }

    #[test]
    fn summary_counts_and_goodput() {
        let mut rs: Vec<Record> = (0..98).map(|i| rec(i * 10, 10 + i % 5, Outcome::Ok, "b1")).collect();
        rs.push(rec(5, 1, Outcome::Refused, ""));
        rs.push(rec(6, 1000, Outcome::Timeout, ""));
        rs[3].attempts = 2;
        let s = Summary::of(&rs, 2.0);
        assert_eq!((s.sent, s.attempts, s.ok, s.refused, s.timeouts, s.errors), (100, 101, 98, 1, 1, 0));
        assert_eq!(s.goodput, 49.0);
        assert_eq!(s.offered(), 50.0);
        assert_eq!(s.p50_ms, Some(12.0));
        assert_eq!(s.p99_ms, Some(14.0));
        assert_eq!(s.refused_p99_ms, Some(1.0));
        assert_eq!(s.lag_p99_ms, Some(0.0));
        assert_eq!(Summary::of(&[], 0.0).p99_ms, None);
    }

    #[test]
    fn timeline_shares() {
        let rs = vec![
            rec(100, 5, Outcome::Ok, "b1"),
            rec(200, 5, Outcome::Ok, "b2"),
            rec(1100, 5, Outcome::Ok, "b1"),
            rec(1900, 9, Outcome::Refused, ""),
        ];
        let t = timeline(&rs, 1.0);
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].sent, t[0].ok, t[0].share("b2")), (2, 2, 0.5));
        assert_eq!((t[1].t_s, t[1].sent, t[1].ok, t[1].share("b2")), (1.0, 2, 1, 0.0));
        assert_eq!(t[1].p99_ms, Some(5.0));
    }

    #[test]
    fn records_round_trip_compactly() {
        let r = rec(1, 2, Outcome::Refused, "");
        let text = serde_json::to_string(&r).expect("json");
        assert_eq!(text, r#"{"t":1000,"l":2000,"s":503,"o":"refused","a":1,"g":0}"#);
        assert_eq!(serde_json::from_str::<Record>(&text).expect("parse"), r);
    }
}
