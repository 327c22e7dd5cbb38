//! Client-side timeouts end to end (docs/operations.md, "Timeouts"): a client that stops
//! reading its response, or stalls sending a request body, frees its backend slot and is closed
//! within its timeout while other clients keep being served; one that stops reading while
//! others wait for its backend frees it within the contended stall, its rest spilled or its
//! connection reset, and costs the others nothing (the conformance scenario of 40 stalled
//! readers, docs/overload.md "Clients that stop reading"); a slow head is served as long as it
//! keeps coming, a stalled one gets 408; an idle keep-alive connection is closed silently.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::*;
use refract_blob::pattern;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::fd::AsRawFd;
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
    // The write-stall bound alone: the contended stall (which frees slots sooner when others
    // wait) is the subject of the tests below.
    let stall = "write_stall_ms = 1000\ncontended_stall_ms = 60000";
    let ([_b1, _b2], d) = cluster().backends(2).dispatcher(&slots(stall)).with(Binary::default()).run().split();
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

/// One slot on the one backend, which the reads use (no replica); a contended stall of 300 ms.
const CONTENDED: &str =
    "[overload]\nmax_concurrency = 1\ninitial_concurrency = 1\n[timeouts]\ncontended_stall_ms = 300\n";

/// A client that asks `b1` for `bytes` (pattern `seed`) and holds its one slot.
fn slot_holder(d: &Dispatcher, bytes: u64, seed: u64) -> Client {
    let mut c = Client::connect(d.proc.addr);
    c.send(&raw_request("GET", &format!("/blob?bytes={bytes}&seed={seed}"), &[], b""));
    wait_in_flight(d, "b1", 1, Duration::from_secs(5));
    c
}

#[test]
fn a_paused_reader_keeps_its_backend_until_another_request_wants_it_then_reads_the_rest_from_a_spill() {
    const N: u64 = 16 << 20;
    let ([_b1], d) = cluster()
        .backends(1)
        .dispatcher(&format!("{CONTENDED}[limits]\nspill_bytes = {N}\n"))
        .with(Binary::default())
        .run()
        .split();
    let mut a = slot_holder(&d, N, 5);
    // Nobody else wants the slot: a pause of four times the contended stall costs nothing.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(in_flight(&d, "b1"), 1, "the paused reader lost its slot");
    // Another read comes: the rest of the paused response is read into a spill, the slot is its.
    let started = Instant::now();
    let r = get(d.proc.addr, "/blob?bytes=10");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(started.elapsed() < Duration::from_millis(300) + SLACK, "served after {:?}", started.elapsed());
    wait_in_flight(&d, "b1", 0, Duration::from_secs(2));
    assert_eq!(metric(d.admin, r#"refract_stall_yields_total{backend="b1",how="spilled"}"#), 1);
    // The paused reader gets its whole response, byte-exact, and its connection goes on.
    let r = a.read_response(false).unwrap();
    assert_eq!((r.status, r.body.len() as u64), (200, N));
    assert_eq!(pattern::first_mismatch(&r.body, 0, 5), None);
    a.send(&raw_request("GET", "/blob?bytes=7", &[], b""));
    assert_eq!(a.read_response(false).unwrap().body.len(), 7);
    assert_eq!(metric(d.admin, r#"refract_errors_total{kind="client_stalled"}"#), 0);
}

#[test]
fn a_stalled_reader_whose_rest_cannot_be_spilled_is_reset_when_another_request_waits() {
    let ([_b1], d) = cluster().backends(1).dispatcher(CONTENDED).with(Binary::default()).run().split();
    // 64 MiB, the default spill 1 MiB: no rest of it fits.
    let mut a = slot_holder(&d, BIG, 6);
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let r = get(d.proc.addr, "/blob?bytes=10");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(started.elapsed() < Duration::from_millis(300) + SLACK, "served after {:?}", started.elapsed());
    assert_eq!(metric(d.admin, r#"refract_stall_yields_total{backend="b1",how="cut"}"#), 1);
    assert_eq!(metric(d.admin, r#"refract_errors_total{kind="client_stalled"}"#), 1);
    assert!(ends_within(&mut a.stream, BIG as usize), "the stalled reader's connection is still open");
    wait_in_flight(&d, "b1", 0, Duration::from_secs(2));
    // Its backend connection, cut mid-response, was not reused.
    assert_eq!(get(d.proc.addr, "/blob?bytes=3").body.len(), 3);
}

/// Reads a response of `n` body bytes from `s` `chunk` bytes at a time with `pause` between
/// reads; the body.
fn read_slowly(s: &mut TcpStream, n: usize, chunk: usize, pause: Duration) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut piece = vec![0u8; chunk];
    loop {
        let head = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4);
        if head.is_some_and(|h| buf.len() >= h + n) {
            return buf.split_off(head.unwrap_or(0));
        }
        let got = s.read(&mut piece).unwrap();
        assert!(got > 0, "closed after {} bytes", buf.len());
        buf.extend_from_slice(&piece[..got]);
        std::thread::sleep(pause);
    }
}

#[test]
fn a_slow_reader_that_keeps_reading_keeps_its_backend_while_others_wait() {
    const N: usize = 6 << 20;
    // Never spilled: a reader taken for stalled would be reset.
    let extra = format!("{CONTENDED}[limits]\nspill_bytes = 0\n");
    let ([_b1], d) = cluster().backends(1).dispatcher(&extra).with(Binary::default()).run().split();
    let mut a = slot_holder(&d, N as u64, 7);
    let addr = d.proc.addr;
    let other = std::thread::spawn(move || get(addr, "/blob?bytes=10").status);
    // 64 KiB every 50 ms (about 1.3 MB/s): the kernel wakes a blocked writer only every few
    // hundred milliseconds at that pace, the client's acknowledgements come at each read.
    let body = read_slowly(&mut a.stream, N, 64 << 10, Duration::from_millis(50));
    assert_eq!((body.len(), pattern::first_mismatch(&body, 0, 7)), (N, None));
    assert_eq!(other.join().unwrap(), 200, "the other read waited for the slot and was served");
    assert_eq!(metric(d.admin, r#"refract_errors_total{kind="client_stalled"}"#), 0);
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
    // Longer than the 2 s a write may take: waiting for the stalled ones to time out is too late.
    let ([b1], d) = cluster().backends(1).dispatcher(&slots("body_ms = 3000")).with(Binary::default()).run().split();
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
    let extra = format!("{}[limits]\nmax_buffered_body = 1024\n", slots("body_ms = 1000"));
    let ([_b1], d) = cluster().backends(1).dispatcher(&extra).with(Binary::default()).run().split();
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
    let ([_b1], d) = cluster().backends(1).dispatcher(HEAD).with(Binary::default()).run().split();
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
    let ([_b1], d) = cluster()
        .backends(1)
        .dispatcher("[timeouts]\nhead_ms = 500\nclient_idle_ms = 1500\n")
        .with(Binary::default())
        .run()
        .split();
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

/// The stalled-readers scenario: [`STALLERS`] clients from `from` each ask for 64 MiB and read
/// nothing, while [`PROBES`] clients from 127.0.0.1 each read 1 KiB every 3 s on a fresh
/// connection, for `run`. Three blob servers as in `examples/loopback.toml` (reads on the two
/// replicas), the test kit's configuration with `extra`, otherwise shipped defaults.
struct Stalls {
    from: Ipv4Addr,
    run: Duration,
    extra: &'static str,
}

const STALLERS: usize = 40;
const PROBES: usize = 10;
const PROBE_EVERY: Duration = Duration::from_secs(3);
const PROBE_WITHIN: Duration = Duration::from_secs(2);

/// What the scenario measured.
#[derive(Debug)]
struct Measured {
    /// (seconds into the run at the probe's start, served 200 within 2 s) per probe read.
    probes: Vec<(f64, bool)>,
    /// How long each probe read took (those answered 200), sorted.
    took: Vec<Duration>,
    /// Stalled connections the proxy had closed by the end of the run.
    closed: usize,
    /// When the dispatcher had given every stalled client up (`client_stalled` errors).
    all_given_up: Option<Duration>,
}

impl Measured {
    fn served(&self) -> usize {
        self.probes.iter().filter(|p| p.1).count()
    }

    /// The `q` quantile of the probe reads' times (of those served).
    fn quantile(&self, q: f64) -> Duration {
        let i = ((self.took.len() as f64 * q) as usize).min(self.took.len().saturating_sub(1));
        self.took.get(i).copied().unwrap_or_default()
    }

    /// Probe reads served within 2 s by window of `secs` seconds: "served/total" each.
    fn by_window(&self, secs: f64) -> String {
        let windows = (self.probes.iter().map(|p| p.0).fold(0.0, f64::max) / secs) as usize + 1;
        let window = |w: usize| {
            let in_w: Vec<_> = self.probes.iter().filter(|p| (p.0 / secs) as usize == w).collect();
            let ok = in_w.iter().filter(|p| p.1).count();
            format!("{}-{} s: {ok}/{}", w as f64 * secs, (w + 1) as f64 * secs, in_w.len())
        };
        (0..windows).map(window).collect::<Vec<_>>().join(", ")
    }

    fn report(&self, what: &str) -> String {
        format!(
            "{what}: probe reads served within 2 s: {}/{} ({}); p50 {:.1?}, p99 {:.1?}, max {:.1?}; \
             stalled connections closed: {}/{STALLERS}, all given up after {:.1?}",
            self.served(),
            self.probes.len(),
            self.by_window(9.0),
            self.quantile(0.5),
            self.quantile(0.99),
            self.quantile(1.0),
            self.closed,
            self.all_given_up,
        )
    }

    /// The acceptance: at least 95 % of the probe reads over the whole run served within 2 s,
    /// every stalled connection closed by the proxy by the end.
    fn check(&self, what: &str) {
        let report = self.report(what);
        eprintln!("{report}");
        assert!(self.served() * 100 >= self.probes.len() * 95, "{report}");
        assert_eq!(self.closed, STALLERS, "{report}");
    }
}

/// A connection to `to` from the local address `from` (any 127/8 address is on loopback).
fn connect_from(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
    use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
    let SocketAddr::V4(to) = to else { panic!("the test kit listens on IPv4") };
    let fd = socket(AddressFamily::Inet, SockType::Stream, SockFlag::empty(), None).unwrap();
    bind(fd.as_raw_fd(), &SockaddrIn::from(SocketAddrV4::new(from, 0))).unwrap();
    connect(fd.as_raw_fd(), &SockaddrIn::from(to)).unwrap();
    TcpStream::from(fd)
}

/// One probe read: a fresh connection, `GET 1 KiB`; how long it took to be answered 200, or
/// what went wrong (given up a second after [`PROBE_WITHIN`]).
fn probe(addr: SocketAddr) -> Result<Duration, String> {
    let started = Instant::now();
    let s = TcpStream::connect_timeout(&addr, PROBE_WITHIN).map_err(|e| format!("connect: {e}"))?;
    let mut c = Client::on(s);
    c.stream.set_read_timeout(Some(PROBE_WITHIN + Duration::from_secs(1))).unwrap();
    c.send(&raw_request("GET", "/blob?bytes=1024", &[], b""));
    let r = c.read_response(false).map_err(|e| format!("after {:?}: {e}", started.elapsed()))?;
    match (r.status, r.body.len()) {
        (200, 1024) => Ok(started.elapsed()),
        _ => Err(format!("{} {}", r.status, String::from_utf8_lossy(&r.body))),
    }
}

/// Probe reads every [`PROBE_EVERY`] from `PROBES` clients, spread over the period, until `end`.
fn probe_until(addr: SocketAddr, start: Instant, end: Instant) -> Vec<(f64, Result<Duration, String>)> {
    let probers: Vec<_> = (0..PROBES)
        .map(|i| {
            std::thread::spawn(move || {
                let mut at = start + PROBE_EVERY * i as u32 / PROBES as u32;
                let mut out = Vec::new();
                while at < end {
                    std::thread::sleep(at.saturating_duration_since(Instant::now()));
                    out.push(((at - start).as_secs_f64(), probe(addr)));
                    at += PROBE_EVERY;
                }
                out
            })
        })
        .collect();
    let mut all: Vec<_> = probers.into_iter().flat_map(|h| h.join().unwrap()).collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    all
}

/// When (polling the metrics until `end`) the dispatcher had given up every stalled client.
fn given_up(admin: SocketAddr, start: Instant, end: Instant) -> std::thread::JoinHandle<Option<Duration>> {
    std::thread::spawn(move || {
        while Instant::now() < end {
            if metric(admin, r#"refract_errors_total{kind="client_stalled"}"#) >= STALLERS as u64 {
                return Some(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    })
}

fn stalled_readers(s: &Stalls) -> Measured {
    let ([_b1, _b2, _b3], d) = cluster().backends(3).dispatcher(s.extra).with(Binary::default()).run().split();
    let addr = d.proc.addr;
    let start = Instant::now();
    let end = start + s.run;
    let mut stalled: Vec<TcpStream> = (0..STALLERS)
        .map(|i| {
            let mut c = connect_from(s.from, addr);
            c.write_all(format!("GET /blob?bytes={BIG}&seed={i} HTTP/1.1\r\nhost: t\r\n\r\n").as_bytes()).unwrap();
            c
        })
        .collect();
    let watcher = given_up(d.admin, start, end);
    let all = probe_until(addr, start, end);
    std::thread::sleep(end.saturating_duration_since(Instant::now()));
    let closed = stalled.iter_mut().map(closed_now).filter(|&c| c).count();
    for (at, r) in all.iter().filter(|p| p.1.as_ref().map_or(true, |t| *t > PROBE_WITHIN)) {
        eprintln!("probe read at {at:.1} s: {r:?}");
    }
    let mut took: Vec<Duration> = all.iter().filter_map(|p| p.1.as_ref().ok().copied()).collect();
    took.sort();
    let probes = all.iter().map(|(at, r)| (*at, r.as_ref().is_ok_and(|t| *t <= PROBE_WITHIN))).collect();
    Measured { probes, took, closed, all_given_up: watcher.join().unwrap() }
}

/// Whether the proxy has closed (or reset) `s` already: what is still queued is read, then
/// the end must follow at once.
fn closed_now(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// The conformance scenario in a third of its time, the write-stall timeout scaled with it (10 s
/// of 15, as 30 s of 45): 40 clients from one address ask for 64 MiB each and read nothing while
/// probe reads from another address go on; the assertion holds over the whole run. The
/// `_for_45_s` run is the scenario at full length with the shipped defaults, from one address
/// and from two.
#[test]
fn clients_that_stop_reading_cost_other_clients_nothing() {
    let stalls = Stalls {
        from: Ipv4Addr::new(127, 0, 0, 2),
        run: Duration::from_secs(15),
        extra: "[timeouts]\nwrite_stall_ms = 10000\n",
    };
    stalled_readers(&stalls).check("15 s, stalled from 127.0.0.2");
}

/// The conformance scenario as reported, 45 s, stalled readers from another address than the
/// probes and from the same one (about 2 minutes:
/// `cargo test --profile ci -p refract --test it timeouts::for_45_s -- --ignored --nocapture`).
#[test]
#[ignore = "the full 45 s scenario, twice (about 2 minutes)"]
fn clients_that_stop_reading_cost_other_clients_nothing_for_45_s() {
    for from in [Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::LOCALHOST] {
        let m = stalled_readers(&Stalls { from, run: Duration::from_secs(45), extra: "" });
        m.check(&format!("45 s, stalled from {from}"));
    }
}
