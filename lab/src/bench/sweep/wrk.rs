//! wrk, the load generator: the command line for one run and a parser for its report.

use crate::support::sh;
use crate::support::units::wrk_duration;
use anyhow::{bail, Context, Result};
use std::process::Command;
use std::time::Duration;

/// What one wrk run reported.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WrkReport {
    /// `Requests/sec:`.
    pub requests_per_sec: f64,
    /// Completed requests (`N requests in …`).
    pub requests: u64,
    /// The measured wall time (`… in 5.00s`), in seconds.
    pub seconds: f64,
    /// Bytes read, partial last responses included (`…, 10.00MB read`).
    pub bytes_read: f64,
    /// Mean latency in microseconds (`Latency` row, `Avg` column).
    pub latency_avg_us: f64,
    /// Median latency in microseconds (`--latency` distribution), if printed.
    pub latency_p50_us: Option<f64>,
    /// 99th percentile latency in microseconds, if printed.
    pub latency_p99_us: Option<f64>,
    /// `Non-2xx or 3xx responses:` (0 when absent).
    pub non_2xx: u64,
    /// Sum of `Socket errors: connect A, read B, write C, timeout D` (0 when absent).
    pub socket_errors: u64,
}

impl WrkReport {
    /// Whether anything went wrong (a run with errors is flagged in reports).
    pub fn has_errors(&self) -> bool {
        self.non_2xx > 0 || self.socket_errors > 0
    }

    /// Parse wrk's stdout.
    pub fn parse(text: &str) -> Result<Self> {
        let mut r = WrkReport::default();
        let mut seen_rps = false;
        for line in text.lines().map(str::trim) {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["Requests/sec:", v] => {
                    r.requests_per_sec = v.parse().context("Requests/sec")?;
                    seen_rps = true;
                }
                ["Latency", avg, _stdev, _max, _within] => r.latency_avg_us = parse_latency_us(avg)?,
                ["50%", v] => r.latency_p50_us = Some(parse_latency_us(v)?),
                ["99%", v] => r.latency_p99_us = Some(parse_latency_us(v)?),
                [n, "requests", "in", secs, bytes, "read"] => {
                    r.requests = n.parse().context("request count")?;
                    r.seconds = parse_latency_us(secs.trim_end_matches(','))? / 1e6;
                    r.bytes_read = parse_bytes(bytes)?;
                }
                ["Socket", "errors:", rest @ ..] => r.socket_errors = sum_numbers(rest),
                ["Non-2xx", "or", "3xx", "responses:", v] => r.non_2xx = v.parse().context("Non-2xx count")?,
                _ => {}
            }
        }
        if !seen_rps {
            bail!("no `Requests/sec:` line in wrk output:\n{}", text.trim());
        }
        Ok(r)
    }
}

/// A wrk time with its unit (`52.30us`, `1.23ms`, `2.00s`, `1.50m`) in microseconds.
pub fn parse_latency_us(s: &str) -> Result<f64> {
    let split = s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().with_context(|| format!("bad wrk time {s:?}"))?;
    let scale = match unit {
        "us" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        "m" => 60e6,
        "h" => 3600e6,
        _ => bail!("bad wrk time unit in {s:?}"),
    };
    Ok(v * scale)
}

/// A wrk byte count with its (binary) unit: `10.00MB`, `512.00B`.
pub fn parse_bytes(s: &str) -> Result<f64> {
    let split = s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().with_context(|| format!("bad wrk byte count {s:?}"))?;
    let exp = ["B", "KB", "MB", "GB", "TB", "PB"]
        .iter()
        .position(|u| *u == unit)
        .with_context(|| format!("bad wrk byte unit in {s:?}"))?;
    Ok(v * 1024f64.powi(exp as i32))
}

/// Add up the numbers in `connect 0, read 1, write 0, timeout 2`.
fn sum_numbers(words: &[&str]) -> u64 {
    words.iter().filter_map(|w| w.trim_end_matches(',').parse::<u64>().ok()).sum()
}

/// The wrk command for one client: one thread, one connection, `--latency`.
/// `--timeout` is raised from wrk's 2 s so that 128 MiB over a shared link does not time out.
pub fn command(ns: Option<&str>, url: &str, duration: Duration) -> Command {
    let d = wrk_duration(duration);
    sh::cmd(ns, "wrk", &["-t1", "-c1", "-d", &d, "--timeout", "30s", "--latency", url])
}

/// Start wrk runs side by side and collect every report (in the order given).
pub fn run_parallel(cmds: Vec<Command>) -> Result<Vec<WrkReport>> {
    let mut children = Vec::new();
    for mut c in cmds {
        let shown = sh::show(&c);
        c.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        let child = c.spawn().with_context(|| format!("cannot start `{shown}`"))?;
        children.push((shown, child));
    }
    children
        .into_iter()
        .map(|(shown, child)| {
            let out = child.wait_with_output().with_context(|| format!("waiting for `{shown}`"))?;
            let text = String::from_utf8_lossy(&out.stdout);
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr);
                bail!("`{shown}` failed ({}): {}{}", out.status, err.trim(), text.trim());
            }
            WrkReport::parse(&text).with_context(|| format!("parsing the output of `{shown}`"))
        })
        .collect()
}
