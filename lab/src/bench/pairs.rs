//! Paired runs: two targets measured in alternating short runs at the same sizes, for claims
//! that two targets perform *alike* (hybrid vs relay at small sizes) or differ by a given
//! factor. On this 2-core machine a single run of a small-payload cell moves by ±15 % from
//! one run to the next for any target, so the medians of a few interleaved runs (the sweep)
//! cannot decide a 5 % question. Here each pair runs A and B back to back (the order
//! alternates from pair to pair), so slow drift of the machine hits both alike, and the
//! per-pair log ratios give an estimate with a confidence interval, per size and pooled.
//!
//! [`cpu`]: the CPU each run cost.

pub mod cpu;

use crate::bench::sweep::run::{self as sweep, Progress};
use crate::bench::sweep::switch::Switch;
use crate::cluster;
use crate::cluster::layout::{label, variant, Layout};
use crate::lab::LabGuard;
use crate::report::environment::Environment;
use crate::support::interrupt;
use crate::support::units::{format_rate, parse_duration, sig3, wrk_duration, ByteSize, Rate};
use anyhow::{Context, Result};
use clap::Args;
use cpu::{CpuUse, PerRequest};
use std::fmt::Write;
use std::path::PathBuf;
use std::time::Duration;

/// Options of `bench pairs`.
#[derive(Debug, Args)]
pub struct PairsArgs {
    /// The reference target (denominator): direct, refract, handover, hybrid, haproxy, or
    /// refract-busypoll (the relay's busy-polling variant, labelled so in the report).
    #[arg(long, default_value = "refract")]
    a: String,
    /// The compared target (numerator).
    #[arg(long, default_value = "hybrid")]
    b: String,
    /// Payload sizes (K = 1024).
    #[arg(long, default_value = "1,8,64,512,4K", value_delimiter = ',', value_parser = ByteSize::parse)]
    sizes: Vec<ByteSize>,
    /// Pairs per size.
    #[arg(long, default_value_t = 20)]
    pairs: usize,
    /// wrk duration of each run.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    duration: Duration,
    /// Link rate (`1gbit`, …) or `none`.
    #[arg(long, default_value = "1gbit", value_parser = Rate::parse)]
    rate: Rate,
    /// The markdown page; section `pairs:A-B-RATE` is replaced.
    #[arg(long, default_value = "docs/benchmarks.md")]
    out: PathBuf,
}

impl PairsArgs {
    /// `bench pairs`: bring the lab up if needed, run the pairs, write the section.
    pub fn run(self) -> Result<()> {
        interrupt::install();
        let plan = PairPlan {
            a: self.a.clone(),
            b: self.b.clone(),
            sizes: self.sizes.clone(),
            pairs: self.pairs,
            duration: self.duration,
        };
        let guard = LabGuard::ensure(self.rate)?;
        let Pairs { cells, .. } = run(&guard.layout, &plan)?;
        drop(guard);
        let body = self.section(&plan, &cells);
        let name = format!("{}-{}-{}", self.a, self.b, self.rate.label());
        let existing = std::fs::read_to_string(&self.out).unwrap_or_default();
        let page = crate::report::replace_marked(&existing, "pairs", &name, &body, crate::report::PAGE_HEADER);
        std::fs::write(&self.out, page).with_context(|| format!("writing {}", self.out.display()))?;
        println!("{}", table(&plan, &cells));
        eprintln!("wrote {} (section pairs:{name})", self.out.display());
        Ok(())
    }

    fn section(&self, plan: &PairPlan, cells: &[PairedCell]) -> String {
        let env = Environment::detect();
        let sizes: Vec<String> = self.sizes.iter().map(ByteSize::to_string).collect();
        format!(
            "## Paired runs: {title}, links {rate}\n\n\
             Written by `refract bench pairs` (lab/src/bench/pairs.rs); do not edit by hand.\n\n\
             - **Date:** {date}\n- **Machine:** {cores} cores ({cpu}), Linux {kernel}; TCP congestion control {cc}\n\
             - **Load:** per pair one `{a}` and one `{b}` run, back to back, the order alternating from pair \
             to pair; each run is 2 clients (rf-c1, rf-c2) × `wrk -t1 -c1 -d{d}` at once, requests/s summed. \
             The paired estimate is the geometric mean of the per-pair ratios with a 90 % confidence interval \
             (Student's t).\n- **Tools:** wrk {wrk}; {haproxy}; refract {refract}\n\
             - **Rerun:** `sudo refract bench pairs --a {a} --b {b} --sizes {sizes} --pairs {n} --duration {d} \
             --rate {rate} --out {out}`\n\n{table}{cpu_use}",
            a = self.a,
            b = self.b,
            title = title(&self.a, &self.b),
            rate = self.rate.label(),
            date = env.date,
            cores = env.cores,
            cpu = env.cpu,
            kernel = env.kernel,
            cc = crate::fabric::congestion::describe(),
            d = wrk_duration(self.duration),
            wrk = env.wrk,
            haproxy = env.haproxy,
            refract = env.refract,
            sizes = sizes.join(","),
            n = self.pairs,
            out = self.out.display(),
            table = table(plan, cells),
            cpu_use = cpu_section(plan, cells, env.cores),
        )
    }
}

/// `` `b` vs `a` ``, each target with its label (the busy-polling variant is named so).
fn title(a: &str, b: &str) -> String {
    let named = |t: &str| match variant(t) {
        Some(v) => format!("`{t}` ({v})"),
        None => format!("`{t}`"),
    };
    format!("{} vs {}", named(b), named(a))
}

/// The CPU part of a pairs section: what the columns mean, then [`cpu_table`].
fn cpu_section(plan: &PairPlan, cells: &[PairedCell], cores: usize) -> String {
    let Some(t) = cpu_table(plan, cells, cores) else { return String::new() };
    format!(
        "\n### CPU per request\n\n\
         Over each target's runs: the machine's CPU time from `/proc/stat` (all {cores} cores; busy = \
         every process and the kernel, softirq networking included), the dispatcher's own from \
         `/proc/PID/stat` (HAProxy or the refract process serving the target; none for `direct`), in \
         clock ticks of {tick} ms, divided by the requests completed. The **ceiling** is the rate the same \
         runs would reach if the dispatcher spent no user-space time and no CPU were idle, all other \
         work per request (the clients, the backends, the kernel's networking, the dispatcher's system \
         calls) staying as measured: {cores} cores ÷ (busy − dispatcher user) per request; an \
         estimate of the most that any dispatcher with the same kernel work per request could reach \
         on this machine, where the CPUs are the bottleneck at small sizes.\n\n{t}",
        tick = sig3(1000.0 / cpu::ticks_per_sec()),
    )
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct PairPlan {
    /// The reference target (the ratio's denominator).
    pub a: String,
    /// The compared target (the numerator).
    pub b: String,
    /// Payload sizes.
    pub sizes: Vec<ByteSize>,
    /// Pairs per size.
    pub pairs: usize,
    /// wrk duration of each run.
    pub duration: Duration,
}

/// One size: requests/s (summed over the clients) of each run, in pair order.
#[derive(Debug, Clone, PartialEq)]
pub struct PairedCell {
    /// Payload size.
    pub size: ByteSize,
    /// Target A's runs.
    pub a: Vec<f64>,
    /// Target B's runs, `b[i]` paired with `a[i]`.
    pub b: Vec<f64>,
    /// Non-2xx responses and socket errors over all runs.
    pub errors: u64,
    /// CPU used during each of A's runs that `/proc` could account for.
    pub cpu_a: Vec<CpuUse>,
    /// The same for B.
    pub cpu_b: Vec<CpuUse>,
}

impl PairedCell {
    /// No runs yet (size 0).
    pub fn empty() -> PairedCell {
        PairedCell { size: ByteSize(0), a: Vec::new(), b: Vec::new(), errors: 0, cpu_a: Vec::new(), cpu_b: Vec::new() }
    }

    /// `ln(b / a)` of each pair with both sides non-zero.
    pub fn log_ratios(&self) -> Vec<f64> {
        self.a.iter().zip(&self.b).filter(|(a, b)| **a > 0.0 && **b > 0.0).map(|(a, b)| (b / a).ln()).collect()
    }
}

/// The ratio B/A with its confidence interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Geometric mean of the per-pair ratios.
    pub ratio: f64,
    /// Lower end of the 90 % confidence interval.
    pub lo: f64,
    /// Upper end.
    pub hi: f64,
    /// Pairs behind it.
    pub n: usize,
}

impl Estimate {
    /// From per-pair log ratios (Student's t on their mean); `None` below two pairs. A 90 %
    /// interval inside ±x is the two one-sided tests' (TOST) evidence, at 5 % each, that
    /// the ratio is within ±x.
    pub fn of(log_ratios: &[f64]) -> Option<Estimate> {
        let n = log_ratios.len();
        if n < 2 {
            return None;
        }
        let mean = log_ratios.iter().sum::<f64>() / n as f64;
        let var = log_ratios.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        let half = t90(n - 1) * (var / n as f64).sqrt();
        Some(Estimate { ratio: mean.exp(), lo: (mean - half).exp(), hi: (mean + half).exp(), n })
    }

    /// Whether the whole interval lies within `1 ± tolerance`.
    pub fn within(&self, tolerance: f64) -> bool {
        self.lo >= 1.0 - tolerance && self.hi <= 1.0 + tolerance
    }

    /// `0.991× (90 % CI 0.962–1.02×, 20 pairs)`.
    pub fn describe(&self) -> String {
        format!("{}× (90 % CI {}–{}×, {} pairs)", sig3(self.ratio), sig3(self.lo), sig3(self.hi), self.n)
    }
}

/// Student's t quantile for a two-sided 90 % interval (0.95 one-sided) with `df` degrees of
/// freedom; between table rows the smaller df is used, which errs on the wide side.
fn t90(df: usize) -> f64 {
    const TABLE: [(usize, f64); 17] = [
        (1, 6.314),
        (2, 2.920),
        (3, 2.353),
        (4, 2.132),
        (5, 2.015),
        (6, 1.943),
        (7, 1.895),
        (8, 1.860),
        (9, 1.833),
        (10, 1.812),
        (12, 1.782),
        (15, 1.753),
        (20, 1.725),
        (30, 1.697),
        (60, 1.671),
        (120, 1.658),
        (usize::MAX, 1.645),
    ];
    TABLE.iter().rev().find(|(d, _)| *d <= df.max(1)).map_or(6.314, |(_, t)| *t)
}

#[cfg(test)]
impl PairPlan {
    /// A plan for tests: `a` against `b` at `sizes`, `pairs` runs of 2 s each.
    pub(crate) fn for_test(a: &str, b: &str, sizes: &[u64], pairs: usize) -> PairPlan {
        PairPlan {
            a: a.into(),
            b: b.into(),
            sizes: sizes.iter().map(|&n| ByteSize(n)).collect(),
            pairs,
            duration: Duration::from_secs(2),
        }
    }
}

/// A plan's runs.
#[derive(Debug, Clone)]
pub struct Pairs {
    /// What was run.
    pub plan: PairPlan,
    /// Per size.
    pub cells: Vec<PairedCell>,
    /// Hand-overs target B's dispatcher made meanwhile, if it hands over (for hybrid at small
    /// sizes none are expected: nothing is that large).
    pub handovers: Option<f64>,
}

/// The pooled estimate over every size of `cells`.
pub fn pooled(cells: &[PairedCell]) -> Option<Estimate> {
    let all: Vec<f64> = cells.iter().flat_map(PairedCell::log_ratios).collect();
    Estimate::of(&all)
}

/// Runs the plan in a lab that is up; progress on stderr. A steering target that is not
/// running is started for its runs (hybrid and hand-over take turns), and the cluster is put
/// back as it was at the end.
pub fn run(layout: &Layout, plan: &PairPlan) -> Result<Pairs> {
    sweep::check_targets(layout, &[plan.a.clone(), plan.b.clone()])?;
    let mut switch = Switch::new(layout);
    let mut progress = Progress::new("pairs", plan.sizes.len() * plan.pairs * 2, plan.duration);
    let mut cells = Vec::new();
    for &size in &plan.sizes {
        let mut cell = PairedCell { size, ..PairedCell::empty() };
        for i in 0..plan.pairs {
            // Sides by position, so that `--a X --b X` (an A/A check of the method) works too.
            let order =
                if i % 2 == 0 { [(false, &plan.a), (true, &plan.b)] } else { [(true, &plan.b), (false, &plan.a)] };
            for (is_b, target) in order {
                interrupt::check()?;
                switch.activate(layout, target)?;
                let pid = layout.daemon(target).and_then(|name| cluster::pid_of(&name));
                let before = cpu::Before::take(pid);
                let m = sweep::measure(layout, target, size, plan.duration)?;
                let used = before.finish(m.reports.iter().map(|r| r.requests as f64).sum());
                let rps = m.effective_rps();
                progress.done(&format!("pair {:>2} {target:<8} {size:>5}", i + 1), &format_rate(rps), m.errors());
                cell.errors += m.errors();
                let (runs, cpu) = if is_b { (&mut cell.b, &mut cell.cpu_b) } else { (&mut cell.a, &mut cell.cpu_a) };
                runs.push(rps);
                cpu.extend(used);
            }
        }
        cells.push(cell);
    }
    let handovers = switch.finish(layout)?.get(&plan.b).map(|h| h.handovers());
    Ok(Pairs { plan: plan.clone(), cells, handovers })
}

/// The mean of `v`, 0 if empty.
fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The markdown table: per size the mean requests/s of each target, B/A of the means, and the
/// paired estimate; then the pooled estimate.
pub fn table(plan: &PairPlan, cells: &[PairedCell]) -> String {
    let (a, b) = (&plan.a, &plan.b);
    let (la, lb) = (label(a), label(b));
    let mut s = format!(
        "| payload | pairs | {la} (mean req/s) | {lb} (mean req/s) | {b}/{a} of means | paired {b}/{a} (90 % CI) | errors |\n\
         |---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for c in cells {
        let (ma, mb) = (mean(&c.a), mean(&c.b));
        let est = Estimate::of(&c.log_ratios()).map_or_else(|| "–".to_string(), |e| e.describe());
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {est} | {} |",
            c.size.human(),
            c.a.len().min(c.b.len()),
            format_rate(ma),
            format_rate(mb),
            crate::report::ratio(mb, ma),
            c.errors
        );
    }
    if let Some(p) = pooled(cells) {
        let _ = writeln!(s, "| **all sizes** | {} | | | | **{}** | |", p.n, p.describe());
    }
    s
}

/// The CPU table: per size and target, the machine's idle share, busy CPU per request, the
/// dispatcher's user and system time per request and the ceiling they imply
/// ([`PerRequest::ceiling`]), also as a multiple of A's mean rate. `None` if no run could be
/// accounted for (no `/proc`).
pub fn cpu_table(plan: &PairPlan, cells: &[PairedCell], cores: usize) -> Option<String> {
    if cells.iter().all(|c| c.cpu_a.is_empty() && c.cpu_b.is_empty()) {
        return None;
    }
    let mut s = format!(
        "| payload | target | req/s (mean) | CPU idle | busy CPU per request | dispatcher user per request | \
         dispatcher system per request | ceiling (req/s) | ceiling ÷ {a}'s req/s |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|\n",
        a = plan.a
    );
    let us = |v: Option<f64>| v.map_or_else(|| "–".to_string(), |x| format!("{} µs", sig3(x)));
    for c in cells {
        let a_rate = mean(&c.a);
        for (target, rates, runs) in [(&plan.a, &c.a, &c.cpu_a), (&plan.b, &c.b, &c.cpu_b)] {
            let Some(pr) = PerRequest::of(runs) else { continue };
            let ceiling = pr.ceiling(cores);
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.1} % | {} | {} | {} | {} | {} |",
                c.size.human(),
                label(target),
                format_rate(mean(rates)),
                pr.idle_share * 100.0,
                us(Some(pr.busy_us)),
                us(pr.user_us),
                us(pr.system_us),
                ceiling.map_or_else(|| "–".to_string(), format_rate),
                ceiling.map_or_else(|| "–".to_string(), |x| crate::report::ratio(x, a_rate)),
            );
        }
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(size: u64, a: &[f64], b: &[f64]) -> PairedCell {
        PairedCell { size: ByteSize(size), a: a.to_vec(), b: b.to_vec(), ..PairedCell::empty() }
    }

    #[test]
    fn equal_pairs_give_a_tight_interval_around_one() {
        let c = cell(1, &[100.0, 200.0, 150.0], &[100.0, 200.0, 150.0]);
        let e = Estimate::of(&c.log_ratios()).unwrap();
        assert_eq!((e.ratio, e.lo, e.hi, e.n), (1.0, 1.0, 1.0, 3));
        assert!(e.within(0.05));
    }

    #[test]
    fn the_interval_follows_students_t() {
        // ln ratios 0.1 and -0.1 and 0: mean 0, sd 0.1, se 0.1/√3, t(2) = 2.920.
        let logs = [0.1f64, -0.1, 0.0];
        let e = Estimate::of(&logs).unwrap();
        let half = 2.920 * 0.1 / 3f64.sqrt();
        assert!((e.hi.ln() - half).abs() < 1e-9 && (e.lo.ln() + half).abs() < 1e-9, "{e:?}");
        assert!(!e.within(0.05), "a wide interval does not show equivalence");
        assert_eq!(Estimate::of(&[0.1]), None);
    }

    #[test]
    fn a_real_difference_is_not_called_equal() {
        // B is 10 % faster in every pair, with a little noise.
        let a = [100.0, 120.0, 90.0, 110.0, 105.0, 95.0];
        let b: Vec<f64> = a.iter().enumerate().map(|(i, x)| x * (1.10 + 0.01 * (i % 2) as f64)).collect();
        let e = Estimate::of(&cell(8, &a, &b).log_ratios()).unwrap();
        assert!(e.lo > 1.09 && e.hi < 1.12, "{e:?}");
        assert!(!e.within(0.05));
    }

    #[test]
    fn t_quantiles_err_on_the_wide_side_between_rows() {
        assert_eq!(t90(1), 6.314);
        assert_eq!(t90(11), 1.812, "df 11 uses df 10's quantile");
        assert_eq!(t90(99), 1.671);
        assert_eq!(t90(10_000), 1.658);
        assert_eq!(t90(0), 6.314);
    }

    #[test]
    fn the_cpu_table_gives_per_request_figures_and_the_ceiling_against_a() {
        let plan = PairPlan::for_test("haproxy", "refract", &[1], 2);
        let secs = Duration::from_secs;
        // HAProxy: 100k requests per run, 6 s busy + 4 s idle, 0.5 s user and 2.5 s system.
        let h =
            CpuUse { requests: 100_000.0, busy: secs(6), idle: secs(4), dispatcher: Some((secs(1) / 2, secs(5) / 2)) };
        // refract: 120k requests, 7.2 s busy, no idle, 0.6 s user, 3.6 s system.
        let r = CpuUse {
            requests: 120_000.0,
            busy: Duration::from_millis(7200),
            idle: Duration::ZERO,
            dispatcher: Some((Duration::from_millis(600), Duration::from_millis(3600))),
        };
        let mut c = cell(1, &[20_000.0, 20_000.0], &[24_000.0, 24_000.0]);
        c.cpu_a = vec![h, h];
        c.cpu_b = vec![r, r];
        let t = cpu_table(&plan, &[c], 2).unwrap();
        assert!(t.contains("ceiling ÷ haproxy's req/s"), "{t}");
        // HAProxy: busy 60 µs, user 5 µs → 2 cores / 55 µs = 36.4k, 1.82× its 20k.
        assert!(t.contains("| 1 B | haproxy | 20.0k | 40.0 % | 60.0 µs | 5.00 µs | 25.0 µs | 36.4k | 1.82× |"), "{t}");
        // refract: busy 60 µs, user 5 µs, system 30 µs, no idle.
        assert!(t.contains("| 1 B | refract | 24.0k | 0.0 % | 60.0 µs | 5.00 µs | 30.0 µs | 36.4k | 1.82× |"), "{t}");
        // Without CPU figures there is no table, and direct (no dispatcher) has no ceiling.
        assert_eq!(cpu_table(&plan, &[cell(1, &[1.0], &[1.0])], 2), None);
        let mut d = cell(1, &[1.0], &[1.0]);
        d.cpu_a = vec![CpuUse { dispatcher: None, ..h }];
        let t = cpu_table(&plan, &[d], 2).unwrap();
        assert!(t.contains("| 1 B | haproxy | 1.00 | 40.0 % | 60.0 µs | – | – | – | – |"), "{t}");
    }

    #[test]
    fn the_busy_polling_variant_is_labelled_in_every_table_and_the_title() {
        let plan = PairPlan::for_test("refract", "refract-busypoll", &[1], 2);
        let r = CpuUse {
            requests: 1000.0,
            busy: Duration::from_millis(60),
            idle: Duration::ZERO,
            dispatcher: Some((Duration::from_millis(5), Duration::from_millis(25))),
        };
        let mut c = cell(1, &[100.0, 100.0], &[110.0, 110.0]);
        c.cpu_a = vec![r, r];
        c.cpu_b = vec![r, r];
        let t = table(&plan, std::slice::from_ref(&c));
        assert!(
            t.starts_with(
                "| payload | pairs | refract (mean req/s) | refract-busypoll, busy-polling variant (mean req/s) |"
            ),
            "{t}"
        );
        let cpu = cpu_table(&plan, &[c], 2).expect("cpu table");
        assert!(cpu.contains("| 1 B | refract-busypoll, busy-polling variant | 110 | 0.0 % | 60.0 µs |"), "{cpu}");
        assert!(cpu.contains("| 1 B | refract | 100 |"), "{cpu}");
        assert_eq!(title("refract", "refract-busypoll"), "`refract-busypoll` (busy-polling variant) vs `refract`");
        assert_eq!(title("haproxy", "refract"), "`refract` vs `haproxy`");
    }

    #[test]
    fn pooled_over_sizes_and_the_table() {
        let cells = [cell(1, &[100.0, 100.0], &[99.0, 101.0]), cell(512, &[50.0, 60.0], &[50.0, 61.0])];
        let p = pooled(&cells).unwrap();
        assert_eq!(p.n, 4);
        let plan = PairPlan::for_test("refract", "hybrid", &[1, 512], 2);
        let t = table(&plan, &cells);
        assert!(
            t.starts_with("| payload | pairs | refract (mean req/s) | hybrid (mean req/s) | hybrid/refract"),
            "{t}"
        );
        assert!(t.contains("| 1 B | 2 | 100 | 100 | 1.00× |"), "{t}");
        assert!(t.contains("| **all sizes** | 4 |"), "{t}");
    }
}
