//! `quiesce` (docs/handover.md, I3) asks a client that holds back its ACK for it instead of
//! waiting for the client's delayed-ACK timer, on loopback inside a throw-away namespace (whose
//! TCP counters are this test's alone).
#![allow(clippy::unwrap_used)]

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use refract_handover::{quiesce, unacked};

/// A `TcpExt` counter of the calling thread's network namespace.
fn tcp_ext(name: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/thread-self/net/netstat").unwrap();
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("TcpExt:")).collect();
    let (names, values) = (rows[0].split_whitespace(), rows[1].split_whitespace());
    names.zip(values).find(|(n, _)| *n == name).map(|(_, v)| v.parse().unwrap()).unwrap()
}

/// The client sends a query right after a greeting (Linux then treats it as interactive and
/// delays its ACKs), the server answers with one short segment: the client's ACK of it waits
/// for its delayed-ACK timer (≥ 40 ms), as psql's does behind a relayed result's last bytes.
fn interactive_exchange(client: &mut TcpStream, server: &mut TcpStream) {
    server.write_all(b"hello").unwrap();
    let mut buf = [0u8; 5];
    client.read_exact(&mut buf).unwrap();
    client.write_all(b"query").unwrap();
    server.read_exact(&mut buf).unwrap();
    server.write_all(&[7u8; 43]).unwrap();
}

/// One exchange, then `quiesce`: whether it asked for the ACK (a window probe) and got it
/// before the client's delayed-ACK timer fired; the connection still works both ways.
fn asked_not_waited() -> bool {
    let p = pair(None);
    let (mut client, mut server) = (p.client, TcpStream::from(p.server));
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let (delayed, probes) = (tcp_ext("DelayedACKs"), tcp_ext("TCPWinProbe"));
    interactive_exchange(&mut client, &mut server);
    let started = Instant::now();
    rt.block_on(quiesce(&server, Duration::from_secs(2))).unwrap();
    let took = started.elapsed();
    assert_eq!(unacked(&server).unwrap(), 0);
    let (delayed, probes) = (tcp_ext("DelayedACKs") - delayed, tcp_ext("TCPWinProbe") - probes);
    assert!(probes <= 1, "one probe at most, {probes} sent");
    // The probe changed nothing else: the connection goes on both ways.
    let mut got = [0u8; 43];
    client.read_exact(&mut got).unwrap();
    assert_eq!(got, [7u8; 43]);
    client.write_all(b"more").unwrap();
    let mut more = [0u8; 4];
    server.read_exact(&mut more).unwrap();
    assert_eq!(&more, b"more");
    println!("quiesced in {took:?}: {probes} probe(s), {delayed} delayed-ACK timer(s) fired");
    probes == 1 && delayed == 0
}

#[test]
fn a_held_back_ack_is_asked_for_not_waited_for() {
    if !root_or_skip("a_held_back_ack_is_asked_for_not_waited_for") {
        return;
    }
    // Without the probe the wait ends only when the client's delayed-ACK timer fires (every
    // attempt fails). A test thread descheduled past that timer on a loaded machine can miss
    // it once: a few attempts.
    let ok = in_netns(None, || (0..5).any(|_| asked_not_waited()));
    assert!(ok, "no attempt quiesced by asking for the ACK before the client's delayed-ACK timer");
}

#[test]
fn a_client_that_never_acknowledges_is_not_quiescent() {
    in_netns_as_root("a_client_that_never_acknowledges_is_not_quiescent", None, || {
        let p = pair(None);
        let (mut client, mut server) = (p.client, TcpStream::from(p.server));
        interactive_exchange(&mut client, &mut server);
        // Nothing reaches the client any more: neither the probe nor retransmissions are answered.
        ip(&["link", "set", "lo", "down"]);
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let r = rt.block_on(quiesce(&server, Duration::from_millis(100)));
        assert!(matches!(r, Err(refract_handover::Error::NotQuiescent(43))), "{r:?}");
    });
}
