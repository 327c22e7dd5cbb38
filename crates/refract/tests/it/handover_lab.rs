//! The cross-host hand-over in a four-namespace lab (root only): client `c`, dispatcher `d`
//! (owns the VIP, steers from its eth0 ingress), agent host `a` (VIP on lo, guard, blob server
//! b2) on one bridge `sw`. Reads are handed to the agent with TCP_REPAIR (`mode = "always"`),
//! answered by direct server return and handed back; a write in between is relayed by `d`.
//! Every body is checked against the blob pattern; no steering entry may be left (the
//! dispatcher's `refract_steering_entries` gauge, read from its admin /metrics at the end, is 0).
//! Namespaces are named `rf-*<pid>` and removed even when the test fails.
//!
//! The correctness run (`lab_correctness_*`): many keep-alive connections at once, random sizes,
//! pipelining, every body checked; CI-sized by default, the acceptance size through
//! `RF_LAB_CONNS`, `RF_LAB_REQUESTS`, `RF_LAB_MAX_BYTES` (examples/lab/README.md). Plus the two
//! "relay instead" cases: a full steering map and a flow that is not quiescent.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::{blob_get as get, check_blob as check};

use common::{Client, Proc, TOKEN};
use refract_blob::pattern;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const VIP: &str = "198.18.6.100";
const KEY: &str = "lab hand-over test key, 16+ bytes";
/// The dispatcher's admin port (on `d`'s loopback).
const ADMIN: u16 = 9090;

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
}

fn sh(cmd: &str) {
    let out = Command::new("sh").args(["-c", cmd]).output().unwrap();
    assert!(out.status.success(), "{cmd}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The lab's namespaces; removed on drop (processes in them are killed first by their `Proc`).
struct Lab {
    tag: String,
}

impl Lab {
    fn ns(&self, host: &str) -> String {
        format!("rf-{host}{}", self.tag)
    }

    fn up(variant: &str) -> Lab {
        let lab = Lab { tag: format!("{variant}{}", std::process::id()) };
        let (sw, t) = (lab.ns("sw"), &lab.tag);
        sh(&format!("ip netns add {sw} && ip -n {sw} link add br0 type bridge && ip -n {sw} link set br0 up"));
        for (host, ip) in [("c", "198.18.6.1"), ("d", "198.18.6.10"), ("a", "198.18.6.21")] {
            let ns = lab.ns(host);
            sh(&format!(
                "ip netns add {ns} && ip link add eth0 netns {ns} type veth peer name {host}{t} netns {sw} && \
                 ip -n {sw} link set {host}{t} master br0 up && ip -n {ns} link set lo up && \
                 ip -n {ns} addr add {ip}/24 dev eth0 && ip -n {ns} link set eth0 up"
            ));
        }
        let (d, a) = (lab.ns("d"), lab.ns("a"));
        sh(&format!("ip -n {d} addr add {VIP}/24 dev eth0"));
        sh(&format!("ip -n {a} addr add {VIP}/32 dev lo"));
        for iface in ["all", "eth0"] {
            sh(&format!("ip netns exec {a} sysctl -qw net.ipv4.conf.{iface}.arp_ignore=1"));
            sh(&format!("ip netns exec {a} sysctl -qw net.ipv4.conf.{iface}.arp_announce=2"));
        }
        lab
    }

    /// Starts the refract binary in `host`'s namespace and waits until `port` listens there.
    fn start(&self, host: &str, args: &[&str], port: u16) -> Proc {
        let ns = self.ns(host);
        let child = Command::new("ip")
            .args(["netns", "exec", &ns, common::bin()])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = Command::new("ip").args(["netns", "exec", &ns, "ss", "-ltnH"]).output().unwrap();
            if String::from_utf8_lossy(&out.stdout).contains(&format!(":{port} ")) {
                break;
            }
            assert!(Instant::now() < deadline, "{args:?} never listened on {port} in {ns}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Proc { child, addr: ([127, 0, 0, 1], port).into() }
    }
}

impl Lab {
    /// `GET /metrics` from the dispatcher's admin listener in `host`'s namespace.
    fn metrics(&self, host: &str) -> String {
        let req = format!(
            "exec 3<>/dev/tcp/127.0.0.1/{ADMIN} && \
             printf 'GET /metrics HTTP/1.1\\r\\nhost: d\\r\\nconnection: close\\r\\n\\r\\n' >&3 && cat <&3"
        );
        let out = Command::new("ip").args(["netns", "exec", &self.ns(host), "bash", "-c", &req]).output().unwrap();
        assert!(out.status.success(), "metrics: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for host in ["c", "d", "a", "sw"] {
            let _ = Command::new("ip").args(["netns", "del", &self.ns(host)]).status();
        }
    }
}

/// The client's side, run by this test binary inside `c`'s namespace.
fn client() {
    let mut c = Client::connect(format!("{VIP}:8080").parse().unwrap());
    c.stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    common::check_always_session(&mut c);
}

/// Negative control, run inside `c`: without STEER the client's ACKs reach the dispatcher's
/// stack, which has no socket for the flow any more and resets it.
fn client_without_steering() {
    let mut c = Client::connect(format!("{VIP}:8080").parse().unwrap());
    c.stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c.send(get(3 << 20, 5).as_bytes());
    let r = c.read_response(false);
    assert!(r.is_err(), "without steering the hand-over cannot work: {:?}", r.map(|r| r.head));
}

/// Run inside `c`: the agent (pid in `RF_AGENT_PID`) is killed while it streams to us; we see
/// the connection end (reset by the dispatcher's stack once it un-steers) within the bound, and
/// a new connection is served by relay.
fn client_agent_dies() {
    use std::io::Read;
    let mut c = Client::connect(format!("{VIP}:8080").parse().unwrap());
    c.stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.send(get(1 << 30, 5).as_bytes());
    let mut chunk = vec![0u8; 1 << 16];
    let n = c.stream.read(&mut chunk).unwrap();
    assert!(n > 0 && chunk.starts_with(b"HTTP/1.1 200"), "the agent is streaming");
    let pid = std::env::var("RF_AGENT_PID").unwrap();
    assert!(Command::new("kill").args(["-KILL", &pid]).status().unwrap().success());
    let killed = Instant::now();
    let mut got = n as u64;
    let end = loop {
        match c.stream.read(&mut chunk) {
            Ok(0) => break "eof",
            Ok(k) => got += k as u64,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break "reset",
            Err(e) => panic!("after {:?}: {e}", killed.elapsed()),
        }
    };
    let took = killed.elapsed();
    eprintln!("agent killed: the client saw {end} after {took:?} ({got} bytes)");
    assert!(got < (1 << 30), "the response was cut short ({got} bytes, {end})");
    assert!(took < Duration::from_millis(1500), "the client saw the end ({end}) after {took:?}");
    let mut other = Client::connect(format!("{VIP}:8080").parse().unwrap());
    other.stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    other.send(get(1 << 20, 2).as_bytes());
    check(&other.read_response(false).unwrap(), 1 << 20, 2, None);
}

#[test]
fn lab_agent_killed_mid_stream_resets_only_that_client() {
    if std::env::var_os("RF_LAB_CLIENT").is_some() {
        return client_agent_dies();
    }
    run_lab("lab_agent_killed_mid_stream_resets_only_that_client", true);
}

#[test]
fn lab_hand_over_with_steering_and_direct_return() {
    if std::env::var_os("RF_LAB_CLIENT").is_some() {
        return client();
    }
    run_lab("lab_hand_over_with_steering_and_direct_return", true);
}

#[test]
fn lab_negative_control_without_steering_the_client_is_reset() {
    if std::env::var_os("RF_LAB_CLIENT").is_some() {
        return client_without_steering();
    }
    run_lab("lab_negative_control_without_steering_the_client_is_reset", false);
}

/// The processes of one lab run: blob servers `b1` (on `d`, no agent) and `b2` (on `a`), the
/// agent in front of `b2`, the dispatcher; killed when dropped (before the namespaces go).
struct Cluster {
    agent: Proc,
    _procs: Vec<Proc>,
    _dir: tempfile::TempDir,
}

/// Starts the cluster with `handover` as the dispatcher's `[handover]` body (mode and options;
/// the agent and key are added here).
fn cluster(lab: &Lab, handover: &str) -> Cluster {
    cluster_with(lab, handover, false)
}

/// [`cluster`]; with `pass_socket`, the agent reaches `b2` over a Unix socket and passes it
/// the client socket for large results (`refract_http::defer`).
fn cluster_with(lab: &Lab, handover: &str, pass_socket: bool) -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let b1 = lab.start("d", &["blob-server", "--listen", "127.0.0.1:9001", "--name", "b1"], 9001);
    let socket = dir.path().join("b2.sock");
    let mut b2_args = vec!["blob-server", "--listen", "198.18.6.21:9002", "--name", "b2"];
    if pass_socket {
        b2_args.extend(["--unix", socket.to_str().unwrap()]);
    }
    let b2 = lab.start("a", &b2_args, 9002);
    let agent_cfg = dir.path().join("agent.toml");
    let mut text = format!(
        "backend = \"198.18.6.21:9002\"\ncontrol = \"198.18.6.21:9100\"\nvip = \"{VIP}\"\ninterface = \"eth0\"\nkey = \"{KEY}\"\n"
    );
    if pass_socket {
        text += &format!("backend_socket = \"{}\"\npass_socket = true\n", socket.display());
    }
    std::fs::write(&agent_cfg, text).unwrap();
    let agent = lab.start("a", &["agent", "--config", agent_cfg.to_str().unwrap()], 9100);
    let key_file = dir.path().join("control.key");
    std::fs::write(&key_file, KEY).unwrap();
    let cfg = dir.path().join("refract.toml");
    let text = format!(
        "[listen]\nhttp = \"{VIP}:8080\"\nadmin = \"127.0.0.1:{ADMIN}\"\nworkers = 1\n\
         [admin]\ntoken = \"{TOKEN}\"\n\
         [[backend]]\nname = \"b1\"\naddr = \"127.0.0.1:9001\"\nrole = \"primary\"\n\
         [[backend]]\nname = \"b2\"\naddr = \"198.18.6.21:9002\"\nrole = \"replica\"\n\
         [handover]\n{handover}key_file = \"{}\"\nagents = {{ b2 = \"198.18.6.21:9100\" }}\n",
        key_file.display()
    );
    std::fs::write(&cfg, text).unwrap();
    let d = lab.start("d", &["dispatch", "--config", cfg.to_str().unwrap()], 8080);
    Cluster { agent, _procs: vec![d, b1, b2], _dir: dir }
}

/// Runs this test binary's client side (`test`, with `RF_LAB_CLIENT` set) in `c`; its output.
fn run_client(lab: &Lab, test: &str, agent_pid: u32) -> String {
    let me = std::env::current_exe().unwrap();
    let out = Command::new("ip")
        .args(["netns", "exec", &lab.ns("c")])
        .arg(me)
        .args(["--exact", &format!("handover_lab::{test}"), "--nocapture", "--include-ignored"])
        .env("RF_LAB_CLIENT", "1")
        .env("RF_AGENT_PID", agent_pid.to_string())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("1 passed"), "client in rf-c:\n{text}");
    text
}

/// The dispatcher's metrics once no steering entry is left (or after 5 s; a flow the agent
/// closed stays steered for 1 s, for its retransmitted FINs).
fn settled_metrics(lab: &Lab) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = lab.metrics("d");
        if value(&text, "refract_steering_entries") == Some(0) || Instant::now() >= deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn run_lab(test: &str, steer: bool) {
    if !is_root() {
        let _ = writeln!(std::io::stderr(), "SKIP {test}: needs root");
        return;
    }
    let lab = Lab::up(&test[4..5]);
    // `idle_ms = 0`: the epochs `client` expects do not depend on how fast it sends its next request.
    let steering = if steer { "interface = \"eth0\"\n" } else { "" };
    let handover = format!("mode = \"always\"\nidle_ms = 0\n{steering}");
    let cluster = cluster(&lab, &handover);
    let text = run_client(&lab, test, cluster.agent.child.id());
    for line in text.lines().filter(|l| l.starts_with("agent killed")) {
        eprintln!("{line}");
    }
    let filters = Command::new("ip")
        .args(["netns", "exec", &lab.ns("d"), "tc", "filter", "show", "dev", "eth0", "ingress"])
        .output()
        .unwrap();
    let attached = String::from_utf8_lossy(&filters.stdout).contains("refract");
    assert_eq!(attached, steer, "steering attached on d only when configured");
    // The acceptance check "no map entries left", through the dispatcher's own gauge.
    let text = if steer { settled_metrics(&lab) } else { lab.metrics("d") };
    if steer {
        // The capacity gauge is set by the same scrape-time read as the entries: it ran.
        assert!(value(&text, "refract_steering_capacity") > Some(0), "{text}");
        assert_eq!(value(&text, "refract_steering_entries"), Some(0), "steering entries left:\n{text}");
        assert!(value(&text, r#"refract_handover_total{backend="b2",result="ok"}"#) >= Some(1), "{text}");
        assert!(value(&text, "refract_handover_frozen_seconds_count") >= Some(1), "{text}");
        if test.contains("killed") {
            let lost = value(&text, r#"refract_handover_ended_total{backend="b2",end="lost"}"#);
            assert_eq!(lost, Some(1), "{text}");
        } else {
            // 3 hand-overs, each acknowledged by the client through the steering; each came
            // back (the last may end as `closed` instead when the client leaves first).
            let back = value(&text, r#"refract_handback_total{backend="b2"}"#).unwrap_or(0);
            let closed = value(&text, r#"refract_handover_ended_total{backend="b2",end="closed"}"#).unwrap_or(0);
            assert_eq!(back + closed, 3, "{text}");
            assert!(value(&text, r#"refract_steering_packets_total{kind="steered"}"#) >= Some(1), "{text}");
            let direct = value(&text, r#"refract_bytes_direct_total{backend="b2"}"#).unwrap_or(0);
            assert!(direct > (3 << 20) + 1000 + 70_000 + (1 << 20), "{text}");
        }
    } else {
        let capacity = value(&text, "refract_steering_capacity");
        assert_eq!(capacity, Some(0), "no steering program attached:\n{text}");
    }
}

/// The value of `series` (name and labels exactly as rendered) in a metrics text.
fn value(text: &str, series: &str) -> Option<u64> {
    let v = text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))?;
    Some(v.trim().parse::<f64>().unwrap() as u64)
}

/// A setting from the environment (the acceptance-sized run), else the CI default.
fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// xorshift64*: reproducible sizes and seeds per connection, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % below.max(1)
    }
}

/// One keep-alive connection of the correctness run: `requests` reads of random sizes up to
/// `max` bytes, sent in pipelined batches of 1–4, every body checked against the pattern.
/// Returns the hand-overs it saw (distinct `x-refract-handover` epochs).
fn one_connection(i: u64, requests: u64, max: u64) -> u64 {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (i + 1));
    let mut c = Client::connect(format!("{VIP}:8080").parse().unwrap());
    c.stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut epochs = std::collections::HashSet::new();
    let mut done = 0;
    while done < requests {
        let depth = (1 + rng.next(4)).min(requests - done);
        let batch: Vec<(u64, u64)> = (0..depth).map(|_| (rng.next(max + 1), rng.next(251))).collect();
        c.send(batch.iter().map(|&(n, s)| get(n, s)).collect::<String>().as_bytes());
        for (n, seed) in batch {
            let r = c.read_response(false).unwrap_or_else(|e| panic!("connection {i}, request {done}: {e}"));
            assert_eq!((r.status, r.body.len() as u64), (200, n), "connection {i}: {}", r.head);
            assert_eq!(pattern::first_mismatch(&r.body, 0, seed), None, "connection {i}: body differs");
            epochs.extend(r.header("x-refract-handover"));
            done += 1;
        }
    }
    epochs.len() as u64
}

/// The correctness run's client side, inside `c`: every connection at once.
fn client_correctness() {
    let (conns, requests) = (setting("RF_LAB_CONNS", 20), setting("RF_LAB_REQUESTS", 20));
    let max = setting("RF_LAB_MAX_BYTES", 4 << 20);
    let threads: Vec<_> = (0..conns).map(|i| std::thread::spawn(move || one_connection(i, requests, max))).collect();
    let seen: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    eprintln!("correctness: {conns} connections x {requests} requests up to {max} B; hand-overs seen {seen}");
}

/// The correctness run in `mode` (the `[handover]` body without agents and key).
fn run_correctness(test: &str, variant: &str, handover: &str) {
    run_correctness_with(test, variant, handover, false);
}

/// [`run_correctness`]; `pass_socket` as in [`cluster_with`]. Then the blob server's `/stats`
/// must show bodies it wrote into passed sockets.
fn run_correctness_with(test: &str, variant: &str, handover: &str, pass_socket: bool) {
    if !is_root() {
        let _ = writeln!(std::io::stderr(), "SKIP {test}: needs root");
        return;
    }
    let lab = Lab::up(variant);
    let cluster = cluster_with(&lab, handover, pass_socket);
    let started = Instant::now();
    let text = run_client(&lab, test, cluster.agent.child.id());
    let line = text.lines().find(|l| l.starts_with("correctness:")).unwrap().to_string();
    eprintln!("{line} in {:.1?}", started.elapsed());
    let seen: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    let conns = setting("RF_LAB_CONNS", 20);
    let metrics = settled_metrics(&lab);
    let ok = value(&metrics, r#"refract_handover_total{backend="b2",result="ok"}"#).unwrap_or(0);
    assert!(seen >= conns, "fewer hand-overs seen ({seen}) than connections ({conns}):\n{metrics}");
    assert!(ok >= seen, "{ok} hand-overs counted, {seen} seen by the clients:\n{metrics}");
    let lost = value(&metrics, r#"refract_handover_ended_total{backend="b2",end="lost"}"#).unwrap_or(0);
    assert_eq!(lost, 0, "{metrics}");
    assert_eq!(value(&metrics, "refract_steering_entries"), Some(0), "steering entries left:\n{metrics}");
    let stats = backend_stats(&lab);
    let passed = stats["passed"].as_u64().unwrap();
    assert_eq!(passed > 0, pass_socket, "bodies b2 wrote into passed client sockets: {stats}");
}

/// `b2`'s `/stats`, read from its own host.
fn backend_stats(lab: &Lab) -> serde_json::Value {
    let out = Command::new("ip")
        .args(["netns", "exec", &lab.ns("a"), "curl", "-s", "http://198.18.6.21:9002/stats"])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn lab_correctness_always() {
    if std::env::var_os("RF_LAB_CLIENT").is_some() {
        return client_correctness();
    }
    run_correctness("lab_correctness_always", "ca", "mode = \"always\"\ninterface = \"eth0\"\n");
}

#[test]
fn lab_correctness_hybrid() {
    if std::env::var_os("RF_LAB_CLIENT").is_some() {
        return client_correctness();
    }
    run_correctness("lab_correctness_hybrid", "cy", &hybrid_half());
}

/// Hybrid with the threshold at half the largest size: half the results are handed over, the
/// rest relayed.
fn hybrid_half() -> String {
    format!("mode = \"hybrid\"\nthreshold = {}\ninterface = \"eth0\"\n", setting("RF_LAB_MAX_BYTES", 4 << 20) / 2)
}

#[test]
fn lab_correctness_hybrid_backend_writes_itself() {
    if std::env::var_os("RF_LAB_CLIENT").is_some() {
        return client_correctness();
    }
    // As above, with the agent passing the client socket to b2 for the large results.
    run_correctness_with("lab_correctness_hybrid_backend_writes_itself", "cp", &hybrid_half(), true);
}

/// Inside `c`: 4 connections at once, each 6 reads of 4 MiB, all bodies checked.
fn client_map_full() {
    let threads: Vec<_> = (0..4u64)
        .map(|i| {
            std::thread::spawn(move || {
                let mut c = Client::connect(format!("{VIP}:8080").parse().unwrap());
                for k in 0..6 {
                    c.send(get(4 << 20, i * 10 + k).as_bytes());
                    let r = c.read_response(false).unwrap();
                    assert_eq!((r.status, r.body.len()), (200, 4 << 20), "{}", r.head);
                    assert_eq!(pattern::first_mismatch(&r.body, 0, i * 10 + k), None, "body differs");
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
}

#[test]
fn lab_map_full_means_relay_instead() {
    if std::env::var_os("RF_LAB_CLIENT").is_some() {
        return client_map_full();
    }
    let test = "lab_map_full_means_relay_instead";
    if !is_root() {
        let _ = writeln!(std::io::stderr(), "SKIP {test}: needs root");
        return;
    }
    let lab = Lab::up("m");
    let cluster = cluster(&lab, "mode = \"always\"\ninterface = \"eth0\"\nmap_capacity = 1\n");
    run_client(&lab, test, cluster.agent.child.id());
    let metrics = settled_metrics(&lab);
    assert!(value(&metrics, r#"refract_handover_total{backend="b2",result="map_full"}"#) > Some(0), "{metrics}");
    assert!(value(&metrics, r#"refract_handover_total{backend="b2",result="ok"}"#) > Some(0), "{metrics}");
    assert_eq!(value(&metrics, "refract_steering_entries"), Some(0), "{metrics}");
}

/// Inside `c`, whose receive buffers are 4 KiB: a 64 KiB result the dispatcher relays (routed
/// as a write, to b1, which has no agent), and behind it a read of b2. The client reads nothing
/// for a while, so the relayed bytes stay unacknowledged in the dispatcher's socket: the
/// hand-over for the read cannot reach quiescence and the read is relayed instead.
fn client_not_quiescent() {
    let mut c = Client::connect(format!("{VIP}:8080").parse().unwrap());
    let first = "GET /blob?bytes=65536&seed=3 HTTP/1.1\r\nhost: t\r\nx-refract-route: write\r\n\r\n";
    c.send((first.to_string() + &get(100_000, 4)).as_bytes());
    std::thread::sleep(Duration::from_millis(500));
    for (n, seed) in [(65536, 3), (100_000, 4)] {
        let r = c.read_response(false).unwrap();
        assert_eq!((r.status, r.body.len()), (200, n), "{}", r.head);
        assert_eq!(pattern::first_mismatch(&r.body, 0, seed), None, "body differs");
        assert_eq!(r.header("x-refract-handover"), None, "relayed, not handed over: {}", r.head);
    }
}

#[test]
fn lab_not_quiescent_means_relay_instead() {
    if std::env::var_os("RF_LAB_CLIENT").is_some() {
        return client_not_quiescent();
    }
    let test = "lab_not_quiescent_means_relay_instead";
    if !is_root() {
        let _ = writeln!(std::io::stderr(), "SKIP {test}: needs root");
        return;
    }
    let lab = Lab::up("q");
    // The client's window stays tiny; the dispatcher's send buffer takes the whole relayed
    // result at once, so it reaches the next request while those bytes are still unacked.
    sh(&format!("ip netns exec {} sysctl -qw net.ipv4.tcp_rmem='4096 4096 4096'", lab.ns("c")));
    sh(&format!("ip netns exec {} sysctl -qw net.ipv4.tcp_wmem='4096 1048576 4194304'", lab.ns("d")));
    let cluster = cluster(&lab, "mode = \"always\"\ninterface = \"eth0\"\n");
    run_client(&lab, test, cluster.agent.child.id());
    let metrics = settled_metrics(&lab);
    let declined = value(&metrics, r#"refract_handover_total{backend="b2",result="not_quiescent"}"#);
    assert!(declined >= Some(1), "{metrics}");
    assert_eq!(value(&metrics, "refract_steering_entries"), Some(0), "{metrics}");
}
