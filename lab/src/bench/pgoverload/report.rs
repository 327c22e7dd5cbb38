//! The `<!-- overload:pg -->` section of docs/overload.md, from the results alone, replaced
//! whole on rerun.

use super::openloop::{End, Shot};
use super::PgOverloadArgs;
use crate::bench::loadgen::summary::percentile;
use crate::bench::overload::report::PAGE_HEADER;
use crate::report::environment::{short_version, Environment};
use anyhow::{Context, Result};
use std::fmt::Write;
use std::path::Path;

/// One load point of one target.
#[derive(Debug, Clone)]
pub struct Point {
    /// Multiple of the capacity.
    pub x: f64,
    /// Statements per second offered.
    pub offered: f64,
    /// Served statements per second.
    pub goodput: f64,
    /// p50 and p99 of served statements, ms.
    pub p50: f64,
    /// p99 of served statements, ms.
    pub p99: f64,
    /// Refused statements (53300 / 57014).
    pub refused: usize,
    /// p99 time to refusal, ms (`None`: none refused).
    pub refused_p99: Option<f64>,
    /// Statements with no answer within the client timeout.
    pub timeouts: usize,
    /// Statements that failed otherwise (including no free client connection).
    pub errors: usize,
    /// Statements sent.
    pub sent: usize,
}

impl Point {
    /// Sums up the shots of a run of `secs`.
    pub fn of(x: f64, offered: f64, shots: &[Shot], secs: f64) -> Point {
        let micros = |f: &dyn Fn(&End) -> bool| -> Vec<u64> {
            let mut v: Vec<u64> = shots.iter().filter(|s| f(&s.end)).map(|s| (s.ms * 1000.0) as u64).collect();
            v.sort_unstable();
            v
        };
        let served = micros(&|e| *e == End::Served);
        let refused = micros(&|e| matches!(e, End::Refused(_)));
        let ms = |v: &[u64], q| percentile(v, q).map_or(0.0, |us| us as f64 / 1000.0);
        Point {
            x,
            offered,
            goodput: served.len() as f64 / secs,
            p50: ms(&served, 50.0),
            p99: ms(&served, 99.0),
            refused: refused.len(),
            refused_p99: percentile(&refused, 99.0).map(|us| us as f64 / 1000.0),
            timeouts: shots.iter().filter(|s| s.end == End::Timeout).count(),
            errors: shots.iter().filter(|s| matches!(s.end, End::Error(_))).count(),
            sent: shots.len(),
        }
    }

    /// One line for the terminal.
    pub fn describe(&self) -> String {
        format!(
            "goodput {:.0}/s, p50 {:.1} ms, p99 {:.1} ms, refused {} (p99 {}), timeouts {}, errors {} of {}",
            self.goodput,
            self.p50,
            self.p99,
            self.refused,
            self.refused_p99.map_or("–".into(), |v| format!("{v:.1} ms")),
            self.timeouts,
            self.errors,
            self.sent
        )
    }
}

/// Everything the section shows.
#[derive(Debug)]
pub struct Results {
    /// The options.
    pub args: PgOverloadArgs,
    /// The machine.
    pub env: Environment,
    /// pgbench's and PgBouncer's version lines.
    pub tools: String,
    /// Closed-loop statements per second through refract.
    pub capacity: f64,
    /// The pgbench command that measured it.
    pub capacity_load: String,
    /// Per target, its points.
    pub points: Vec<(String, Vec<Point>)>,
    /// Per target, its config (referenced by path in the page, printed on the terminal).
    pub configs: Vec<(String, String)>,
}

impl Results {
    /// Empty results for `args`.
    pub fn new(args: &PgOverloadArgs, pgbench: &Path) -> Results {
        let version = |bin: &Path| {
            let out = std::process::Command::new(bin).arg("--version").output();
            out.map(|o| short_version(String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or_default()))
                .unwrap_or_default()
        };
        let tools = format!("{}; {}", version(pgbench), version(Path::new(crate::bench::pgbench::targets::PGBOUNCER)));
        let env = Environment::detect();
        Results {
            args: args.clone(),
            env,
            tools,
            capacity: 0.0,
            capacity_load: String::new(),
            points: vec![],
            configs: vec![],
        }
    }
}

/// Writes the section into `out` and prints it.
pub fn write(out: &Path, res: &Results) -> Result<()> {
    let body = render(res);
    println!("{body}");
    let doc = std::fs::read_to_string(out).unwrap_or_default();
    let page = crate::report::replace_marked(&doc, "overload", "pg", &body, PAGE_HEADER);
    std::fs::write(out, page).with_context(|| format!("writing {}", out.display()))
}

/// (goodput at the top load ÷ peak, p99 at the top ÷ p99 at the lowest).
fn ratios(capacity: f64, points: &[Point]) -> Option<(f64, f64)> {
    let (low, top) = (points.first()?, points.last()?);
    let peak = points.iter().map(|p| p.goodput).fold(capacity, f64::max);
    Some((top.goodput / peak, top.p99 / low.p99.max(0.001)))
}

fn mark(ok: bool) -> &'static str {
    if ok {
        "✓"
    } else {
        "✗"
    }
}

/// The whole section.
pub fn render(res: &Results) -> String {
    let a = &res.args;
    let mut s = String::new();
    let _ = writeln!(s, "## PostgreSQL past saturation (`refract bench pg-overload`)\n");
    let _ = writeln!(s, "- **Date:** {}", res.env.date);
    let _ = writeln!(s, "- **Machine:** {} cores ({}), Linux {}", res.env.cores, res.env.cpu, res.env.kernel);
    let _ = writeln!(s, "- **Tools:** {}; {}", res.tools, res.env.refract);
    let _ = writeln!(
        s,
        "- **Rerun:** `sudo refract bench pg-overload --pool-size {} --seconds {}`\n",
        a.pool_size, a.seconds
    );
    let _ = writeln!(
        s,
        "**Method.** A primary and a streaming replica (refract-pg test kit) on loopback; every statement is `{}` (a read). \
         **Capacity: {:.0} statements/s**, by `{}` (a closed loop) through refract. Then an open loop at {} × that capacity, \
         {} s per point after a 1 s warm-up: Poisson arrivals from a seeded generator (every target sees the same arrivals), \
         each statement on an idle client connection or a new one (at most {}), latency from its scheduled start, as `pgbench -R` \
         measures; client timeout {} ms. pgbench itself is not the open-loop client: pgbench {} ends a client at its first error \
         other than a serialization failure or deadlock (`--max-tries` retries only those; `--continue-on-error` came later), so \
         a refusal would stop a client; the generator (`lab/src/bench/pgoverload/openloop.rs`) counts each \
         statement as served, *refused* (ErrorResponse 53300 or 57014), *timeout* (no answer in time) or *error*. \
         **Targets:** `refract` with shipped defaults (no `[overload]` section) but `[balance] read_from_primary = true` and \
         `pool_size = {p}`: the primary and the replica both serve the reads, balanced by peak-EWMA cost; `pgbouncer` in \
         transaction mode, `default_pool_size = {p2}`, pointed at the primary (PgBouncer has one server per database). Each has \
         {p2} server connections for these statements. Configurations: `refract_config` and `pgbouncer_config` in \
         `lab/src/bench/pgbench/targets.rs`.\n",
        super::SQL,
        res.capacity,
        res.capacity_load,
        a.loads.iter().map(|x| format!("{x}")).collect::<Vec<_>>().join(", "),
        a.seconds,
        a.max_conns,
        a.timeout_ms,
        res.tools.split(';').next().unwrap_or_default().trim(),
        p = a.pool_size,
        p2 = a.pool_size * 2,
    );
    acceptance(&mut s, res);
    for (name, points) in &res.points {
        table(&mut s, name, points);
    }
    s
}

fn acceptance(s: &mut String, res: &Results) {
    let _ = writeln!(s, "| target | goodput at top load ÷ peak (≥ 0.9) | p99 at top ÷ p99 at lowest (≤ 2) |");
    let _ = writeln!(s, "|---|---:|---:|");
    for (name, points) in &res.points {
        if let Some((g, l)) = ratios(res.capacity, points) {
            let _ = writeln!(s, "| {name} | {g:.2}× {} | {l:.2}× {} |", mark(g >= 0.9), mark(l <= 2.0));
        }
    }
    let _ = writeln!(s, "\nPeak: the larger of the capacity and the target's best goodput.\n");
}

fn table(s: &mut String, name: &str, points: &[Point]) {
    let _ = writeln!(s, "**{name}**\n");
    let _ = writeln!(s, "| offered | offered (stmt/s) | goodput (stmt/s) | p50 (ms) | p99 (ms) | refused | refused p99 (ms) | timeouts | errors |");
    let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for p in points {
        let rp = p.refused_p99.map_or("–".into(), |v| format!("{v:.1}"));
        let _ = writeln!(
            s,
            "| {}× | {:.0} | {:.0} | {:.1} | {:.1} | {} of {} | {rp} | {} | {} |",
            p.x, p.offered, p.goodput, p.p50, p.p99, p.refused, p.sent, p.timeouts, p.errors
        );
    }
    let _ = writeln!(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shot(end: End, ms: f64) -> Shot {
        Shot { end, ms }
    }

    #[test]
    fn a_point_counts_each_end_and_takes_percentiles_of_served_statements_only() {
        let mut shots: Vec<Shot> = (1..=100).map(|i| shot(End::Served, i as f64)).collect();
        shots.push(shot(End::Refused("53300".into()), 2.0));
        shots.push(shot(End::Refused("57014".into()), 900.0));
        shots.push(shot(End::Timeout, 1000.0));
        shots.push(shot(End::Error("08006".into()), 3.0));
        let p = Point::of(3.0, 60.0, &shots, 2.0);
        assert_eq!((p.goodput, p.refused, p.timeouts, p.errors, p.sent), (50.0, 2, 1, 1, 104));
        assert_eq!((p.p50, p.p99), (50.0, 99.0));
        assert_eq!(p.refused_p99, Some(900.0));
    }

    #[test]
    fn ratios_compare_the_top_load_with_the_peak_and_the_lowest_load() {
        let pt = |goodput: f64, p99: f64| Point {
            x: 1.0,
            offered: 0.0,
            goodput,
            p50: 0.0,
            p99,
            refused: 0,
            refused_p99: None,
            timeouts: 0,
            errors: 0,
            sent: 0,
        };
        let points = [pt(250.0, 22.0), pt(480.0, 30.0), pt(450.0, 33.0)];
        let (g, l) = ratios(500.0, &points).expect("points");
        assert!((g - 0.9).abs() < 1e-9 && (l - 1.5).abs() < 1e-9, "{g} {l}");
        assert_eq!(ratios(500.0, &[]), None);
    }
}
