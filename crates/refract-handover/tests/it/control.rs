//! Control messages: codec properties, and the authenticated channel on loopback.
#![allow(clippy::unwrap_used)]

use std::net::{SocketAddr, SocketAddrV4};
use std::time::Duration;

use bytes::BytesMut;
use proptest::prelude::*;
use refract_handover::control::{ChannelOptions, ControlChannel, ControlKey, NonceCache};
use refract_handover::msg::{encode, parse};
use refract_handover::{
    Carrier, Error, FlowKey, Msg, RepairWindow, Serving, SockOpts, Socket, TcpOptions, TcpState, Transfer, MAX_FRAME,
    VERSION,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

// ---- codec ----------------------------------------------------------------------------------

fn addr_v4() -> impl Strategy<Value = SocketAddr> {
    (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::from((ip, port)))
}

fn addr_pair() -> impl Strategy<Value = (SocketAddr, SocketAddr)> {
    prop_oneof![
        (addr_v4(), addr_v4()),
        (any::<([u8; 16], u16, [u8; 16], u16)>())
            .prop_map(|(a, p, b, q)| (SocketAddr::from((a, p)), SocketAddr::from((b, q)))),
    ]
}

fn tcp_state() -> impl Strategy<Value = TcpState> {
    let queues = (proptest::collection::vec(any::<u8>(), 0..300), proptest::collection::vec(any::<u8>(), 0..300));
    (
        addr_pair(),
        0u8..8,
        0u8..15,
        0u8..15,
        any::<[u32; 3]>(),
        any::<[u32; 7]>(),
        queues,
        any::<(u32, bool, bool, u32)>(),
    )
        .prop_map(|((local, peer), bits, sw, rw, [clamp, mss, ts], w, (rq, sq), (unsent, nd, ka, uto))| {
            let unsent = if sq.is_empty() { 0 } else { unsent % (sq.len() as u32 + 1) };
            TcpState {
                local,
                peer,
                options: TcpOptions::from_bits(bits),
                snd_wscale: sw,
                rcv_wscale: rw,
                mss_clamp: clamp,
                mss,
                timestamp: ts,
                window: RepairWindow { snd_wl1: w[0], snd_wnd: w[1], max_window: w[2], rcv_wnd: w[3], rcv_wup: w[4] },
                recv_seq: w[5],
                send_seq: w[6],
                recv_queue: rq,
                send_queue: sq,
                unsent,
                sockopts: SockOpts { nodelay: nd, keepalive: ka, user_timeout_ms: uto },
            }
        })
}

fn transfer() -> impl Strategy<Value = Box<Transfer>> {
    let flow = (any::<[u8; 4]>(), any::<u16>(), any::<[u8; 4]>(), any::<u16>())
        .prop_map(|(a, p, b, q)| FlowKey::new(SocketAddrV4::new(a.into(), p), SocketAddrV4::new(b.into(), q)));
    let socket = prop_oneof![
        Just(Socket::Passed),
        (flow, tcp_state()).prop_map(|(flow, tcp_state)| Socket::Repair { flow, tcp_state }),
    ];
    let backend = prop_oneof![Just(None), addr_pair().prop_map(|(a, _)| Some(a))];
    let serving = (any::<u32>(), backend).prop_map(|(idle_ms, backend)| Serving { idle_ms, backend });
    let blob = proptest::collection::vec(any::<u8>(), 0..200);
    (any::<(u64, u64, u64)>(), socket, blob, serving).prop_map(|((conn, epoch, sent), socket, pending, serving)| {
        Box::new(Transfer { conn, epoch, socket, pending, serving, sent })
    })
}

fn msg() -> impl Strategy<Value = Msg> {
    let reason = "\\PC{0,40}";
    prop_oneof![
        (any::<u16>(), any::<[u8; 32]>()).prop_map(|(version, nonce)| Msg::Hello { version, nonce }),
        (any::<[u8; 32]>(), any::<[u8; 32]>()).prop_map(|(nonce, proof)| Msg::Challenge { nonce, proof }),
        any::<[u8; 32]>().prop_map(|proof| Msg::Proof { proof }),
        Just(Msg::Heartbeat),
        any::<(u64, u64)>().prop_map(|(conn, request)| Msg::WantConnection { conn, request }),
        transfer().prop_map(Msg::HandOff),
        any::<(u64, u64)>().prop_map(|(conn, epoch)| Msg::HandOffOk { conn, epoch }),
        (any::<(u64, u64)>(), reason).prop_map(|((conn, epoch), reason)| Msg::HandOffErr { conn, epoch, reason }),
        transfer().prop_map(Msg::HandBack),
        any::<(u64, u64)>().prop_map(|(conn, epoch)| Msg::HandBackOk { conn, epoch }),
        (any::<(u64, u64, u64)>(), reason).prop_map(|((conn, epoch, sent), reason)| Msg::Closed {
            conn,
            epoch,
            sent,
            reason
        }),
        (any::<(u64, u64)>(), reason).prop_map(|((conn, request), reason)| Msg::RelayInstead { conn, request, reason }),
        (any::<(u64, u64, u64)>(), proptest::collection::vec(any::<u8>(), 0..300))
            .prop_map(|((conn, request, threshold), bytes)| Msg::Forward { conn, request, threshold, bytes }),
        (any::<(u64, u64, bool, bool)>(), proptest::collection::vec(any::<u8>(), 0..300))
            .prop_map(|((conn, request, last, keep), bytes)| Msg::Response { conn, request, last, keep, bytes }),
        (any::<(u64, u64)>(), proptest::collection::vec(any::<u8>(), 0..300))
            .prop_map(|((conn, request), bytes)| Msg::Next { conn, request, bytes }),
        any::<(u64, u64)>().prop_map(|(conn, request)| Msg::Serve { conn, request }),
        any::<(u64, u64)>().prop_map(|(conn, request)| Msg::Return { conn, request }),
        any::<(u64, u64)>().prop_map(|(conn, request)| Msg::Idle { conn, request }),
    ]
}

proptest! {
    #[test]
    fn round_trip(msgs in proptest::collection::vec(msg(), 1..4)) {
        let mut buf = BytesMut::new();
        for m in &msgs {
            encode(m, &mut buf);
        }
        let mut at = 0;
        for m in &msgs {
            let (got, n) = parse(&buf[at..]).unwrap().unwrap();
            prop_assert_eq!(&got, m);
            at += n;
        }
        prop_assert_eq!(at, buf.len());
    }

    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = parse(&bytes);
    }

    /// Garbage behind a valid length prefix reaches every field decoder.
    #[test]
    fn framed_garbage_never_panics(kind in prop_oneof![1u8..4, 10u8..25, any::<u8>()],
                                   body in proptest::collection::vec(any::<u8>(), 0..400)) {
        let mut f = ((body.len() + 1) as u32).to_be_bytes().to_vec();
        f.push(kind);
        f.extend_from_slice(&body);
        if let Ok(Some((_, n))) = parse(&f) {
            prop_assert_eq!(n, f.len());
        }
    }

    #[test]
    fn a_corrupted_frame_never_panics(m in msg(), at in any::<usize>(), byte in any::<u8>(), cut in any::<usize>()) {
        let mut buf = BytesMut::new();
        encode(&m, &mut buf);
        let i = at % buf.len();
        buf[i] = byte;
        let _ = parse(&buf);
        let _ = parse(&buf[..cut % (buf.len() + 1)]);
    }
}

#[test]
fn an_oversized_length_is_refused_from_the_prefix() {
    let len = (MAX_FRAME as u32 + 1).to_be_bytes();
    assert!(matches!(parse(&len), Err(Error::Codec(_))));
    let ok = (MAX_FRAME as u32).to_be_bytes();
    assert!(parse(&ok).unwrap().is_none(), "a frame of exactly MAX_FRAME waits for its bytes");
}

// ---- channel --------------------------------------------------------------------------------

fn key(k: &[u8]) -> ControlKey {
    ControlKey::try_new(k.to_vec()).unwrap()
}

const KEY: &[u8] = b"lab key: not a secret, 32 bytes.";

fn fast() -> ChannelOptions {
    ChannelOptions {
        heartbeat: Duration::from_millis(50),
        dead_after: Duration::from_millis(300),
        handshake_timeout: Duration::from_secs(2),
    }
}

async fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

/// Accepts one connection and authenticates it with `k` on a task.
fn accept_one(l: TcpListener, k: ControlKey) -> tokio::task::JoinHandle<refract_handover::Result<ControlChannel>> {
    tokio::spawn(async move {
        let nonces = NonceCache::default();
        let (s, _) = l.accept().await.unwrap();
        ControlChannel::accept(s, &k, &nonces, fast()).await
    })
}

/// A dispatcher's channel and the agent's, authenticated with [`KEY`] on loopback.
async fn connected() -> (ControlChannel, ControlChannel) {
    let (l, addr) = listener().await;
    let agent = accept_one(l, key(KEY));
    let d = ControlChannel::connect(addr, &key(KEY), fast()).await.unwrap();
    (d, agent.await.unwrap().unwrap())
}

#[tokio::test]
async fn an_authenticated_exchange_with_heartbeats() {
    let (mut d, mut a) = connected().await;

    a.send(&Msg::WantConnection { conn: 7, request: 1 }).await.unwrap();
    assert_eq!(d.recv().await.unwrap(), Msg::WantConnection { conn: 7, request: 1 });
    d.send(&Msg::RelayInstead { conn: 7, request: 1, reason: "map full".into() }).await.unwrap();
    assert!(matches!(a.recv().await.unwrap(), Msg::RelayInstead { conn: 7, .. }));

    // Both sides idle for four times the dead bound: heartbeats keep the channel alive.
    let d_task = tokio::spawn(async move {
        let m = d.recv().await;
        (d, m)
    });
    let idle = tokio::time::timeout(Duration::from_millis(1200), a.recv()).await;
    assert!(idle.is_err(), "nothing but heartbeats arrived, and the peer is alive: {idle:?}");
    a.send(&Msg::Closed { conn: 7, epoch: 2, sent: 9, reason: "client closed".into() }).await.unwrap();
    let (_d, m) = d_task.await.unwrap();
    assert_eq!(m.unwrap(), Msg::Closed { conn: 7, epoch: 2, sent: 9, reason: "client closed".into() });
}

#[tokio::test]
async fn a_passed_socket_is_refused_on_a_tcp_channel() {
    let (mut d, mut a) = connected().await;
    let t =
        Transfer { conn: 1, epoch: 1, socket: Socket::Passed, pending: vec![], serving: Serving::default(), sent: 0 };
    let passed = Msg::HandOff(Box::new(t));
    assert!(matches!(d.send(&passed).await, Err(Error::Codec("a passed socket on a TCP channel"))));
    let some_socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let fd = std::os::fd::AsFd::as_fd(&some_socket);
    let beside = Carrier::send(&mut d, &Msg::HandOffOk { conn: 1, epoch: 1 }, Some(fd)).await;
    assert!(matches!(beside, Err(Error::Codec("a descriptor on a TCP channel"))));
    // Nothing of either reached the peer: the channel still carries the next message.
    d.send(&Msg::HandOffOk { conn: 1, epoch: 1 }).await.unwrap();
    assert_eq!(Carrier::recv(&mut a).await.unwrap().0, Msg::HandOffOk { conn: 1, epoch: 1 });
}

#[tokio::test]
async fn a_wrong_key_is_refused_on_both_sides() {
    let (l, addr) = listener().await;
    let agent = accept_one(l, key(b"the agent's key, not the same.."));
    let d = ControlChannel::connect(addr, &key(KEY), fast()).await;
    assert!(matches!(d, Err(Error::Auth)), "the dispatcher refuses the agent's proof: {d:?}");
    let a = agent.await.unwrap();
    assert!(matches!(a, Err(Error::Auth | Error::Closed)), "the agent gets no valid proof: {a:?}");
}

/// A raw peer that speaks the handshake by hand: replays, wrong proofs, oversized frames.
async fn raw_hello(addr: SocketAddr, nonce: [u8; 32]) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut b = BytesMut::new();
    encode(&Msg::Hello { version: VERSION, nonce }, &mut b);
    s.write_all(&b).await.unwrap();
    s
}

#[tokio::test]
async fn a_replayed_nonce_is_refused() {
    let (l, addr) = listener().await;
    let k = key(KEY);
    let server = tokio::spawn(async move {
        let nonces = NonceCache::default();
        let mut results = Vec::new();
        for _ in 0..2 {
            let (s, _) = l.accept().await.unwrap();
            results.push(ControlChannel::accept(s, &k, &nonces, fast()).await.map(|_| ()));
        }
        results
    });
    let nonce = [42u8; 32];
    // First Hello: answered with a Challenge (the raw peer then gives up without a proof).
    let mut first = raw_hello(addr, nonce).await;
    let mut buf = vec![0u8; 128];
    let n = first.read(&mut buf).await.unwrap();
    assert!(matches!(parse(&buf[..n]).unwrap(), Some((Msg::Challenge { .. }, _))));
    drop(first);
    // The same nonce again: refused before any Challenge is sent.
    let mut second = raw_hello(addr, nonce).await;
    let n = second.read(&mut buf).await.unwrap_or(0);
    assert_eq!(n, 0, "no Challenge for a replayed Hello");
    let r = server.await.unwrap();
    assert!(matches!(r[0], Err(Error::Closed)), "{r:?}");
    assert!(matches!(r[1], Err(Error::Auth)), "{r:?}");
}

#[tokio::test]
async fn a_large_frame_before_authentication_is_refused() {
    let (l, addr) = listener().await;
    let agent = accept_one(l, key(KEY));
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&(1u32 << 20).to_be_bytes()).await.unwrap();
    assert!(matches!(agent.await.unwrap(), Err(Error::Auth)));
}

#[tokio::test]
async fn a_silent_peer_is_declared_dead_within_the_bound() {
    let (l, addr) = listener().await;
    let agent = accept_one(l, key(KEY));
    // The dispatcher authenticates, then never calls recv: it sends no heartbeat.
    let _d = ControlChannel::connect(addr, &key(KEY), fast()).await.unwrap();
    let mut a = agent.await.unwrap().unwrap();
    let t0 = Instant::now();
    let r = a.recv().await;
    let took = t0.elapsed();
    assert!(matches!(r, Err(Error::PeerDead(d)) if d == fast().dead_after), "{r:?}");
    assert!(took >= Duration::from_millis(250), "declared dead too early: {took:?}");
    assert!(took < Duration::from_millis(800), "declared dead too late: {took:?}");
}

#[tokio::test]
async fn an_unresponsive_acceptor_fails_the_handshake_in_time() {
    let (l, addr) = listener().await;
    // Accepts the TCP connection but never answers the Hello.
    let hold = tokio::spawn(async move { l.accept().await.unwrap() });
    let opts = ChannelOptions { handshake_timeout: Duration::from_millis(300), ..fast() };
    let t0 = Instant::now();
    let r = ControlChannel::connect(addr, &key(KEY), opts).await;
    assert!(matches!(r, Err(Error::PeerDead(_))), "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(1));
    drop(hold);
}

#[tokio::test]
async fn a_closed_peer_and_a_late_handshake_message_end_the_channel() {
    let (mut d, mut a) = connected().await;
    d.send(&Msg::Proof { proof: [0; 32] }).await.unwrap();
    assert!(matches!(a.recv().await, Err(Error::Codec(_))));
    drop(a);
    assert!(matches!(d.recv().await, Err(Error::Closed | Error::Io(_))));
}

#[tokio::test]
async fn an_idle_channel_is_refreshed_or_refused() {
    let (mut d, a) = connected().await;
    d.refresh().unwrap();
    // The agent waits in recv (sending heartbeats); the dispatcher is idle, then sends again.
    let a_task = tokio::spawn(async move {
        let mut a = a;
        let m = a.recv().await;
        (a, m)
    });
    tokio::time::sleep(Duration::from_millis(120)).await;
    d.refresh().unwrap();
    d.send(&Msg::WantConnection { conn: 1, request: 1 }).await.unwrap();
    let (mut a, m) = a_task.await.unwrap();
    assert_eq!(m.unwrap(), Msg::WantConnection { conn: 1, request: 1 });
    // Idle beyond half the dead bound: the peer may have given up on us.
    tokio::time::sleep(Duration::from_millis(160)).await;
    assert!(matches!(d.refresh(), Err(Error::PeerDead(_))), "stale");
    // A message nobody asked for is refused; so is a closed peer.
    d.send(&Msg::Heartbeat).await.unwrap();
    a.send(&Msg::HandBackOk { conn: 1, epoch: 1 }).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(matches!(d.refresh(), Err(Error::Codec(_))), "unexpected message");
    let (l, addr) = listener().await;
    let agent = accept_one(l, key(KEY));
    let mut d = ControlChannel::connect(addr, &key(KEY), fast()).await.unwrap();
    drop(agent.await.unwrap().unwrap());
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(matches!(d.refresh(), Err(Error::Closed | Error::Io(_))), "closed");
}

#[tokio::test]
async fn heartbeats_keep_a_busy_side_alive() {
    let (mut d, mut a) = connected().await;
    // The agent is busy (not in recv) for three dead bounds but beats meanwhile.
    let busy = tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_millis(900), a.heartbeats()).await;
        a.send(&Msg::WantConnection { conn: 2, request: 5 }).await.unwrap();
        a
    });
    assert_eq!(d.recv().await.unwrap(), Msg::WantConnection { conn: 2, request: 5 });
    drop(busy.await.unwrap());
}
