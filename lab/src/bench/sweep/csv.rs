//! The CSV next to the report: one row per measurement (per client, so nothing is averaged
//! away), rows of other sections kept when a section is rewritten.

use crate::bench::sweep::run::{client_throughput, Results};
use crate::bench::sweep::wrk::WrkReport;
use crate::support::units::ByteSize;
use std::fmt::Write;

/// The header line.
pub const HEADER: &str = "section,table,target,payload_bytes,client,requests,seconds,requests_per_sec,\
throughput_bytes_per_sec,bytes_read,latency_avg_us,latency_p50_us,latency_p99_us,non_2xx,socket_errors";

/// Rows for one sweep.
pub fn rows(section: &str, results: &Results) -> Vec<String> {
    let mut v = Vec::new();
    for m in &results.throughput {
        for (i, r) in m.reports.iter().enumerate() {
            v.push(row(section, "throughput", &m.target, m.size, i + 1, r));
        }
    }
    for l in &results.latency {
        v.push(row(section, "latency", &l.target, ByteSize(1), 1, &l.report));
    }
    v
}

fn row(section: &str, table: &str, target: &str, size: ByteSize, client: usize, r: &WrkReport) -> String {
    let opt = |v: Option<f64>| v.map(|x| format!("{x:.1}")).unwrap_or_default();
    let mut s = String::new();
    let _ = write!(
        s,
        "{section},{table},{target},{},{client},{},{:.2},{:.2},{:.0},{:.0},{:.1},{},{},{},{}",
        size.0,
        r.requests,
        r.seconds,
        r.requests_per_sec,
        client_throughput(r, size),
        r.bytes_read,
        r.latency_avg_us,
        opt(r.latency_p50_us),
        opt(r.latency_p99_us),
        r.non_2xx,
        r.socket_errors
    );
    s
}

/// Merge: keep the existing file's rows of other sections, replace this section's.
pub fn merge(existing: &str, section: &str, new_rows: &[String]) -> String {
    let prefix = format!("{section},");
    let mut out = String::from(HEADER);
    out.push('\n');
    let kept =
        existing.lines().skip_while(|l| l.starts_with("section,")).filter(|l| !l.is_empty() && !l.starts_with(&prefix));
    for l in kept.chain(new_rows.iter().map(String::as_str)) {
        out.push_str(l);
        out.push('\n');
    }
    out
}
