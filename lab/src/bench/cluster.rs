//! `refract bench cluster`: several dispatchers behind one address ([`crate::multi`]). In the
//! lab with two dispatcher hosts behind rf-r's ECMP route, large results (16 MiB) on 4 client
//! connections (2 from each client host, `bench streams`, source ports chosen so that rf-r
//! gives each dispatcher it routes to the same number): relay-only through one dispatcher
//! (rf-r routes the VIP to d1 only), relay-only through both, hybrid through both, taking
//! turns in each repeat; every run records the requests each dispatcher served (its
//! `/metrics`). Then a dispatcher killed under hybrid streams ([`failover`]) and 100
//! PostgreSQL cancels ([`cancels`]). Writes section `cluster:RATE` of docs/benchmarks.md.

pub mod cancels;

use crate::bench::streams::ConnResult;
use crate::cluster::http_client::Client;
use crate::fabric::topology::{Host, B1, B2, C1, C2, VIP};
use crate::lab::LabGuard;
use crate::multi::{self, Kind, Node, DISPATCHERS};
use crate::report::environment::Environment;
use crate::support::interrupt;
use crate::support::sh;
use crate::support::units::{parse_duration, sig3, ByteSize, Rate};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::fmt::Write;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Options of `bench cluster`.
#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// Link rate (`1gbit`, …).
    #[arg(long, default_value = "1gbit", value_parser = Rate::parse)]
    rate: Rate,
    /// Result size (K = 1024).
    #[arg(long, default_value = "16M", value_parser = ByteSize::parse)]
    size: ByteSize,
    /// Connections per client host (two client hosts).
    #[arg(long, default_value_t = 2)]
    per_client: usize,
    /// Duration of each run.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    duration: Duration,
    /// Repeats (each runs every target once, in turn).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// PostgreSQL clients (half in each client host) that each cancel a `pg_sleep(10)` through
    /// the VIP, after the HTTP runs (0: none).
    #[arg(long, default_value_t = 100)]
    cancels: usize,
    /// The markdown page; section `cluster:RATE` is (re)written.
    #[arg(long, default_value = "docs/benchmarks.md")]
    out: PathBuf,
}

/// A target: its name, the dispatcher hosts rf-r routes to, the kind of dispatcher.
struct Target {
    name: &'static str,
    hosts: usize,
    kind: Kind,
}

/// The dispatchers' kinds ([`multi::HTTP_KINDS`]).
const RELAY: Kind = multi::HTTP_KINDS[0];
const HYBRID: Kind = multi::HTTP_KINDS[1];

const TARGETS: [Target; 3] = [
    Target { name: "relay, 1 dispatcher", hosts: 1, kind: RELAY },
    Target { name: "relay, 2 dispatchers", hosts: 2, kind: RELAY },
    Target { name: "hybrid, 2 dispatchers", hosts: 2, kind: HYBRID },
];

/// One run of one target.
struct Run {
    target: usize,
    /// Payload bytes per second, all connections.
    throughput: f64,
    /// Requests each dispatcher host served during the run.
    split: Vec<u64>,
    errors: u64,
}

/// Runs the benchmark and writes its section.
pub fn run(a: &ClusterArgs) -> Result<()> {
    let mut guard = LabGuard::ensure(a.rate)?;
    let was_up = multi::is_up();
    let exe = std::env::current_exe().context("locating the refract binary")?;
    multi::up(DISPATCHERS.len(), a.rate, &exe)?;
    let result = measure(a, &exe).and_then(|runs| Ok((runs, failover(a.rate, &exe)?))).and_then(|(runs, f)| {
        let cancelled = if a.cancels > 0 { Some(pg_cancels(&mut guard, a, &exe)?) } else { None };
        Ok((runs, f, cancelled))
    });
    if !was_up {
        multi::down();
    } else {
        let _ = multi::route(&DISPATCHERS);
    }
    drop(guard);
    let (runs, failover, cancelled) = result?;
    let mut body = render(a, &runs);
    body += &render_failover(&failover);
    if let Some(c) = &cancelled {
        body += &render_cancels(c);
    }
    crate::report::write_marked(&a.out, "cluster", &a.rate.label(), &body)?;
    eprintln!("wrote section cluster:{} of {}", a.rate.label(), a.out.display());
    print!("{body}");
    Ok(())
}

fn measure(a: &ClusterArgs, exe: &std::path::Path) -> Result<Vec<Run>> {
    let probe = Client::Curl(C1.ns());
    let mut runs = vec![];
    for rep in 0..a.repeat {
        for (i, t) in TARGETS.iter().enumerate() {
            interrupt::check()?;
            multi::route(&DISPATCHERS[..t.hosts])?;
            let nodes = multi::nodes_of(DISPATCHERS.len(), &[t.kind]);
            let before: Vec<u64> = nodes.iter().map(|n| requests(&probe, n)).collect();
            let port = t.kind.port;
            let mut children = vec![];
            for c in [C1, C2] {
                // Ports rf-r spreads evenly over the dispatchers it routes to (one each, or all
                // on d1): the split is the dispatchers', not the hash's luck with 4 connections.
                let per_hop = a.per_client / t.hosts;
                let from = 42000 + (rep * TARGETS.len() + i) as u16 * 40;
                let ports = multi::ports_per_hop(&c, port, per_hop, from)?;
                let spec = streams_args(&c, port, &ports, a.duration, &[a.size], 1);
                children.push(spawn_streams(exe, &c, &spec)?);
            }
            let mut results = vec![];
            for child in children {
                results.extend(collect(child)?);
            }
            let after: Vec<u64> = nodes.iter().map(|n| requests(&probe, n)).collect();
            let run = Run {
                target: i,
                throughput: results.iter().map(|r| r.bytes as f64 / r.seconds.max(1e-3)).sum(),
                split: after.iter().zip(&before).map(|(a, b)| a.saturating_sub(*b)).collect(),
                errors: results.iter().filter(|r| r.error.is_some()).count() as u64,
            };
            eprintln!(
                "[cluster] run {}/{} {:<22} {:>7} MB/s, requests per dispatcher {:?}",
                rep + 1,
                a.repeat,
                t.name,
                sig3(run.throughput / 1e6),
                run.split
            );
            runs.push(run);
        }
    }
    Ok(runs)
}

/// `refract bench streams` arguments for `ports` from client host `c` to VIP:`port`.
fn streams_args(
    c: &Host,
    port: u16,
    ports: &[(u16, Host)],
    duration: Duration,
    sizes: &[ByteSize],
    pipeline: usize,
) -> Vec<String> {
    let ports: Vec<String> = ports.iter().map(|(p, _)| p.to_string()).collect();
    let sizes: Vec<String> = sizes.iter().map(|s| s.0.to_string()).collect();
    vec![
        "bench".into(),
        "streams".into(),
        "--target".into(),
        format!("{VIP}:{port}"),
        "--source".into(),
        c.addr.into(),
        "--ports".into(),
        ports.join(","),
        "--duration".into(),
        format!("{}ms", duration.as_millis()),
        "--sizes".into(),
        sizes.join(","),
        "--pipeline".into(),
        pipeline.to_string(),
    ]
}

fn spawn_streams(exe: &std::path::Path, c: &Host, args: &[String]) -> Result<std::process::Child> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cmd = sh::cmd(Some(&c.ns()), &exe.to_string_lossy(), &args);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().with_context(|| format!("cannot start `{}`", sh::show(&cmd)))
}

/// The result lines of a `bench streams` run.
fn collect(child: std::process::Child) -> Result<Vec<ConnResult>> {
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("bench streams failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}

/// What the failover run found.
pub struct Failover {
    /// Per connection: its client host, the dispatcher host rf-r sent it to, its outcome.
    pub conns: Vec<(Host, Host, ConnResult)>,
    /// Milliseconds from the run's start to the kill's (the withdrawal's) start.
    pub killed_at_ms: u64,
    /// Per client host: how long after the kill a new connection first got a response.
    pub new_connection_ms: Vec<Option<u64>>,
    /// Hash-map entries left on each host after the run (`None`: bpftool could not tell).
    pub left: Vec<(Host, Option<usize>)>,
}

/// Hybrid streams (pipelined, mixed sizes, every byte checked) from both client hosts through
/// both dispatchers; d2 killed (and withdrawn from rf-r) in the middle; d2 started again after.
/// Needs the lab with `--dispatchers 2` up (`exe`: the refract binary).
pub fn failover(rate: Rate, exe: &std::path::Path) -> Result<Failover> {
    multi::route(&DISPATCHERS)?;
    multi::up(DISPATCHERS.len(), rate, exe)?; // d2 back if an earlier run killed it
    let sizes = [ByteSize(1024), ByteSize(64 * 1024), ByteSize(1 << 20), ByteSize(4 << 20)];
    let duration = Duration::from_secs(8);
    let mut children = vec![];
    let mut hops = vec![];
    for c in [C1, C2] {
        let ports = multi::ports_per_hop(&c, HYBRID.port, 2, 43000)?;
        hops.extend(ports.iter().map(|(p, h)| (c, *p, *h)));
        children.push(spawn_streams(exe, &c, &streams_args(&c, HYBRID.port, &ports, duration, &sizes, 2))?);
    }
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    // From when the kill begins: the route is withdrawn first, and d2's clients are reset by
    // d1 as soon as their next segment arrives there, before the SIGKILL is sent.
    let killed_at_ms = started.elapsed().as_millis() as u64;
    let killed = Instant::now();
    multi::kill_dispatcher(DISPATCHERS[1].name)?;
    let mut new_connection_ms = vec![];
    for c in [C1, C2] {
        let probe = Client::Curl(c.ns());
        let mut ok = None;
        while killed.elapsed() < Duration::from_secs(10) {
            if probe.get(&format!("{VIP}:{}", HYBRID.port), "/blob?bytes=1").is_ok_and(|r| r.status == 200) {
                ok = Some(killed.elapsed().as_millis() as u64);
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        new_connection_ms.push(ok);
    }
    let mut conns = vec![];
    for (c, child) in [C1, C2].into_iter().zip(children) {
        for r in collect(child)? {
            if let Some((_, _, h)) = hops.iter().find(|(hc, p, _)| *hc == c && *p == r.port) {
                conns.push((c, *h, r));
            }
        }
    }
    std::thread::sleep(Duration::from_secs(2)); // the agents' tombstone grace
    let left = [DISPATCHERS[0], B1, B2].iter().map(|h| (*h, multi::flow_entries(h))).collect();
    multi::up(DISPATCHERS.len(), rate, exe)?;
    Ok(Failover { conns, killed_at_ms, new_connection_ms, left })
}

/// Requests a dispatcher has forwarded (`refract_requests_total`, every label).
fn requests(probe: &Client, n: &Node) -> u64 {
    let text = probe.get(&n.admin(), "/metrics").map(|r| r.body).unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("refract_requests_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn render(a: &ClusterArgs, runs: &[Run]) -> String {
    let env = Environment::detect();
    let mut out = String::new();
    let _ = writeln!(out, "## Several dispatchers behind one address `{}`\n", a.rate.label());
    let _ = writeln!(
        out,
        "Two dispatcher hosts (rf-d1, rf-d2, the VIP on `lo`) behind router rf-r's ECMP route to the \
         VIP (5-tuple hash); {} results, {} client connections ({} per client host, each a \
         `refract bench streams` connection asking for one result at a time, its source port \
         chosen so that rf-r's hash gives each dispatcher it routes to the same number; every \
         byte checked), {:?} per run, links shaped at {}; the targets take turns in each of {} \
         repeats. `relay, 1 dispatcher` is the same setup with rf-r routing the VIP to d1 only. \
         Requests per dispatcher are read from each one's `/metrics`. Every link, the two client \
         hosts' and the two backend hosts' included, has the same rate each way: relay through \
         two dispatchers and hybrid (answers from the backend hosts straight to the clients) \
         both meet the clients' two links, so hybrid cannot double relay here as it does \
         through one dispatcher. {}, {} cores, \
         kernel {}, {}; {}.\n",
        a.size.human(),
        2 * a.per_client,
        a.per_client,
        a.duration,
        a.rate.label(),
        a.repeat,
        env.cpu,
        env.cores,
        env.kernel,
        env.refract,
        env.date
    );
    let _ = writeln!(
        out,
        "Rerun: `sudo refract bench cluster --rate {} --size {} --per-client {} --duration {}s --repeat {} \
         --cancels {}`\n",
        a.rate.label(),
        a.size.0,
        a.per_client,
        a.duration.as_secs(),
        a.repeat,
        a.cancels
    );
    let _ = writeln!(out, "| target | median MB/s | runs (MB/s; requests on d1 / d2) | errors |");
    let _ = writeln!(out, "|---|---:|---|---:|");
    let mut medians = vec![];
    for (i, t) in TARGETS.iter().enumerate() {
        let mine: Vec<&Run> = runs.iter().filter(|r| r.target == i).collect();
        let m = median(mine.iter().map(|r| r.throughput).collect());
        medians.push(m);
        let each: Vec<String> = mine
            .iter()
            .map(|r| {
                let split: Vec<String> = r.split.iter().map(u64::to_string).collect();
                format!("{} ({})", sig3(r.throughput / 1e6), split.join(" / "))
            })
            .collect();
        let errors: u64 = mine.iter().map(|r| r.errors).sum();
        let _ = writeln!(out, "| {} | {} | {} | {errors} |", t.name, sig3(m / 1e6), each.join(", "));
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Medians: two dispatchers / one, relay: **{}**; hybrid / relay, two dispatchers: **{}**.",
        crate::report::ratio(medians[1], medians[0]),
        crate::report::ratio(medians[2], medians[1])
    );
    out
}

fn render_failover(f: &Failover) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n### A dispatcher killed\n\nHybrid (VIP:{}), 8 connections (4 per client host, 2 of them \
         through each dispatcher), each keeping 2 requests in flight for 1 KiB, 64 KiB, 1 MiB and \
         4 MiB blobs in turn for 8 s, every byte checked; `lab kill-dispatcher d2` (SIGKILL, its \
         next hop withdrawn from rf-r) after {} ms.\n",
        HYBRID.port, f.killed_at_ms
    );
    let _ = writeln!(out, "| connection | dispatcher | responses | MiB | ended |");
    let _ = writeln!(out, "|---|---|---:|---:|---|");
    for (c, h, r) in &f.conns {
        let ended = match (&r.error, r.error_after_ms) {
            (Some(e), Some(ms)) => format!("{e}, {} ms after the kill", ms as i64 - f.killed_at_ms as i64),
            (Some(e), None) => e.clone(),
            (None, _) => "no error".into(),
        };
        let mib = r.bytes as f64 / 1048576.0;
        let _ = writeln!(out, "| {}:{} | {} | {} | {mib:.0} | {ended} |", c.name, r.port, h.name, r.responses);
    }
    let news: Vec<String> = f
        .new_connection_ms
        .iter()
        .zip(["c1", "c2"])
        .map(|(ms, c)| match ms {
            Some(ms) => format!("{c} {ms} ms"),
            None => format!("{c} none within 10 s"),
        })
        .collect();
    let left: Vec<String> = f
        .left
        .iter()
        .map(|(h, n)| format!("{} {}", h.name, n.map_or("unknown (no bpftool)".into(), |n| n.to_string())))
        .collect();
    let _ = writeln!(
        out,
        "\nA new connection answered after the kill: {}. Flow entries (steering, tombstones) left \
         2 s after the run: {}.",
        news.join(", "),
        left.join(", ")
    );
    out
}

/// The PostgreSQL cluster in place of the HTTP one, its dispatchers on both hosts, and the
/// cancels through the VIP's hybrid port.
fn pg_cancels(guard: &mut LabGuard, a: &ClusterArgs, exe: &std::path::Path) -> Result<Vec<cancels::Cancelled>> {
    guard.stop_cluster();
    multi::stop_nodes(&multi::HTTP_KINDS);
    multi::clients_direct(); // the PostgreSQL cluster's readiness is probed on rf-d, as always
    crate::pglab::start(exe)?;
    let result = multi::up_kinds(DISPATCHERS.len(), &multi::PG_KINDS, a.rate, exe)
        .and_then(|()| cancels::run(6432, a.cancels.div_ceil(2)));
    multi::stop_nodes(&multi::PG_KINDS);
    crate::pglab::stop();
    result
}

fn render_cancels(c: &[cancels::Cancelled]) -> String {
    let mut out = String::new();
    let took: Vec<f64> = c.iter().filter(|x| x.code.as_deref() == Some("57014")).filter_map(|x| x.seconds).collect();
    let within = took.iter().filter(|s| **s <= 1.0).count();
    let _ = writeln!(
        out,
        "\n### PostgreSQL cancels through either dispatcher\n\n{} psycopg2 clients (half in each client \
         host) each run `SELECT pg_sleep(10)` through VIP:6432 (refract hybrid on both dispatcher \
         hosts, `[cluster] cancel_listen`, `pool_size = {}`) and cancel it after 0.5 s with \
         `connection.cancel()`, whose CancelRequest rf-r hashes to either dispatcher. \
         **{within} / {}** cancels took effect (`57014`) within 1 s; median {} ms, slowest {} ms.",
        c.len(),
        multi::PG_POOL_SIZE,
        c.len(),
        sig3(median(took.clone()) * 1000.0),
        sig3(took.iter().copied().fold(0.0, f64::max) * 1000.0)
    );
    let others: Vec<String> = c
        .iter()
        .filter(|x| x.code.as_deref() != Some("57014"))
        .map(|x| {
            format!(
                "{} {}",
                x.code.as_deref().unwrap_or("-"),
                x.message.as_deref().or(x.error.as_deref()).unwrap_or("")
            )
        })
        .collect();
    if !others.is_empty() {
        let _ = writeln!(out, "Not cancelled: {}.", others.join("; "));
    }
    out
}
