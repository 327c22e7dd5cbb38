//! Routing against three real blob servers: reads spread over replicas, writes on the primary,
#![allow(clippy::unwrap_used)]
//! a TableLoad on all, `x-refract-route` honoured, pipelined responses in order, `Expect:
//! 100-continue` answered.

use crate::common;
use common::*;
use refract_blob::pattern;
use std::net::SocketAddr;

/// b1 (the primary), b2 and b3 behind a dispatcher balancing round robin, as in
/// examples/loopback.toml (the default, peak-EWMA, spreads by latency).
fn round_robin() -> ([Proc; 3], Dispatcher) {
    cluster().backends(3).dispatcher("[balance]\npolicy = \"round-robin\"\n").with(Binary::default()).run().split()
}

#[test]
fn default_peak_ewma_policy_uses_both_replicas() {
    let ([_b1, _b2, _b3], d) = cluster().backends(3).dispatcher("").with(Binary::default()).run().split();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..60 {
        seen.insert(get(d.proc.addr, "/blob?bytes=1").header("x-served-by").unwrap());
    }
    assert!(!seen.contains("b1"), "the primary took reads: {seen:?}");
    assert!(seen.contains("b2") && seen.contains("b3"), "{seen:?}");
}

#[test]
fn reads_spread_writes_on_primary_tableload_on_all() {
    let ([b1, b2, b3], d) = round_robin();
    let mut c = Client::connect(d.proc.addr);
    let mut served = std::collections::HashMap::new();
    for i in 0..30 {
        c.send(&raw_request("GET", &format!("/blob?bytes=100&seed={i}"), &[], b""));
        let r = c.read_response(false).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(pattern::first_mismatch(&r.body, 0, i), None);
        *served.entry(r.header("x-served-by").unwrap()).or_insert(0) += 1;
    }
    assert!(served.get("b2").copied().unwrap_or(0) >= 5, "{served:?}");
    assert!(served.get("b3").copied().unwrap_or(0) >= 5, "{served:?}");
    assert_eq!(served.get("b1"), None, "the primary took reads: {served:?}");
    for _ in 0..10 {
        c.send(&raw_request("POST", "/blob", &[], b"some data"));
        let r = c.read_response(false).unwrap();
        assert_eq!((r.status, r.header("x-served-by").as_deref()), (200, Some("b1")));
    }
    c.send(&raw_request("POST", "/query", &[], &plan_body(TABLE_LOAD)));
    let r = c.read_response(false).unwrap();
    assert_eq!((r.status, r.json()["served_by"].as_str()), (200, Some("b1")));
    let (s1, s2, s3) = (stats(b1.addr), stats(b2.addr), stats(b3.addr));
    assert_eq!((s1["writes"].as_u64(), s2["writes"].as_u64(), s3["writes"].as_u64()), (Some(10), Some(0), Some(0)));
    for s in [&s1, &s2, &s3] {
        assert_eq!(s["loads"], 1, "{s}");
    }
    assert_eq!(s2["reads"].as_u64().unwrap() + s3["reads"].as_u64().unwrap(), 30);
}

#[test]
fn hyrise_plans_are_classified() {
    let ([b1, b2, b3], d) = round_robin();
    let insert = r#"{"operators":{"0":{"type":"GetTable","name":"t"},"1":{"type":"InsertScan"}},"edges":[["0","1"]]}"#;
    let scan = r#"{"operators":{"0":{"type":"GetTable","name":"t"},"1":{"type":"SimpleTableScan"}}}"#;
    assert_eq!(request(d.proc.addr, "POST", "/query", &[], &plan_body(insert)).json()["served_by"], "b1");
    let r = request(d.proc.addr, "POST", "/query", &[], &plan_body(scan));
    assert_ne!(r.json()["served_by"], "b1");
    assert_eq!(stats(b1.addr)["writes"], 1);
    assert_eq!(stats(b2.addr)["reads"].as_u64().unwrap() + stats(b3.addr)["reads"].as_u64().unwrap(), 1);
}

#[test]
fn route_header_is_honoured() {
    let ([b1, b2, b3], d) = round_robin();
    let r = request(d.proc.addr, "GET", "/blob?bytes=1", &[("x-refract-route", "write")], b"");
    assert_eq!(r.header("x-served-by").as_deref(), Some("b1"));
    let r = request(d.proc.addr, "POST", "/blob", &[("x-refract-route", "read")], b"x");
    assert_ne!(r.header("x-served-by").as_deref(), Some("b1"));
    let r = request(d.proc.addr, "GET", "/blob?bytes=1", &[("x-refract-route", "all")], b"");
    assert_eq!((r.status, r.header("x-served-by").as_deref()), (200, Some("b1")));
    assert_eq!(stats(b1.addr)["reads"], 2);
    let (s2, s3) = (stats(b2.addr), stats(b3.addr));
    assert_eq!((s2["reads"].as_u64(), s3["reads"].as_u64()), (Some(1), Some(1)), "the fan-out reached both replicas");
    assert_eq!(s2["writes"].as_u64().unwrap() + s3["writes"].as_u64().unwrap(), 1, "the forced read went to a replica");
    let bad = request(d.proc.addr, "GET", "/blob?bytes=1", &[("x-refract-route", "sideways")], b"");
    assert_eq!(bad.status, 400);
    assert!(bad.json()["error"].as_str().unwrap().contains("x-refract-route"));
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let ([_b1, _b2, _b3], d) = round_robin();
    let mut c = Client::connect(d.proc.addr);
    let sizes = [1u64, 70_000, 0, 5, 300_000, 12, 64, 1_000_000];
    let mut all = Vec::new();
    for (i, n) in sizes.iter().enumerate() {
        all.extend(raw_request("GET", &format!("/blob?bytes={n}&seed={i}"), &[], b""));
    }
    c.send(&all);
    for (i, n) in sizes.iter().enumerate() {
        let r = c.read_response(false).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body.len() as u64, *n, "response {i}");
        assert_eq!(pattern::first_mismatch(&r.body, 0, i as u64), None, "response {i}");
    }
}

#[test]
fn expect_100_continue_gets_the_go_ahead_before_the_body() {
    let ([b1, _b2, _b3], d) = round_robin();
    let mut c = Client::connect(d.proc.addr);
    c.stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
    c.send(b"POST /blob HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\ncontent-length: 5000\r\n\r\n");
    // The client holds its body back until it is told to go ahead (curl: for up to a second).
    let r = c.read_response(false).expect("no 100 Continue before the body was sent");
    assert_eq!(r.status, 100);
    c.send(&[b'x'; 5000]);
    let r = std::iter::repeat_with(|| c.read_response(false).unwrap()).find(|r| r.status != 100).unwrap();
    assert_eq!((r.status, r.json()["written"].as_u64()), (200, Some(5000)));
    // An expectation refract cannot vouch for is refused before any backend sees it.
    assert_eq!(request(d.proc.addr, "POST", "/blob", &[("expect", "x-magic")], b"abc").status, 417);
    assert_eq!(stats(b1.addr)["writes"], 1);
}

#[test]
fn chunked_bodies_both_ways() {
    let ([b1, _b2, _b3], d) = round_robin();
    let mut c = Client::connect(d.proc.addr);
    c.send(b"POST /blob HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n3\r\nabc\r\n0\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!((r.status, r.json()["written"].as_u64()), (200, Some(8)));
    c.send(&raw_request("GET", "/blob?bytes=200000&seed=7&chunked=1", &[], b""));
    let r = c.read_response(false).unwrap();
    assert_eq!(r.header("transfer-encoding").as_deref(), Some("chunked"));
    assert_eq!(r.body.len(), 200_000);
    assert_eq!(pattern::first_mismatch(&r.body, 0, 7), None);
    c.send(&raw_request("GET", "/blob?bytes=3", &[], b""));
    assert_eq!(c.read_response(false).unwrap().body.len(), 3);
    assert_eq!(stats(b1.addr)["writes"], 1);
}

#[test]
fn least_outstanding_policy_spreads_reads() {
    let build = cluster().backends(3).dispatcher("[balance]\npolicy = \"least-outstanding\"\n");
    let ([_b1, _b2, _b3], d) = build.with(Binary::default()).run().split();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..40 {
        seen.insert(get(d.proc.addr, "/blob?bytes=1").header("x-served-by").unwrap());
    }
    assert_eq!(seen, ["b2".to_string(), "b3".to_string()].into_iter().collect());
}

#[test]
fn the_loopback_example_works_as_documented() {
    let _b: Vec<Proc> = (1..=3).map(|i| blob_at(&format!("b{i}"), 9000 + i, &[])).collect();
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/loopback.toml")).unwrap();
    let d = dispatcher_with(&text, "127.0.0.1:8080".parse().unwrap(), "127.0.0.1:8081".parse().unwrap());
    assert_eq!(get(d.proc.addr, "/blob?bytes=1").status, 200);
    // The example's own token (users copy it, then replace it).
    let token = text.lines().find_map(|l| l.strip_prefix("token = ")).unwrap().trim_matches('"');
    let auth = format!("Bearer {token}");
    let backends = request(d.admin, "GET", "/backends", &[("authorization", &auth)], b"").json();
    let names: Vec<_> = backends.as_array().unwrap().iter().map(|b| b["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, ["b1", "b2", "b3"]);
}

/// A dispatcher in front of a primary and a replica, with `listen_extra` added to `[listen]`.
fn dispatcher_listening_with(listen: &'static str) -> ([Proc; 2], Dispatcher) {
    cluster().backends(2).dispatcher("").with(Binary { listen, ..Binary::default() }).run().split()
}

/// `clients` keep-alive connections at once, each reading `sizes(i)` bytes for i in
/// 0..requests, every body checked against the blob pattern.
fn keep_alive_clients(addr: SocketAddr, clients: u64, requests: u64, sizes: fn(u64) -> u64) {
    let threads: Vec<_> = (0..clients)
        .map(|seed| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                for i in 0..requests {
                    let bytes = sizes(i);
                    c.send(&raw_request("GET", &format!("/blob?bytes={bytes}&seed={seed}"), &[], b""));
                    let r = c.read_response(false).unwrap();
                    assert_eq!(r.status, 200);
                    assert_eq!(r.body.len() as u64, bytes);
                    assert_eq!(pattern::first_mismatch(&r.body, 0, seed), None);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn balanced_accept_serves_concurrent_keep_alive_connections() {
    let ([_b1, b2], d) = dispatcher_listening_with("accept = \"balanced\"");
    keep_alive_clients(d.proc.addr, 8, 5, |i| 1000 + i);
    assert_eq!(stats(b2.addr)["reads"], 40, "every read served (by the replica)");
}

/// `refract_client_connections_open{worker="i"}` from the admin's `/metrics`, for workers 0 and 1.
fn open_per_worker(admin: SocketAddr) -> [i64; 2] {
    let text = String::from_utf8(get(admin, "/metrics").body).unwrap();
    [0, 1].map(|i| {
        let prefix = format!("refract_client_connections_open{{worker=\"{i}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(prefix.as_str())).map_or(0, |v| v.trim().parse().unwrap())
    })
}

#[test]
fn balanced_accept_does_not_count_connections_closed_before_they_spoke() {
    // wrk and health checkers connect and close once before their real connection. Such
    // probes, right before two real clients, must not push both clients onto one event loop.
    let ([_b1, _b2], d) = dispatcher_listening_with("accept = \"balanced\"");
    for round in 0..5u64 {
        let mut clients = Vec::new();
        for seed in 0..2 {
            drop(std::net::TcpStream::connect(d.proc.addr).unwrap());
            drop(std::net::TcpStream::connect(d.proc.addr).unwrap());
            let mut c = Client::connect(d.proc.addr);
            c.send(&raw_request("GET", &format!("/blob?bytes=10&seed={seed}"), &[], b""));
            assert_eq!(c.read_response(false).unwrap().status, 200);
            clients.push(c);
        }
        assert_eq!(open_per_worker(d.admin), [1, 1], "round {round}: one client per event loop");
        drop(clients);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while open_per_worker(d.admin) != [0, 0] {
            assert!(
                std::time::Instant::now() < deadline,
                "closed clients still counted: {:?}",
                open_per_worker(d.admin)
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

#[test]
fn busy_polling_serves_keep_alive_connections_and_counts_its_time() {
    let ([_b1, b2], d) = dispatcher_listening_with("busy_poll_us = 500");
    keep_alive_clients(d.proc.addr, 4, 20, |i| if i == 7 { 1 << 20 } else { i * 100 });
    assert_eq!(stats(b2.addr)["reads"], 80, "every read served (by the replica)");
    // The loops' polling periods end 500 µs after their last read (and are counted every ms
    // while they last).
    std::thread::sleep(std::time::Duration::from_millis(50));
    let text = String::from_utf8(get(d.admin, "/metrics").body).unwrap();
    let polled: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("refract_busy_poll_seconds_total "))
        .expect("the busy-polling time is exported")
        .trim()
        .parse()
        .unwrap();
    assert!(polled > 0.0, "the event loops polled between requests");
}

/// A backend that answers every request with an empty 200 and sends each request head it
/// received to the returned channel.
fn recording_backend() -> (SocketAddr, std::sync::mpsc::Receiver<String>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut out = stream.try_clone().unwrap();
                let mut lines = BufReader::new(stream);
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    if lines.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    head += &line;
                    if line == "\r\n" {
                        let _ = tx.send(std::mem::take(&mut head));
                        let _ = out.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
                    }
                }
            });
        }
    });
    (addr, rx)
}

#[test]
fn refract_internal_headers_from_a_client_never_reach_the_backend() {
    let (addr, heads) = recording_backend();
    let d = dispatcher(&[("b1", addr, "primary")], "");
    let sent = [
        ("x-refract-deadline-ms", "999999"),
        ("X-Refract-Handover", "7"),
        ("x-refract-defer", "1"),
        ("x-refract-deferred", "1"),
        ("x-refract-route", "write"),
        ("x-refract-timeout-ms", "5000"),
        ("x-test", "kept"),
    ];
    let r = request(d.proc.addr, "GET", "/internal", &sent, b"");
    assert_eq!(r.status, 200, "{r:?}");
    let head = heads.iter().find(|h| h.starts_with("GET /internal ")).unwrap().to_ascii_lowercase();
    for internal in ["x-refract-handover", "x-refract-defer:", "x-refract-deferred"] {
        assert!(!head.contains(internal), "{internal} reached the backend:\n{head}");
    }
    // Only the dispatcher's own deadline (time left of the client's 5000 ms) arrives.
    let deadlines: Vec<&str> = head.lines().filter(|l| l.starts_with("x-refract-deadline-ms:")).collect();
    assert_eq!(deadlines.len(), 1, "{head}");
    let left: u64 = deadlines[0].split(':').nth(1).unwrap().trim().parse().unwrap();
    assert!(left <= 5000, "the client's deadline header was passed on: {head}");
    for kept in ["x-refract-route: write", "x-refract-timeout-ms: 5000", "x-test: kept"] {
        assert!(head.contains(kept), "{kept} was dropped:\n{head}");
    }
}
