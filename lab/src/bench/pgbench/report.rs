//! The outputs of `bench pgbench`: a section of the benchmarks page between
//! `<!-- pgbench:loopback -->` markers (the rest of the page is left as it is) and
//! `pgbench.csv` next to it, one row per pgbench run.

use crate::bench::pgbench::client::Summary;
use crate::bench::pgbench::options::{MODES, SERVER_SETTINGS};
use crate::bench::pgbench::results::{Mix, Results, Run};
use crate::bench::pgbench::targets::{Placement, REFRACT_NO_RYW, TARGETS};
use crate::report::{self, ratio};
use crate::support::units::{format_rate, sig3};
use anyhow::{Context, Result};
use std::fmt::Write;

/// The marker kind of the section (`<!-- pgbench:NAME -->`).
pub const MARKER: &str = "pgbench";
/// The section name.
pub const SECTION: &str = "loopback";

/// The CSV's header line.
pub const CSV_HEADER: &str = "table,target,mode,run,tps,latency_avg_ms,transactions,failed_transactions,\
reads_sent,writes_sent,primary_commits,replica_commits,primary_account_scans,replica_account_scans,error";

/// Writes the section into the page and the CSV next to it; prints the tables.
pub fn write(r: &Results) -> Result<()> {
    let out = &r.opts.out;
    report::write_marked(out, MARKER, SECTION, &render(r))?;
    let csv = r.opts.csv_path();
    std::fs::write(&csv, csv_text(r)).with_context(|| format!("writing {}", csv.display()))?;
    println!("{}", tables(r));
    eprintln!("wrote {} (section {MARKER}:{SECTION}), {}", out.display(), csv.display());
    Ok(())
}

/// The section (without markers).
pub fn render(r: &Results) -> String {
    let mut out = String::new();
    out.push_str("## PostgreSQL: pgbench through refract, PgBouncer and pgpool-II\n\n");
    out.push_str(
        "Written by `refract bench pgbench` (lab/src/bench/pgbench/); do not edit by hand. \
         Every run is in `pgbench.csv`.\n\n",
    );
    header(&mut out, r);
    out.push_str(&tables(r));
    configs(&mut out, r);
    out
}

fn header(out: &mut String, r: &Results) {
    let (e, v, o) = (&r.env, &r.versions, &r.opts);
    let settings = SERVER_SETTINGS.trim().replace('\n', "`, `");
    let _ = write!(
        out,
        "- **Date:** {}\n\
         - **Machine:** {} cores ({}), Linux {}. Both PostgreSQL servers, the pooler under test and pgbench \
         share these cores over loopback (TCP congestion control {}), so the figures compare CPU cost per \
         transaction, not a network. \
         Load average (1/5/15 min) at the start {}, at the end {}: anything above the benchmark's own \
         load means other work shared the cores.\n\
         - **Versions:** {}; {}; {}; {}; refract {}\n\
         - **Servers:** the refract-pg test kit's primary and streaming replica (`fsync = off`) with `{settings}`; \
         `pgbench -i -s {}` ({} accounts, in memory)\n\
         - **Load:** {}; each cell is the median of {} interleaved runs (the targets take turns, each round starting one later, so \
         drift in the machine's load hits all of them alike), after {}. TPS excludes connection time; \
         latency is pgbench's mean.\n\
         - **Pools:** {} server connections per server for every pooler: refract `pool_size`, PgBouncer \
         `default_pool_size`, pgpool-II `num_init_children` with `max_pool = 1`.\n\
         - **Placement:** {}; {}.\n\
         - **Rerun:** `{}`\n\n",
        e.date,
        e.cores,
        e.cpu,
        e.kernel,
        crate::fabric::congestion::host(),
        r.loadavg.0,
        r.loadavg.1,
        v.postgres,
        v.pgbench,
        v.pgbouncer,
        v.pgpool,
        e.refract,
        o.scale,
        o.scale as u64 * 100_000,
        r.tps_load.iter().map(|l| format!("`{l}`")).collect::<Vec<_>>().join(" and "),
        o.repeat,
        if o.warmup { "a 2 s warm-up through every target" } else { "no warm-up" },
        o.clients,
        placement_note(o.placement),
        autogroup_note(&r.autogroup),
        o.command
    );
    out.push_str(
        "Targets: `direct` = pgbench → the primary; `direct-replica` = pgbench → the replica (the server \
         refract's reads go to, without a pooler); `refract` → refract → the replica (refract sends reads \
         to replicas, to the primary only when none qualifies); `pgbouncer` → PgBouncer (transaction pooling) \
         → the primary (one server per database entry: it cannot route reads); `pgpool` → pgpool-II \
         (streaming-replication mode, load balancing) → the primary or the replica, chosen per client \
         session.\n\n",
    );
    for (t, why) in &r.unavailable {
        let _ = writeln!(out, "⚠ `{t}` could not be started and is not part of this run: {}\n", one_line(why));
    }
}

/// Where the servers, the poolers and pgbench ran.
fn placement_note(p: Placement) -> &'static str {
    match p {
        Placement::Own => {
            "each PostgreSQL server (by `pg_ctl`) and each pooler (by `setsid`, as a service manager or \
             `pgbouncer -d` would) runs in a session of its own, pgbench in the harness's"
        }
        Placement::Shared => {
            "each PostgreSQL server (by `pg_ctl`) runs in a session of its own; the poolers run in the \
             harness's session, with pgbench (`--placement shared`)"
        }
    }
}

/// What `kernel.sched_autogroup_enabled` (as read at the start) means for the placement.
fn autogroup_note(value: &str) -> String {
    match value {
        "1" => "`kernel.sched_autogroup_enabled = 1` here, so the scheduler shares the CPUs between \
                sessions first and between the threads of a session second"
            .into(),
        "0" => "`kernel.sched_autogroup_enabled = 0` here, so sessions do not matter to the scheduler".into(),
        other => format!("`kernel.sched_autogroup_enabled` could not be read ({other:?})"),
    }
}

/// Tables P1 (TPS), P1 ratios and P2 (the mix), as markdown.
pub fn tables(r: &Results) -> String {
    let mut out = String::new();
    let mut notes = Vec::new();
    let _ =
        writeln!(out, "### Table P1 — `pgbench -S`, transactions/s (median run; range over runs) and mean latency\n");
    let _ = writeln!(out, "| target | {} |\n|---|{}", MODES.join(" | "), "---:|".repeat(MODES.len()));
    for t in TARGETS {
        let mut row = format!("| {t} |");
        for m in MODES {
            let _ = write!(row, " {} |", cell(r, t, m, &mut notes));
        }
        let _ = writeln!(out, "{row}");
    }
    out.push('\n');
    let _ = writeln!(out, "| ratio (median TPS) | {} |\n|---|{}", MODES.join(" | "), "---:|".repeat(MODES.len()));
    for other in ["pgbouncer", "direct", "direct-replica", "pgpool"] {
        let mut row = format!("| refract/{other} |");
        for m in MODES {
            let v = median(r, "refract", m).zip(median(r, other, m)).map(|(a, b)| ratio(a.tps, b.tps));
            let _ = write!(row, " {} |", v.unwrap_or_else(|| "–".into()));
        }
        let _ = writeln!(out, "{row}");
    }
    out.push('\n');
    for n in notes {
        let _ = writeln!(out, "{n}\n");
    }
    if r.opts.mix {
        mix_table(&mut out, r);
    }
    out
}

/// The run of median TPS among the successful runs of `target` in `mode`.
pub fn median<'r>(r: &'r Results, target: &str, mode: &str) -> Option<&'r Summary> {
    let mut ok: Vec<&Summary> = runs(r, target, mode).filter_map(|x| x.outcome.as_ref().ok()).collect();
    ok.sort_by(|a, b| a.tps.total_cmp(&b.tps));
    ok.get(ok.len() / 2).copied()
}

fn runs<'r, 'a>(r: &'r Results, target: &'a str, mode: &'a str) -> impl Iterator<Item = &'r Run> + 'a
where
    'r: 'a,
{
    r.runs.iter().filter(move |x| x.target == target && x.mode == mode)
}

fn cell(r: &Results, target: &str, mode: &str, notes: &mut Vec<String>) -> String {
    let all: Vec<&Run> = runs(r, target, mode).collect();
    if all.is_empty() {
        return "not run".into();
    }
    let errors: Vec<&str> = all.iter().filter_map(|x| x.outcome.as_ref().err().map(String::as_str)).collect();
    let mark = if errors.is_empty() {
        String::new()
    } else {
        notes.push(failure_note(notes.len() + 1, target, mode, &errors, all.len()));
        format!(" ⚠{}", notes.len())
    };
    let Some(m) = median(r, target, mode) else { return format!("failed{mark}") };
    let tps: Vec<f64> = all.iter().filter_map(|x| x.outcome.as_ref().ok().map(|s| s.tps)).collect();
    let (lo, hi) = tps.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let range = if tps.len() > 1 { format!(" ({}–{})", format_rate(lo), format_rate(hi)) } else { String::new() };
    format!("**{}**{range}, {} ms{mark}", format_rate(m.tps), sig3(m.latency_ms))
}

fn failure_note(n: usize, target: &str, mode: &str, errors: &[&str], total: usize) -> String {
    let mut s = format!("⚠{n} `{target}`, {mode}: {} of {total} runs failed: `{}`", errors.len(), one_line(errors[0]));
    if target == "pgbouncer" && mode == "prepared" && errors[0].contains("prepared statement") {
        s.push_str(
            ". PgBouncer 1.18 does not support protocol-level prepared statements in transaction mode: a \
             statement pgbench prepared on one server connection is missing on the next one, or already \
             there under the same name (support came with PgBouncer 1.21's `max_prepared_statements`).",
        );
    }
    s
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ").replace('`', "'")
}

fn mix_table(out: &mut String, r: &Results) {
    let _ = writeln!(
        out,
        "### Table P2 — read/write mix: where the reads ran\n\n\
         `{}`: 80 % single-SELECT transactions (reads), 20 % pgbench's simple-update transaction \
         (`BEGIN; UPDATE; SELECT; INSERT; END`, writes). Each pooler is started afresh for its run and \
         stopped after it, so that its server connections close and flush their statistics; the \
         counters are deltas over the run on each server, read with psql directly. *Reads run* come \
         from `pg_stat_user_tables.idx_scan` of `pgbench_accounts`, which every read scans once and \
         every write twice (on the primary): reads on the primary = its scans − 2 × writes. *Commits* \
         are `pg_stat_database.xact_commit` and include the poolers' own transactions: refract's \
         health and lag query (one per server per second), its SETs when a server connection \
         passes to a client with other parameters (sent in the same write as the client's query), \
         and, with `read_your_writes`, its WAL-position polls (every 10 ms on each server while a \
         session waits for a replica to replay its write, and for 2 s after); pgpool-II's \
         streaming-replication check every 10 s. `{REFRACT_NO_RYW}` is refract with \
         `read_your_writes = false`.\n",
        r.mix_load
    );
    let _ = writeln!(
        out,
        "| target | TPS | reads sent | writes sent | reads run on primary | reads run on replica | \
         share of reads on the replica | commits on primary | commits on replica |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for m in &r.mix {
        let _ = writeln!(out, "{}", mix_row(m));
    }
    out.push('\n');
    out.push_str(
        "PgBouncer has one server per database entry, so every read runs on the primary. refract sends a \
         session's reads to the replica unless, with `read_your_writes = true` (the default), the session \
         wrote and the replica has not yet been seen to replay that write (a WAL-position poll numbered \
         after the write's commit, every 10 ms while some session waits): then they go to the primary. \
         Each pgbench client here writes in one transaction out of five and reads within a millisecond of \
         its own write, so with the default many of its reads still go to the primary; sessions that only \
         read are not affected. pgpool-II balances per client session (`statement_level_load_balance = off`).\n\n",
    );
}

/// `(reads, writes)` sent: the select-only and the update script's transactions.
pub fn sent(s: &Summary) -> (u64, u64) {
    let count = |needle: &str| s.scripts.iter().filter(|(n, _)| n.contains(needle)).map(|(_, c)| c).sum();
    (count("select only"), count("update"))
}

/// Reads run on `(primary, replica)`: `pgbench_accounts` scans, less the writes' two each on
/// the primary (`None` without a summary).
pub fn reads_run(m: &Mix) -> Option<(u64, u64)> {
    let (_, writes) = sent(m.outcome.as_ref().ok()?);
    Some((m.primary.account_scans.saturating_sub(2 * writes), m.replica.account_scans))
}

/// The share of the reads sent that ran on the replica (0 when no reads were sent).
pub fn replica_share(m: &Mix) -> f64 {
    let reads = m.outcome.as_ref().map(|s| sent(s).0).unwrap_or(0);
    match reads_run(m) {
        Some((_, on_replica)) if reads > 0 => on_replica as f64 / reads as f64,
        _ => 0.0,
    }
}

fn mix_row(m: &Mix) -> String {
    let (p, r) = (m.primary, m.replica);
    match &m.outcome {
        Ok(s) => {
            let (reads, writes) = sent(s);
            let (on_primary, on_replica) = reads_run(m).unwrap_or_default();
            format!(
                "| {} | {} | {reads} | {writes} | {on_primary} | {on_replica} | {} % | {} | {} |",
                m.target,
                format_rate(s.tps),
                sig3(100.0 * replica_share(m)),
                p.commits,
                r.commits
            )
        }
        Err(e) => format!(
            "| {} | failed: `{}` | – | – | – | {} | – | {} | {} |",
            m.target,
            one_line(e),
            r.account_scans,
            p.commits,
            r.commits
        ),
    }
}

/// Names where the configurations come from instead of embedding them (the page's header has
/// the commit).
fn configs(out: &mut String, r: &Results) {
    let names: Vec<&str> = r.configs.iter().map(|(n, _)| n.as_str()).collect();
    if !names.is_empty() {
        let _ = writeln!(
            out,
            "Configurations ({}): generated by `lab/src/bench/pgbench/targets.rs`; \
             pgpool-II's `pool_passwd` holds `refract:TEXTrefract`.\n",
            names.join(", ")
        );
    }
}

/// The CSV: every `-S` run and every mix run.
pub fn csv_text(r: &Results) -> String {
    let mut s = String::from(CSV_HEADER);
    s.push('\n');
    for x in &r.runs {
        let _ = writeln!(s, "tps,{},{},{},{}", x.target, x.mode, x.run, fields(&x.outcome, None));
    }
    for m in &r.mix {
        let _ = writeln!(s, "mix,{},simple,1,{}", m.target, fields(&m.outcome, Some(m)));
    }
    s
}

fn fields(o: &crate::bench::pgbench::client::Outcome, mix: Option<&Mix>) -> String {
    let counts = |s: Option<&Summary>| match (mix, s) {
        (Some(m), s) => {
            let (reads, writes) = s.map(sent).map(|(r, w)| (r.to_string(), w.to_string())).unwrap_or_default();
            let (p, r) = (m.primary, m.replica);
            format!("{reads},{writes},{},{},{},{}", p.commits, r.commits, p.account_scans, r.account_scans)
        }
        (None, _) => ",,,,,".into(),
    };
    match o {
        Ok(s) => format!("{:.2},{:.3},{},{},{},", s.tps, s.latency_ms, s.transactions, s.failed, counts(Some(s))),
        Err(e) => format!(",,,,{},\"{}\"", counts(None), one_line(e).replace('"', "\"\"")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::pgbench::options::PgbenchOptions;
    use crate::bench::pgbench::results::{Counters, Versions};
    use crate::report::environment::Environment;

    fn summary(tps: f64) -> Summary {
        Summary { tps, latency_ms: 1.0, transactions: 100, failed: 0, scripts: vec![] }
    }

    fn results() -> Results {
        let mut runs = vec![];
        for (t, tps) in [
            ("direct", 30_000.0),
            ("direct-replica", 28_000.0),
            ("refract", 15_000.0),
            ("pgbouncer", 30_000.0),
            ("pgpool", 20_000.0),
        ] {
            for m in MODES {
                let outcome = if t == "pgbouncer" && m == "prepared" {
                    Err("ERROR:  prepared statement \"P_0\" already exists".to_string())
                } else {
                    Ok(summary(tps))
                };
                runs.push(Run { target: t.into(), mode: m.into(), run: 1, outcome });
            }
        }
        let mut s = summary(5000.0);
        s.scripts = vec![("<builtin: select only>".into(), 800), ("<builtin: simple update>".into(), 200)];
        let (primary, replica) =
            (Counters { commits: 1400, account_scans: 600 }, Counters { commits: 1200, account_scans: 600 });
        let mix = vec![Mix { target: "refract".into(), outcome: Ok(s), primary, replica }];
        Results {
            opts: PgbenchOptions::quick("docs/benchmarks.md".into(), "refract".into()),
            env: Environment::default(),
            versions: Versions::default(),
            runs,
            mix,
            unavailable: vec![],
            configs: vec![("pgbouncer".into(), "[pgbouncer]".into())],
            tps_load: vec!["pgbench -S".into()],
            mix_load: "pgbench -b".into(),
            loadavg: ("0.1 0.1 0.1".into(), "2.0 1.0 0.5".into()),
            autogroup: "1".into(),
        }
    }

    #[test]
    fn section() {
        let r = results();
        let text = render(&r);
        assert!(text.contains("| refract | **15.0k**, 1.00 ms | **15.0k**, 1.00 ms |"), "{text}");
        assert!(text.contains("| pgbouncer | **30.0k**, 1.00 ms | failed ⚠1 |"), "{text}");
        assert!(text.contains("| refract/pgbouncer | 0.500× | – |"), "{text}");
        assert!(text.contains("| direct-replica | **28.0k**, 1.00 ms | **28.0k**, 1.00 ms |"), "{text}");
        assert!(text.contains("| refract/direct-replica | 0.536× | 0.536× |"), "{text}");
        assert!(text.contains("PgBouncer 1.18 does not support"), "{text}");
        assert!(text.contains("in a session of its own") && text.contains("`kernel.sched_autogroup_enabled = 1`"));
        assert!(text.contains("| refract | 5000 | 800 | 200 | 200 | 600 | 75.0 % | 1400 | 1200 |"), "{text}");
        assert!(text.contains("generated by `lab/src/bench/pgbench/targets.rs`"), "{text}");
        assert!(!text.contains("```ini"), "configs are named, not embedded");
        assert_eq!(replica_share(&r.mix[0]), 0.75);
    }

    #[test]
    fn csv() {
        let text = csv_text(&results());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], CSV_HEADER);
        let cols = CSV_HEADER.split(',').count();
        assert!(lines.iter().all(|l| l.split(',').count() >= cols), "{text}");
        assert!(text.contains("tps,refract,simple,1,15000.00,1.000,100,0,,,,,,,\n"), "{text}");
        assert!(text
            .contains("tps,pgbouncer,prepared,1,,,,,,,,,,,\"ERROR: prepared statement \"\"P_0\"\" already exists\""));
        assert!(text.contains("mix,refract,simple,1,5000.00,1.000,100,0,800,200,1400,1200,600,600,\n"), "{text}");
    }
}
