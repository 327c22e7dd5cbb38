//! Client-side timeouts end to end (docs/operations.md, "Timeouts"): a client that stops
//! reading its response, or stalls sending a request body, frees its backend slot and is closed
//! within its timeout while other clients keep being served; a slow head is served as long as it
//! keeps coming, a stalled one gets 408; an idle keep-alive connection is closed silently.
#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Slack on every "within the timeout" bound: a loaded 2-core CI machine.
const SLACK: Duration = Duration::from_millis(2500);

fn in_flight(d: &Dispatcher, name: &str) -> u64 {
    let list = admin_get(d.admin, "/backends").json();
    list.as_array().unwrap().iter().find(|b| b["name"] == name).unwrap()["in_flight"].as_u64().unwrap()
}

/// Waits (at most `within`) until `name` has `want` requests in flight.
fn wait_in_flight(d: &Dispatcher, name: &str, want: u64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let got = in_flight(d, name);
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{name} has {got} requests in flight, expected {want}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `threads` clients send `method path` (with `body`) one after another on fresh connections
/// for `run`; returns (served with `want` within `within`, total).
fn load(addr: SocketAddr, threads: usize, run: Duration, req: Vec<u8>, want: u16, within: Duration) -> (usize, usize) {
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let req = req.clone();
            std::thread::spawn(move || {
                let (mut ok, mut total) = (0, 0);
                let end = Instant::now() + run;
                while Instant::now() < end {
                    let started = Instant::now();
                    let mut c = Client::connect(addr);
                    c.stream.set_read_timeout(Some(within + SLACK)).unwrap();
                    c.send(&req);
                    let r = c.read_response(false);
                    total += 1;
                    if r.is_ok_and(|r| r.status == want) && started.elapsed() <= within {
                        ok += 1;
                    }
                }
                (ok, total)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// Whether the server has closed (or reset) `s`: reads what is left (at most `cap` bytes)
/// and expects the end before it.
fn ends_within(s: &mut TcpStream, cap: usize) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0;
    while total <= cap {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => total += n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false
            }
            Err(_) => return true,
        }
    }
    false
}

const STALLED: usize = 20;
const BIG: u64 = 64 << 20;

/// One replica with exactly as many slots as there are stalled clients, reads never sent to
/// the primary, and a queue that lets a read wait (rather than be refused) while slots free up.
fn slots(stall: &str) -> String {
    format!(
        "[timeouts]\n{stall}\n[balance]\nread_fallback_to_primary = false\n\
         [overload]\nmax_concurrency = {STALLED}\ninitial_concurrency = {STALLED}\nmin_concurrency = {STALLED}\n\
         max_queue_wait_ms = 5000\nqueue_target_ms = 5000\nqueue_interval_ms = 10000\n"
    )
}

#[test]
fn clients_that_stop_reading_free_their_slots_within_the_write_stall_timeout() {
    let (b1, b2) = (blob("b1"), blob("b2"));
    let d = dispatcher(&[("b1", b1.addr, "primary"), ("b2", b2.addr, "replica")], &slots("write_stall_ms = 1000"));
    let addr = d.proc.addr;
    // Each asks 64 MiB and reads nothing: their slots fill the replica's limit.
    let mut stalled: Vec<TcpStream> = (0..STALLED)
        .map(|i| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(format!("GET /blob?bytes={BIG}&seed={i} HTTP/1.1\r\nhost: t\r\n\r\n").as_bytes()).unwrap();
            s
        })
        .collect();
    wait_in_flight(&d, "b2", STALLED as u64, Duration::from_secs(10));
    let full = Instant::now();
    let stall = Duration::from_millis(1000);
    // Other reads go on, each served within 2 s (at worst after waiting for a freed slot).
    let read = raw_request("GET", "/blob?bytes=1024", &[], b"");
    let (ok, total) = load(addr, 4, Duration::from_secs(3), read, 200, Duration::from_secs(2));
    assert!(total > 0 && ok * 100 >= total * 95, "{ok} of {total} reads served within 2 s");
    // Every stalled client was given up by the write-stall timeout, its slot freed...
    let closed = "refract_errors_total{kind=\"client_stalled\"}";
    assert_eq!(metric(d.admin, closed), STALLED as u64, "stalled clients closed");
    wait_in_flight(&d, "b2", 0, Duration::from_secs(2));
    assert!(full.elapsed() < Duration::from_secs(3) + stall + SLACK);
    // ... and its connection reset: it ends before the 64 MiB it asked for.
    for s in &mut stalled {
        assert!(ends_within(s, BIG as usize), "a stalled client's connection is still open");
    }
}

/// How long a stalled-body client waits for its answer, and the answer.
fn stalled_post(addr: SocketAddr, declared: usize, sent: usize) -> std::thread::JoinHandle<(Duration, Response, bool)> {
    std::thread::spawn(move || {
        let mut c = Client::connect(addr);
        let head = format!("POST /blob HTTP/1.1\r\nhost: t\r\ncontent-length: {declared}\r\n\r\n");
        c.send(&[head.as_bytes(), &vec![b'x'; sent]].concat());
        let started = Instant::now();
        let r = c.read_response(false).unwrap();
        let took = started.elapsed();
        (took, r, c.is_closed())
    })
}

#[test]
fn stalled_request_bodies_do_not_block_writes_and_get_408() {
    let b1 = blob("b1");
    // Longer than the 2 s a write may take: waiting for the stalled ones to time out is too late.
    let d = dispatcher(&[("b1", b1.addr, "primary")], &slots("body_ms = 3000"));
    let addr = d.proc.addr;
    // 20 POSTs stop after 3 of their 1000 body bytes: read ahead, they hold no backend slot.
    let stalled: Vec<_> = (0..STALLED).map(|_| stalled_post(addr, 1000, 3)).collect();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(in_flight(&d, "b1"), 0, "a stalled body holds a backend slot");
    let write = raw_request("POST", "/blob", &[], b"abc");
    let (ok, total) = load(addr, 4, Duration::from_secs(2), write, 200, Duration::from_secs(2));
    assert!(total > 0 && ok * 100 >= total * 95, "{ok} of {total} writes served within 2 s");
    for h in stalled {
        let (took, r, closed) = h.join().unwrap();
        assert_eq!(r.status, 408, "{r:?}");
        assert_eq!(r.header("connection").as_deref(), Some("close"), "{}", r.head);
        assert!(took < Duration::from_millis(3000) + SLACK, "408 after {took:?}");
        assert!(closed, "the connection is closed after the 408");
    }
    assert_eq!(writes(&b1) as usize, total, "no stalled body reached the backend");
}

#[test]
fn a_stalled_body_too_large_to_buffer_frees_its_slot_within_the_body_timeout() {
    let b1 = blob("b1");
    let extra = format!("{}[limits]\nmax_buffered_body = 1024\n", slots("body_ms = 1000"));
    let d = dispatcher(&[("b1", b1.addr, "primary")], &extra);
    // Streamed (larger than what is buffered): the backend holds a slot while it arrives.
    let h = stalled_post(d.proc.addr, 100_000, 2000);
    wait_in_flight(&d, "b1", 1, Duration::from_secs(5));
    let (took, r, closed) = h.join().unwrap();
    assert_eq!((r.status, closed), (408, true), "{r:?}");
    assert!(took < Duration::from_millis(1000) + SLACK, "408 after {took:?}");
    wait_in_flight(&d, "b1", 0, Duration::from_secs(2));
    let w = request(d.proc.addr, "POST", "/blob", &[], b"abc");
    assert_eq!(w.status, 200, "the backend still serves: the half request was not reused");
}

/// Heads: at most 1 s between two bytes, 2 s idle between requests.
const HEAD: &str = "[timeouts]\nhead_ms = 1000\nclient_idle_ms = 2000\n";

#[test]
fn a_slow_head_is_served_while_it_keeps_coming_and_a_stalled_one_gets_408() {
    let b1 = blob("b1");
    let d = dispatcher(&[("b1", b1.addr, "primary")], HEAD);
    // 4 s in all, longer than both timeouts, but never 1 s without a byte.
    let mut c = Client::connect(d.proc.addr);
    for b in b"GET /blob?bytes=10 HTTP/1.1\r\nhost: t\r\n\r\n" {
        c.send(&[*b]);
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = c.read_response(false).unwrap();
    assert_eq!((r.status, r.body.len()), (200, 10), "{r:?}");
    // A head that stops: 408, connection closed.
    let mut c = Client::connect(d.proc.addr);
    c.send(b"GET /blob?bytes=10 HTTP/1.1\r\nhost:");
    let started = Instant::now();
    let r = c.read_response(false).unwrap();
    assert_eq!(r.status, 408, "{r:?}");
    assert_eq!(r.header("connection").as_deref(), Some("close"), "{}", r.head);
    assert!(started.elapsed() < Duration::from_millis(1000) + SLACK, "408 after {:?}", started.elapsed());
    assert!(c.is_closed());
    assert_eq!(metric(d.admin, "refract_errors_total{kind=\"client_timeout\"}"), 1);
}

#[test]
fn an_idle_keep_alive_connection_is_closed_silently_after_the_idle_timeout() {
    let b1 = blob("b1");
    let d = dispatcher(&[("b1", b1.addr, "primary")], "[timeouts]\nhead_ms = 500\nclient_idle_ms = 1500\n");
    let mut c = Client::connect(d.proc.addr);
    c.send(&raw_request("GET", "/blob?bytes=10", &[], b""));
    assert_eq!(c.read_response(false).unwrap().status, 200);
    // Idle longer than the head timeout: still open (no byte of a request was sent).
    std::thread::sleep(Duration::from_millis(1000));
    c.send(&raw_request("GET", "/blob?bytes=10", &[], b""));
    assert_eq!(c.read_response(false).unwrap().status, 200);
    let idle = Instant::now();
    let mut byte = [0u8; 1];
    c.stream.set_read_timeout(Some(Duration::from_millis(1500) + SLACK)).unwrap();
    let n = c.stream.read(&mut byte).unwrap();
    assert_eq!(n, 0, "closed without a response");
    let took = idle.elapsed();
    assert!(took >= Duration::from_millis(1400) && took < Duration::from_millis(1500) + SLACK, "{took:?}");
    assert_eq!(metric(d.admin, "refract_errors_total{kind=\"client_timeout\"}"), 0);
}
