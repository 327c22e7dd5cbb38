//! What `bench pg-shard` measured, and its section of the benchmarks page between
//! `<!-- pgshard:loopback -->` markers (the rest of the page is left as it is).

use super::{PgShardOptions, TARGETS};
use crate::bench::pairs::cpu::{CpuUse, PerRequest};
use crate::bench::pairs::Estimate;
use crate::bench::pgbench::client::Outcome;
use crate::bench::pgbench::options::SERVER_SETTINGS;
use crate::bench::pgbench::results::Versions;
use crate::report::environment::Environment;
use crate::report::{self, ratio};
use crate::support::units::{format_rate, sig3};
use anyhow::Result;
use std::fmt::Write;

/// The marker kind of the section (`<!-- pgshard:NAME -->`).
pub const MARKER: &str = "pgshard";
/// The section name.
pub const SECTION: &str = "loopback";
/// The acceptance target: sharded at least this share of unsharded's TPS (within 10 %).
pub const TARGET_RATIO: f64 = 0.90;

/// One protocol's pairs; index 0 is [`TARGETS`]`[0]` (unsharded, A), 1 is sharded (B).
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// `simple` or `extended`.
    pub mode: &'static str,
    /// TPS of each run in pair order (0 for a failed run, which leaves its pair out).
    pub tps: [Vec<f64>; 2],
    /// pgbench's mean latency of each successful run, ms.
    pub latency: [Vec<f64>; 2],
    /// CPU used during each successful run, per transaction.
    pub cpu: [Vec<CpuUse>; 2],
    /// Failed transactions pgbench counted, over every run.
    pub failed: u64,
    /// Runs pgbench reported as failed, with its first error.
    pub errors: Vec<String>,
}

impl Cell {
    /// No runs yet.
    pub fn new(mode: &'static str) -> Cell {
        Cell {
            mode,
            tps: [vec![], vec![]],
            latency: [vec![], vec![]],
            cpu: [vec![], vec![]],
            failed: 0,
            errors: vec![],
        }
    }

    /// Records a run of `side` (0 = A, 1 = B).
    pub fn record(&mut self, side: usize, outcome: Outcome, cpu: Option<CpuUse>) {
        match outcome {
            Ok(s) => {
                self.tps[side].push(s.tps);
                self.latency[side].push(s.latency_ms);
                self.failed += s.failed;
                self.cpu[side].extend(cpu);
            }
            Err(e) => {
                self.tps[side].push(0.0);
                self.errors.push(format!("{}: {e}", TARGETS[side]));
            }
        }
    }

    /// The paired estimate of B/A: per-pair log ratios, pairs with a failed run left out.
    pub fn estimate(&self) -> Option<Estimate> {
        let logs: Vec<f64> = self.tps[0]
            .iter()
            .zip(&self.tps[1])
            .filter(|(a, b)| **a > 0.0 && **b > 0.0)
            .map(|(a, b)| (b / a).ln())
            .collect();
        Estimate::of(&logs)
    }
}

/// Everything a run measured, and what it ran with.
#[derive(Debug, Clone)]
pub struct Results {
    /// The options.
    pub opts: PgShardOptions,
    /// The machine.
    pub env: Environment,
    /// Tool versions (PostgreSQL and pgbench are shown).
    pub versions: Versions,
    /// `/proc/loadavg` (1, 5, 15 min) at the start and at the end.
    pub loadavg: (String, String),
    /// `(target, config)` of both refracts as run.
    pub configs: Vec<(String, String)>,
    /// `/* refract: explain */` of a few keyed reads through the sharded refract.
    pub routes: String,
    /// Per protocol.
    pub cells: Vec<Cell>,
}

/// Writes the section into the page; prints the table.
pub fn write(r: &Results) -> Result<()> {
    let out = &r.opts.out;
    report::write_marked(out, MARKER, SECTION, &render(r))?;
    println!("{}", table(&r.cells));
    eprintln!("wrote {} (section {MARKER}:{SECTION})", out.display());
    Ok(())
}

/// The section (without markers).
pub fn render(r: &Results) -> String {
    let mut out = String::from("## PostgreSQL: the cost of sharding's routing (keyed reads)\n\n");
    out.push_str("Written by `refract bench pg-shard` (lab/src/bench/pgshard/); do not edit by hand.\n\n");
    header(&mut out, r);
    out.push_str(&table(&r.cells));
    out.push('\n');
    for c in &r.cells {
        let _ = writeln!(out, "- **{}:** {}", c.mode, verdict(c.estimate()));
    }
    for c in r.cells.iter().filter(|c| !c.errors.is_empty()) {
        let _ = writeln!(out, "- ⚠ {} runs failed ({}): first `{}`", c.mode, c.errors.len(), c.errors[0]);
    }
    out.push('\n');
    out.push_str(&cpu_table(&r.cells));
    details(&mut out, &r.routes, &r.configs);
    out
}

fn header(out: &mut String, r: &Results) {
    let (e, o) = (&r.env, &r.opts);
    let settings = SERVER_SETTINGS.trim().replace('\n', "`, `");
    let loads: Vec<String> = o.modes.iter().map(|m| format!("`{}`", super::shown(o, m))).collect();
    let _ = write!(
        out,
        "Does routing by shard key cost much? `unsharded` is refract over one PostgreSQL server; \
         `sharded` is refract with two shards that **both point at that same server and database**, \
         `pgbench_accounts` sharded by `aid` (hash, integer). Each shard then holds every row, so the \
         shard a key names answers it correctly, and the two differ only in what sharding adds per \
         statement: finding the key in the statement (or in the Bind of the extended protocol), \
         hashing it, picking the shard and its pool. The data placement and the server's work are the \
         same, which isolates the routing cost; with the shards on separate servers the figures would \
         also measure the servers. Acceptance (issue 24): sharded within 10 % of unsharded.\n\n\
         - **Date:** {}\n\
         - **Machine:** {} cores ({}), Linux {}, shared by the server, both refracts and pgbench over \
         loopback, and by other work: load average (1/5/15 min) {} at the start, {} at the end.\n\
         - **Versions:** {}; {}; refract {}\n\
         - **Server:** the refract-testkit's (`fsync = off`) with `{settings}`; `pgbench -i -s {}` \
         ({} accounts, in memory).\n\
         - **Load:** {}, where `{}` is `-S`'s keyed read: `\\set aid random(1, 100000 * :scale)` then \
         `SELECT abalance FROM pgbench_accounts WHERE aid = :aid;` (with `-M extended` the key travels \
         as `$1` in the Bind).\n\
         - **Pairs:** {} per protocol, each one run through each refract back to back, the order \
         alternating from pair to pair{}; the estimate is the geometric mean of the per-pair ratios \
         sharded/unsharded with a 90 % confidence interval (Student's t). Both refracts run throughout, \
         in transaction pooling with `pool_size = {}` per server (the sharded one has that many per \
         shard, so up to twice as many server connections, of which at most {} are busy at once).\n\
         - **Rerun:** `{}`\n\n",
        e.date,
        e.cores,
        e.cpu,
        e.kernel,
        r.loadavg.0,
        r.loadavg.1,
        r.versions.postgres,
        r.versions.pgbench,
        e.refract,
        o.scale,
        o.scale as u64 * 100_000,
        loads.join(" and "),
        super::SCRIPT_FILE,
        o.pairs,
        if o.warmup { ", after a 2 s warm-up through each" } else { "" },
        o.clients,
        o.clients,
        o.command,
    );
}

fn mean(v: &[f64]) -> f64 {
    let ok: Vec<f64> = v.iter().copied().filter(|x| *x > 0.0).collect();
    if ok.is_empty() {
        0.0
    } else {
        ok.iter().sum::<f64>() / ok.len() as f64
    }
}

/// Per protocol: mean TPS and latency of each, B/A of the means, the paired estimate.
pub fn table(cells: &[Cell]) -> String {
    let mut s = String::from(
        "| protocol | pairs | unsharded (mean TPS) | sharded (mean TPS) | unsharded latency | sharded latency | \
         sharded/unsharded of means | paired sharded/unsharded (90 % CI) | failed transactions |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for c in cells {
        let (a, b) = (mean(&c.tps[0]), mean(&c.tps[1]));
        let est = c.estimate().map_or_else(|| "–".to_string(), |e| e.describe());
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} ms | {} ms | {} | **{est}** | {} |",
            c.mode,
            c.tps[0].len().min(c.tps[1].len()),
            format_rate(a),
            format_rate(b),
            sig3(mean(&c.latency[0])),
            sig3(mean(&c.latency[1])),
            ratio(b, a),
            c.failed
        );
    }
    s
}

/// What the interval says about the 10 % target.
pub fn verdict(e: Option<Estimate>) -> String {
    let Some(e) = e else { return "no estimate (fewer than two complete pairs)".into() };
    let lo = sig3(TARGET_RATIO);
    if e.lo >= TARGET_RATIO {
        format!("within 10 %: the whole interval ({}–{}×) is above {lo}×", sig3(e.lo), sig3(e.hi))
    } else if e.hi < TARGET_RATIO {
        format!("not within 10 %: the whole interval ({}–{}×) is below {lo}×", sig3(e.lo), sig3(e.hi))
    } else {
        format!(
            "undecided: the interval ({}–{}×) spans {lo}×, the target sits inside this machine's run-to-run noise",
            sig3(e.lo),
            sig3(e.hi)
        )
    }
}

/// CPU per transaction of each refract and of the whole machine, per protocol.
fn cpu_table(cells: &[Cell]) -> String {
    let mut s = String::from(
        "CPU per transaction over each refract's runs: the refract process's user and system time \
         (`/proc/PID/stat`) and the whole machine's busy time (`/proc/stat`, all cores: the server, \
         pgbench, the kernel and anything else running), divided by the transactions.\n\n\
         | protocol | refract | refract user | refract system | refract total | machine busy | machine idle |\n\
         |---|---|---:|---:|---:|---:|---:|\n",
    );
    let us = |v: Option<f64>| v.map_or_else(|| "–".to_string(), |x| format!("{} µs", sig3(x)));
    for c in cells {
        for (side, name) in TARGETS.iter().enumerate() {
            let Some(p) = PerRequest::of(&c.cpu[side]) else { continue };
            let total = p.user_us.zip(p.system_us).map(|(u, s)| u + s);
            let _ = writeln!(
                s,
                "| {} | {name} | {} | {} | {} | {} | {:.1} % |",
                c.mode,
                us(p.user_us),
                us(p.system_us),
                us(total),
                us(Some(p.busy_us)),
                p.idle_share * 100.0
            );
        }
    }
    s
}

/// Where the keyed reads went, and where both configs come from (named, not embedded: the
/// page's header has the commit).
fn details(out: &mut String, routes: &str, configs: &[(String, String)]) {
    let _ =
        write!(out, "\nWhere keyed reads go through `sharded` (`/* refract: explain */`):\n\n```text\n{}```\n", routes);
    let names: Vec<String> = configs.iter().map(|(n, _)| format!("`{n}`")).collect();
    if !names.is_empty() {
        let _ = writeln!(
            out,
            "\nConfigurations ({}): generated for each run by `config` in `lab/src/bench/pgshard.rs` \
             (on ports chosen at start); `sharded` has two shards, `s0` and `s1`, over the one server, \
             and `pgbench_accounts` sharded by `aid` (hash, integer).",
            names.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::pgbench::client::Summary;

    fn summary(tps: f64) -> Outcome {
        Ok(Summary { tps, latency_ms: 1.0, transactions: 1000, ..Summary::default() })
    }

    #[test]
    fn a_failed_run_leaves_its_pair_out_and_is_reported() {
        let mut c = Cell::new("simple");
        for (a, b) in [(100.0, 94.0), (200.0, 190.0)] {
            c.record(0, summary(a), None);
            c.record(1, summary(b), None);
        }
        c.record(0, summary(150.0), None);
        c.record(1, Err("boom".into()), None);
        let e = c.estimate().expect("two complete pairs");
        assert_eq!(e.n, 2);
        assert!((e.ratio - (0.94f64 * 0.95).sqrt()).abs() < 1e-9, "{e:?}");
        assert_eq!(c.errors, vec!["sharded: boom".to_string()]);
        let t = table(&[c]);
        assert!(t.contains("| simple | 3 | 150 | 142 |"), "means over the successful runs: {t}");
    }

    #[test]
    fn the_verdict_reads_the_interval_against_ninety_percent() {
        let e = |lo, hi| Some(Estimate { ratio: (lo + hi) / 2.0, lo, hi, n: 10 });
        assert!(verdict(e(0.93, 0.99)).starts_with("within 10 %"));
        assert!(verdict(e(0.80, 0.88)).starts_with("not within 10 %"));
        assert!(verdict(e(0.86, 0.97)).starts_with("undecided"));
        assert!(verdict(None).starts_with("no estimate"));
    }

    #[test]
    fn configs_are_named_not_embedded() {
        let mut out = String::new();
        details(&mut out, "aid = 1: read on shard s0\n", &[("sharded".into(), "[postgres]".into())]);
        assert!(out.contains("`config` in `lab/src/bench/pgshard.rs`"), "{out}");
        assert!(!out.contains("```toml"), "configs are named, not embedded: {out}");
    }
}
