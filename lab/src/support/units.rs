//! Units on the command line and in reports: payload sizes, link rates, durations, throughput.

use anyhow::{bail, Context, Result};
use std::fmt;
use std::time::Duration;

/// A payload size in bytes; `4K` is 4096, `1M` is 1 MiB (binary multiples, as `--sizes` takes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Parse `512`, `4K`, `4k`, `4KiB`, `1M`, `2G` (binary multiples).
    pub fn parse(s: &str) -> Result<Self> {
        let t = s.trim();
        let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(digits);
        let n: u64 = num.parse().with_context(|| format!("bad size {s:?}"))?;
        let shift = match unit.to_ascii_uppercase().as_str() {
            "" | "B" => 0,
            "K" | "KB" | "KIB" => 10,
            "M" | "MB" | "MIB" => 20,
            "G" | "GB" | "GIB" => 30,
            _ => bail!("bad size unit in {s:?} (use K, M or G)"),
        };
        n.checked_mul(1 << shift).map(ByteSize).context("size too large")
    }

    /// For tables: `1 B`, `512 B`, `4 KiB`, `128 MiB` (exact multiples only; else bytes).
    pub fn human(&self) -> String {
        match self.exact_unit() {
            Some((v, unit)) => format!("{v} {unit}iB"),
            None => format!("{} B", self.0),
        }
    }

    /// The largest binary unit the size is an exact multiple of: `(4, "K")` for 4096.
    fn exact_unit(&self) -> Option<(u64, &'static str)> {
        let n = self.0;
        [(30, "G"), (20, "M"), (10, "K")]
            .into_iter()
            .find(|&(shift, _)| n != 0 && n.trailing_zeros() >= shift)
            .map(|(shift, unit)| (n >> shift, unit))
    }

    /// Parse a comma-separated list, e.g. `1,8,64,4K,1M`.
    pub fn parse_list(s: &str) -> Result<Vec<Self>> {
        s.split(',').filter(|p| !p.trim().is_empty()).map(Self::parse).collect()
    }
}

impl fmt::Display for ByteSize {
    /// The shortest exact form: `4K`, `1M`, `1000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.exact_unit() {
            Some((v, unit)) => write!(f, "{v}{unit}"),
            None => write!(f, "{}", self.0),
        }
    }
}

/// A link rate for tbf, or `None` for unshaped links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rate {
    /// No qdisc: veth at full speed.
    Unlimited,
    /// Bits per second.
    BitsPerSec(u64),
}

impl Rate {
    /// Parse `1gbit`, `100mbit`, `500kbit`, `none` (tc's decimal units).
    pub fn parse(s: &str) -> Result<Self> {
        let t = s.trim().to_ascii_lowercase();
        if t == "none" || t == "unlimited" {
            return Ok(Rate::Unlimited);
        }
        let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(digits);
        let n: u64 = num.parse().with_context(|| format!("bad rate {s:?}"))?;
        let mult = match unit {
            "gbit" => 1_000_000_000,
            "mbit" => 1_000_000,
            "kbit" => 1_000,
            "bit" => 1,
            _ => bail!("bad rate unit in {s:?} (use gbit, mbit, kbit or none)"),
        };
        match n.checked_mul(mult) {
            Some(0) | None => bail!("rate {s:?} out of range"),
            Some(b) => Ok(Rate::BitsPerSec(b)),
        }
    }

    /// The label used in file names and report sections: `1gbit`, `100mbit`, `none`.
    pub fn label(&self) -> String {
        match *self {
            Rate::Unlimited => "none".into(),
            Rate::BitsPerSec(b) if b % 1_000_000_000 == 0 => format!("{}gbit", b / 1_000_000_000),
            Rate::BitsPerSec(b) if b % 1_000_000 == 0 => format!("{}mbit", b / 1_000_000),
            Rate::BitsPerSec(b) if b % 1_000 == 0 => format!("{}kbit", b / 1_000),
            Rate::BitsPerSec(b) => format!("{b}bit"),
        }
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

/// Parse a duration: `5s`, `500ms`, `2m`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().with_context(|| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" | "min" => n * 60.0,
        _ => bail!("bad duration unit in {s:?} (use ms, s or m)"),
    };
    if !(secs.is_finite() && secs > 0.0) {
        bail!("duration {s:?} must be positive");
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Format a duration the way wrk's `-d` takes it (whole seconds, at least 1).
pub fn wrk_duration(d: Duration) -> String {
    format!("{}s", d.as_secs_f64().round().max(1.0) as u64)
}

/// Format a throughput in bytes/s as bits/s with three significant digits: `938 Mbit/s`.
pub fn format_throughput(bytes_per_sec: f64) -> String {
    let bits = bytes_per_sec * 8.0;
    let (v, unit) = if bits >= 1e9 {
        (bits / 1e9, "Gbit/s")
    } else if bits >= 1e6 {
        (bits / 1e6, "Mbit/s")
    } else if bits >= 1e3 {
        (bits / 1e3, "kbit/s")
    } else {
        (bits, "bit/s")
    };
    format!("{} {unit}", sig3(v))
}

/// Format a byte count with three significant digits: `512 B`, `1.50 MiB`, `3.20 GiB`.
pub fn format_bytes(bytes: f64) -> String {
    let units = [(30, "GiB"), (20, "MiB"), (10, "KiB")];
    match units.iter().find(|(shift, _)| bytes >= (1u64 << shift) as f64) {
        Some((shift, unit)) => format!("{} {unit}", sig3(bytes / (1u64 << shift) as f64)),
        None => format!("{bytes:.0} B"),
    }
}

/// Format a count per second compactly: `18.4k`, `950`, `2.31`.
pub fn format_rate(per_sec: f64) -> String {
    if per_sec >= 1e6 {
        format!("{}M", sig3(per_sec / 1e6))
    } else if per_sec >= 1e4 {
        format!("{}k", sig3(per_sec / 1e3))
    } else {
        sig3(per_sec)
    }
}

/// Format a latency given in microseconds: `52.3 µs`, `1.25 ms`, `2.10 s`.
pub fn format_latency_us(us: f64) -> String {
    if us >= 1e6 {
        format!("{} s", sig3(us / 1e6))
    } else if us >= 1e3 {
        format!("{} ms", sig3(us / 1e3))
    } else {
        format!("{} µs", sig3(us))
    }
}

/// Three significant digits without exponent: `0.00123`, `1.23`, `12.3`, `123`, `1234`.
pub fn sig3(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let mag = v.abs().log10().floor() as i32;
    let decimals = (2 - mag).max(0) as usize;
    format!("{v:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts() {
        assert_eq!(format_bytes(512.0), "512 B");
        assert_eq!(format_bytes(1.5 * 1048576.0), "1.50 MiB");
        assert_eq!(format_bytes(3.2 * 1073741824.0), "3.20 GiB");
    }

    #[test]
    fn sizes_parse_and_print() {
        let list = ByteSize::parse_list("1,8,64,512,4K,32K,256K,1M,2M,16M,128M").expect("parse");
        let printed: Vec<String> = list.iter().map(|s| s.to_string()).collect();
        assert_eq!(printed.join(","), "1,8,64,512,4K,32K,256K,1M,2M,16M,128M");
        assert_eq!(ByteSize::parse("4k").expect("4k").0, 4096);
        assert_eq!(ByteSize::parse("2MiB").expect("2MiB").0, 2 << 20);
        assert_eq!(ByteSize(1000).to_string(), "1000");
        assert_eq!(ByteSize(1536).to_string(), "1536");
        assert_eq!(ByteSize(128 << 20).human(), "128 MiB");
        assert_eq!(ByteSize(4096).human(), "4 KiB");
        assert_eq!(ByteSize(8).human(), "8 B");
        assert!(ByteSize::parse("4X").is_err());
        assert!(ByteSize::parse("").is_err());
    }

    #[test]
    fn rates_parse_and_label() {
        assert_eq!(Rate::parse("1gbit").expect("1gbit"), Rate::BitsPerSec(1_000_000_000));
        assert_eq!(Rate::parse("none").expect("none"), Rate::Unlimited);
        assert_eq!(Rate::parse("100mbit").expect("100mbit").label(), "100mbit");
        assert_eq!(Rate::parse("1000mbit").expect("1000mbit").label(), "1gbit");
        assert!(Rate::parse("1gbps").is_err());
        assert!(Rate::parse("0mbit").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s").expect("5s"), Duration::from_secs(5));
        assert_eq!(parse_duration("250ms").expect("ms"), Duration::from_millis(250));
        assert_eq!(parse_duration("2").expect("2"), Duration::from_secs(2));
        assert_eq!(parse_duration("1m").expect("1m"), Duration::from_secs(60));
        assert!(parse_duration("0s").is_err());
        assert_eq!(wrk_duration(Duration::from_millis(400)), "1s");
    }

    #[test]
    fn formatting() {
        assert_eq!(format_throughput(117_500_000.0), "940 Mbit/s");
        assert_eq!(format_throughput(250_000_000.0), "2.00 Gbit/s");
        assert_eq!(format_throughput(20_000.0), "160 kbit/s");
        assert_eq!(format_rate(18_432.0), "18.4k");
        assert_eq!(format_rate(2.3125), "2.31");
        assert_eq!(format_latency_us(52.3), "52.3 µs");
        assert_eq!(format_latency_us(1250.0), "1.25 ms");
        assert_eq!(sig3(0.001234), "0.00123");
    }
}
