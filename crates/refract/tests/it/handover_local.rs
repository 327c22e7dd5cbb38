//! Same-host hand-over end to end: the real binary runs two blob servers, an agent in front of
//! the replica (Unix socket, SCM_RIGHTS) and the dispatcher with `[handover] mode = "always"`.
//! One keep-alive client connection alternates reads (served by the agent, tagged
//! `x-refract-handover: EPOCH`) and writes (relayed by the dispatcher), then pipelines reads;
//! every body is checked byte for byte against the blob pattern.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::{blob_get as get, check_blob as check};

use common::{agents_line, check_pipelined_write, cluster, direct, metric, wait_metric, writes};
use common::{Agent, Binary, Client, Cluster, Dispatcher, Proc};
use refract_blob::pattern;
use std::time::{Duration, Instant};

/// What most tests here start from: blob servers b1 (the primary) and b2 (a replica), an
/// agent in front of b2, and a dispatcher with `extra` (`{agents}` in it: the agent's line of
/// `[handover]`). Fields in drop order (the dispatcher first).
struct Rig {
    d: Dispatcher,
    agent: Agent,
    b2: Proc,
    b1: Proc,
}

fn rig(extra: &str) -> Rig {
    let Cluster { dispatcher, agents, backends, .. } =
        cluster().backends(2).agent("b2").dispatcher(extra).with(Binary::default()).run();
    let [(_, b1), (_, b2)] = <[_; 2]>::try_from(backends).ok().unwrap();
    let [(_, agent)] = <[_; 1]>::try_from(agents).ok().unwrap();
    Rig { d: dispatcher.unwrap(), agent, b2, b1 }
}

/// A write, relayed by the dispatcher: once it is answered, the agent has handed the
/// connection back (an agent killed while it serves takes the connection with it: the
/// dispatcher cannot tell whether that response was whole; one killed while the client is idle
/// there gives it back, `clients_idle_at_a_killed_agent_come_back_to_the_dispatcher`).
fn relayed_write(c: &mut Client) {
    c.send(b"POST /blob HTTP/1.1\r\nhost: t\r\ncontent-length: 3\r\n\r\nabc");
    let w = c.read_response(false).unwrap();
    assert_eq!((w.status, w.header("x-refract-handover")), (200, None), "{}", w.head);
}

/// `always`, the agent handing back at once when nothing is buffered (`idle_ms = 0`: the
/// epochs these tests expect do not depend on how fast the client sends its next request).
const HANDOVER: &str = "[handover]\nmode = \"always\"\nidle_ms = 0\n{agents}\n";

const HYBRID: &str = "[handover]\nmode = \"hybrid\"\nthreshold = 1048576\nidle_ms = 0\n{agents}\n";

/// A large read with a write pipelined behind it: the agent serves the read, asks about the
/// write (`Next`), hands it back (`Return`), and the dispatcher sends it to the primary.
fn pipelined_write_goes_to_the_primary(mode: &str) {
    let Rig { b1, b2, agent: _agent, d } =
        rig(&format!("[handover]\nmode = \"{mode}\"\nthreshold = 65536\n{{agents}}\n"));
    let mut c = Client::connect(d.proc.addr);
    check_pipelined_write(&mut c, d.admin, &b1, &b2);
}

#[test]
fn a_pipelined_write_behind_a_large_read_goes_to_the_primary_always() {
    pipelined_write_goes_to_the_primary("always");
}

#[test]
fn a_pipelined_write_behind_a_large_read_goes_to_the_primary_hybrid() {
    pipelined_write_goes_to_the_primary("hybrid");
}

#[test]
fn consecutive_large_reads_stay_at_the_agent() {
    const N: u64 = 20;
    let Rig { b1, b2, agent: _agent, d } =
        rig("[handover]\nmode = \"hybrid\"\nthreshold = 65536\nidle_ms = 1000\n{agents}\n");
    let mut c = Client::connect(d.proc.addr);
    let started = Instant::now();
    for seed in 0..N {
        c.send(get(1 << 20, seed).as_bytes());
        check(&c.read_response(false).unwrap(), 1 << 20, seed, Some("1"));
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "{N} reads of 1 MiB took {took:?}");
    assert_eq!(metric(d.admin, r#"refract_handover_total{backend="b2",result="ok"}"#), 1);
    assert_eq!(metric(d.admin, r#"refract_handover_kept_total{backend="b2"}"#), N - 1);
    wait_metric(d.admin, r#"refract_handback_total{backend="b2"}"#, 1);
    // Back at the dispatcher: a write goes to the primary.
    relayed_write(&mut c);
    assert_eq!((writes(&b1), writes(&b2)), (1, 0));
}

#[test]
fn hybrid_hands_over_only_large_results() {
    let Rig { b1: _b1, b2: _b2, agent: _agent, d } = rig(HYBRID);
    let mut c = Client::connect(d.proc.addr);
    let mut sent_direct = 0;
    // Small: relayed through the agent and the dispatcher. At the threshold: handed over.
    c.send(get(100, 1).as_bytes());
    check(&c.read_response(false).unwrap(), 100, 1, None);
    c.send(get((1 << 20) - 1, 2).as_bytes());
    check(&c.read_response(false).unwrap(), (1 << 20) - 1, 2, None);
    c.send(get(1 << 20, 3).as_bytes());
    let r = c.read_response(false).unwrap();
    check(&r, 1 << 20, 3, Some("1"));
    sent_direct += direct(&r);
    c.send(get(0, 0).as_bytes());
    check(&c.read_response(false).unwrap(), 0, 0, None);
    // Pipelined small, large, small: the large one's hand-over carries the third request,
    // which the agent then serves itself before handing back.
    let sizes = [(10u64, 4u64), (5 << 20, 5), (20, 6)];
    c.send(sizes.iter().map(|&(n, s)| get(n, s)).collect::<String>().as_bytes());
    let via = [None, Some("3"), Some("3")];
    for ((n, s), v) in sizes.into_iter().zip(via) {
        let r = c.read_response(false).unwrap();
        check(&r, n, s, v);
        sent_direct += direct(&r);
    }
    c.send(b"POST /blob HTTP/1.1\r\nhost: t\r\ncontent-length: 3\r\n\r\nabc");
    assert_eq!(c.read_response(false).unwrap().status, 200);
    c.send(get(2 << 20, 7).as_bytes());
    let r = c.read_response(false).unwrap();
    check(&r, 2 << 20, 7, Some("5"));
    sent_direct += direct(&r);
    // Three hand-overs (the small results are relayed, not counted), three hand-backs, and
    // every byte the agent wrote to the client.
    wait_metric(d.admin, r#"refract_handback_total{backend="b2"}"#, 3);
    assert_eq!(metric(d.admin, r#"refract_handover_total{backend="b2",result="ok"}"#), 3);
    assert_eq!(metric(d.admin, r#"refract_bytes_direct_total{backend="b2"}"#), sent_direct);
    assert_eq!(metric(d.admin, "refract_handover_seconds_count"), 3);
}

#[test]
fn hybrid_sends_reads_known_to_be_small_straight_to_the_backend() {
    let Rig { b1: _b1, b2: _b2, agent: _agent, d } = rig(HYBRID);
    let forwarded = || metric(d.admin, r#"refract_handover_forwarded_total{backend="b2"}"#);
    let mut c = Client::connect(d.proc.addr);
    // A small read: through the agent once (its size is not known yet), then straight to b2.
    for _ in 0..3 {
        c.send(get(100, 1).as_bytes());
        check(&c.read_response(false).unwrap(), 100, 1, None);
    }
    assert_eq!(forwarded(), 1, "only the first small read went through the agent");
    // A large read: through the agent, and handed over, every time.
    for _ in 0..2 {
        c.send(get(2 << 20, 2).as_bytes());
        let r = c.read_response(false).unwrap();
        assert!(r.header("x-refract-handover").is_some(), "handed over: {}", r.head);
        check(&r, 2 << 20, 2, r.header("x-refract-handover").as_deref());
        wait_metric(d.admin, r#"refract_handback_total{backend="b2"}"#, forwarded() - 1);
    }
    assert_eq!(forwarded(), 3);
    assert_eq!(metric(d.admin, r#"refract_handover_total{backend="b2",result="ok"}"#), 2);
}

#[test]
fn hybrid_without_its_agent_relays() {
    let Rig { b1: _b1, b2: _b2, agent, d } = rig(HYBRID);
    let mut c = Client::connect(d.proc.addr);
    c.send(get(2 << 20, 1).as_bytes());
    check(&c.read_response(false).unwrap(), 2 << 20, 1, Some("1"));
    relayed_write(&mut c);
    drop(agent);
    for (n, s) in [(2u64 << 20, 2u64), (5, 3)] {
        c.send(get(n, s).as_bytes());
        check(&c.read_response(false).unwrap(), n, s, None);
    }
}

#[test]
fn reads_go_through_the_agent_and_the_connection_comes_back() {
    let Rig { b1: _b1, b2: _b2, agent: _agent, d } = rig(HANDOVER);
    let mut c = Client::connect(d.proc.addr);
    let mut sent_direct = 0;

    c.send(get(3 << 20, 5).as_bytes());
    let r = c.read_response(false).unwrap();
    check(&r, 3 << 20, 5, Some("1"));
    sent_direct += direct(&r);
    // A write is relayed by the dispatcher on the same connection: it has the socket back.
    c.send(b"POST /blob HTTP/1.1\r\nhost: t\r\ncontent-length: 3\r\n\r\nabc");
    let w = c.read_response(false).unwrap();
    assert_eq!((w.status, w.header("x-refract-handover")), (200, None), "{}", w.head);
    c.send(get(1000, 2).as_bytes());
    let r = c.read_response(false).unwrap();
    check(&r, 1000, 2, Some("3"));
    sent_direct += direct(&r);
    // Pipelined reads travel with the first: the agent serves all three in one hand-over.
    let sizes = [(70_000u64, 1u64), (0, 0), (1 << 20, 250)];
    c.send(sizes.iter().map(|&(n, s)| get(n, s)).collect::<String>().as_bytes());
    for (n, s) in sizes {
        let r = c.read_response(false).unwrap();
        check(&r, n, s, Some("5"));
        sent_direct += direct(&r);
    }
    // A request split across writes: the agent hands back the partial one, the dispatcher
    // completes it and hands over again.
    let req = get(4096, 9);
    c.send(&req.as_bytes()[..10]);
    std::thread::sleep(Duration::from_millis(50));
    c.send(&req.as_bytes()[10..]);
    let r = c.read_response(false).unwrap();
    check(&r, 4096, 9, Some("7"));
    sent_direct += direct(&r);
    // Four hand-overs, four hand-backs, and every byte the agent wrote to the client counted.
    wait_metric(d.admin, r#"refract_handback_total{backend="b2"}"#, 4);
    assert_eq!(metric(d.admin, r#"refract_handover_total{backend="b2",result="ok"}"#), 4);
    assert_eq!(metric(d.admin, r#"refract_bytes_direct_total{backend="b2"}"#), sent_direct);
    assert_eq!(metric(d.admin, "refract_handover_seconds_count"), 4);
    assert_eq!(metric(d.admin, r#"refract_handover_ended_total{backend="b2",end="lost"}"#), 0);
    let backends = common::admin_get(d.admin, "/backends").json();
    let b2 = backends.as_array().unwrap().iter().find(|b| b["name"] == "b2").unwrap();
    let want = serde_json::json!({"handovers": 4, "handbacks": 4, "bytes_direct": sent_direct});
    assert_eq!(b2["handover"], want, "{backends}");
}

#[test]
fn an_unreachable_agent_means_relay() {
    let dir = tempfile::tempdir().unwrap();
    let extra = HANDOVER.replace("{agents}", &agents_line(&[("b2", &dir.path().join("nobody.sock"))]));
    let ([_b1, _b2], d) = cluster().backends(2).dispatcher(&extra).with(Binary::default()).run().split();
    let mut c = Client::connect(d.proc.addr);
    for (n, s) in [(2u64 << 20, 3u64), (10, 4)] {
        c.send(get(n, s).as_bytes());
        check(&c.read_response(false).unwrap(), n, s, None);
    }
    assert_eq!(metric(d.admin, r#"refract_handover_total{backend="b2",result="unreachable"}"#), 2);
    assert_eq!(metric(d.admin, r#"refract_handover_total{backend="b2",result="ok"}"#), 0);
}

#[test]
fn an_agent_killed_between_hand_overs_means_relay() {
    let Rig { b1: _b1, b2: _b2, agent, d } = rig(HANDOVER);
    let mut c = Client::connect(d.proc.addr);
    c.send(get(100, 1).as_bytes());
    check(&c.read_response(false).unwrap(), 100, 1, Some("1"));
    relayed_write(&mut c); // the connection is back at the dispatcher: the agent may go
    drop(agent);
    for (n, s) in [(1u64 << 20, 2u64), (5, 3)] {
        c.send(get(n, s).as_bytes());
        check(&c.read_response(false).unwrap(), n, s, None);
    }
}

/// Reads a response head and then whatever body arrives until the connection ends.
fn read_until_cut(c: &mut Client, first: &[u8]) -> (u16, usize) {
    use std::io::Read;
    let mut raw = first.to_vec();
    let mut chunk = vec![0u8; 1 << 16];
    while let Ok(n) = c.stream.read(&mut chunk) {
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&chunk[..n]);
    }
    let head = refract_http::ResponseHead::parse(&raw, 1 << 16, false).unwrap().unwrap();
    (head.status, raw.len() - head.len)
}

#[test]
fn an_agent_killed_mid_stream_cuts_only_that_client() {
    let Rig { b1: _b1, b2: _b2, agent, d } = rig(HANDOVER);
    let mut c = Client::connect(d.proc.addr);
    c.stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let big = 256u64 << 20;
    c.send(get(big, 1).as_bytes());
    let mut first = [0u8; 1];
    std::io::Read::read_exact(&mut c.stream, &mut first).unwrap(); // the agent is streaming
    agent.signal("KILL");
    let started = Instant::now();
    let (status, got) = read_until_cut(&mut c, &first);
    assert_eq!(status, 200);
    assert!((got as u64) < big, "the cut response is short ({got} bytes)");
    assert!(started.elapsed() < Duration::from_secs(2), "the cut is seen within the bound");
    wait_metric(d.admin, r#"refract_handover_ended_total{backend="b2",end="lost"}"#, 1);
    // Other clients are served (by relay now).
    let mut other = Client::connect(d.proc.addr);
    other.send(get(1 << 20, 2).as_bytes());
    check(&other.read_response(false).unwrap(), 1 << 20, 2, None);
}

#[test]
fn a_client_gone_mid_stream_leaves_the_agent_serving() {
    let Rig { b1: _b1, b2: _b2, agent: _agent, d } = rig(HANDOVER);
    let mut c = Client::connect(d.proc.addr);
    c.send(get(256 << 20, 1).as_bytes());
    let mut first = [0u8; 1];
    std::io::Read::read_exact(&mut c.stream, &mut first).unwrap();
    drop(c);
    let mut other = Client::connect(d.proc.addr);
    for (n, s) in [(3u64 << 20, 2u64), (7, 3)] {
        other.send(get(n, s).as_bytes());
        let r = other.read_response(false).unwrap();
        assert!(r.header("x-refract-handover").is_some(), "{}", r.head);
        assert_eq!(pattern::first_mismatch(&r.body, 0, s), None);
    }
}

#[test]
fn clients_idle_at_a_killed_agent_come_back_to_the_dispatcher() {
    let Rig { b1: _b1, b2: _b2, agent, d } = rig(
        // The agent waits up to 1 s for each client's next request: both are idle there when it dies.
        "[handover]\nmode = \"always\"\nidle_ms = 1000\n{agents}\n",
    );
    let mut clients = [Client::connect(d.proc.addr), Client::connect(d.proc.addr)];
    for (i, c) in clients.iter_mut().enumerate() {
        c.stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.send(get(1000, i as u64).as_bytes());
        check(&c.read_response(false).unwrap(), 1000, i as u64, Some("1"));
    }
    agent.signal("KILL");
    wait_metric(d.admin, r#"refract_handover_ended_total{backend="b2",end="taken_back"}"#, 2);
    // Each client's next request is answered by the dispatcher (relayed: the agent is gone).
    for (i, c) in clients.iter_mut().enumerate() {
        let seed = 10 + i as u64;
        c.send(get(1 << 20, seed).as_bytes());
        check(&c.read_response(false).unwrap(), 1 << 20, seed, None);
    }
    assert_eq!(metric(d.admin, r#"refract_handover_ended_total{backend="b2",end="lost"}"#), 0);
}
