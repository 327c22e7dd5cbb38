//! The payload sweep: for each size and target, wrk from every client at once; then the
//! one-connection latency of 1-byte requests. Prints one progress line per measurement. The
//! hand-over dispatchers' own figures (hand-overs, their latency) are tallied over the run.

use crate::bench::sweep::handover_stats::HandoverStats;
use crate::bench::sweep::switch::Switch;
use crate::bench::sweep::wrk::{self, WrkReport};
use crate::cluster::layout::Layout;
use crate::support::interrupt;
use crate::support::units::{format_rate, format_throughput, ByteSize};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Below this many completed requests per client, wrk's byte counter (which includes the
/// partial last response) measures throughput better than requests × size.
const MIN_REQUESTS_FOR_RPS: u64 = 20;

/// What to measure.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Payload sizes (rows).
    pub sizes: Vec<ByteSize>,
    /// Targets (columns): `direct`, `refract` (relay), `handover`, `hybrid`, `haproxy`.
    pub targets: Vec<String>,
    /// wrk's duration per measurement.
    pub duration: Duration,
    /// Whether to measure Table 2 (1-byte latency on one connection).
    pub latency: bool,
    /// Interleaved runs per cell (targets take turns); the median run is reported.
    pub repeat: usize,
}

/// One cell of Table 1: all clients' reports for one size and target.
#[derive(Debug, Clone)]
pub struct Measurement {
    /// Target name.
    pub target: String,
    /// Payload size.
    pub size: ByteSize,
    /// One report per client.
    pub reports: Vec<WrkReport>,
}

impl Measurement {
    /// Requests per second, all clients.
    pub fn requests_per_sec(&self) -> f64 {
        self.reports.iter().map(|r| r.requests_per_sec).sum()
    }

    /// Payload bytes per second, all clients.
    pub fn throughput(&self) -> f64 {
        self.reports.iter().map(|r| client_throughput(r, self.size)).sum()
    }

    /// Requests per second implied by [`Self::throughput`] (equal to wrk's count, except for
    /// huge payloads where the unfinished last response counts pro rata).
    pub fn effective_rps(&self) -> f64 {
        self.throughput() / self.size.0.max(1) as f64
    }

    /// Non-2xx responses plus socket errors, all clients.
    pub fn errors(&self) -> u64 {
        self.reports.iter().map(|r| r.non_2xx + r.socket_errors).sum()
    }

    /// A cell of one client's 4 s run of 100 requests at `rps`, for tests.
    #[cfg(test)]
    pub(crate) fn for_test(target: &str, size: ByteSize, rps: f64) -> Measurement {
        let r = WrkReport { requests: 100, requests_per_sec: rps, seconds: 4.0, ..Default::default() };
        Measurement { target: target.into(), size, reports: vec![r] }
    }
}

/// One client's payload throughput (see [`MIN_REQUESTS_FOR_RPS`]).
pub fn client_throughput(r: &WrkReport, size: ByteSize) -> f64 {
    if r.requests >= MIN_REQUESTS_FOR_RPS || r.seconds <= 0.0 {
        r.requests_per_sec * size.0 as f64
    } else {
        r.bytes_read / r.seconds
    }
}

/// One row of Table 2.
#[derive(Debug, Clone)]
pub struct LatencyRow {
    /// Target name.
    pub target: String,
    /// The single client's report.
    pub report: WrkReport,
}

/// Everything a sweep measured.
#[derive(Debug, Clone, Default)]
pub struct Results {
    /// Table 1 cells, in measurement order.
    pub throughput: Vec<Measurement>,
    /// Table 2 rows.
    pub latency: Vec<LatencyRow>,
    /// Per hand-over target: its dispatchers' figures over the run (from their `/metrics`).
    pub handover: BTreeMap<String, HandoverStats>,
}

impl Results {
    /// The cell for a size and target.
    pub fn cell(&self, size: ByteSize, target: &str) -> Option<&Measurement> {
        self.throughput.iter().find(|m| m.size == size && m.target == target)
    }
}

/// The URL of a blob of `size` bytes at `addr`.
pub fn url(addr: &str, size: ByteSize) -> String {
    format!("http://{addr}/blob?bytes={}", size.0)
}

/// Check that every target exists in the layout.
pub fn check_targets(layout: &Layout, targets: &[String]) -> Result<()> {
    for t in targets {
        if layout.target_addrs(t).is_none() {
            bail!("unknown or unavailable target {t:?} ({})", layout.targets().join(", "));
        }
    }
    Ok(())
}

/// Run the plan.
pub fn run(layout: &Layout, plan: &Plan) -> Result<Results> {
    check_targets(layout, &plan.targets)?;
    let reps = plan.repeat.max(1);
    let total = (plan.sizes.len() * plan.targets.len() + if plan.latency { plan.targets.len() } else { 0 }) * reps;
    let mut progress = Progress::new("sweep", total, plan.duration);
    let mut switch = Switch::new(layout);
    let mut results = Results::default();
    for &size in &plan.sizes {
        let mut runs: Vec<Vec<Measurement>> = vec![Vec::new(); plan.targets.len()];
        for _ in 0..reps {
            for (i, target) in plan.targets.iter().enumerate() {
                switch.activate(layout, target)?;
                let m = measure(layout, target, size, plan.duration)?;
                let note = format!("{} ({} req/s)", format_throughput(m.throughput()), format_rate(m.effective_rps()));
                progress.done(&format!("{target:<8} {size:>5}"), &note, m.errors());
                runs[i].push(m);
            }
        }
        results.throughput.extend(runs.into_iter().map(|r| median_by(r, Measurement::throughput)));
    }
    if plan.latency {
        let mut runs: Vec<Vec<LatencyRow>> = vec![Vec::new(); plan.targets.len()];
        for _ in 0..reps {
            for (i, target) in plan.targets.iter().enumerate() {
                switch.activate(layout, target)?;
                let row = measure_latency(layout, target, plan.duration)?;
                let note = format!("mean {:.1} µs", row.report.latency_avg_us);
                progress.done(
                    &format!("{target:<8} 1-conn latency"),
                    &note,
                    row.report.non_2xx + row.report.socket_errors,
                );
                runs[i].push(row);
            }
        }
        results.latency.extend(runs.into_iter().map(|r| median_by(r, |l| l.report.latency_avg_us)));
    }
    results.handover = switch.finish(layout)?;
    results.handover.retain(|t, _| plan.targets.contains(t));
    Ok(results)
}

/// The run with the median `key` (the lower middle one for an even count). Errors of any
/// run are kept: a cell is flagged if any of its runs had errors.
fn median_by<T: Clone + Errors>(mut runs: Vec<T>, key: impl Fn(&T) -> f64) -> T {
    runs.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let errors: u64 = runs.iter().map(Errors::errors).sum();
    let mut mid = runs[(runs.len() - 1) / 2].clone();
    mid.set_errors(errors);
    mid
}

/// Error counts of a run, so a median keeps every run's errors.
trait Errors {
    fn errors(&self) -> u64;
    fn set_errors(&mut self, n: u64);
}

impl Errors for Measurement {
    fn errors(&self) -> u64 {
        Measurement::errors(self)
    }
    fn set_errors(&mut self, n: u64) {
        let others: u64 = self.reports.iter().skip(1).map(|r| r.non_2xx + r.socket_errors).sum();
        if let Some(first) = self.reports.first_mut() {
            first.socket_errors = n.saturating_sub(others + first.non_2xx);
        }
    }
}

impl Errors for LatencyRow {
    fn errors(&self) -> u64 {
        self.report.non_2xx + self.report.socket_errors
    }
    fn set_errors(&mut self, n: u64) {
        self.report.socket_errors = n.saturating_sub(self.report.non_2xx);
    }
}

/// Table 1 cell: every client at once, each to its own address for the target.
pub(crate) fn measure(layout: &Layout, target: &str, size: ByteSize, duration: Duration) -> Result<Measurement> {
    interrupt::check()?;
    let addrs = layout.target_addrs(target).context("unknown target")?;
    let cmds = layout
        .clients
        .iter()
        .zip(&addrs)
        .map(|(ns, addr)| wrk::command(ns.as_deref(), &url(addr, size), duration))
        .collect();
    let reports = wrk::run_parallel(cmds).with_context(|| format!("{target}, {size} B"))?;
    Ok(Measurement { target: target.to_string(), size, reports })
}

/// Table 2 row: one connection from the first client, 1-byte payloads.
fn measure_latency(layout: &Layout, target: &str, duration: Duration) -> Result<LatencyRow> {
    interrupt::check()?;
    let addrs = layout.target_addrs(target).context("unknown target")?;
    let ns = layout.clients.first().cloned().flatten();
    let cmd = wrk::command(ns.as_deref(), &url(&addrs[0], ByteSize(1)), duration);
    let mut reports = wrk::run_parallel(vec![cmd]).with_context(|| format!("{target}, latency"))?;
    let report = reports.pop().context("no report")?;
    Ok(LatencyRow { target: target.to_string(), report })
}

/// Progress lines on stderr with an ETA.
pub(crate) struct Progress {
    total: usize,
    done: usize,
    started: Instant,
    estimate: Duration,
}

impl Progress {
    pub(crate) fn new(what: &str, total: usize, per_run: Duration) -> Self {
        // wrk's start-up and the gap between runs add roughly a quarter of a second.
        let estimate = per_run + Duration::from_millis(250);
        eprintln!("{what}: {total} measurements, about {}", eta(estimate * total as u32));
        Progress { total, done: 0, started: Instant::now(), estimate }
    }

    pub(crate) fn done(&mut self, what: &str, note: &str, errors: u64) {
        self.done += 1;
        let per = self.started.elapsed() / self.done as u32;
        let per = if self.done < 2 { per.max(self.estimate) } else { per };
        let left = per * (self.total - self.done) as u32;
        let flag = if errors > 0 { format!("  ERRORS: {errors}") } else { String::new() };
        eprintln!("[{:>2}/{}] {what}: {note}{flag}  (ETA {})", self.done, self.total, eta(left));
    }
}

/// `1m05s`, `42s`.
fn eta(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(requests: u64, rps: f64, bytes_read: f64) -> WrkReport {
        WrkReport { requests, requests_per_sec: rps, seconds: 5.0, bytes_read, ..Default::default() }
    }

    #[test]
    fn throughput_uses_requests_or_bytes() {
        let small = report(1000, 200.0, 0.0);
        assert_eq!(client_throughput(&small, ByteSize(4096)), 200.0 * 4096.0);
        // 128 MiB, four whole responses and a partial fifth: bytes read is the better measure.
        let big = report(4, 0.8, 600.0 * 1048576.0);
        assert_eq!(client_throughput(&big, ByteSize(128 << 20)), 120.0 * 1048576.0);
    }

    #[test]
    fn eta_format() {
        assert_eq!(eta(Duration::from_secs(65)), "1m05s");
        assert_eq!(eta(Duration::from_secs(9)), "9s");
    }
}
