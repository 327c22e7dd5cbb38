//! The overload page: one marked section per run kind (`<!-- overload:full -->`,
//! `<!-- overload:quick -->`), replaced whole on rerun; the text outside the markers (the
//! mechanism) is left alone.

use crate::bench::loadgen::summary::Summary;
use crate::bench::overload::args::OverloadOptions;
use crate::bench::overload::plot;
use crate::bench::overload::results::{self, Acceptance, OverloadResults, ScenarioRun};
use crate::report::environment::Environment;
use anyhow::{Context, Result};
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// The page's opening when the file does not exist yet.
pub const PAGE_HEADER: &str = "# Overload control\n\n\
How refract holds its goodput and latency past saturation is described by the dispatcher's \
authors; the measurements below are written by `refract bench overload` \
(`lab/`) and replaced whole when rerun — do not edit inside the markers.\n";

/// Everything the section shows besides the results.
pub struct Page<'a> {
    /// The options the run had.
    pub opts: &'a OverloadOptions,
    /// Where it ran.
    pub env: &'a Environment,
    /// How the links were shaped.
    pub links: &'a str,
    /// The plots' file names (relative to the page), those that were drawn.
    pub plots: Plots,
}

/// Plot file names, `None` when not drawn.
#[derive(Debug, Clone, Default)]
pub struct Plots {
    /// Goodput vs offered load.
    pub goodput: Option<String>,
    /// p50/p99 vs offered load.
    pub latency: Option<String>,
    /// Slow replica's share over time.
    pub slow: Option<String>,
}

/// Draw the plots, render the section, write the page.
pub fn write(opts: &OverloadOptions, env: &Environment, links: &str, res: &OverloadResults) -> Result<()> {
    if let Some(dir) = opts.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let plots = Plots {
        goodput: draw(&opts.out, &opts.section, "goodput", |p| plot::goodput(p, res)),
        latency: draw(&opts.out, &opts.section, "latency", |p| plot::latency(p, res)),
        slow: draw(&opts.out, &opts.section, "slow", |p| plot::slow_share(p, &res.slow, "b2")),
    };
    let ctx = Page { opts, env, links, plots };
    let body = render(&ctx, res);
    let existing = std::fs::read_to_string(&opts.out).unwrap_or_default();
    let page = replace_section(&existing, &opts.section, &body);
    std::fs::write(&opts.out, page).with_context(|| format!("writing {}", opts.out.display()))?;
    println!("{}", acceptance_table(res));
    eprintln!("wrote {} (section {})", opts.out.display(), opts.section);
    Ok(())
}

/// `docs/overload-goodput.png` (full) or `docs/overload-quick-goodput.png`.
pub fn plot_path(out: &Path, section: &str, what: &str) -> PathBuf {
    let stem = out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "overload".into());
    let name = if section == "full" { format!("{stem}-{what}.png") } else { format!("{stem}-{section}-{what}.png") };
    out.with_file_name(name)
}

fn draw(out: &Path, section: &str, what: &str, f: impl FnOnce(&Path) -> Result<()>) -> Option<String> {
    let path = plot_path(out, section, what);
    match f(&path) {
        Ok(()) => path.file_name().map(|n| n.to_string_lossy().into_owned()),
        Err(e) => {
            eprintln!("warning: no {what} plot: {e:#}");
            None
        }
    }
}

/// Put `body` into `doc` between `<!-- overload:NAME -->` markers.
pub fn replace_section(doc: &str, name: &str, body: &str) -> String {
    crate::report::replace_marked(doc, "overload", name, body, PAGE_HEADER)
}

/// The whole section.
pub fn render(ctx: &Page, res: &OverloadResults) -> String {
    let mut out = String::new();
    let title = if ctx.opts.section == "quick" { "quick run (`--quick`)" } else { "full run" };
    let _ = writeln!(out, "## Measurements: {title}\n");
    method(&mut out, ctx, res);
    let _ = writeln!(out, "### Acceptance, computed from the tables below\n\n{}", acceptance_table(res));
    sweep(&mut out, ctx, res);
    slow(&mut out, ctx, res);
    retry(&mut out, ctx, res);
    failed(&mut out, res);
    configs(&mut out);
    out
}

fn method(out: &mut String, ctx: &Page, res: &OverloadResults) {
    let (o, e, c) = (ctx.opts, ctx.env, &res.capacity);
    let per: Vec<String> = c.per_backend.iter().map(|(n, r)| format!("{n} {r:.0} req/s")).collect();
    let _ = write!(
        out,
        "- **Date:** {}\n- **Machine:** {} cores ({}), Linux {}\n- **Links:** {}; TCP congestion \
         control {}\n- **Tools:** {}; refract {}\n\
         - **Rerun:** `{}`\n\n### Method\n\n\
         - **Backends:** blob servers b1 and b2 (`--delay-ms {} --concurrency {}`): each works on at most \
         {} requests at once, {} ms each. **Measured capacity: {:.0} req/s** ({}), by a {:.0} s closed loop \
         of {} workers per server (c1 → b1 and c2 → b2 at once). Offered loads are multiples of it.\n\
         - **Load:** an open loop from rf-c1 (`refract bench loadgen`): Poisson arrivals from a seeded \
         generator (every target sees the same arrivals at a given load), {} s per point, {} B payloads, \
         each request on a pooled keep-alive connection (a new one when all are busy, at most {}), \
         client timeout {} ms, also sent as `x-refract-timeout-ms`. Latency runs from the scheduled \
         start (no coordinated omission). **Goodput** = 200s within the timeout per second; \
         *refused* = 503; *timeouts* = no whole answer in time; *errors* = anything else (including \
         no free connection under the cap). p50/p99 are of successful requests. A goodput marked ⚠ \
         is from a run where the load generator itself fell behind its schedule (p99 lag over 10 ms: \
         the target's overload starved the client of CPU on this 2-core machine); its latencies \
         include that lag.\n\
         - **Targets**, one at a time in rf-d, each warmed up for {:.1} s at 0.5× first: `refract` = \
         `examples/lab/relay.toml` moved to the rig's ports, overload control as by default; \
         `refract-off` = the same with `[overload] enabled = false`; `haproxy` = `maxconn {}` per \
         server (the backends' concurrency) and `timeout queue {} ms`, `balance roundrobin`.\n\n",
        e.date,
        e.cores,
        e.cpu,
        e.kernel,
        ctx.links,
        crate::fabric::congestion::describe(),
        e.haproxy,
        e.refract,
        o.command,
        o.capacity.delay_ms,
        o.capacity.concurrency,
        o.capacity.concurrency,
        o.capacity.delay_ms,
        c.total(),
        per.join(", "),
        c.duration_s,
        c.workers,
        o.duration.as_secs_f64(),
        o.bytes,
        o.max_conns,
        o.timeout_ms,
        o.warmup.as_secs_f64(),
        o.capacity.concurrency,
        o.settings.haproxy_queue_ms,
    );
}

/// The acceptance figures per target, with the overload bounds.
pub fn acceptance_table(res: &OverloadResults) -> String {
    let mut out = String::from(
        "| target | top load | goodput at top ÷ peak (≥ 0.9) | p99 at top ÷ p99 at 0.5× (≤ 2) | \
         refused p99 at top (< 5 ms) | retrying clients: goodput ÷ peak (≥ 0.9) |\n|---|---:|---:|---:|---:|---:|\n",
    );
    for t in res.targets() {
        let a: Acceptance = res.acceptance(&t);
        let top = a.top_level.map(|l| format!("{l}×")).unwrap_or_else(|| "–".into());
        let _ = writeln!(
            out,
            "| {t} | {top} | {} | {} | {} | {} |",
            judged(a.goodput_ratio, |v| v >= 0.9, "×"),
            judged(a.p99_ratio, |v| v <= 2.0, "×"),
            judged(a.refused_p99_ms, |v| v < 5.0, " ms"),
            judged(a.retry_goodput_ratio, |v| v >= 0.9, "×"),
        );
    }
    out
}

/// `0.97× ✓`, `3.4× ✗`, or `–`.
fn judged(v: Option<f64>, ok: impl Fn(f64) -> bool, unit: &str) -> String {
    match v {
        Some(v) => format!("{v:.2}{unit} {}", if ok(v) { "✓" } else { "✗" }),
        None => "–".into(),
    }
}

fn ms(v: Option<f64>) -> String {
    v.map(|v| if v < 10.0 { format!("{v:.2}") } else { format!("{v:.0}") }).unwrap_or_else(|| "–".into())
}

fn pct(n: u64, of: u64) -> String {
    if of == 0 {
        "–".into()
    } else {
        format!("{:.1} %", 100.0 * n as f64 / of as f64)
    }
}

/// The columns every run table shares.
const RUN_HEAD: &str = "goodput (req/s) | p50 (ms) | p99 (ms) | refused | refused p99 (ms) | timeouts | errors |";

/// Client lag (p99) above which a row is flagged: the load generator fell behind.
const LAG_FLAG_MS: f64 = 10.0;

fn run_cells(s: &Summary) -> String {
    let flag = match s.lag_p99_ms {
        Some(l) if l > LAG_FLAG_MS => format!(" ⚠ client lag p99 {l:.0} ms"),
        _ => String::new(),
    };
    format!(
        "{:.0}{flag} | {} | {} | {} | {} | {} | {} |",
        s.goodput,
        ms(s.p50_ms),
        ms(s.p99_ms),
        pct(s.refused, s.sent),
        ms(s.refused_p99_ms),
        pct(s.timeouts, s.sent),
        pct(s.errors, s.sent)
    )
}

fn sweep(out: &mut String, ctx: &Page, res: &OverloadResults) {
    let _ = writeln!(out, "### Sweep: goodput and latency vs offered load\n");
    for t in res.targets() {
        let _ = writeln!(
            out,
            "**{t}**\n\n| offered | offered (req/s) | {RUN_HEAD}\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for p in res.points(&t) {
            let _ = writeln!(out, "| {}× | {:.0} | {}", p.level, p.rate, run_cells(&p.summary));
        }
        out.push('\n');
    }
    for (alt, plot) in
        [("Goodput vs offered load", &ctx.plots.goodput), ("p50 and p99 vs offered load", &ctx.plots.latency)]
    {
        if let Some(p) = plot {
            let _ = writeln!(out, "![{alt}]({p})\n");
        }
    }
}

fn slow(out: &mut String, ctx: &Page, res: &OverloadResults) {
    let Some(first) = res.slow.first() else { return };
    let o = ctx.opts;
    let _ = writeln!(
        out,
        "### Slow replica\n\nb2 restarted with `--delay-ms {}` (10× slower; ≈ {:.0} req/s), {:.0} req/s \
         offered ({}× the capacity measured above), {} s, client timeout {} ms. *Answered* shares are of \
         the answers (any status) carrying `x-served-by: b2`, by second of scheduled start — a request \
         that timed out has no answer; *served* is b2's share of the reads the blob servers themselves \
         counted by the end of the run (work done, late or not).\n\n\
         | target | {RUN_HEAD} b2 answered | first s | last s | b2 served |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        o.slow_delay_ms,
        o.capacity.concurrency as f64 * 1000.0 / o.slow_delay_ms.max(1) as f64,
        first.rate,
        o.slow_level,
        o.slow_duration.as_secs_f64(),
        o.timeout_ms
    );
    for r in &res.slow {
        let first = r.timeline.first().map(|b| b.share("b2") * 100.0).unwrap_or(0.0);
        let last = r.timeline.last().map(|b| b.share("b2") * 100.0).unwrap_or(0.0);
        let _ = writeln!(
            out,
            "| {} | {} {:.1} % | {first:.1} % | {last:.1} % | {} |",
            r.target,
            run_cells(&r.summary),
            results::share(r, "b2"),
            served_share(r, "b2")
        );
    }
    out.push('\n');
    timeline_table(out, &res.slow);
    if let Some(p) = &ctx.plots.slow {
        let _ = writeln!(out, "![Slow replica's share over time]({p})\n");
    }
}

/// `backend`'s share of the reads the blob servers counted, e.g. `12.5 % (250 of 2000)`.
fn served_share(r: &ScenarioRun, backend: &str) -> String {
    let total: u64 = r.served.iter().map(|(_, n)| n).sum();
    let mine = r.served.iter().find(|(n, _)| n == backend).map(|(_, n)| *n).unwrap_or(0);
    if total == 0 {
        "–".into()
    } else {
        format!("{:.1} % ({mine} of {total})", 100.0 * mine as f64 / total as f64)
    }
}

fn timeline_table(out: &mut String, runs: &[ScenarioRun]) {
    let seconds = runs.iter().map(|r| r.timeline.len()).max().unwrap_or(0);
    let mut head = String::from("| second |");
    for r in runs {
        let _ = write!(head, " {}: b2 answered | p99 (ms) |", r.target);
    }
    let _ = writeln!(out, "{head}\n|---:|{}", "---:|---:|".repeat(runs.len()));
    for i in 0..seconds {
        let mut row = format!("| {i} |");
        for r in runs {
            match r.timeline.get(i) {
                Some(b) => {
                    let _ = write!(row, " {:.1} % | {} |", b.share("b2") * 100.0, ms(b.p99_ms));
                }
                None => row.push_str(" – | – |"),
            }
        }
        let _ = writeln!(out, "{row}");
    }
    out.push('\n');
}

fn retry(out: &mut String, ctx: &Page, res: &OverloadResults) {
    let Some(first) = res.retry.first() else { return };
    let o = ctx.opts;
    let _ = writeln!(
        out,
        "### Clients that retry on a short timeout\n\n{:.0} req/s offered ({}× capacity), {} s; each \
         client gives an attempt {} ms (sent as `x-refract-timeout-ms`), then retries once on a timeout \
         or an error (not on a 503). Goodput counts requests answered 200 by either attempt; latency \
         runs from the first attempt's scheduled start.\n\n\
         | target | attempts ÷ requests | {RUN_HEAD} goodput ÷ sweep peak |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        first.rate,
        o.retry_level,
        o.duration.as_secs_f64(),
        o.retry_timeout_ms
    );
    for r in &res.retry {
        let s = &r.summary;
        let amp = if s.sent == 0 { 0.0 } else { s.attempts as f64 / s.sent as f64 };
        let ratio = res.acceptance(&r.target).retry_goodput_ratio.map(|v| format!("{v:.2}×"));
        let _ = writeln!(out, "| {} | {amp:.2} | {} {} |", r.target, run_cells(s), ratio.unwrap_or_else(|| "–".into()));
    }
    out.push('\n');
}

fn failed(out: &mut String, res: &OverloadResults) {
    if res.failed.is_empty() {
        return;
    }
    let _ = writeln!(out, "### Targets that did not run\n");
    for (t, why) in &res.failed {
        let why: Vec<&str> = why.lines().filter(|l| !l.trim().is_empty()).take(6).collect();
        let _ = writeln!(out, "- `{t}` failed to start:\n\n  ```text\n  {}\n  ```\n", why.join("\n  "));
    }
}

/// Names where the configurations come from instead of embedding them (the page's header has
/// the commit; the Method section gives the settings that differ).
fn configs(out: &mut String) {
    let _ = writeln!(
        out,
        "Configurations: `refract_config` and `haproxy_config` in `lab/src/bench/overload/rig.rs` \
         (refract's from `examples/lab/relay.toml`).\n"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::overload::results::Point;

    #[test]
    fn sections_are_replaced_whole() {
        let page = replace_section("", "quick", "one");
        assert!(page.starts_with("# Overload control"));
        assert!(page.contains("<!-- overload:quick -->\none\n<!-- /overload:quick -->"));
        let page = replace_section(&page, "full", "A");
        let page = replace_section(&page, "quick", "two");
        assert!(!page.contains("one") && page.contains("two") && page.contains("\nA\n"));
        assert_eq!(page.matches("<!-- overload:quick -->").count(), 1);
    }

    #[test]
    fn plot_names() {
        let out = Path::new("docs/overload.md");
        assert_eq!(plot_path(out, "full", "goodput"), PathBuf::from("docs/overload-goodput.png"));
        assert_eq!(plot_path(out, "quick", "slow"), PathBuf::from("docs/overload-quick-slow.png"));
    }

    #[test]
    fn the_section_renders_every_part() {
        use crate::bench::overload::args::OverloadArgs;
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: OverloadArgs,
        }
        let opts = Cli::parse_from(["x", "--quick"]).args.into_options();
        let lagged = Summary { goodput: 700.0, lag_p99_ms: Some(40.0), ..Default::default() };
        let mut res = OverloadResults::default();
        res.capacity.per_backend = vec![("b1".into(), 725.0), ("b2".into(), 726.0)];
        res.sweep.push(Point { target: "refract".into(), level: 0.5, rate: 725.5, summary: lagged.clone() });
        res.failed.push(("refract-off".into(), "unknown field `enabled`\nat line 3".into()));
        let env = Environment::default();
        let page = Page { opts: &opts, env: &env, links: "unshaped", plots: Plots::default() };
        let text = render(&page, &res);
        for needle in [
            "## Measurements: quick run",
            "**Measured capacity: 1451 req/s** (b1 725 req/s, b2 726 req/s)",
            "| 0.5× | 726 | 700 ⚠ client lag p99 40 ms |",
            "`refract-off` failed to start",
            "unknown field `enabled`",
            "`refract_config` and `haproxy_config` in `lab/src/bench/overload/rig.rs`",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
        assert!(!text.contains("<details>"), "configs are named, not embedded:\n{text}");
    }

    #[test]
    fn acceptance_is_judged_from_data() {
        let s = |goodput, p99| Summary { goodput, p99_ms: Some(p99), refused_p99_ms: Some(0.8), ..Default::default() };
        let pt = |level: f64, g, p| Point { target: "refract".into(), level, rate: level * 1600.0, summary: s(g, p) };
        let res = OverloadResults {
            sweep: vec![pt(0.5, 800.0, 12.0), pt(1.0, 1580.0, 14.0), pt(3.0, 1500.0, 30.0)],
            ..Default::default()
        };
        let t = acceptance_table(&res);
        assert!(t.contains("| refract | 3× | 0.95× ✓ | 2.50× ✗ | 0.80 ms ✓ | – |"), "{t}");
    }
}
