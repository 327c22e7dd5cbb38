//! One measurement: both clients at once, each running psql on a query whose result is a known
//! number of bytes, `\timing` giving each query's time from sending it to its last message.

use crate::pglab::layout::{self, SERVERS};
use crate::support::{sh, state};
use anyhow::{bail, Context, Result};
use std::process::Stdio;

/// The targets, in report order.
pub const TARGETS: [&str; 4] = ["direct", "relay", "hybrid", "pgbouncer"];

/// Row size for large results: 1 MiB.
const ROW: u64 = 1 << 20;

/// Bytes each client fetches per measurement at least (small results are repeated in one
/// session so that a measurement is not one round trip), and queries per session at most.
const MIN_BYTES: u64 = 32 << 20;
const MAX_QUERIES: u64 = 64;

/// A query whose result holds `bytes` of payload: rows of 1 MiB, or one row below that.
pub fn query(bytes: u64) -> String {
    if bytes >= ROW && bytes.is_multiple_of(ROW) {
        format!("select repeat('x', {ROW}) from generate_series(1, {})", bytes / ROW)
    } else {
        format!("select repeat('x', {bytes})")
    }
}

/// How many times each client runs the query in one measurement.
pub fn queries(bytes: u64) -> u64 {
    (MIN_BYTES / bytes.max(1)).clamp(1, MAX_QUERIES)
}

/// Where client `i` (0: rf-c1, 1: rf-c2) connects for `target`.
pub fn addr(target: &str, i: usize) -> Result<String> {
    Ok(match target {
        "direct" => SERVERS[i % SERVERS.len()].listen_addr(),
        "relay" => layout::vip(6433),
        "hybrid" => layout::vip(6432),
        "pgbouncer" => layout::pgbouncer_addr(),
        t => bail!("unknown target {t:?} (one of {})", TARGETS.join(", ")),
    })
}

/// Sums psql's `Time: 12.345 ms` lines, in seconds; the count of them.
pub fn timings(stdout: &str) -> (f64, usize) {
    let ms: Vec<f64> =
        stdout.lines().filter_map(|l| l.strip_prefix("Time: ")?.split_whitespace().next()?.parse().ok()).collect();
    (ms.iter().sum::<f64>() / 1000.0, ms.len())
}

/// Both clients fetch `bytes` (`queries(bytes)` times each) through `target` at once; the
/// throughput over both, bytes per second: both clients' bytes over the longer one's query
/// time (not the sum of each client's rate, which would count the time the faster client no
/// longer shares a link with the slower one twice).
pub fn measure(target: &str, bytes: u64) -> Result<f64> {
    let n = queries(bytes);
    let script = format!("\\timing on\n{}", format!("{};\n", query(bytes)).repeat(n as usize));
    let file = state::write("pg-large.sql", &script)?.to_string_lossy().into_owned();
    let psql = refract_pg::testkit::tool("psql")?.to_string_lossy().into_owned();
    let mut children = Vec::new();
    for (i, ns) in ["rf-c1", "rf-c2"].into_iter().enumerate() {
        let addr = addr(target, i)?;
        let (host, port) = addr.rsplit_once(':').context("IP:PORT")?;
        let args = ["-XAtq", "-v", "ON_ERROR_STOP=1", "-h", host, "-p", port, "-U", "refract", "-d", "postgres"];
        let mut c = sh::cmd(Some(ns), &psql, &args);
        c.args(["-o", "/dev/null", "-f", &file]).env("PGPASSWORD", "refract").env("PGCONNECT_TIMEOUT", "10");
        c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        children.push(c.spawn().with_context(|| format!("starting `{}`", sh::show(&c)))?);
    }
    let mut longest = 0.0f64;
    for child in children {
        let out = child.wait_with_output()?;
        let (secs, got) = timings(&String::from_utf8_lossy(&out.stdout));
        if !out.status.success() || got != n as usize || secs <= 0.0 {
            bail!("{target}, {bytes} B: psql: {} ({got} of {n} timings)", String::from_utf8_lossy(&out.stderr).trim());
        }
        longest = longest.max(secs);
    }
    Ok((2 * n * bytes) as f64 / longest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_of_the_asked_size_and_psql_timings_summed() {
        assert_eq!(query(1024), "select repeat('x', 1024)");
        assert_eq!(query(64 << 20), "select repeat('x', 1048576) from generate_series(1, 64)");
        assert_eq!((queries(1024), queries(1 << 20), queries(256 << 20)), (64, 32, 1));
        let out = "Time: 1.500 ms\nTime: 1234.500 ms (00:01.235)\nother\n";
        assert_eq!(timings(out), (1.236, 2));
        assert_eq!(addr("direct", 1).expect("direct"), "198.18.0.22:5432");
        assert!(addr("haproxy", 0).is_err());
    }
}
