//! The environment a sweep ran in, for the report: kernel, CPU, tool versions, date.

use crate::support::sh;
use std::time::{SystemTime, UNIX_EPOCH};

/// What the report's environment section states.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environment {
    /// `uname -r`.
    pub kernel: String,
    /// CPU model name.
    pub cpu: String,
    /// Logical cores available.
    pub cores: usize,
    /// wrk's version line.
    pub wrk: String,
    /// HAProxy's version line.
    pub haproxy: String,
    /// refract's version (and git commit when known).
    pub refract: String,
    /// UTC date and time, `2026-05-01 12:34 UTC`.
    pub date: String,
}

impl Environment {
    /// Look everything up on this machine.
    pub fn detect() -> Self {
        Environment {
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
            cpu: cpu_model(),
            cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            wrk: first_line("wrk", &["--version"]),
            haproxy: first_line(crate::cluster::haproxy::BINARY, &["-v"]),
            refract: refract_version(),
            date: utc_now(),
        }
    }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_else(|_| "?".into())
}

fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "?".into())
}

/// The first line a tool prints about itself (wrk prints its version and exits non-zero).
fn first_line(program: &str, args: &[&str]) -> String {
    let Ok(out) = sh::output(&mut sh::cmd(None, program, args)) else {
        return "not installed".into();
    };
    let text = [out.stdout, out.stderr].concat();
    let line = String::from_utf8_lossy(&text).lines().next().unwrap_or("?").to_string();
    short_version(&line)
}

/// `wrk debian/4.1.0-3+b2 [epoll] Copyright …` → `wrk debian/4.1.0-3+b2`;
/// `HAProxy version 2.6.12-1 2026/10/17 - https://…` → `HAProxy version 2.6.12-1`.
pub fn short_version(line: &str) -> String {
    let line = line.split(" [").next().unwrap_or(line);
    let line = line.split(" - ").next().unwrap_or(line);
    let words: Vec<&str> = line.split_whitespace().collect();
    let keep = words.iter().position(|w| w.contains('/') && w.chars().all(|c| c.is_ascii_digit() || c == '/'));
    words[..keep.unwrap_or(words.len())].join(" ")
}

fn refract_version() -> String {
    let dir = env!("CARGO_MANIFEST_DIR");
    let git = sh::cmd(None, "git", &["-C", dir, "rev-parse", "--short", "HEAD"]);
    // Source changes not yet committed (the reports this run writes under docs/ do not count).
    let changed = sh::cmd(None, "git", &["-C", dir, "status", "--porcelain", "--", "../crates", "../examples", "."]);
    let changed = sh::run(changed).map(|out| !out.trim().is_empty()).unwrap_or(false);
    match sh::run(git) {
        Ok(rev) => version_label(env!("CARGO_PKG_VERSION"), rev.trim(), changed),
        Err(_) => env!("CARGO_PKG_VERSION").to_string(),
    }
}

/// `0.1.0 (abc1234)`, or `0.1.0 (abc1234 + uncommitted changes)` when the source tree differs
/// from that commit; just the version outside a git checkout.
fn version_label(version: &str, rev: &str, changed: bool) -> String {
    match (rev.is_empty(), changed) {
        (true, _) => version.to_string(),
        (false, false) => format!("{version} ({rev})"),
        (false, true) => format!("{version} ({rev} + uncommitted changes)"),
    }
}

/// Now, as `YYYY-MM-DD HH:MM UTC`.
pub fn utc_now() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    format_utc(secs)
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM UTC`.
pub fn format_utc(secs: u64) -> String {
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", rem / 3600, rem % 3600 / 60)
}

/// Days since 1970-01-01 to (year, month, day) — Howard Hinnant's `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_says_whether_the_source_was_committed() {
        assert_eq!(version_label("0.1.0", "abc1234", false), "0.1.0 (abc1234)");
        assert_eq!(version_label("0.1.0", "abc1234", true), "0.1.0 (abc1234 + uncommitted changes)");
        assert_eq!(version_label("0.1.0", "", true), "0.1.0");
    }

    #[test]
    fn versions() {
        assert_eq!(
            short_version("wrk debian/4.1.0-3+b2 [epoll] Copyright (C) 2012 Will Glozer"),
            "wrk debian/4.1.0-3+b2"
        );
        assert_eq!(
            short_version("HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/"),
            "HAProxy version 2.6.12-1+deb12u4"
        );
    }

    #[test]
    fn dates() {
        assert_eq!(format_utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(format_utc(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(format_utc(1_700_000_000), "2023-11-14 22:13 UTC");
    }
}
