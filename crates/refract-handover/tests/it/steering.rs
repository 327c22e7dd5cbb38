//! FREEZE / STEER / guard in a namespace lab: a whole hand-off to an agent host and back; and
//! several dispatchers' programs (or guards) on one interface, in an anonymous namespace.
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

/// The address the one-namespace tests below listen on (on `lo`).
const LO_VIP: &str = "198.18.7.100";
/// The MAC of `st1`, where STEER sends frames in those tests.
const ST1_MAC: [u8; 6] = [0x02, 0x52, 0x46, 0, 0, 0x71];

/// The priorities (`pref`) of the filters running `program` on `iface`'s ingress, in the
/// calling thread's namespace.
fn prefs(iface: &str, program: &str) -> Vec<u32> {
    let out = std::process::Command::new("tc").args(["filter", "show", "dev", iface, "ingress"]).output().unwrap();
    assert!(out.status.success(), "tc filter show failed");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut prefs: Vec<u32> = text
        .lines()
        .filter(|l| l.contains(program))
        .filter_map(|l| l.split_whitespace().skip_while(|w| *w != "pref").nth(1)?.parse().ok())
        .collect();
    prefs.sort_unstable();
    prefs
}

/// In the namespace of [`common::in_netns`]: a client connected to a listener on
/// `LO_VIP:port` over `lo`. Returns (client, server, key).
fn lo_connect(port: u16) -> (TcpStream, TcpStream, FlowKey) {
    let listener = TcpListener::bind(vip_at(LO_VIP, port)).unwrap();
    let client = TcpStream::connect(vip_at(LO_VIP, port)).unwrap();
    timeouts(&client);
    let (server, peer) = listener.accept().unwrap();
    timeouts(&server);
    (client, server, FlowKey::new(v4(peer), vip_at(LO_VIP, port)))
}

fn vip_at(ip: &str, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(ip.parse().unwrap(), port)
}

/// Frames `st1` has received (from `/proc/thread-self/net/dev`: this thread's namespace).
fn st1_rx_packets() -> u64 {
    let dev = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
    let line = dev.lines().find(|l| l.trim_start().starts_with("st1:")).unwrap();
    line.split(':').nth(1).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Two dispatchers' ingress programs on one interface (`lo` of an anonymous namespace): the
/// second attach adds a filter of its own in front of the first (the kernel's choice of
/// priority), each program freezes and steers its own flows — the first one's too, which it
/// only sees because the second passes on what is not its own (TC_ACT_UNSPEC; TC_ACT_OK would
/// end the chain) — a flow in neither map reaches the stack, and dropping one program leaves
/// the other attached and working.
#[test]
fn two_dispatchers_steering_programs_share_one_interface() {
    common::in_netns_as_root("two_dispatchers_steering_programs_share_one_interface", None, || {
        common::ip(&["addr", "add", &format!("{LO_VIP}/32"), "dev", "lo"]);
        // STEER's way out: frames redirected out of st0 arrive at st1 and end there (their
        // source address is this namespace's own: a martian, dropped, never answered).
        common::ip(&["link", "add", "st0", "type", "veth", "peer", "name", "st1"]);
        common::ip(&["link", "set", "st1", "address", &mac(ST1_MAC)]);
        common::ip(&["link", "set", "st0", "up"]);
        common::ip(&["link", "set", "st1", "up"]);
        let target =
            SteerTarget { ifindex: nix::net::if_::if_nametoindex("st0").unwrap(), dst_mac: ST1_MAC, src_mac: D_MAC };

        let mut first = Steering::attach("lo", 16).unwrap();
        let p_first = prefs("lo", "refract_ingress");
        assert_eq!(p_first.len(), 1);
        let mut second = Steering::attach("lo", 16).unwrap();
        let both = prefs("lo", "refract_ingress");
        assert_eq!(both.len(), 2, "the second program is added beside the first: {both:?}");
        assert!(both[0] < p_first[0] && both[1] == p_first[0], "the later one runs first: {both:?}");

        // a: frozen by the first (runs last), b: frozen by the second, c: steered by the first,
        // d: steered by the second, e: in neither map.
        let (mut ca, mut sa, ka) = lo_connect(7010);
        let (mut cb, mut sb, kb) = lo_connect(7011);
        let (mut cc, mut sc, kc) = lo_connect(7012);
        let (mut cd, mut sd, kd) = lo_connect(7013);
        let (mut ce, mut se, _) = lo_connect(7014);
        first.freeze(ka).unwrap();
        second.freeze(kb).unwrap();
        first.steer(kc, target, 1).unwrap();
        second.steer(kd, target, 2).unwrap();
        let rx = st1_rx_packets();
        for c in [&mut ca, &mut cb, &mut cc, &mut cd, &mut ce] {
            c.write_all(b"x").unwrap();
        }
        expect(&mut se, b"x"); // in neither map: passes both programs to the stack
        se.write_all(b"y").unwrap();
        expect(&mut ce, b"y");
        for (s, k, owner) in
            [(&first, ka, "first"), (&second, kb, "second"), (&first, kc, "first"), (&second, kd, "second")]
        {
            let met = || s.entry(&k).unwrap().is_some_and(|e| e.packets >= 1);
            assert!(wait_until(Duration::from_secs(2), met), "{}: no packet met the {owner}'s entry", k.vip());
        }
        assert!(second.entry(&ka).unwrap().is_none() && first.entry(&kb).unwrap().is_none());
        std::thread::sleep(Duration::from_millis(100));
        for s in [&sa, &sb, &sc, &sd] {
            assert_eq!(inq(s), 0, "a frozen or steered flow must not reach this stack");
        }
        for s in [&first, &second] {
            let st = s.stats().unwrap();
            assert!(st.frozen_drops >= 1 && st.steered >= 1 && st.redirect_errors == 0, "{st:?}");
        }
        assert!(st1_rx_packets() >= rx + 2, "steered frames left through st0");

        // The first goes: the second stays attached and keeps its flows; the first's reach the
        // stack again (their retransmissions).
        drop(first);
        assert_eq!(prefs("lo", "refract_ingress"), [both[0]]);
        expect(&mut sa, b"x");
        expect(&mut sc, b"x");
        let frozen = second.entry(&kb).unwrap().unwrap().packets;
        assert!(wait_until(Duration::from_secs(5), || second.entry(&kb).unwrap().unwrap().packets > frozen));
        assert_eq!(inq(&sb), 0, "still frozen by the second");
        assert!(second.remove(&kb).unwrap() && second.remove(&kd).unwrap());
        expect(&mut sb, b"x");
        expect(&mut sd, b"x");
        drop(second);
        assert!(prefs("lo", "refract_ingress").is_empty(), "filter left behind");
    });
}

/// Two guards on one interface (say, two agents on one host): a flow tombstoned in the guard
/// that runs last is dropped although the one in front finds its socket — it passes the
/// segment on (TC_ACT_UNSPEC) instead of ending the chain — and comes through once the
/// tombstone is lifted.
#[test]
fn two_guards_share_one_interface() {
    common::in_netns_as_root("two_guards_share_one_interface", None, || {
        common::ip(&["addr", "add", &format!("{LO_VIP}/32"), "dev", "lo"]);
        let vip_ip = LO_VIP.parse().unwrap();
        let mut first = Guard::attach("lo", vip_ip, 16).unwrap();
        let second = Guard::attach("lo", vip_ip, 16).unwrap();
        let both = prefs("lo", "refract_guard");
        assert_eq!(both.len(), 2, "{both:?}");
        let (mut client, mut server, key) = lo_connect(7020);
        first.tombstone(key).unwrap();
        client.write_all(b"t").unwrap();
        assert!(wait_until(Duration::from_secs(2), || first.stats().unwrap().tombstone_drops >= 1));
        assert!(second.stats().unwrap().passed >= 1, "the second guard saw the socket and passed");
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(inq(&server), 0, "a tombstoned flow must not reach the stack");
        assert!(first.remove(&key).unwrap());
        expect(&mut server, b"t");
        drop(second);
        assert_eq!(prefs("lo", "refract_guard").len(), 1, "the first guard stays");
        drop(first);
        assert!(prefs("lo", "refract_guard").is_empty());
    });
}
