//! The markdown report: one marked section per sweep (`<!-- sweep:NAME -->`), replaced on its
//! own so that runs at different rates share one page.

use crate::bench::sweep::handover_stats::HandoverStats;
use crate::bench::sweep::run::{Measurement, Results};
use crate::cluster::layout::label;
use crate::report::environment::Environment;
use crate::report::{ratio, replace_marked, PAGE_HEADER};
use crate::support::units::{format_latency_us, format_rate, format_throughput, ByteSize};
use std::fmt::Write;

/// Everything one section shows.
pub struct Section<'a> {
    /// Section name (the marker), e.g. `1gbit`.
    pub name: &'a str,
    /// How the links were shaped, one line.
    pub shaping: &'a str,
    /// Seconds per measurement.
    pub duration_s: f64,
    /// Interleaved runs per cell; the median is shown.
    pub repeat: usize,
    /// The command that reruns this section.
    pub command: &'a str,
    /// Where and with what it ran.
    pub env: &'a Environment,
    /// Row order.
    pub sizes: &'a [ByteSize],
    /// Column order.
    pub targets: &'a [String],
    /// The figures.
    pub results: &'a Results,
    /// The plot's file name, relative to the page.
    pub plot: Option<&'a str>,
    /// Whether HAProxy (with its generated config) was measured.
    pub haproxy: bool,
    /// Where refract's configs come from (their files), one per dispatcher measured.
    pub refract_sources: &'a [String],
    /// What each target is (one markdown paragraph; empty for none).
    pub targets_note: &'a str,
}

/// Put `body` (without markers) into `doc` as section `name`: replace the section if present,
/// append it otherwise; start a page if `doc` is empty.
pub fn replace_section(doc: &str, name: &str, body: &str) -> String {
    replace_marked(doc, "sweep", name, body, PAGE_HEADER)
}

/// Render a section (without markers).
pub fn render(s: &Section) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## Sweep `{}`\n", s.name);
    environment(&mut out, s);
    out.push_str(&tables(s));
    if let Some(plot) = s.plot {
        let _ = writeln!(out, "![Throughput vs payload size, log-log]({plot})\n");
    }
    configs(&mut out, s);
    out
}

/// Table 1, and when measured Table 2 and the hand-over figures, as markdown.
pub fn tables(s: &Section) -> String {
    let mut out = String::new();
    table1(&mut out, s);
    if !s.results.latency.is_empty() {
        table2(&mut out, s);
    }
    if !s.results.handover.is_empty() {
        handover_table(&mut out, &s.results.handover);
    }
    out
}

fn environment(out: &mut String, s: &Section) {
    let e = s.env;
    let _ = write!(
        out,
        "- **Date:** {}\n- **Machine:** {} cores ({}), Linux {}\n- **Links:** {}; TCP \
         congestion control {}\n\
         - **Load:** 2 clients (rf-c1, rf-c2) at once, each `wrk -t1 -c1 -d{}s --timeout 30s \
         --latency`; each cell is the median of {} interleaved runs (the targets take turns, so \
         drift in the machine's load hits all of them alike)\n- **Tools:** {}; {}; refract {}\n\
         - **Rerun:** `{}`\n\n",
        e.date,
        e.cores,
        e.cpu,
        e.kernel,
        s.shaping,
        crate::fabric::congestion::describe(),
        s.duration_s,
        s.repeat,
        e.wrk,
        e.haproxy,
        e.refract,
        s.command
    );
    out.push_str(s.targets_note);
    out.push_str(
        " Throughput is the payload rate summed over both clients: requests/s × payload size, \
         except that runs with fewer than 20 requests per client use wrk's bytes-read counter \
         (which also counts the unfinished last response); the requests/s in brackets is \
         throughput ÷ payload size.\n\n",
    );
    if s.shaping.starts_with("tbf") {
        out.push_str(
            "The dispatcher host has one link, so through refract or HAProxy at most one link's \
             rate reaches the clients, while `direct` uses two backend links.\n\n",
        );
    } else {
        out.push_str("Unshaped, every path runs at memory speed: the figures measure CPU cost on 2 cores.\n\n");
    }
}

fn table1(out: &mut String, s: &Section) {
    let has = |t: &str| s.targets.iter().any(|x| x == t);
    let pairs = [
        ("refract", "direct"),
        ("refract", "haproxy"),
        ("hybrid", "refract"),
        ("hybrid", "haproxy"),
        ("hybrid", "direct"),
    ];
    let ratios: Vec<(&str, &str)> = pairs.into_iter().filter(|(a, b)| has(a) && has(b)).collect();
    let _ = writeln!(out, "### Table 1 — throughput by payload size\n");
    let mut head = String::from("| payload |");
    let mut rule = String::from("|---:|");
    for t in s.targets {
        let _ = write!(head, " {} |", label(t));
        rule.push_str("---:|");
    }
    for (a, b) in &ratios {
        let _ = write!(head, " {a}/{b} |");
        rule.push_str("---:|");
    }
    let _ = writeln!(out, "{head}\n{rule}");
    let mut flagged = Vec::new();
    for &size in s.sizes {
        let _ = writeln!(out, "{}", row1(s, size, &ratios, &mut flagged));
    }
    out.push('\n');
    for m in flagged {
        let (non_2xx, socket) = (sum(m, |r| r.non_2xx), sum(m, |r| r.socket_errors));
        let _ = writeln!(
            out,
            "⚠ {} at {} had errors: {non_2xx} non-2xx/3xx responses, {socket} socket errors.\n",
            m.target,
            m.size.human()
        );
    }
}

fn sum(m: &Measurement, f: impl Fn(&crate::bench::sweep::wrk::WrkReport) -> u64) -> u64 {
    m.reports.iter().map(f).sum()
}

fn row1<'r>(s: &Section<'r>, size: ByteSize, ratios: &[(&str, &str)], flagged: &mut Vec<&'r Measurement>) -> String {
    let mut row = format!("| {} |", size.human());
    for t in s.targets {
        match s.results.cell(size, t) {
            Some(m) => {
                let flag = if m.errors() > 0 { " ⚠" } else { "" };
                if m.errors() > 0 {
                    flagged.push(m);
                }
                let _ = write!(
                    row,
                    " {} ({} req/s){flag} |",
                    format_throughput(m.throughput()),
                    format_rate(m.effective_rps())
                );
            }
            None => row.push_str(" – |"),
        }
    }
    for (a, b) in ratios {
        let cell = s.results.cell(size, a).zip(s.results.cell(size, b));
        let _ = write!(
            row,
            " {} |",
            cell.map(|(x, y)| ratio(x.throughput(), y.throughput())).unwrap_or_else(|| "–".into())
        );
    }
    row
}

fn table2(out: &mut String, s: &Section) {
    let _ = writeln!(
        out,
        "### Table 2 — latency of 1-byte requests on one connection\n\n\
         One `wrk -t1 -c1 --latency` from one client (c1 in the lab), {} s.\n\n\
         | target | mean | p50 | p99 | requests/s | mean vs direct |\n|---|---:|---:|---:|---:|---:|",
        s.duration_s
    );
    let direct = s.results.latency.iter().find(|r| r.target == "direct").map(|r| r.report.latency_avg_us);
    for row in &s.results.latency {
        let r = &row.report;
        let pct = |v: Option<f64>| v.map(format_latency_us).unwrap_or_else(|| "–".into());
        let vs = direct.map(|d| ratio(r.latency_avg_us, d)).unwrap_or_else(|| "–".into());
        let flag = if r.has_errors() { " ⚠" } else { "" };
        let _ = writeln!(
            out,
            "| {}{flag} | {} | {} | {} | {} | {vs} |",
            label(&row.target),
            format_latency_us(r.latency_avg_us),
            pct(r.latency_p50_us),
            pct(r.latency_p99_us),
            format_rate(r.requests_per_sec)
        );
    }
    out.push('\n');
}

/// The hand-over dispatchers' own figures over the run (their admin `/metrics`).
fn handover_table(out: &mut String, stats: &std::collections::BTreeMap<String, HandoverStats>) {
    let _ = writeln!(
        out,
        "### Hand-overs — from the dispatchers' `/metrics` over the whole run\n\n\
         *Hand-over latency* is FREEZE → STEER in the dispatcher \
         (`refract_handover_frozen_seconds`: snapshot, silent unhash, the map update). *Until \
         HandOffOk* is the whole move (`refract_handover_seconds`: also `HandOff` to the agent, its \
         restore and its answer: a round trip between the hosts). Quantiles are interpolated inside \
         the ×2 buckets.\n\n\
         | target | hand-overs | relayed instead | hand-backs | bytes sent directly | latency p50 | p99 | until HandOffOk p50 | p99 | mean |\n\
         |---|---:|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (target, h) in stats {
        let declined: Vec<String> = h.declined().iter().map(|(r, n)| format!("{n:.0} {r}")).collect();
        let us = |v: Option<f64>| v.map(|x| format_latency_us(x * 1e6)).unwrap_or_else(|| "–".into());
        let _ = writeln!(
            out,
            "| {target} | {:.0} | {} | {:.0} | {} | {} | {} | {} | {} | {} |",
            h.handovers(),
            if declined.is_empty() { "0".to_string() } else { declined.join(", ") },
            h.handbacks,
            crate::support::units::format_bytes(h.bytes_direct),
            us(h.frozen.quantile(0.5)),
            us(h.frozen.quantile(0.99)),
            us(h.latency.quantile(0.5)),
            us(h.latency.quantile(0.99)),
            us(h.latency.mean())
        );
    }
    out.push('\n');
}

/// Names the configurations instead of embedding them (the page's header has the commit):
/// refract's are the lab's example files, HAProxy's is generated from the layout.
fn configs(out: &mut String, s: &Section) {
    if !s.refract_sources.is_empty() {
        let _ =
            writeln!(out, "Configurations: refract from {} (on the lab's addresses).", s.refract_sources.join(", "));
    }
    if s.haproxy {
        let _ = writeln!(
            out,
            "HAProxy's configuration is generated by `haproxy_config` in `lab/src/cluster.rs`; \
             `refract lab up` writes it to `/tmp/refract-lab/haproxy.cfg`.\n"
        );
    }
}
