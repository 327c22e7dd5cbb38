//! The `<!-- pglarge:RATE -->` section of docs/benchmarks.md (replaced whole on rerun) and its
//! figure `benchmarks-pg-large-RATE.png`, from the results alone.

use super::fetch::TARGETS;
use super::PgLargeArgs;
use crate::bench::pairs::Estimate;
use crate::bench::sweep::handover_stats::HandoverStats;
use crate::fabric::{congestion, shaping};
use crate::report::environment::Environment;
use crate::report::{ratio, replace_marked, PAGE_HEADER};
use crate::support::units::{sig3, ByteSize, Rate};
use anyhow::{Context, Result};
use std::fmt::Write;
use std::path::Path;

/// The `pgbench -S` pairs.
#[derive(Debug, Clone, Default)]
pub struct Pgbench {
    /// The command (without the address).
    pub load: String,
    /// TPS through hybrid, per pair.
    pub hybrid: Vec<f64>,
    /// TPS through the relay, per pair.
    pub relay: Vec<f64>,
    /// The paired ratio hybrid/relay.
    pub estimate: Option<Estimate>,
}

/// Everything the section shows.
#[derive(Debug, Clone)]
pub struct Results {
    /// The options.
    pub args: PgLargeArgs,
    /// The link rate.
    pub rate: Rate,
    /// The sizes, bytes.
    pub sizes: Vec<u64>,
    /// `(size, target, bytes/s over both clients)`, one per measurement.
    pub runs: Vec<(u64, String, f64)>,
    /// The hybrid dispatcher's hand-over counters over the fetches.
    pub handovers: HandoverStats,
    /// The pgbench pairs, if run.
    pub pgbench: Option<Pgbench>,
    /// The machine.
    pub env: Environment,
    /// Seconds the whole run took.
    pub took_s: f64,
}

impl Results {
    /// Empty results.
    pub fn new(args: &PgLargeArgs, rate: Rate, sizes: &[ByteSize]) -> Results {
        Results {
            args: args.clone(),
            rate,
            sizes: sizes.iter().map(|s| s.0).collect(),
            runs: vec![],
            handovers: HandoverStats::default(),
            pgbench: None,
            env: Environment::detect(),
            took_s: 0.0,
        }
    }

    /// One measurement.
    pub fn add(&mut self, size: u64, target: &str, bps: f64) {
        self.runs.push((size, target.to_string(), bps));
    }

    /// The median over a cell's measurements, MiB/s.
    pub fn median(&self, size: u64, target: &str) -> Option<f64> {
        let mut v: Vec<f64> =
            self.runs.iter().filter(|r| r.0 == size && r.1 == target).map(|r| r.2 / f64::from(1u32 << 20)).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        (n > 0).then(|| if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
    }
}

/// The figure's file name beside the page.
pub fn figure_name(rate: Rate) -> String {
    format!("benchmarks-pg-large-{}.png", rate.label())
}

/// Writes the section into `out` and prints it (the figure beside it is `plot`'s).
pub fn write(out: &Path, res: &Results) -> Result<()> {
    let body = render(res);
    println!("{body}");
    let doc = std::fs::read_to_string(out).unwrap_or_default();
    let page = replace_marked(&doc, "pglarge", &res.rate.label(), &body, PAGE_HEADER);
    std::fs::write(out, page).with_context(|| format!("writing {}", out.display()))
}

fn cell(v: Option<f64>) -> String {
    v.map_or("–".into(), sig3)
}

/// The table: one row per size, MiB/s per target (median), the hybrid's ratios and direct's
/// over the relay (what the machine allows beyond one link).
pub fn table(res: &Results) -> String {
    let mut s = String::from(
        "| result | direct | relay | hybrid | PgBouncer | hybrid/relay | hybrid/PgBouncer | hybrid/direct | direct/relay |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for &size in &res.sizes {
        let m: Vec<Option<f64>> = TARGETS.iter().map(|t| res.median(size, t)).collect();
        // A ratio of two measured cells, else `–`.
        let r = |a: usize, b: usize| m[a].zip(m[b]).map_or("–".into(), |(a, b)| ratio(a, b));
        let cells: Vec<String> = m.iter().map(|v| cell(*v)).collect();
        let ratios = [r(2, 1), r(2, 3), r(2, 0), r(0, 1)].join(" | ");
        let _ = writeln!(s, "| {} | {} | {ratios} |", ByteSize(size).human(), cells.join(" | "));
    }
    s
}

/// The whole section.
pub fn render(res: &Results) -> String {
    let (a, e) = (&res.args, &res.env);
    let mut s = format!("## PostgreSQL large results, links {} (`refract bench pg-large`)\n\n", res.rate.label());
    let _ = writeln!(
        s,
        "- **Date:** {}; {:.1} min. **Machine:** {} cores ({}), Linux {}; TCP congestion control {}; links {}; {}",
        e.date,
        res.took_s / 60.0,
        e.cores,
        e.cpu,
        e.kernel,
        congestion::describe(),
        shaping::describe(res.rate),
        e.refract
    );
    let _ = writeln!(
        s,
        "- **Load:** rf-c1 and rf-c2 at once, each psql (`-XAt -o /dev/null`, `\\timing`) running `select repeat('x', 1048576) \
         from generate_series(1, N/1MiB)` (below 1 MiB one row of N bytes), repeated to ≥ 32 MiB per client (at most 64 \
         times); MiB/s = both clients' bytes over the slower client's query time; median of {} rounds, the targets taking turns. \
         `direct`: c1 → pg-b1, c2 → pg-b2; `relay` VIP:6433; `hybrid` VIP:6432; PgBouncer 198.18.0.2:6434 (pg-b1 only)",
        a.repeat
    );
    let h = &res.handovers;
    let declined: Vec<String> = h.declined().iter().map(|(r, v)| format!("{r} {v:.0}")).collect();
    let _ = writeln!(
        s,
        "- **Hand-overs** (hybrid's `/metrics` over the fetches): {:.0} ok{}, {:.0} hand-backs, {} sent by the agents\n",
        h.handovers(),
        if declined.is_empty() { String::new() } else { format!(", declined: {}", declined.join(", ")) },
        h.handbacks,
        crate::support::units::format_bytes(h.bytes_direct)
    );
    s += &table(res);
    if let Some(p) = &res.pgbench {
        let est = p.estimate.map_or("–".into(), |e| e.describe());
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        let _ = writeln!(
            s,
            "\n`{}` from rf-c1, hybrid and relay back to back, alternating: hybrid/relay **{est}**; mean TPS hybrid {:.0}, relay {:.0}.",
            p.load,
            mean(&p.hybrid),
            mean(&p.relay)
        );
    }
    let _ = writeln!(
        s,
        "\n![PostgreSQL result throughput vs size]({})\n\nRerun: `sudo refract bench pg-large --sizes {} --repeat {} --rate {} --pairs {} --seconds {}`",
        figure_name(res.rate),
        a.sizes,
        a.repeat,
        a.rate,
        a.pairs,
        a.seconds
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn results() -> Results {
        let args = PgLargeArgs {
            sizes: "1K,64M".into(),
            repeat: 3,
            rate: "1gbit".into(),
            pairs: 0,
            seconds: 5,
            out: "x.md".into(),
        };
        let rate = Rate::parse("1gbit").expect("rate");
        Results::new(&args, rate, &[ByteSize(1024), ByteSize(64 << 20)])
    }

    #[test]
    fn medians_per_cell_and_the_hybrids_ratios_in_the_table() {
        let mut r = results();
        let mib = f64::from(1u32 << 20);
        for (t, v) in [("direct", 200.0), ("relay", 100.0), ("hybrid", 190.0), ("pgbouncer", 95.0)] {
            for k in [1.0, 0.5, 2.0] {
                r.add(64 << 20, t, v * k * mib);
            }
        }
        r.add(1024, "relay", 4.0 * mib);
        assert_eq!(r.median(64 << 20, "hybrid"), Some(190.0));
        assert_eq!(r.median(1024, "hybrid"), None);
        let t = table(&r);
        assert!(t.contains("| 64 MiB | 200 | 100 | 190 | 95.0 | 1.90× | 2.00× | 0.950× | 2.00× |"), "{t}");
        assert!(t.contains("| 1 KiB | – | 4.00 | – | – | – | – | – | – |"), "{t}");
    }
}
