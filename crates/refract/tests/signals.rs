//! Signals and reload: SIGHUP (and `refract reload`) applies a changed config without cutting
//! a connection and keeps the old one when the new one is invalid; SIGTERM drains, marking
//! the last responses `connection: close`, and exits 3 when the drain timed out.
#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use refract_blob::pattern;
use std::io::Read;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

/// A logged dispatcher on fresh ports in front of `backends`, with `extra` appended.
fn logged(backends: &[(&str, SocketAddr, &str)], extra: &str) -> (Dispatcher, String) {
    let http: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let text = config(http, admin, backends, extra);
    (dispatcher_logged(&text, http, admin), text)
}

/// Reads a response head byte by byte (leaving the body on the socket).
fn read_head(c: &mut Client) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        c.stream.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

/// Reads `n` body bytes and checks them against the blob pattern from `offset` on.
fn check_body(c: &mut Client, mut offset: u64, n: u64, seed: u64) {
    let mut buf = vec![0u8; 1 << 20];
    while offset < n {
        let want = buf.len().min((n - offset) as usize);
        let got = c.stream.read(&mut buf[..want]).unwrap();
        assert!(got > 0, "connection closed at {offset}");
        assert_eq!(pattern::first_mismatch(&buf[..got], offset, seed), None, "at {offset}");
        offset += got as u64;
    }
}

/// Waits until the replica b2 has a request in flight.
fn wait_in_flight_on_b2(d: &Dispatcher) {
    wait_for("a request in flight on b2", || admin_get(d.admin, "/backends").json()[1]["in_flight"] == 1);
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !ok() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sighup_applies_a_new_backend_list_while_a_long_response_streams_on() {
    const N: u64 = 64 << 20;
    let (b1, b2, b3) = (blob("b1"), blob("b2"), blob("b3"));
    let (d, text) = logged(&[("b1", b1.addr, "primary"), ("b2", b2.addr, "replica")], "");
    let mut long = Client::connect(d.proc.addr);
    long.send(&raw_request("GET", &format!("/blob?bytes={N}&seed=7"), &[], b""));
    let head = read_head(&mut long);
    assert!(head.contains("x-served-by: b2"), "{head}");
    check_body(&mut long, 0, 1 << 20, 7);
    // b2 out, b3 in, a route added; the long response (from b2) is not read meanwhile.
    let b2_line = format!("[[backend]]\nname = \"b2\"\naddr = \"{}\"\nrole = \"replica\"\n", b2.addr);
    let b3_line = format!("[[backend]]\nname = \"b3\"\naddr = \"{}\"\nrole = \"replica\"\n", b3.addr);
    let next =
        text.replace(&b2_line, &b3_line) + "[[route]]\nmethod = \"GET\"\npath_prefix = \"/stats\"\nclass = \"write\"\n";
    std::fs::write(d.config_path(), next).unwrap();
    d.proc.signal("HUP");
    wait_for("the reload took effect", || {
        get(d.proc.addr, "/blob?bytes=1").header("x-served-by").as_deref() == Some("b3")
    });
    for _ in 0..5 {
        assert_eq!(get(d.proc.addr, "/blob?bytes=1").header("x-served-by").as_deref(), Some("b3"));
    }
    let writes = r#"refract_requests_total{class="write",backend="b1"}"#;
    assert_eq!(metric(d.admin, writes), 0);
    assert_eq!(get(d.proc.addr, "/stats").status, 200);
    // A request is counted when its exchange is booked, just after its last byte went out.
    wait_for("the new route sent GET /stats to the primary as a write", || metric(d.admin, writes) == 1);
    assert_eq!(metric(d.admin, writes), 1);
    let names: Vec<_> =
        admin_get(d.admin, "/backends").json().as_array().unwrap().iter().map(|b| b["name"].to_string()).collect();
    assert_eq!(names, ["\"b1\"", "\"b3\""]);
    check_body(&mut long, 1 << 20, N, 7);
    long.send(&raw_request("GET", "/blob?bytes=5", &[], b""));
    assert_eq!(long.read_response(false).unwrap().header("x-served-by").as_deref(), Some("b3"), "still open");
    assert!(d.log().contains("config reloaded"), "{}", d.log());
}

#[test]
fn an_invalid_config_on_reload_keeps_the_old_one_and_says_why() {
    let (b1, b2) = (blob("b1"), blob("b2"));
    let (d, text) = logged(&[("b1", b1.addr, "primary"), ("b2", b2.addr, "replica")], "");
    std::fs::write(d.config_path(), format!("{text}[timeouts]\ndrain_ms = 0\n")).unwrap();
    d.proc.signal("HUP");
    wait_for("the refusal is logged", || d.log().contains("reload refused"));
    let log = d.log();
    let line = log.lines().find(|l| l.contains("reload refused")).unwrap();
    assert!(line.contains("ERROR") && line.contains("drain_ms must be > 0") && line.contains("line "), "{line}");
    assert_eq!(get(d.proc.addr, "/blob?bytes=1").header("x-served-by").as_deref(), Some("b2"));
    // `refract reload` says the same, and fails.
    let out = Command::new(bin()).args(["reload", "--config", d.config_path().to_str().unwrap()]).output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("drain_ms must be > 0"), "{err}");
    // A listener change needs a restart: reported, left as it was; the rest applies.
    let moved = text.replace(&d.proc.addr.to_string(), "127.0.0.1:1").replace("workers = 2", "workers = 1");
    let b2_line = format!("name = \"b2\"\naddr = \"{}\"", b2.addr);
    std::fs::write(d.config_path(), moved.replace(&b2_line, &b2_line.replace("b2\"", "b2x\""))).unwrap();
    let out = Command::new(bin()).args(["reload", "--config", d.config_path().to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("added b2x"), "{out:?}");
    assert!(d.log().contains("needs restart") && d.log().contains("[listen]"), "{}", d.log());
    assert_eq!(get(d.proc.addr, "/blob?bytes=1").header("x-served-by").as_deref(), Some("b2"), "same listener");
    assert_eq!(admin_get(d.admin, "/backends").json()[1]["name"], "b2x");
}

#[test]
fn a_response_finished_during_the_drain_says_connection_close() {
    let (b1, b2) = (blob("b1"), blob_at("b2", 0, &["--delay-ms", "1000"]));
    let (mut d, _) = logged(&[("b1", b1.addr, "primary"), ("b2", b2.addr, "replica")], "");
    let mut c = Client::connect(d.proc.addr);
    c.send(&raw_request("GET", "/blob?bytes=10", &[], b""));
    wait_in_flight_on_b2(&d);
    d.proc.signal("TERM");
    let r = c.read_response(false).unwrap();
    assert_eq!((r.status, r.body.len()), (200, 10));
    assert_eq!(r.header("connection").as_deref(), Some("close"), "{}", r.head);
    assert!(c.is_closed());
    assert_eq!(d.wait_exit(), Some(0), "drained in time");
}

#[test]
fn a_drain_that_times_out_exits_3() {
    let (b1, b2) = (blob("b1"), blob_at("b2", 0, &["--delay-ms", "5000"]));
    let (mut d, _) = logged(&[("b1", b1.addr, "primary"), ("b2", b2.addr, "replica")], "[timeouts]\ndrain_ms = 300\n");
    let mut c = Client::connect(d.proc.addr);
    c.send(&raw_request("GET", "/blob?bytes=10", &[], b""));
    wait_in_flight_on_b2(&d);
    d.proc.signal("TERM");
    assert_eq!(d.wait_exit(), Some(3));
    assert!(d.log().contains("drain timeout"), "{}", d.log());
}
