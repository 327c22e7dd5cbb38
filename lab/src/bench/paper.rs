//! `refract bench paper`: the paper's reproduction in one run — the payload sweep of every
//! target (direct, refract relay, hand-over, hybrid, HAProxy) with links at 1 Gbit/s and
//! unshaped, each written as its own section of docs/benchmarks.md (Table 1, Table 2, Fig. 4,
//! the dispatchers' hand-over figures), then a summary section with the hand-over's acceptance
//! figures computed from those runs. It is the sweep, run twice, plus paired runs of the
//! relay and hybrid at the small sizes (`crate::bench::pairs`) for the one criterion that asks
//! whether two targets perform alike.

use crate::bench::pairs::{self, Estimate, PairPlan, Pairs};
use crate::bench::sweep::run::{Plan, Results};
use crate::bench::sweep::{self, SweepOptions};
use crate::lab::LabGuard;
use crate::report::{self, ratio, PAGE_HEADER};
use crate::support::interrupt;
use crate::support::units::{format_latency_us, parse_duration, sig3, wrk_duration, ByteSize, Rate};
use anyhow::{Context, Result};
use clap::Args;
use std::fmt::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Options of `bench paper`.
#[derive(Debug, Args)]
pub struct PaperArgs {
    /// Payload sizes (K = 1024).
    #[arg(long, default_value = "1,8,64,512,4K,32K,256K,1M,2M,16M,128M", value_delimiter = ',', value_parser = ByteSize::parse)]
    sizes: Vec<ByteSize>,
    /// Targets, in report order.
    #[arg(long, default_value = "direct,refract,handover,hybrid,haproxy", value_delimiter = ',')]
    targets: Vec<String>,
    /// Link settings, one sweep each (`1gbit`, `none`, …).
    #[arg(long, default_value = "1gbit,none", value_delimiter = ',', value_parser = Rate::parse)]
    rates: Vec<Rate>,
    /// wrk duration per measurement.
    #[arg(long, default_value = "4s", value_parser = parse_duration)]
    duration: Duration,
    /// Interleaved runs per cell; the median run is reported.
    #[arg(long, default_value_t = 2)]
    repeat: usize,
    /// The markdown page; the CSV and PNGs go next to it.
    #[arg(long, default_value = "docs/benchmarks.md")]
    out: PathBuf,
    /// Paired runs (relay, hybrid back to back, order alternating) per size up to 4 KiB at
    /// 1 Gbit/s, for "hybrid within 5 % of the relay"; 0 skips them.
    #[arg(long, default_value_t = 20)]
    pairs: usize,
    /// wrk duration of each paired run.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pair_duration: Duration,
}

/// What `bench paper` runs.
#[derive(Debug, Clone)]
pub struct PaperPlan {
    /// One sweep per link setting.
    pub sweeps: Vec<SweepOptions>,
    /// Relay vs hybrid at the small sizes, at 1 Gbit/s (when that rate, both targets and
    /// some size up to 4 KiB are in the run, and pairs are asked for).
    pub pairs: Option<PairPlan>,
}

impl PaperArgs {
    /// The sweeps and the paired runs.
    pub fn into_plan(self) -> PaperPlan {
        let small: Vec<ByteSize> = self.sizes.iter().copied().filter(|s| s.0 <= SMALL).collect();
        let has = |t: &str| self.targets.iter().any(|x| x == t);
        let pairs =
            (self.pairs > 0 && !small.is_empty() && has("refract") && has("hybrid") && self.rates.contains(&GBIT))
                .then(|| PairPlan {
                    a: "refract".into(),
                    b: "hybrid".into(),
                    sizes: small,
                    pairs: self.pairs,
                    duration: self.pair_duration,
                });
        PaperPlan { pairs, sweeps: self.into_sweeps() }
    }

    /// The sweep of each rate: section `paper-RATE`.
    fn into_sweeps(self) -> Vec<SweepOptions> {
        let command = self.command();
        self.rates
            .iter()
            .map(|&rate| SweepOptions {
                section: format!("paper-{}", rate.label()),
                plan: Plan {
                    sizes: self.sizes.clone(),
                    targets: self.targets.clone(),
                    duration: self.duration,
                    latency: true,
                    repeat: self.repeat,
                },
                rate,
                out: self.out.clone(),
                command: command.clone(),
            })
            .collect()
    }

    fn command(&self) -> String {
        let sizes: Vec<String> = self.sizes.iter().map(ByteSize::to_string).collect();
        let rates: Vec<String> = self.rates.iter().map(Rate::label).collect();
        format!(
            "sudo refract bench paper --rates {} --duration {} --repeat {} --sizes {} --targets {} --pairs {} \
             --pair-duration {} --out {}",
            rates.join(","),
            wrk_duration(self.duration),
            self.repeat,
            sizes.join(","),
            self.targets.join(","),
            self.pairs,
            wrk_duration(self.pair_duration),
            self.out.display()
        )
    }
}

/// "Small" for the relay-vs-hybrid criterion: up to 4 KiB.
const SMALL: u64 = 4096;
/// The paper's link rate, where the shaped acceptance criteria are measured.
const GBIT: Rate = Rate::BitsPerSec(1_000_000_000);
/// "Within 5 %".
const TOLERANCE: f64 = 0.05;

/// Run every sweep in the lab (brought up once, reshaped per sweep), write each section as it
/// completes, then the summary.
pub fn run(plan: &PaperPlan) -> Result<()> {
    interrupt::install();
    let sweeps = &plan.sweeps;
    let first = sweeps.first().context("no link setting given")?;
    let started = Instant::now();
    let lab = LabGuard::ensure(first.rate)?;
    let mut done = Vec::new();
    let mut pairs = None;
    for (i, opts) in sweeps.iter().enumerate() {
        eprintln!("== paper {}/{}: links {} (section {})", i + 1, sweeps.len(), opts.rate, opts.section);
        // A second guard only reshapes the running lab, and puts the first rate back on drop.
        let reshaped = if i > 0 { Some(LabGuard::ensure(opts.rate)?) } else { None };
        let results = sweep::measure(&lab.layout, opts)?;
        if let Some(p) = plan.pairs.as_ref().filter(|_| opts.rate == GBIT) {
            eprintln!("== paper: paired runs, {} vs {} up to 4 KiB at {}", p.a, p.b, opts.rate);
            pairs = Some(pairs::run(&lab.layout, p)?);
        }
        drop(reshaped);
        sweep::write_outputs(opts, &lab.layout, &results)?;
        done.push((opts.rate, results));
    }
    drop(lab);
    let took = started.elapsed();
    let body = summary(first, &done, pairs.as_ref(), took);
    let existing = std::fs::read_to_string(&first.out).unwrap_or_default();
    let page = report::replace_marked(&existing, "paper", "summary", &body, PAGE_HEADER);
    std::fs::write(&first.out, page).with_context(|| format!("writing {}", first.out.display()))?;
    println!("{}", checks_table(&acceptance(&done, pairs.as_ref())));
    eprintln!("paper: done in {:.1} min; wrote {} (sections paper-*)", took.as_secs_f64() / 60.0, first.out.display());
    Ok(())
}

/// One acceptance figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// What must hold.
    pub criterion: String,
    /// What was measured.
    pub measured: String,
    /// Whether it held; `None` when not measured.
    pub holds: Option<bool>,
}

/// The hand-over's acceptance figures from the sweeps (`(rate, results)`) and the paired runs.
pub fn acceptance(sweeps: &[(Rate, Results)], pairs: Option<&Pairs>) -> Vec<Check> {
    let shaped = sweeps.iter().find(|(r, _)| matches!(r, Rate::BitsPerSec(b) if *b == 1_000_000_000));
    let unshaped = sweeps.iter().find(|(r, _)| *r == Rate::Unlimited);
    let mut v = Vec::new();
    for size in [ByteSize(16 << 20), ByteSize(128 << 20)] {
        for (peer, min) in [("haproxy", 1.9), ("refract", 1.8)] {
            let label = format!("1 Gbit/s, {}: hybrid ≥ {min}× {peer}", size.human());
            v.push(ratio_check(label, shaped.map(|s| &s.1), size, "hybrid", peer, |x| x >= min));
        }
    }
    match pairs {
        Some(p) => v.push(small_paired(p)),
        None => v.push(small_results(shaped.map(|s| &s.1))),
    }
    let label = "unshaped, 16 MiB: hybrid ≥ 0.8× direct".to_string();
    v.push(ratio_check(label, unshaped.map(|s| &s.1), ByteSize(16 << 20), "hybrid", "direct", |x| x >= 0.8));
    for (rate, results) in sweeps {
        for (target, h) in &results.handover {
            // The hand-over latency is as FREEZE → STEER, in the dispatcher.
            let p50 = h.frozen.quantile(0.5);
            v.push(Check {
                criterion: format!("{}, {target}: hand-over latency (freeze → steer) p50 ≤ 100 µs", rate.label()),
                measured: match p50 {
                    Some(s) => format!("{} over {:.0} hand-overs", format_latency_us(s * 1e6), h.handovers()),
                    None => "no hand-overs".into(),
                },
                holds: p50.map(|s| s <= 100e-6),
            });
        }
    }
    v
}

/// `a / b` at one size, checked by `ok`.
fn ratio_check(
    criterion: String,
    results: Option<&Results>,
    size: ByteSize,
    a: &str,
    b: &str,
    ok: impl Fn(f64) -> bool,
) -> Check {
    let pair = results.and_then(|r| r.cell(size, a).zip(r.cell(size, b)));
    let value = pair.map(|(x, y)| (x.throughput(), y.throughput())).filter(|(_, y)| *y > 0.0);
    Check {
        criterion,
        measured: value.map(|(x, y)| ratio(x, y)).unwrap_or_else(|| "not measured".into()),
        holds: value.map(|(x, y)| ok(x / y)),
    }
}

/// Hybrid within 5 % of the relay up to 4 KiB (it hands nothing that small over), from the
/// paired runs: holds when the pooled 90 % interval lies within ±5 % (equivalence by two
/// one-sided tests); the per-size estimates are listed beside it.
fn small_paired(p: &Pairs) -> Check {
    let pooled = pairs::pooled(&p.cells);
    let per_size: Vec<String> = p
        .cells
        .iter()
        .filter_map(|c| Estimate::of(&c.log_ratios()).map(|e| format!("{} {}×", c.size.human(), sig3(e.ratio))))
        .collect();
    Check {
        criterion: "1 Gbit/s, ≤ 4 KiB: hybrid within 5 % of refract relay (paired runs)".into(),
        measured: match pooled {
            Some(e) => format!("{}; per size {}", e.describe(), per_size.join(", ")),
            None => "not measured".into(),
        },
        holds: pooled.map(|e| e.within(TOLERANCE)),
    }
}

/// Hybrid within 5 % of the relay at every size up to 4 KiB, from the sweep's medians (when no
/// paired runs were made).
fn small_results(results: Option<&Results>) -> Check {
    let ratios: Vec<f64> = results
        .map(|r| {
            let small = r.throughput.iter().filter(|m| m.target == "hybrid" && m.size.0 <= SMALL);
            small
                .filter_map(|h| r.cell(h.size, "refract").map(|x| (h.throughput(), x.throughput())))
                .filter(|(_, y)| *y > 0.0)
                .map(|(x, y)| x / y)
                .collect()
        })
        .unwrap_or_default();
    let (lo, hi) = ratios.iter().fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
    Check {
        criterion: "1 Gbit/s, ≤ 4 KiB: hybrid within 5 % of refract relay".into(),
        measured: if ratios.is_empty() {
            "not measured".into()
        } else {
            format!("{}× – {}× over {} sizes", sig3(lo), sig3(hi), ratios.len())
        },
        holds: (!ratios.is_empty()).then_some(lo >= 1.0 - TOLERANCE && hi <= 1.0 + TOLERANCE),
    }
}

/// The acceptance figures as a markdown table.
pub fn checks_table(checks: &[Check]) -> String {
    let mut s = String::from("| criterion | measured | holds |\n|---|---|---|\n");
    for c in checks {
        let holds = match c.holds {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "–",
        };
        let _ = writeln!(s, "| {} | {} | {holds} |", c.criterion, c.measured);
    }
    s
}

/// The summary section.
fn summary(first: &SweepOptions, done: &[(Rate, Results)], pairs: Option<&Pairs>, took: Duration) -> String {
    let sections: Vec<String> = done.iter().map(|(r, _)| format!("`paper-{}`", r.label())).collect();
    let mut s = String::new();
    let _ = write!(
        s,
        "## Paper reproduction — summary (`refract bench paper`)\n\n\
         - **Sections:** {} (each: Table 1, Table 2, Fig. 4, hand-over figures, configs)\n\
         - **Took:** {:.1} min\n- **Rerun:** `{}`\n\n\
         ### Acceptance figures, computed from those sections\n\n",
        sections.join(", "),
        took.as_secs_f64() / 60.0,
        first.command
    );
    s.push_str(&checks_table(&acceptance(done, pairs)));
    if let Some(p) = pairs {
        s.push_str(&pairs_section(p));
    }
    s
}

/// The paired runs' table and how to read it.
fn pairs_section(p: &Pairs) -> String {
    let mut s = format!(
        "\n### Paired runs: {b} vs {a} up to 4 KiB, 1 Gbit/s\n\n\
         Each pair is one `{a}` and one `{b}` run of {d} (2 clients × 1 connection, as in Table 1), \
         back to back, the order alternating from pair to pair, so that the machine's slow drift \
         hits both alike; the estimate is the geometric mean of the per-pair ratios with a 90 % \
         confidence interval (Student's t). Single runs at these sizes move by ±15 % on this \
         2-core machine, for any target, which is why the medians of Table 1 cannot decide a 5 % \
         question. The criterion holds when the pooled interval lies within ±5 % (two one-sided \
         tests at 5 %).",
        a = p.plan.a,
        b = p.plan.b,
        d = wrk_duration(p.plan.duration),
    );
    if let Some(n) = p.handovers {
        let _ = write!(s, " The `{}` dispatcher handed over {n:.0} connections during these runs.", p.plan.b);
    }
    s.push_str("\n\n");
    s.push_str(&pairs::table(&p.plan, &p.cells));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::pairs::PairedCell;
    use crate::bench::sweep::handover_stats::HandoverStats;
    use crate::bench::sweep::run::Measurement;

    fn cell(target: &str, size: ByteSize, rps: f64) -> Measurement {
        Measurement::for_test(target, size, rps)
    }

    #[test]
    fn acceptance_from_results() {
        let mut shaped = Results::default();
        for size in [ByteSize(1), ByteSize(4096), ByteSize(16 << 20), ByteSize(128 << 20)] {
            for (t, f) in [("refract", 1.0), ("haproxy", 0.9), ("hybrid", if size.0 > 4096 { 2.0 } else { 0.97 })] {
                shaped.throughput.push(cell(t, size, 100.0 * f));
            }
        }
        let mut h = HandoverStats::default();
        h.results.insert("ok".into(), 50.0);
        h.frozen.buckets = vec![(40e-6, 10.0), (80e-6, 50.0), (f64::INFINITY, 50.0)];
        shaped.handover.insert("handover".into(), h);
        let checks = acceptance(&[(Rate::BitsPerSec(1_000_000_000), shaped)], None);
        let by = |prefix: &str| checks.iter().find(|c| c.criterion.starts_with(prefix)).expect(prefix).clone();
        let c = by("1 Gbit/s, 16 MiB: hybrid ≥ 1.9× haproxy");
        assert_eq!((c.measured.as_str(), c.holds), ("2.22×", Some(true)));
        assert_eq!(by("1 Gbit/s, 128 MiB: hybrid ≥ 1.8× refract").holds, Some(true));
        let small = by("1 Gbit/s, ≤ 4 KiB");
        assert_eq!((small.measured.as_str(), small.holds), ("0.970× – 0.970× over 2 sizes", Some(true)));
        assert_eq!(by("unshaped").holds, None);
        let lat = by("1gbit, handover: hand-over latency");
        assert_eq!(lat.holds, Some(true), "{lat:?}");
        assert!(checks_table(&checks).contains("| unshaped, 16 MiB: hybrid ≥ 0.8× direct | not measured | – |"));
    }

    #[test]
    fn one_sweep_per_rate() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            a: PaperArgs,
        }
        let plan = Cli::parse_from(["x", "--sizes", "1,4K,16M", "--duration", "1s"]).a.into_plan();
        let names: Vec<&str> = plan.sweeps.iter().map(|s| s.section.as_str()).collect();
        assert_eq!(names, ["paper-1gbit", "paper-none"]);
        assert_eq!(plan.sweeps[0].plan.targets, ["direct", "refract", "handover", "hybrid", "haproxy"]);
        assert!(plan.sweeps[1]
            .command
            .starts_with("sudo refract bench paper --rates 1gbit,none --duration 1s --repeat 2"));
        assert!(plan.sweeps[1].command.contains("--pairs 20 --pair-duration 2s"), "{}", plan.sweeps[1].command);
        let pairs = plan.pairs.expect("pairs by default");
        assert_eq!(
            (pairs.a.as_str(), pairs.b.as_str(), pairs.sizes.clone()),
            ("refract", "hybrid", vec![ByteSize(1), ByteSize(4096)])
        );
        let none = Cli::parse_from(["x", "--targets", "refract,haproxy"]).a.into_plan();
        assert!(none.pairs.is_none(), "no hybrid, no pairs");
        assert!(Cli::parse_from(["x", "--pairs", "0"]).a.into_plan().pairs.is_none());
        assert!(Cli::parse_from(["x", "--rates", "none"]).a.into_plan().pairs.is_none(), "pairs are at 1 Gbit/s");
    }

    #[test]
    fn the_small_size_criterion_comes_from_the_paired_runs_when_there_are_any() {
        let plan = PairPlan::for_test("refract", "hybrid", &[1, 64], 3);
        let close = |size| PairedCell {
            size: ByteSize(size),
            a: vec![100.0, 110.0, 90.0],
            b: vec![101.0, 109.0, 90.0],
            ..PairedCell::empty()
        };
        let p = Pairs { plan: plan.clone(), cells: vec![close(1), close(64)], handovers: Some(0.0) };
        // The sweep's medians alone would fail it (0.80×); the pairs decide.
        let mut shaped = Results::default();
        shaped.throughput.push(cell("refract", ByteSize(1), 100.0));
        shaped.throughput.push(cell("hybrid", ByteSize(1), 80.0));
        let sweeps = [(Rate::BitsPerSec(1_000_000_000), shaped)];
        let c = acceptance(&sweeps, Some(&p)).into_iter().find(|c| c.criterion.contains("≤ 4 KiB")).unwrap();
        assert_eq!(c.holds, Some(true), "{c:?}");
        assert!(c.measured.contains("6 pairs") && c.measured.contains("per size 1 B"), "{c:?}");
        let far = |size| PairedCell {
            size: ByteSize(size),
            a: vec![100.0, 110.0, 90.0],
            b: vec![80.0, 95.0, 70.0],
            ..PairedCell::empty()
        };
        let p = Pairs { plan, cells: vec![far(1), far(64)], handovers: None };
        let c = acceptance(&sweeps, Some(&p)).into_iter().find(|c| c.criterion.contains("≤ 4 KiB")).unwrap();
        assert_eq!(c.holds, Some(false), "{c:?}");
        assert!(pairs_section(&p).contains("| **all sizes** | 6 |"));
    }
}
