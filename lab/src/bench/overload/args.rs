//! `OverloadArgs`: the options of `refract bench overload`, and what `--quick` changes; the
//! `OverloadOptions` they become, which the runner and the report both read.

use crate::bench::overload::rig::{Capacity, TargetSettings};
use crate::support::units::{parse_duration, Rate};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// Options of `bench overload`.
#[derive(Debug, Clone, Args)]
pub struct OverloadArgs {
    /// About a minute: loads 0.5,1,3 for 2 s each, shorter scenarios; section `quick`.
    #[arg(long)]
    quick: bool,
    /// Offered loads as multiples of the measured capacity.
    #[arg(long, default_value = "0.25,0.5,1,1.5,2,3", value_delimiter = ',')]
    levels: Vec<f64>,
    /// Targets: refract (overload control on), refract-off, haproxy.
    #[arg(long, default_value = "refract,refract-off,haproxy", value_delimiter = ',')]
    targets: Vec<String>,
    /// Per sweep point (and per retry run).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    duration: Duration,
    /// Per slow-replica run.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    slow_duration: Duration,
    /// Blob servers' `--delay-ms`.
    #[arg(long, default_value_t = 10)]
    delay_ms: u64,
    /// Blob servers' `--concurrency`.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// The slow replica's (b2's) `--delay-ms`.
    #[arg(long, default_value_t = 100)]
    slow_delay_ms: u64,
    /// Offered load in the slow-replica scenario, × capacity.
    #[arg(long, default_value_t = 0.4)]
    slow_level: f64,
    /// Offered load in the retrying-clients scenario, × capacity.
    #[arg(long, default_value_t = 3.0)]
    retry_level: f64,
    /// Client timeout, ms (sent as `x-refract-timeout-ms`).
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
    /// The retrying clients' timeout per attempt, ms.
    #[arg(long, default_value_t = 100)]
    retry_timeout_ms: u64,
    /// HAProxy's `timeout queue`, ms.
    #[arg(long, default_value_t = 250)]
    haproxy_queue_ms: u64,
    /// Override `[balance] policy` in both refract configs (default: relay.toml's).
    #[arg(long)]
    policy: Option<String>,
    /// The load generator's connection cap.
    #[arg(long, default_value_t = 2000)]
    max_conns: usize,
    /// Payload size, bytes.
    #[arg(long, default_value_t = 64)]
    bytes: u64,
    /// Reshape the lab's links for the run (`none`, `1gbit`); default: leave them as they are.
    #[arg(long, value_parser = Rate::parse)]
    rate: Option<Rate>,
    /// The markdown page; the plots go next to it.
    #[arg(long, default_value = "docs/overload.md")]
    out: PathBuf,
}

impl OverloadArgs {
    /// The options, with `--quick` applied.
    pub fn into_options(self) -> OverloadOptions {
        let q = self.quick;
        OverloadOptions {
            levels: if q { vec![0.5, 1.0, 3.0] } else { self.levels },
            targets: self.targets,
            duration: if q { Duration::from_secs(2) } else { self.duration },
            slow_duration: if q { Duration::from_secs(4) } else { self.slow_duration },
            warmup: Duration::from_millis(if q { 500 } else { 1000 }),
            capacity_duration: Duration::from_millis(if q { 1500 } else { 3000 }),
            capacity: Capacity { delay_ms: self.delay_ms, concurrency: self.concurrency },
            slow_delay_ms: self.slow_delay_ms,
            slow_level: self.slow_level,
            retry_level: self.retry_level,
            timeout_ms: self.timeout_ms,
            retry_timeout_ms: self.retry_timeout_ms,
            settings: TargetSettings { haproxy_queue_ms: self.haproxy_queue_ms, policy: self.policy },
            max_conns: self.max_conns,
            bytes: self.bytes,
            rate: self.rate,
            out: self.out,
            section: if q { "quick".into() } else { "full".into() },
            command: rerun_command(std::env::args().skip(1)),
        }
    }
}

/// `sudo refract ARGS…`, as this run was started.
pub fn rerun_command(args: impl Iterator<Item = String>) -> String {
    let mut c = String::from("sudo refract");
    for a in args {
        c.push(' ');
        c.push_str(&a);
    }
    c
}

/// What to run.
#[derive(Debug, Clone)]
pub struct OverloadOptions {
    /// Offered loads, as multiples of the measured capacity.
    pub levels: Vec<f64>,
    /// `refract`, `refract-off`, `haproxy`.
    pub targets: Vec<String>,
    /// Per sweep point.
    pub duration: Duration,
    /// Per slow-replica run.
    pub slow_duration: Duration,
    /// Unrecorded load (0.5×) after a target starts.
    pub warmup: Duration,
    /// The closed-loop capacity run.
    pub capacity_duration: Duration,
    /// Every blob server's capacity.
    pub capacity: Capacity,
    /// The slow replica's delay.
    pub slow_delay_ms: u64,
    /// Offered load in the slow-replica scenario, × capacity.
    pub slow_level: f64,
    /// Offered load in the retry scenario, × capacity.
    pub retry_level: f64,
    /// Client timeout in the sweep and the slow-replica scenario.
    pub timeout_ms: u64,
    /// The retrying clients' (short) timeout per attempt.
    pub retry_timeout_ms: u64,
    /// Target settings (HAProxy queue timeout, balance policy).
    pub settings: TargetSettings,
    /// The load generator's connection cap.
    pub max_conns: usize,
    /// Payload size.
    pub bytes: u64,
    /// Link rate to apply (`None`: keep the lab's).
    pub rate: Option<Rate>,
    /// The markdown page (plots go next to it).
    pub out: PathBuf,
    /// `full` or `quick`.
    pub section: String,
    /// The command that reruns this.
    pub command: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: OverloadArgs,
    }

    #[test]
    fn defaults_and_quick() {
        let o = Cli::parse_from(["x"]).args.into_options();
        assert_eq!(o.levels, vec![0.25, 0.5, 1.0, 1.5, 2.0, 3.0]);
        assert_eq!(
            (o.section.as_str(), o.duration, o.capacity.delay_ms, o.capacity.concurrency),
            ("full", Duration::from_secs(5), 10, 8)
        );
        assert_eq!(o.targets, vec!["refract", "refract-off", "haproxy"]);
        let q = Cli::parse_from(["x", "--quick", "--targets", "refract"]).args.into_options();
        assert_eq!((q.section.as_str(), q.levels.len(), q.targets.len()), ("quick", 3, 1));
        let cmd = rerun_command(["bench", "overload", "--quick"].iter().map(|s| s.to_string()));
        assert_eq!(cmd, "sudo refract bench overload --quick");
    }
}
