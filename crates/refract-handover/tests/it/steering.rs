//! FREEZE / STEER / guard in a namespace lab: a whole hand-off to an agent host and back.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::time::Duration;

use common::lab::{mac, Lab, A_MAC, CLIENT_IP, C_MAC, D_MAC, VIP};
use common::{expect_stream, inq, pattern, root_or_skip, wait_until, A2B};
use refract_handover::{
    discard, restore, snapshot, unacked, unsent, FlowAction, FlowKey, Guard, SteerTarget, Steering,
};

fn vip(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(VIP.parse().unwrap(), port)
}

fn v4(a: SocketAddr) -> SocketAddrV4 {
    match a {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(_) => panic!("ipv6"),
    }
}

fn expect(r: &mut impl Read, want: &[u8]) {
    let mut buf = vec![0u8; want.len()];
    r.read_exact(&mut buf).unwrap();
    assert_eq!(buf, want);
}

fn timeouts(s: &TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.set_nodelay(true).unwrap();
}

/// In d: a listener on the VIP; in c: a client connected to it. Returns (client, server, key).
fn connect(lab: &Lab, port: u16) -> (TcpStream, TcpStream, FlowKey) {
    lab.enter("d");
    let listener = TcpListener::bind(vip(port)).unwrap();
    lab.enter("c");
    let client = TcpStream::connect(vip(port)).unwrap();
    timeouts(&client);
    lab.enter("d");
    let (server, peer) = listener.accept().unwrap();
    timeouts(&server);
    (client, server, FlowKey::new(v4(peer), vip(port)))
}

fn d_target(lab: &Lab) -> SteerTarget {
    lab.enter("d");
    let ifindex = nix::net::if_::if_nametoindex("eth0").unwrap();
    SteerTarget { ifindex, dst_mac: A_MAC, src_mac: D_MAC }
}

/// Runs `test`'s `body` (skipped unless root) in a lab of its own (`tag`, one letter), on a
/// thread of its own that moves between the lab's hosts.
fn in_lab(test: &str, tag: &str, body: impl FnOnce(&Lab) + Send) {
    if !root_or_skip(test) {
        return;
    }
    let lab = Lab::up(tag);
    lab.thread(|| body(&lab));
}

/// A flow to hand off: steering attached at d's `eth0`, a client in c connected to a listener
/// on the VIP at a port in d ([`connect`]), and where steered frames go (a's `eth0`, d's MAC as
/// their source). The thread is left in d.
struct Flow {
    target: SteerTarget,
    steering: Steering,
    client: TcpStream,
    server: TcpStream,
    key: FlowKey,
}

impl Flow {
    fn open(lab: &Lab, port: u16) -> Flow {
        let target = d_target(lab);
        let steering = Steering::attach("eth0", 64).unwrap();
        let (client, server, key) = connect(lab, port);
        Flow { target, steering, client, server, key }
    }
}

#[test]
fn freeze_steer_hand_off_and_hand_back() {
    in_lab("freeze_steer_hand_off_and_hand_back", "s", |lab| {
        let Flow { target, mut steering, mut client, mut server, key } = Flow::open(lab, 7000);
        assert!(lab.tc_filters("d").contains("refract_ingress"));
        client.write_all(b"ping").unwrap();
        expect(&mut server, b"ping");

        // FREEZE drops the flow's packets; removing the entry lets the retransmission in.
        steering.freeze(key).unwrap();
        client.write_all(b"f").unwrap();
        assert!(wait_until(Duration::from_secs(2), || steering.entry(&key).unwrap().unwrap().packets >= 1));
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(inq(&server), 0, "a frozen flow must not reach the stack");
        assert!(steering.stats().unwrap().frozen_drops >= 1);
        assert!(steering.remove(&key).unwrap());
        expect(&mut server, b"f");

        // Hand-off: a request waits in the receive queue; quiesce, freeze, snapshot, steer.
        client.write_all(b"GET 1\n").unwrap();
        assert!(wait_until(Duration::from_secs(2), || inq(&server) == 6));
        assert_eq!(unacked(&server).unwrap(), 0);
        steering.freeze(key).unwrap();
        let state = snapshot(&server).unwrap();
        discard(server.into()).unwrap();
        lab.enter("a");
        let mut guard = Guard::attach("eth0", VIP.parse().unwrap(), 16).unwrap();
        lab.enter("d");
        steering.steer(key, target, 1).unwrap();
        // Steered before the agent has the socket: its guard drops the segment (no RST).
        client.write_all(b"early").unwrap();
        assert!(wait_until(Duration::from_secs(2), || guard.stats().unwrap().orphan_drops >= 1));
        lab.enter("a");
        let mut agent = TcpStream::from(restore(&state).unwrap());
        timeouts(&agent);
        expect(&mut agent, b"GET 1\nearly"); // the client retransmits "early"
        agent.write_all(b"RESULT from a").unwrap(); // direct server return
        expect(&mut client, b"RESULT from a");
        client.write_all(b"more").unwrap();
        expect(&mut agent, b"more");
        match steering.entry(&key).unwrap().unwrap() {
            e @ refract_handover::FlowEntry { action: FlowAction::Steer { epoch: 1, .. }, .. } => {
                assert!(e.packets >= 3, "{e:?}")
            }
            e => panic!("{e:?}"),
        }
        assert!(steering.stats().unwrap().steered >= 3);
        assert!(guard.stats().unwrap().passed >= 1);

        // Hand-back: tombstone at the agent, snapshot there, restore in d, un-steer.
        assert!(wait_until(Duration::from_secs(2), || unacked(&agent).unwrap() == 0));
        guard.tombstone(key).unwrap();
        let state = snapshot(&agent).unwrap();
        discard(agent.into()).unwrap();
        lab.enter("d");
        let mut server = TcpStream::from(restore(&state).unwrap());
        timeouts(&server);
        assert!(steering.remove(&key).unwrap());
        client.write_all(b"back").unwrap();
        expect(&mut server, b"back");
        server.write_all(b"bye").unwrap();
        expect(&mut client, b"bye");
        assert!(guard.remove(&key).unwrap());

        assert_eq!(steering.len().unwrap(), 0);
        assert!(guard.is_empty().unwrap());
        assert_eq!(steering.stats().unwrap().redirect_errors, 0);
        lab.enter("a");
        drop(guard);
        lab.enter("d");
        drop(steering);
        assert!(!lab.tc_filters("d").contains("refract"), "filter left behind");
        assert!(!lab.tc_filters("a").contains("refract"), "filter left behind");
    });
}

#[test]
fn without_the_guard_an_early_segment_resets_the_client() {
    in_lab("without_the_guard_an_early_segment_resets_the_client", "g", |lab| {
        let Flow { target, mut steering, mut client, server, key } = Flow::open(lab, 7001);
        steering.freeze(key).unwrap();
        let _state = snapshot(&server).unwrap();
        discard(server.into()).unwrap();
        steering.steer(key, target, 1).unwrap();
        client.write_all(b"early").unwrap(); // reaches the agent before its socket exists
        let mut buf = [0u8; 1];
        let err = client.read(&mut buf).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ConnectionReset, "the agent's stack answers RST");
        assert!(steering.remove(&key).unwrap());
        drop(steering);
    });
}

#[test]
fn a_full_map_is_reported_so_the_caller_relays() {
    in_lab("a_full_map_is_reported_so_the_caller_relays", "m", |lab| {
        lab.enter("d");
        let mut steering = Steering::attach("eth0", 2).unwrap();
        let key = |port| FlowKey::new(SocketAddrV4::new(Ipv4Addr::new(198, 18, 1, 1), port), vip(80));
        steering.freeze(key(1)).unwrap();
        steering.freeze(key(2)).unwrap();
        let err = steering.freeze(key(3)).unwrap_err();
        assert!(matches!(err, refract_handover::Error::MapFull(2)), "{err}");
        assert!(err.is_retryable());
        steering.freeze(key(2)).unwrap(); // updating an existing entry still works
        assert!(steering.remove(&key(1)).unwrap());
        assert!(!steering.remove(&key(1)).unwrap());
        assert!(steering.remove(&key(2)).unwrap());
        assert_eq!(steering.len().unwrap(), 0);
        assert!(Steering::attach("eth0", 0).is_err());
        drop(steering);
    });
}

#[test]
#[ignore = "not deterministic in release builds (the client still receives the result: the bridge relearns its MAC); to be fixed with issue 3"]
fn without_the_source_mac_rewrite_the_agents_replies_go_to_the_dispatcher() {
    in_lab("without_the_source_mac_rewrite_the_agents_replies_go_to_the_dispatcher", "n", |lab| {
        let Flow { mut target, mut steering, mut client, server, key } = Flow::open(lab, 7002);
        // The agent host already knows the client's MAC (as after any earlier exchange): an
        // ARP reply from the client would re-teach the switch its port for a moment and hide
        // the failure until the client's next steered segment.
        let neigh = ["-n", &lab.ns("a"), "neigh", "replace", CLIENT_IP, "lladdr", &mac(C_MAC), "dev", "eth0"];
        assert!(std::process::Command::new("ip").args(neigh).args(["nud", "permanent"]).status().unwrap().success());
        // ★ rule off: steered frames keep the client's source MAC.
        target.src_mac = C_MAC;
        client.write_all(b"GET 1\n").unwrap();
        assert!(wait_until(Duration::from_secs(2), || inq(&server) == 6));
        steering.freeze(key).unwrap();
        let state = snapshot(&server).unwrap();
        discard(server.into()).unwrap();
        lab.enter("a");
        let guard = Guard::attach("eth0", VIP.parse().unwrap(), 16).unwrap();
        let mut agent = TcpStream::from(restore(&state).unwrap());
        timeouts(&agent);
        lab.enter("d");
        steering.steer(key, target, 1).unwrap();
        expect(&mut agent, b"GET 1\n");
        client.write_all(b"more").unwrap();
        expect(&mut agent, b"more");
        // The steered frame entered the switch on d's port with the client's MAC: learnt there.
        assert_eq!(lab.fdb_port(C_MAC).as_deref(), Some("sw-d"));
        agent.write_all(b"RESULT").unwrap();
        client.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut buf = [0u8; 6];
        let err = client.read(&mut buf).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "{err}");
        assert_eq!(unacked(&agent).unwrap(), 6, "the client never saw the result: it went to d");

        // Rule on: with d's MAC as the source the client's next segment is learnt on its own
        // port again, and the agent's retransmission reaches the client.
        target.src_mac = D_MAC;
        steering.steer(key, target, 1).unwrap();
        client.write_all(b"again").unwrap();
        expect(&mut agent, b"again");
        assert_eq!(lab.fdb_port(C_MAC).as_deref(), Some("sw-c"));
        client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        expect(&mut client, b"RESULT");

        assert!(steering.remove(&key).unwrap());
        drop(agent);
        lab.enter("a");
        drop(guard);
        lab.enter("d");
        drop(steering);
    });
}

#[test]
fn sent_but_unacknowledged_bytes_move_with_the_state() {
    const N: usize = 8000; // under the initial congestion window: all of it goes out at once
    in_lab("sent_but_unacknowledged_bytes_move_with_the_state", "u", |lab| {
        let Flow { target, mut steering, mut client, mut server, key } = Flow::open(lab, 7003);
        // FREEZE drops the client's ACKs at d's ingress: what d sends stays unacknowledged.
        steering.freeze(key).unwrap();
        server.write_all(&pattern(A2B, 0, N)).unwrap();
        expect_stream(&mut client, A2B, 0, N);
        assert!(wait_until(Duration::from_secs(2), || unsent(&server).unwrap() == 0));
        assert_eq!(unacked(&server).unwrap() as usize, N);
        let state = snapshot(&server).unwrap();
        assert_eq!((state.sent_unacked().len(), state.unsent), (N, 0));
        discard(server.into()).unwrap();

        lab.enter("a");
        let guard = Guard::attach("eth0", VIP.parse().unwrap(), 16).unwrap();
        let mut agent = TcpStream::from(restore(&state).unwrap());
        timeouts(&agent);
        assert_eq!(unacked(&agent).unwrap() as usize, N, "the agent holds the unacknowledged bytes");
        lab.enter("d");
        steering.steer(key, target, 1).unwrap();
        // The client's next segment acknowledges them at the agent; the stream continues there.
        client.write_all(b"next").unwrap();
        expect(&mut agent, b"next");
        assert!(wait_until(Duration::from_secs(2), || unacked(&agent).unwrap() == 0));
        agent.write_all(&pattern(A2B, N as u64, 100_000)).unwrap();
        expect_stream(&mut client, A2B, N as u64, 100_000); // no byte lost or repeated

        assert!(steering.remove(&key).unwrap());
        drop(agent);
        lab.enter("a");
        drop(guard);
        lab.enter("d");
        drop(steering);
    });
}
