//! `refract demo`: the main job end to end — a cluster (the lab when root, loopback otherwise),
//! routing shown by each backend's counters, then a short sweep printed as a table.

use crate::cluster::{self, Running};
use crate::http_client::Client;
use crate::lab::LabGuard;
use crate::layout::Layout;
use crate::report::{self, Section};
use crate::sweep::{self, Plan};
use crate::units::{ByteSize, Rate};
use crate::{environment::Environment, haproxy, interrupt, sh};
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
    let started = Instant::now();
    let cluster = start(force_loopback)?;
    let layout = cluster.layout();
    println!("== cluster: {}", if layout.lab { "lab (network namespaces, 1 Gbit/s links)" } else { "loopback" });
    println!("   refract on {}, backends {}\n", layout.refract_addr(), backend_list(layout));
    routing(layout)?;
    short_sweep(layout, quick)?;
    drop(cluster);
    println!("demo finished in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn backend_list(layout: &Layout) -> String {
    let v: Vec<String> =
        layout.config().backends.iter().map(|b| format!("{} {} ({})", b.name, b.addr, b.role)).collect();
    v.join(", ")
}

/// The lab when we may build it, loopback otherwise (or when the lab fails to come up).
fn start(force_loopback: bool) -> Result<Cluster> {
    if !force_loopback && sh::is_root() && sh::have("ip") {
        match LabGuard::ensure(Rate::BitsPerSec(1_000_000_000)) {
            Ok(g) => return Ok(Cluster::Lab(g)),
            Err(e) => eprintln!("the lab did not come up ({e:#}); using loopback instead"),
        }
    } else if !force_loopback {
        eprintln!("not root: running the demo on loopback (127.0.0.1) instead of the lab");
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

/// A few sizes, about a second each, printed as Table 1 and 2.
fn short_sweep(layout: &Layout, quick: bool) -> Result<()> {
    let sizes = if quick { "64,64K,1M" } else { "1,4K,64K,1M,16M" };
    let mut targets = vec!["direct".to_string(), "refract".to_string()];
    if layout.haproxy.is_some() {
        targets.push("haproxy".into());
    }
    let plan = Plan {
        sizes: ByteSize::parse_list(sizes)?,
        targets,
        duration: Duration::from_secs(1),
        latency: !quick,
        repeat: 1,
    };
    println!(
        "== short sweep: {} clients × wrk -t1 -c1, 1 s per measurement (full sweep: `refract bench sweep`)\n",
        layout.clients.len()
    );
    let results = sweep::run(layout, &plan)?;
    let env = Environment::default();
    let section = Section {
        name: "demo",
        shaping: "",
        duration_s: 1.0,
        repeat: 1,
        command: "",
        env: &env,
        sizes: &plan.sizes,
        targets: &plan.targets,
        results: &results,
        plot: None,
        haproxy_cfg: None,
        refract_cfgs: &[],
        targets_note: "",
    };
    println!("{}", report::tables(&section));
    Ok(())
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
}
