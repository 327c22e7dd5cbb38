//! `OverloadResults`: what `refract bench overload` measured, and the acceptance ratios of
//! the acceptance bounds computed from it (never stated by hand).

use crate::bench::loadgen::summary::{Bucket, Summary};

/// One point of the sweep: a target at one offered load.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// Target name.
    pub target: String,
    /// Offered load as a multiple of the measured capacity.
    pub level: f64,
    /// Offered load, requests per second.
    pub rate: f64,
    /// What the client saw.
    pub summary: Summary,
}

/// One target in a single-load scenario (slow replica, retrying clients).
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioRun {
    /// Target name.
    pub target: String,
    /// Offered load, requests per second.
    pub rate: f64,
    /// What the client saw.
    pub summary: Summary,
    /// Per second: sent, served per backend, p99.
    pub timeline: Vec<Bucket>,
    /// `(backend, reads it served)` by the end of the run, as the blob servers count them.
    pub served: Vec<(String, u64)>,
}

/// The closed-loop saturation run that sets the capacity.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CapacityRun {
    /// `(backend, successful requests per second)`.
    pub per_backend: Vec<(String, f64)>,
    /// Closed-loop workers per backend.
    pub workers: usize,
    /// Seconds.
    pub duration_s: f64,
}

impl CapacityRun {
    /// All backends together, requests per second.
    pub fn total(&self) -> f64 {
        self.per_backend.iter().map(|(_, r)| r).sum()
    }
}

/// Everything one run measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OverloadResults {
    /// The capacity the loads are multiples of.
    pub capacity: CapacityRun,
    /// The sweep, in measurement order.
    pub sweep: Vec<Point>,
    /// Targets that could not run, with the reason.
    pub failed: Vec<(String, String)>,
    /// The slow-replica scenario, per target.
    pub slow: Vec<ScenarioRun>,
    /// The retrying-clients scenario, per target.
    pub retry: Vec<ScenarioRun>,
}

/// The acceptance figures of one target.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Acceptance {
    /// Goodput at the highest load ÷ the best goodput of the sweep.
    pub goodput_ratio: Option<f64>,
    /// p99 of successful requests at the highest load ÷ at 0.5×.
    pub p99_ratio: Option<f64>,
    /// p99 latency of refused requests at the highest load, ms.
    pub refused_p99_ms: Option<f64>,
    /// The highest load measured (the ratios' numerator), × capacity.
    pub top_level: Option<f64>,
    /// Goodput with retrying clients ÷ the best goodput of the sweep.
    pub retry_goodput_ratio: Option<f64>,
}

impl OverloadResults {
    /// The sweep points of one target, by load.
    pub fn points(&self, target: &str) -> Vec<&Point> {
        let mut v: Vec<&Point> = self.sweep.iter().filter(|p| p.target == target).collect();
        v.sort_by(|a, b| a.level.total_cmp(&b.level));
        v
    }

    /// The point at a load level (within 1 %).
    pub fn point(&self, target: &str, level: f64) -> Option<&Point> {
        self.sweep.iter().find(|p| p.target == target && (p.level - level).abs() < 0.01)
    }

    /// Targets that have sweep points, in measurement order.
    pub fn targets(&self) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        for p in &self.sweep {
            if !v.contains(&p.target) {
                v.push(p.target.clone());
            }
        }
        v
    }

    /// The acceptance figures of `target`, from whatever was measured.
    pub fn acceptance(&self, target: &str) -> Acceptance {
        let pts = self.points(target);
        let Some(top) = pts.last() else {
            return Acceptance::default();
        };
        let peak = pts.iter().map(|p| p.summary.goodput).fold(0.0, f64::max);
        let div = |a: Option<f64>, b: Option<f64>| a.zip(b).filter(|(_, b)| *b > 0.0).map(|(a, b)| a / b);
        let half = self.point(target, 0.5).and_then(|p| p.summary.p99_ms);
        let retry = self.retry.iter().find(|r| r.target == target).map(|r| r.summary.goodput);
        Acceptance {
            goodput_ratio: div(Some(top.summary.goodput), Some(peak)),
            p99_ratio: div(top.summary.p99_ms, half),
            refused_p99_ms: top.summary.refused_p99_ms,
            top_level: Some(top.level),
            retry_goodput_ratio: div(retry, Some(peak)),
        }
    }
}

/// Percentage of answers that came from `backend` over a whole run.
pub fn share(r: &ScenarioRun, backend: &str) -> f64 {
    let (mut on, mut all) = (0u64, 0u64);
    for b in &r.timeline {
        on += b.by_backend.get(backend).copied().unwrap_or(0);
        all += b.by_backend.values().sum::<u64>();
    }
    if all == 0 {
        0.0
    } else {
        100.0 * on as f64 / all as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(target: &str, level: f64, goodput: f64, p99: f64) -> Point {
        let summary = Summary { goodput, p99_ms: Some(p99), refused_p99_ms: Some(0.4), ..Default::default() };
        Point { target: target.into(), level, rate: level * 1600.0, summary }
    }

    #[test]
    fn acceptance_from_the_data() {
        let mut r = OverloadResults {
            sweep: vec![
                point("refract", 0.5, 800.0, 12.0),
                point("refract", 3.0, 1520.0, 20.0),
                point("refract", 1.0, 1600.0, 15.0),
                point("haproxy", 0.5, 800.0, 10.0),
            ],
            ..Default::default()
        };
        r.retry.push(ScenarioRun {
            target: "refract".into(),
            rate: 4800.0,
            summary: Summary { goodput: 1440.0, ..Default::default() },
            timeline: vec![],
            served: vec![],
        });
        let a = r.acceptance("refract");
        assert_eq!(a.top_level, Some(3.0));
        assert_eq!(a.goodput_ratio, Some(0.95));
        assert_eq!(a.p99_ratio.map(|x| (x * 1000.0).round()), Some(1667.0));
        assert_eq!(a.refused_p99_ms, Some(0.4));
        assert_eq!(a.retry_goodput_ratio, Some(0.9));
        assert_eq!(r.targets(), vec!["refract".to_string(), "haproxy".into()]);
        assert_eq!(r.acceptance("haproxy").p99_ratio, Some(1.0));
        assert_eq!(r.acceptance("nginx"), Acceptance::default());
    }
}
