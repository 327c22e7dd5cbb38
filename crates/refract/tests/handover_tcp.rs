//! The TCP_REPAIR hand-over end to end over the authenticated control channel, in a throw-away
//! network namespace (root only): dispatcher, agent and blob servers are the real binary on one
//! kernel, the agent's guard on `lo` drops the client's segments during the two gaps (I2).
//! Reads are handed over (`mode = "always"`), restored at the agent, answered directly, and
//! handed back; a write in between is relayed by the dispatcher on the restored socket.
#![allow(clippy::unwrap_used)]

mod common;

use common::{blob, config, dispatcher_with, free_port, Client, Proc, Response};
use refract_blob::pattern;
use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

const VIP: &str = "198.18.5.100";
const KEY: &str = "tcp hand-over test key, 16+ bytes";

fn root_or_skip(test: &str) -> bool {
    let uid = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:").map(|v| v.split_whitespace().next().unwrap_or("1").to_string()));
    if uid.as_deref() == Some("0") {
        return true;
    }
    let _ = writeln!(std::io::stderr(), "SKIP {test}: needs root (network namespace, TCP_REPAIR, eBPF)");
    false
}

fn sh(cmd: &str) {
    assert!(Command::new("sh").args(["-c", cmd]).status().unwrap().success(), "{cmd}");
}

/// Prepares the namespace this process was started in by `unshare --net` (lo up, the VIP on
/// lo, ARP sysctls as an agent host needs them); it dies with the process and its children.
fn prepare_netns() {
    sh(&format!("ip link set lo up && ip addr add {VIP}/32 dev lo"));
    for iface in ["all", "lo"] {
        std::fs::write(format!("/proc/sys/net/ipv4/conf/{iface}/arp_ignore"), "1").unwrap();
        std::fs::write(format!("/proc/sys/net/ipv4/conf/{iface}/arp_announce"), "2").unwrap();
    }
}

fn get(bytes: u64, seed: u64) -> String {
    format!("GET /blob?bytes={bytes}&seed={seed} HTTP/1.1\r\nhost: t\r\n\r\n")
}

fn check(r: &Response, bytes: u64, seed: u64, via: Option<&str>) {
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.body.len() as u64, bytes);
    assert_eq!(pattern::first_mismatch(&r.body, 0, seed), None, "body differs");
    assert_eq!(r.header("x-refract-handover").as_deref(), via, "{}", r.head);
}

fn agent(dir: &std::path::Path, backend: SocketAddr, control: SocketAddr) -> Proc {
    let cfg = dir.join("agent.toml");
    let text = format!(
        "backend = \"{backend}\"\ncontrol = \"{control}\"\nvip = \"{VIP}\"\ninterface = \"lo\"\nkey = \"{KEY}\"\nmap_capacity = 64\n"
    );
    std::fs::write(&cfg, text).unwrap();
    let child = Command::new(common::bin())
        .args(["agent", "--config", cfg.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    common::wait_listening(control);
    Proc { child, addr: control }
}

fn scenario() {
    let dir = tempfile::tempdir().unwrap();
    let (b1, b2) = (blob("b1"), blob("b2"));
    let control: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let _agent = agent(dir.path(), b2.addr, control);
    let key_file = dir.path().join("control.key");
    std::fs::write(&key_file, format!("{KEY}\n")).unwrap();
    let http: SocketAddr = format!("{VIP}:8080").parse().unwrap();
    let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let extra = format!(
        "[handover]\nmode = \"always\"\nkey_file = \"{}\"\nagents = {{ b2 = \"{control}\" }}\n",
        key_file.display()
    );
    let text = config(http, admin, &[("b1", b1.addr, "primary"), ("b2", b2.addr, "replica")], &extra);
    let d = dispatcher_with(&text, http, admin);
    let mut c = Client::connect(d.proc.addr);
    c.stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c.send(get(3 << 20, 5).as_bytes());
    check(&c.read_response(false).unwrap(), 3 << 20, 5, Some("1"));
    c.send(b"POST /blob HTTP/1.1\r\ncontent-length: 3\r\n\r\nabc");
    let w = c.read_response(false).unwrap();
    assert_eq!((w.status, w.header("x-refract-handover")), (200, None), "{}", w.head);
    c.send(get(1000, 2).as_bytes());
    check(&c.read_response(false).unwrap(), 1000, 2, Some("3"));
    let sizes = [(70_000u64, 1u64), (0, 0), (1 << 20, 250)];
    c.send(sizes.iter().map(|&(n, s)| get(n, s)).collect::<String>().as_bytes());
    for (n, s) in sizes {
        check(&c.read_response(false).unwrap(), n, s, Some("5"));
    }
}

#[test]
fn tcp_hand_over_and_back_on_one_kernel() {
    if !root_or_skip("tcp_hand_over_and_back_on_one_kernel") {
        return;
    }
    if std::env::var_os("RF_IN_NETNS").is_some() {
        prepare_netns();
        return scenario();
    }
    // Re-run just this test in a fresh network namespace (`unshare --net`), as root.
    let me = std::env::current_exe().unwrap();
    let out = Command::new("unshare")
        .args(["--net", "--"])
        .arg(me)
        .args(["--exact", "tcp_hand_over_and_back_on_one_kernel", "--nocapture"])
        .env("RF_IN_NETNS", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("1 passed"), "in the namespace:\n{text}");
}
