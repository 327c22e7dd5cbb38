//! What `bench pg-cache` measured, and its section of the benchmarks page between
//! `<!-- pgcache:loopback -->` markers (the rest of the page is left as it is): per variant and
//! workload the medians over pairs of every target, the per-pair ratios' median with a paired
//! interval, and every run.

use super::cluster::{Counters, Loaded, COUNT_ONLY_IOPS};
use super::{Dist, Iops, PgCacheOptions, MODE, TABLE};
use crate::bench::pairs::Estimate;
use crate::report::environment::Environment;
use crate::support::units::{format_bytes, format_rate, sig3};
use anyhow::Result;
use std::fmt::Write;

/// The marker kind of the section (`<!-- pgcache:NAME -->`).
pub const MARKER: &str = "pgcache";
/// The section name.
pub const SECTION: &str = "loopback";

/// The ratios reported, numerator over denominator.
pub const RATIOS: [(&str, &str); 5] = [
    ("affinity", "peak-ewma"),
    ("affinity", "ideal"),
    ("ideal", "peak-ewma"),
    ("affinity", "ideal-refract"),
    ("ideal-refract", "peak-ewma"),
];

/// The ratios shown: the first three always (so that a skipped affinity shows as `–`), the
/// others when their targets ran.
fn ratios(targets: &[&str]) -> Vec<(&'static str, &'static str)> {
    let asked = |t: &str| t == "affinity" || targets.contains(&t);
    RATIOS.iter().enumerate().filter(|(i, (a, b))| *i < 3 || (asked(a) && asked(b))).map(|(_, r)| *r).collect()
}

/// What one recorded run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// Transactions per second (pgbench's, without connection time; the ideal's pgbenches
    /// added up).
    pub tps: f64,
    /// Mean latency, ms (the ideal's weighted by transactions).
    pub latency_ms: f64,
    /// Transactions (= queries).
    pub transactions: u64,
    /// Failed transactions.
    pub failed: u64,
    /// Each replica's counters over the run ([`Counters::since`]).
    pub replicas: Vec<Counters>,
}

impl Measured {
    /// `blks_hit / (blks_hit + blks_read)` of replica `i`: shared buffers only.
    pub fn buffer_hit(&self, i: usize) -> Option<f64> {
        let c = self.replicas.get(i)?;
        let all = c.hit + c.read;
        (all > 0).then(|| c.hit as f64 / all as f64)
    }

    /// Pages PostgreSQL read from the kernel (page cache or disk) per query: Σ `blks_read` /
    /// transactions.
    pub fn reads_per_query(&self) -> f64 {
        per(self.replicas.iter().map(|c| c.read).sum(), self.transactions)
    }

    /// Reads the replicas issued to the disk per query (their blkio cgroups).
    pub fn disk_reads_per_query(&self) -> f64 {
        per(self.replicas.iter().map(|c| c.dev_reads).sum(), self.transactions)
    }

    /// Of all page accesses, the share served from memory (shared buffers or page cache):
    /// 1 − disk reads / (`blks_hit` + `blks_read`), over all replicas.
    pub fn memory_hit(&self) -> Option<f64> {
        let all: u64 = self.replicas.iter().map(|c| c.hit + c.read).sum();
        let disk: u64 = self.replicas.iter().map(|c| c.dev_reads).sum();
        (all > 0).then(|| 1.0 - (disk.min(all) as f64 / all as f64))
    }

    /// The busiest replica's queries over the mean (`xact_commit`): 1 is even.
    pub fn imbalance(&self) -> Option<f64> {
        let q: Vec<u64> = self.replicas.iter().map(|c| c.xact).collect();
        let total: u64 = q.iter().sum();
        let max = q.iter().copied().max()?;
        (total > 0).then(|| max as f64 * q.len() as f64 / total as f64)
    }
}

fn per(n: u64, d: u64) -> f64 {
    if d == 0 {
        0.0
    } else {
        n as f64 / d as f64
    }
}

/// One recorded run.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// Pair index (0-based).
    pub pair: usize,
    /// `peak-ewma`, `affinity` or `ideal`.
    pub target: &'static str,
    /// What it measured, or why it failed.
    pub outcome: std::result::Result<Measured, String>,
}

/// One read-cap variant and workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// The read cap.
    pub iops: Iops,
    /// The workload.
    pub dist: Dist,
    /// Every run, in the order taken.
    pub runs: Vec<Run>,
}

impl Cell {
    /// The successful runs of `target`, by pair.
    fn of(&self, target: &str) -> Vec<(usize, &Measured)> {
        self.runs
            .iter()
            .filter(|r| r.target == target)
            .filter_map(|r| Some((r.pair, r.outcome.as_ref().ok()?)))
            .collect()
    }

    /// The median over `target`'s runs of `f` (runs where it is undefined left out).
    pub fn median(&self, target: &str, f: impl Fn(&Measured) -> Option<f64>) -> Option<f64> {
        median(self.of(target).into_iter().filter_map(|(_, m)| f(m)).collect())
    }

    /// The per-pair TPS ratios `a / b` (pairs where either failed left out).
    pub fn pair_ratios(&self, a: &str, b: &str) -> Vec<f64> {
        let bs = self.of(b);
        self.of(a)
            .into_iter()
            .filter_map(|(pair, x)| {
                let y = bs.iter().find(|(p, _)| *p == pair)?.1;
                (x.tps > 0.0 && y.tps > 0.0).then(|| x.tps / y.tps)
            })
            .collect()
    }
}

/// The median (the mean of the middle two for an even count).
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

/// The median of per-pair ratios, with the paired 90 % interval when there are two or more
/// and they spread: `1.42×`, `1.42× (90 % CI 1.31–1.55×, 3 pairs)`, `–`.
pub fn describe_ratio(ratios: &[f64]) -> String {
    let Some(m) = median(ratios.to_vec()) else { return "–".into() };
    let spread = ratios.iter().any(|r| (r - ratios[0]).abs() > 1e-12);
    let logs: Vec<f64> = ratios.iter().map(|r| r.ln()).collect();
    match Estimate::of(&logs).filter(|_| spread) {
        Some(e) => format!("{}× (90 % CI {}–{}×, {} pairs)", sig3(m), sig3(e.lo), sig3(e.hi), e.n),
        None => format!("{}× ({} pair{})", sig3(m), ratios.len(), if ratios.len() == 1 { "" } else { "s" }),
    }
}

/// Whether affinity ran, and if not why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Affinity {
    /// Its runs are in the tables.
    Ran,
    /// The refract binary refused its config: the reason (from refract's log).
    Skipped(String),
    /// Not among `--targets`.
    NotAsked,
}

/// Everything a run measured, and what it ran with.
#[derive(Debug, Clone)]
pub struct Results {
    /// The options.
    pub opts: PgCacheOptions,
    /// The machine.
    pub env: Environment,
    /// `postgres --version`, `pgbench --version`.
    pub versions: (String, String),
    /// `/proc/loadavg` at the start and at the end.
    pub loadavg: (String, String),
    /// What was loaded.
    pub loaded: Loaded,
    /// The data disk, `MAJ:MIN`.
    pub device: String,
    /// Whether affinity ran.
    pub affinity: Affinity,
    /// Per variant and workload, in order.
    pub cells: Vec<Cell>,
    /// Minutes the whole run took.
    pub minutes: f64,
}

/// Writes the section into the page; prints the headline table and where it went.
pub fn write(r: &Results) -> Result<()> {
    let out = &r.opts.out;
    crate::report::write_marked(out, MARKER, SECTION, &render(r))?;
    println!("{}", headline(r));
    if let Affinity::Skipped(why) = &r.affinity {
        println!("affinity runs SKIPPED: {why}");
    }
    eprintln!("wrote {} (section {MARKER}:{SECTION})", out.display());
    Ok(())
}

/// The section (without markers).
pub fn render(r: &Results) -> String {
    let mut out = String::from(
        "## PostgreSQL: cache-affinity routing over replicas of bounded memory (`refract bench pg-cache`)\n\n",
    );
    let _ = writeln!(out, "Rerun: `{}`\n", r.opts.command);
    out.push_str("Written by `refract bench pg-cache` (lab/src/bench/pgcache/); do not edit by hand.\n\n");
    if let Affinity::Skipped(why) = &r.affinity {
        let _ = writeln!(
            out,
            "**The affinity runs were skipped:** this refract refused `[balance] policy = \"affinity\"` \
             (`{}`), so only `peak-ewma` and `ideal` ran and no affinity ratio is shown.\n",
            why.replace('`', "'")
        );
    }
    out.push_str(&headline(r));
    out.push('\n');
    header(&mut out, r);
    for c in &r.cells {
        cell_table(&mut out, r, c);
    }
    runs_table(&mut out, r);
    out
}

fn header(out: &mut String, r: &Results) {
    let (e, o, l) = (&r.env, &r.opts, &r.loaded);
    let parts = super::split(o.rows, o.clients, o.replicas);
    let ideal: Vec<String> = parts
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{} clients → {} (ids {}–{})", p.clients, super::replica_name(i), p.lo, p.hi))
        .collect();
    let resident = l.resident.map_or_else(|| "not checked (no `fincore`)".into(), |b| format_bytes(b as f64));
    let total = l.table + l.index;
    let scripts: Vec<String> = o
        .dists
        .iter()
        .map(|d| {
            let lines: Vec<String> = d.script().lines().map(|l| format!("`{l}`")).collect();
            format!("`{}`: {}", d.name(), lines.join(" then "))
        })
        .collect();
    let _ = write!(
        out,
        "- **Date:** {}; {:.0} min in all. **Machine:** {} cores ({}), Linux {}, shared by the servers, refract \
         and pgbench over loopback (and by other work: load average {} at the start, {} at the end).\n\
         - **Versions:** {}; {}; refract {}\n\
         - **Cluster:** a primary and {} streaming replicas on 127.0.0.1, data on the disk `{}` (ext4 root, not \
         tmpfs), `shared_buffers = 32MB`, `fsync = off` (lab/src/bench/pgcache/cluster.rs). Each replica's \
         postmaster is started inside its own cgroup v1 memory cgroup (`memory.limit_in_bytes` = {}: its \
         processes, shared buffers and page cache) and blkio cgroup; every process it forks inherits both.\n\
         - **Data:** `{TABLE}(id bigint primary key, pad text)`, {} rows loaded in key order on the primary: \
         table {} + index {} = {} ({} per replica when split {} ways); `VACUUM (FREEZE)`, `CHECKPOINT`, replayed; \
         then each replica stopped, its {} relation files evicted from the page cache one by one (`fdatasync`, \
         `posix_fadvise(POSIX_FADV_DONTNEED)`; still resident afterwards: {resident}) and started again cold ({} s \
         in all).\n\
         - **Load:** pgbench `-M {MODE}`, {} clients; through refract one `pgbench -c {} -j {}` over all keys; \
         `ideal`: one pgbench per replica, straight to it, its clients reading only its key range: {}. \
         Scripts (`:lo`, `:len` set by `-D`): {}. The ideal runs each workload's shape over each range (for `zipf`, \
         each range has its own hot keys at its start). The ideal has no dispatcher in its path: `affinity / ideal` \
         counts refract's own cost per query as well as the caches'.\n\
         - **Targets:** `peak-ewma` and `affinity` are refract (`[balance] policy`, everything else shipped \
         defaults, `pool_size = {}`; affinity with `affinity_load_factor = {}` and `[[postgres.affinity]] table = \
         \"{TABLE}\", column = \"id\"`), the primary and every replica as `[[postgres.server]]`, a refract started \
         for each run and stopped after it.{}\n\
         - **Runs:** per variant and workload, {} pair(s); a pair is one run of every target, the order rotating \
         from pair to pair; every run is {} s of warm-up through its target, then {} s recorded.\n\
         - **Measures, per run:** TPS; per replica, from `pg_stat_database` deltas (database `postgres`), \
         `blks_hit / (blks_hit + blks_read)` (shared buffers only: a `blks_read` may still come from the page \
         cache), `blks_read` per query (Σ over replicas / transactions), and the load: the busiest replica's \
         `xact_commit` over the mean; from the blkio cgroups (`blkio.throttle.io_serviced`), the reads that \
         reached the disk per query, and from them the share of page accesses served from memory (1 − disk \
         reads / (`blks_hit` + `blks_read`)). With no read cap a limit of {} IOPS is set only so that the kernel \
         counts the reads. Ratios are medians of the per-pair TPS ratios; with two or more pairs that differ, \
         the paired 90 % interval of their geometric mean (Student's t on the log ratios).\n\n",
        e.date,
        r.minutes,
        e.cores,
        e.cpu,
        e.kernel,
        r.loadavg.0,
        r.loadavg.1,
        r.versions.0,
        r.versions.1,
        e.refract,
        o.replicas,
        r.device,
        format_bytes(o.replica_mem as f64),
        o.rows,
        format_bytes(l.table as f64),
        format_bytes(l.index as f64),
        format_bytes(total as f64),
        format_bytes(total as f64 / o.replicas as f64),
        o.replicas,
        l.files,
        l.secs,
        o.clients,
        o.clients,
        o.jobs,
        ideal.join(", "),
        scripts.join("; "),
        o.clients,
        o.load_factor,
        if o.targets.contains(&"ideal-refract") {
            " `ideal-refract` is the ideal through refract: each replica's clients and key range through a refract \
             of its own whose only replica is that one (`peak-ewma`, `pool_size` = those clients), so it has \
             refract's cost per query and the ideal's caches; `affinity / ideal-refract` is the caches' part alone."
        } else {
            ""
        },
        o.pairs,
        o.warmup,
        o.duration,
        COUNT_ONLY_IOPS,
    );
}

/// Per variant and workload: median TPS of each target and the ratios.
pub fn headline(r: &Results) -> String {
    const ALWAYS: [&str; 3] = ["peak-ewma", "affinity", "ideal"];
    let mut shown: Vec<&str> = ALWAYS.to_vec();
    shown.extend(r.opts.targets.iter().filter(|t| !ALWAYS.contains(t)));
    let ratios = ratios(&r.opts.targets);
    let mut s = String::from("| reads | workload |");
    for t in &shown {
        let _ = write!(s, " {t} TPS |");
    }
    for (a, b) in &ratios {
        let _ = write!(s, " {a} / {b} |");
    }
    let _ = writeln!(s, "\n|---|---|{}", "---:|".repeat(shown.len() + ratios.len()));
    let tps = |c: &Cell, t: &str| c.median(t, |m| Some(m.tps)).map_or_else(|| "–".to_string(), format_rate);
    for c in &r.cells {
        let _ = write!(s, "| {} | {} |", c.iops.label(), c.dist.name());
        for t in &shown {
            let _ = write!(s, " {} |", tps(c, t));
        }
        for (a, b) in &ratios {
            let _ = write!(s, " {} |", describe_ratio(&c.pair_ratios(a, b)));
        }
        s.push('\n');
    }
    s
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |x| format!("{:.1} %", x * 100.0))
}

fn num(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), small)
}

/// Three significant digits; below 0.001 in scientific notation (`1.0e-5`), 0 as `0`.
fn small(v: f64) -> String {
    if v != 0.0 && v.abs() < 0.001 {
        format!("{v:.1e}")
    } else {
        sig3(v)
    }
}

/// Medians over the runs of each target.
fn cell_table(out: &mut String, r: &Results, c: &Cell) {
    let n = r.opts.replicas;
    let _ = write!(
        out,
        "### {}, `{}`: medians over pairs\n\n\
         | target | runs | TPS | latency | buffer hit ({}) | `blks_read` / query | disk reads / query | from memory | load max / mean | page cache at the end ({}) |\n\
         |---|---:|---:|---:|---|---:|---:|---:|---:|---|\n",
        c.iops.label(),
        c.dist.name(),
        (1..=n).map(|i| format!("r{i}")).collect::<Vec<_>>().join(" / "),
        (1..=n).map(|i| format!("r{i}")).collect::<Vec<_>>().join(" / "),
    );
    for t in &r.opts.targets {
        let runs = c.of(t).len();
        if runs == 0 {
            continue;
        }
        let hits: Vec<String> = (0..n).map(|i| pct(c.median(t, |m| m.buffer_hit(i)))).collect();
        let cache: Vec<String> = (0..n)
            .map(|i| {
                c.median(t, |m| m.replicas.get(i).map(|x| x.cache_bytes as f64))
                    .map_or_else(|| "–".into(), format_bytes)
            })
            .collect();
        let _ = writeln!(
            out,
            "| {t} | {runs} | {} | {} ms | {} | {} | {} | {} | {} | {} |",
            c.median(t, |m| Some(m.tps)).map_or_else(|| "–".into(), format_rate),
            num(c.median(t, |m| Some(m.latency_ms))),
            hits.join(" / "),
            num(c.median(t, |m| Some(m.reads_per_query()))),
            num(c.median(t, |m| Some(m.disk_reads_per_query()))),
            pct(c.median(t, Measured::memory_hit)),
            num(c.median(t, Measured::imbalance)),
            cache.join(" / "),
        );
    }
    let failed: Vec<String> = c
        .runs
        .iter()
        .filter_map(|x| x.outcome.as_ref().err().map(|e| format!("pair {} {}: {e}", x.pair + 1, x.target)))
        .collect();
    if !failed.is_empty() {
        let _ = writeln!(out, "\n⚠ failed runs: {}", failed.join("; "));
    }
    out.push('\n');
}

/// Every run, in the order taken.
fn runs_table(out: &mut String, r: &Results) {
    out.push_str(
        "### Every run\n\n<details><summary>per run, in the order taken</summary>\n\n\
         | reads | workload | pair | target | TPS | latency | buffer hit per replica | `blks_read` / query | disk reads / query | from memory | load max / mean | queries per replica | failed |\n\
         |---|---|---:|---|---:|---:|---|---:|---:|---:|---:|---|---:|\n",
    );
    for c in &r.cells {
        for run in &c.runs {
            let _ = write!(out, "| {} | {} | {} | {} | ", c.iops.label(), c.dist.name(), run.pair + 1, run.target);
            match &run.outcome {
                Ok(m) => {
                    let hits: Vec<String> = (0..m.replicas.len()).map(|i| pct(m.buffer_hit(i))).collect();
                    let q: Vec<String> = m.replicas.iter().map(|x| x.xact.to_string()).collect();
                    let _ = writeln!(
                        out,
                        "{} | {} ms | {} | {} | {} | {} | {} | {} | {} |",
                        format_rate(m.tps),
                        sig3(m.latency_ms),
                        hits.join(" / "),
                        small(m.reads_per_query()),
                        small(m.disk_reads_per_query()),
                        pct(m.memory_hit()),
                        num(m.imbalance()),
                        q.join(" / "),
                        m.failed
                    );
                }
                Err(e) => {
                    let _ = writeln!(out, "failed: {} | | | | | | | | |", e.replace('|', "/"));
                }
            }
        }
    }
    out.push_str("\n</details>\n");
}

/// One run as a line for the terminal.
pub fn line(m: &Measured) -> String {
    let hits: Vec<String> = (0..m.replicas.len()).map(|i| pct(m.buffer_hit(i))).collect();
    format!(
        "{:>7} TPS  {:.2} ms  buffer hit {}  blks_read/q {}  disk reads/q {}  load max/mean {}",
        format_rate(m.tps),
        m.latency_ms,
        hits.join(" / "),
        small(m.reads_per_query()),
        small(m.disk_reads_per_query()),
        num(m.imbalance())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(hit: u64, read: u64, xact: u64, dev: u64) -> Counters {
        Counters { hit, read, xact, dev_reads: dev, ..Counters::default() }
    }

    fn measured(tps: f64, replicas: Vec<Counters>) -> Measured {
        let transactions = replicas.iter().map(|c| c.xact).sum();
        Measured { tps, latency_ms: 1.0, transactions, failed: 0, replicas }
    }

    #[test]
    fn per_run_figures() {
        let m = measured(1000.0, vec![counters(300, 100, 600, 50), counters(100, 100, 200, 150)]);
        assert_eq!((m.buffer_hit(0), m.buffer_hit(1), m.buffer_hit(2)), (Some(0.75), Some(0.5), None));
        assert_eq!(m.reads_per_query(), 200.0 / 800.0);
        assert_eq!(m.disk_reads_per_query(), 200.0 / 800.0);
        assert_eq!(m.memory_hit(), Some(1.0 - 200.0 / 600.0));
        assert_eq!(m.imbalance(), Some(1.5), "600 of 800 over two replicas");
        let idle = measured(0.0, vec![Counters::default(); 2]);
        assert_eq!((idle.buffer_hit(0), idle.memory_hit(), idle.imbalance()), (None, None, None));
        assert_eq!(idle.reads_per_query(), 0.0);
    }

    #[test]
    fn medians_and_paired_ratios() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
        assert_eq!((small(0.00001), small(0.0), small(0.682)), ("1.0e-5".into(), sig3(0.0), "0.682".into()));
        let run = |pair, target, tps: f64| Run {
            pair,
            target,
            outcome: if tps > 0.0 { Ok(measured(tps, vec![counters(1, 1, 1, 1)])) } else { Err("boom".into()) },
        };
        let c = Cell {
            iops: Iops(None),
            dist: Dist::Uniform,
            runs: vec![
                run(0, "peak-ewma", 100.0),
                run(0, "ideal", 200.0),
                run(1, "ideal", 220.0),
                run(1, "peak-ewma", 100.0),
                run(2, "peak-ewma", 0.0),
                run(2, "ideal", 300.0),
            ],
        };
        assert_eq!(c.pair_ratios("ideal", "peak-ewma"), vec![2.0, 2.2], "a failed run leaves its pair out");
        assert!(c.pair_ratios("affinity", "peak-ewma").is_empty());
        assert_eq!(c.median("ideal", |m| Some(m.tps)), Some(220.0));
        let d = describe_ratio(&c.pair_ratios("ideal", "peak-ewma"));
        assert!(d.starts_with("2.10× (90 % CI ") && d.ends_with(", 2 pairs)"), "{d}");
        assert_eq!(describe_ratio(&[1.5]), "1.50× (1 pair)");
        assert_eq!(describe_ratio(&[1.5, 1.5]), "1.50× (2 pairs)", "no interval when they do not spread");
        assert_eq!(describe_ratio(&[]), "–");
    }

    #[test]
    fn a_skipped_affinity_is_said_and_its_columns_are_empty() {
        let opts = super::super::PgCacheArgs {
            replicas: 2,
            replica_mem: crate::support::units::ByteSize(384 << 20),
            rows: 20_000,
            iops: vec![Iops(None)],
            dists: vec![Dist::Uniform],
            targets: vec!["peak-ewma".into(), "affinity".into(), "ideal".into()],
            clients: 16,
            jobs: 2,
            warmup: 1,
            duration: 3,
            pairs: 1,
            load_factor: 1.25,
            out: "/tmp/x.md".into(),
            refract_bin: Some("/bin/true".into()),
        }
        .into_options()
        .expect("options");
        let m = |tps| Ok(measured(tps, vec![counters(10, 30, 500, 3), counters(10, 30, 500, 3)]));
        let r = Results {
            opts,
            env: Environment::default(),
            versions: ("postgres 15".into(), "pgbench 15".into()),
            loadavg: ("0.1".into(), "0.2".into()),
            loaded: Loaded { table: 4 << 20, index: 1 << 20, secs: 3, files: 300, resident: Some(0) },
            device: "254:0".into(),
            affinity: Affinity::Skipped("unknown variant `affinity`, expected one of `round-robin`".into()),
            cells: vec![Cell {
                iops: Iops(None),
                dist: Dist::Uniform,
                runs: vec![
                    Run { pair: 0, target: "peak-ewma", outcome: m(1000.0) },
                    Run { pair: 0, target: "ideal", outcome: m(1500.0) },
                ],
            }],
            minutes: 1.0,
        };
        let s = render(&r);
        assert!(s.starts_with("## PostgreSQL: cache-affinity"), "{s}");
        assert!(s.contains("Rerun: `sudo refract bench pg-cache --replicas 2 --replica-mem 384M --rows 20000"), "{s}");
        assert!(s.contains("**The affinity runs were skipped:**") && s.contains("'affinity'"), "{s}");
        assert!(
            s.contains(
                "`uniform`: `\\set id :lo + random(0, :len - 1)` then `SELECT pad FROM rf_cache WHERE id = :id;`"
            ),
            "{s}"
        );
        assert!(s.contains("| unthrottled | uniform | 1000 | – | 1500 | – | – | 1.50× (1 pair) |"), "{s}");
        assert!(s.contains("8 clients → replica1 (ids 1–10000), 8 clients → replica2 (ids 10001–20000)"), "{s}");
        assert!(
            s.contains("| peak-ewma | 1 | 1000 | 1.00 ms | 25.0 % / 25.0 % | 0.0600 | 0.00600 | 92.5 % | 1.00 |"),
            "{s}"
        );
        assert!(!s.contains("| affinity | "), "no affinity row: {s}");
        assert!(s.contains("| unthrottled | uniform | 1 | ideal | 1500 |"), "{s}");
    }
}
