//! `refract demo`: the main job end to end — a cluster (the lab when root, loopback otherwise),
//! routing shown by each backend's counters, then a short sweep printed as a table; in the lab
//! then the PostgreSQL version of the story in one line ([`pg`]).

pub mod pg;

use crate::bench::sweep::plot;
use crate::bench::sweep::report::{self, Section};
use crate::bench::sweep::run::{self as sweep, Plan, Results};
use crate::cluster::haproxy;
use crate::cluster::http_client::Client;
use crate::cluster::layout::Layout;
use crate::cluster::{self, Running};
use crate::lab::LabGuard;
use crate::report::environment::Environment;
use crate::support::units::{ByteSize, Rate};
use crate::support::{interrupt, sh};
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::time::{Duration, Instant};

/// The Hyrise-R plan sent as the demo's table load.
pub const TABLE_LOAD: &str = r#"{"operators":{"0":{"type":"TableLoad","table":"t","filename":"t.tbl"}}}"#;

/// A running cluster for the demo; dropping it tears it down.
enum Cluster {
    Lab(LabGuard),
    /// The running processes are held for their `Drop`, which stops them.
    Loopback(Layout, #[allow(dead_code)] Running),
}

impl Cluster {
    fn layout(&self) -> &Layout {
        match self {
            Cluster::Lab(g) => &g.layout,
            Cluster::Loopback(l, _) => l,
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        match self {
            Cluster::Loopback(layout, _) => {
                eprintln!("stopping the loopback cluster");
                cluster::stop(layout);
            }
            Cluster::Lab(g) if g.owns_anything() => eprintln!("taking the lab down"),
            Cluster::Lab(_) => eprintln!("leaving the lab as it was found (it was already up)"),
        }
    }
}

/// Run the demo.
pub fn run(quick: bool, force_loopback: bool) -> Result<()> {
    interrupt::install();
    story(quick, force_loopback).map_err(|e| after_interrupt(e, interrupt::interrupted()))
}

/// After Ctrl-C (everything is torn down by then) the error says just that, not which step
/// the signal happened to break (a killed `pg_basebackup` has no message of its own).
fn after_interrupt(e: anyhow::Error, interrupted: bool) -> anyhow::Error {
    match interrupted {
        true => anyhow::anyhow!("interrupted; the demo's clusters and lab are taken down"),
        false => e,
    }
}

fn story(quick: bool, force_loopback: bool) -> Result<()> {
    let started = Instant::now();
    let mut cluster = start(force_loopback)?;
    let layout = cluster.layout();
    if layout.lab {
        println!(
            "== cluster: lab (network namespaces, 1 Gbit/s links, TCP congestion control {})",
            crate::fabric::congestion::describe()
        );
    } else {
        println!("== cluster: loopback");
    }
    println!("   refract on {}, backends {}\n", layout.refract_addr(), backend_list(layout));
    routing(layout)?;
    short_sweep(layout, quick)?;
    postgres(&mut cluster)?;
    drop(cluster);
    println!("demo finished in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// The PostgreSQL section in the lab, in the HTTP cluster's place (one cluster runs at a
/// time); elsewhere, or without PostgreSQL, one line saying why not. Its cluster is stopped
/// before the lab goes down, however the section ends.
fn postgres(cluster: &mut Cluster) -> Result<()> {
    let guard = match cluster {
        Cluster::Lab(g) => Some(g),
        Cluster::Loopback(..) => None,
    };
    let owns_cluster = guard.as_ref().is_some_and(|g| g.owns_cluster());
    if let Some(why) = postgres_skipped(guard.is_some(), pg::unavailable, owns_cluster) {
        println!("== PostgreSQL: skipped{why}\n");
        return Ok(());
    }
    interrupt::check()?;
    if let Some(g) = guard {
        g.stop_cluster();
    }
    let exe = std::env::current_exe().context("locating the refract binary")?;
    println!("{}", postgres_section(&exe)?);
    Ok(())
}

/// Why the demo skips its PostgreSQL line, if it does: on loopback (no hosts to hand over
/// between), a program missing (`missing` says which), or a lab whose HTTP cluster the demo
/// found running (it is left as found, not replaced).
fn postgres_skipped(lab: bool, missing: impl FnOnce() -> Option<String>, owns_cluster: bool) -> Option<String> {
    if !lab {
        return Some(" on loopback: its story is the hand-over between the lab's hosts".into());
    }
    if let Some(why) = missing() {
        return Some(format!(": {why}"));
    }
    (!owns_cluster).then(|| {
        ": the lab's HTTP cluster was already running and is left as found (`sudo refract lab down` \
         first, or `sudo refract bench pg-large`)"
            .into()
    })
}

/// In the lab's fabric, without a cluster: the PostgreSQL cluster up (`refract_bin` as its
/// agents and dispatchers), the fetches, the cluster stopped (also on failure); the section.
pub fn postgres_section(refract_bin: &std::path::Path) -> Result<String> {
    let cluster = pg::PgCluster::start(refract_bin)?;
    let story = pg::measure(&cluster)?;
    drop(cluster);
    Ok(story.render())
}

/// Why the lab cannot be built here, if it cannot: not root, no `ip`/`tc`, no namespaces.
fn lab_unavailable() -> Option<String> {
    if !sh::is_root() {
        return Some("not root: the lab builds network namespaces, veth links and tc shaping, which need root".into());
    }
    for tool in ["ip", "tc"] {
        if !sh::have(tool) {
            return Some(format!("`{tool}` is not installed (Debian: iproute2)"));
        }
    }
    if !std::path::Path::new("/proc/self/ns/net").exists() {
        return Some("this kernel has no network namespaces".into());
    }
    None
}

fn backend_list(layout: &Layout) -> String {
    let v: Vec<String> =
        layout.config().backends.iter().map(|b| format!("{} {} ({})", b.name, b.addr, b.role)).collect();
    v.join(", ")
}

/// The lab when we may build it, loopback otherwise (or when the lab fails to come up), saying
/// why and what to run instead.
fn start(force_loopback: bool) -> Result<Cluster> {
    if !force_loopback {
        match lab_unavailable() {
            None => match LabGuard::ensure(Rate::BitsPerSec(1_000_000_000)) {
                Ok(g) => return Ok(Cluster::Lab(g)),
                Err(e) => eprintln!(
                    "the lab did not come up ({e:#}).\nRunning the demo on loopback instead: relay vs HAProxy only, \
                     no hand-over (it needs the lab's separate hosts). `sudo refract lab up` shows the lab's own error; \
                     `sudo refract lab down` clears a partial lab."
                ),
            },
            Some(why) => eprintln!(
                "{why}.\nRunning the demo on loopback instead: relay vs HAProxy only, no hand-over (it needs the \
                 lab's separate hosts). For the paper's story run `sudo make demo`."
            ),
        }
    }
    interrupt::check()?;
    let layout = Layout::loopback(std::path::Path::new(haproxy::BINARY).exists())?;
    cluster::stop(&layout);
    eprintln!(
        "starting blob servers, refract{} on 127.0.0.1…",
        if layout.haproxy.is_some() { " and haproxy" } else { "" }
    );
    let running = cluster::start(&layout)?;
    Ok(Cluster::Loopback(layout, running))
}

/// A backend's `GET /stats`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
pub struct Stats {
    /// Reads served.
    #[serde(default)]
    pub reads: u64,
    /// Writes served.
    #[serde(default)]
    pub writes: u64,
    /// Table loads served.
    #[serde(default)]
    pub loads: u64,
}

fn stats(client: &Client, layout: &Layout) -> Result<Vec<Stats>> {
    layout
        .backends
        .iter()
        .map(|(name, addr)| {
            let r = client.get(addr, "/stats")?;
            serde_json::from_str(&r.body).with_context(|| format!("{name} /stats: {:?}", r.body))
        })
        .collect()
}

/// Send reads, writes and a table load through refract; show where each went.
fn routing(layout: &Layout) -> Result<()> {
    let client = layout.client();
    let refract = layout.refract_addr();
    let before = stats(&client, layout)?;
    let mut failures = 0;
    for _ in 0..30 {
        failures += u32::from(client.get(&refract, "/blob?bytes=64")?.status != 200);
    }
    for i in 0..10 {
        let body = format!("demo write {i}");
        failures += u32::from(client.post(&refract, "/blob", "application/octet-stream", &body)?.status != 200);
    }
    let form = format!("query={}", form_encode(TABLE_LOAD));
    failures += u32::from(client.post(&refract, "/query", "application/x-www-form-urlencoded", &form)?.status != 200);
    interrupt::check()?;
    let after = stats(&client, layout)?;
    println!(
        "== routing: 30 reads (GET /blob?bytes=64), 10 writes (POST /blob), 1 TableLoad (POST /query) via refract\n"
    );
    println!("{}", stats_table(layout, &before, &after));
    println!("expected: reads spread over the backends that serve reads, writes only on the primary, the table load on every backend.\n");
    if failures > 0 {
        bail!("{failures} of 41 requests did not get 200");
    }
    Ok(())
}

/// The per-backend counters (differences over the demo's requests) as a markdown table.
pub fn stats_table(layout: &Layout, before: &[Stats], after: &[Stats]) -> String {
    let mut s = String::from("| backend | role | reads | writes | loads |\n|---|---|---:|---:|---:|\n");
    for ((b, x), y) in layout.config().backends.iter().zip(before).zip(after) {
        let d = |f: fn(&Stats) -> u64| f(y).saturating_sub(f(x));
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            b.name,
            b.role,
            d(|s| s.reads),
            d(|s| s.writes),
            d(|s| s.loads)
        ));
    }
    s
}

/// `application/x-www-form-urlencoded` encoding of a value.
pub fn form_encode(v: &str) -> String {
    let mut out = String::new();
    for b in v.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => out.push(b as char),
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The demo's sizes: the paper's small and large ends.
const LAB_SIZES: &str = "1,4K,1M,16M";
/// Where the demo's plot goes (relative to the working directory, `make demo` runs at the root).
pub const PLOT: &str = "target/demo.png";

/// The paper's story in the lab: relay vs hybrid vs HAProxy on the shaped links, the hand-over
/// counters and a PNG; on loopback a short relay vs HAProxy sweep.
fn short_sweep(layout: &Layout, quick: bool) -> Result<()> {
    let plan = sweep_plan(layout, quick)?;
    println!(
        "== sweep: {} clients at once, each `wrk -t1 -c1`, {} s per measurement, sizes {} (the full \
         paper: `sudo refract bench paper`)\n",
        layout.clients.len(),
        plan.duration.as_secs_f64(),
        plan.sizes.iter().map(ByteSize::to_string).collect::<Vec<_>>().join(", ")
    );
    let results = sweep::run(layout, &plan)?;
    let env = Environment::default();
    let shaping = if layout.lab { "1 Gbit/s tbf on every link" } else { "" };
    let section = Section {
        name: "demo",
        shaping,
        duration_s: plan.duration.as_secs_f64(),
        repeat: 1,
        command: "",
        env: &env,
        sizes: &plan.sizes,
        targets: &plan.targets,
        results: &results,
        plot: None,
        haproxy: false,
        refract_sources: &[],
        targets_note: "",
    };
    println!("{}", report::tables(&section));
    if let Some(line) = hybrid_line(&results, &plan.sizes) {
        println!("{line}\n");
    }
    if layout.lab {
        let path = std::path::Path::new(PLOT);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        plot::draw(path, "refract demo: relay, hybrid, HAProxy at 1 Gbit/s", &results, &plan.targets, &plan.sizes)?;
        println!("plot: {}\n", path.display());
    }
    Ok(())
}

/// In the lab: relay, hybrid, HAProxy at the paper's ends, 2 s each. On loopback (no
/// hand-over across hosts): the relay and HAProxy against direct.
fn sweep_plan(layout: &Layout, quick: bool) -> Result<Plan> {
    let (sizes, targets): (&str, &[&str]) = match (layout.lab, quick) {
        (true, false) => (LAB_SIZES, &["refract", "hybrid", "haproxy"]),
        (true, true) => ("4K,16M", &["refract", "hybrid"]),
        (false, false) => ("1,4K,64K,1M,16M", &["direct", "refract", "haproxy"]),
        (false, true) => ("64,64K,1M", &["direct", "refract", "haproxy"]),
    };
    let targets =
        targets.iter().filter(|t| **t != "haproxy" || layout.haproxy.is_some()).map(|t| t.to_string()).collect();
    Ok(Plan {
        sizes: ByteSize::parse_list(sizes)?,
        targets,
        duration: Duration::from_secs(if layout.lab { 2 } else { 1 }),
        latency: false,
        repeat: 1,
    })
}

/// "hybrid / relay at 16 MiB: 1.97×" for the largest size both were measured at.
pub fn hybrid_line(results: &Results, sizes: &[ByteSize]) -> Option<String> {
    let size = *sizes.iter().rev().find(|s| results.cell(**s, "hybrid").is_some())?;
    let relay = results.cell(size, "refract")?.throughput();
    let hybrid = results.cell(size, "hybrid")?.throughput();
    Some(format!(
        "hybrid / relay at {}: {:.2}× (the relay carries every byte over the dispatcher's one \
         link; the hybrid hands large results to the agents, which send them over the backends' \
         own links)",
        size.human(),
        hybrid / relay
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_load_form() {
        let f = form_encode(TABLE_LOAD);
        assert!(f.starts_with("%7B%22operators%22%3A%7B%220%22"), "{f}");
        assert_eq!(form_encode("a b/c"), "a+b%2Fc");
    }

    #[test]
    fn stats_parse_and_table() {
        let s: Stats = serde_json::from_str(r#"{"name":"b1","reads":3,"writes":1,"loads":0}"#).expect("json");
        assert_eq!(s, Stats { reads: 3, writes: 1, loads: 0 });
        let layout = Layout::lab().expect("lab");
        let after = [Stats { reads: 15, writes: 10, loads: 1 }, Stats { reads: 15, writes: 0, loads: 1 }];
        let t = stats_table(&layout, &[Stats::default(); 2], &after);
        assert!(t.contains("| b1 | primary | 15 | 10 | 1 |"), "{t}");
        assert!(t.contains("| b2 | replica | 15 | 0 | 1 |"), "{t}");
    }

    #[test]
    fn the_lab_demo_runs_relay_hybrid_and_haproxy_at_the_papers_ends() {
        let layout = Layout::lab().expect("lab");
        let plan = sweep_plan(&layout, false).expect("plan");
        assert_eq!(plan.targets, ["refract", "hybrid", "haproxy"]);
        let sizes: Vec<String> = plan.sizes.iter().map(ByteSize::to_string).collect();
        assert_eq!(sizes.join(","), "1,4K,1M,16M");
        for t in &plan.targets {
            assert!(layout.target_addrs(t).is_some(), "the lab has target {t}");
        }
    }

    #[test]
    fn the_postgres_line_is_skipped_on_loopback_without_postgres_or_in_a_lab_found_running() {
        let none = || None;
        assert_eq!(postgres_skipped(true, none, true), None);
        let loopback = postgres_skipped(false, none, false).expect("skipped on loopback");
        assert!(loopback.starts_with(" on loopback: "), "{loopback}");
        let missing = postgres_skipped(true, || Some("PostgreSQL's `initdb` is not installed".into()), true);
        assert_eq!(missing.as_deref(), Some(": PostgreSQL's `initdb` is not installed"));
        let found = postgres_skipped(true, none, false).expect("a running cluster is left alone");
        assert!(found.contains("already running and is left as found"), "{found}");
    }

    #[test]
    fn after_ctrl_c_the_error_says_interrupted() {
        let e = || anyhow::anyhow!("pg_basebackup of pg-b1 for pg-b2");
        assert_eq!(after_interrupt(e(), false).to_string(), "pg_basebackup of pg-b1 for pg-b2");
        assert!(after_interrupt(e(), true).to_string().starts_with("interrupted; "));
    }

    #[test]
    fn the_hybrid_line_gives_the_ratio_at_the_largest_size() {
        use crate::bench::sweep::run::Measurement;
        let m = |target: &str, size: u64, rps: f64| Measurement::for_test(target, ByteSize(size), rps);
        // 100 requests per client: the cell's throughput is rps × size.
        let results = Results {
            throughput: vec![
                m("refract", 4096, 100.0),
                m("hybrid", 4096, 100.0),
                m("refract", 1 << 24, 7.0),
                m("hybrid", 1 << 24, 14.0),
            ],
            ..Results::default()
        };
        let line = hybrid_line(&results, &[ByteSize(4096), ByteSize(1 << 24)]).expect("line");
        assert!(line.starts_with("hybrid / relay at 16 MiB: 2.00×"), "{line}");
        assert!(hybrid_line(&Results::default(), &[ByteSize(4096)]).is_none());
    }
}
