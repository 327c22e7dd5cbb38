//! Cross-host adoption, the agent's half, in a throw-away network namespace on loopback: a
//! stand-in dispatcher snapshots an accepted client socket (TCP_REPAIR) and sends `HandOff`
//! over the authenticated control channel; the agent restores it, serves the pending requests
//! byte-exact from a real blob server (asking with `Next` about the pipelined one), and hands
//! the connection back (`HandBack` with the TCP
//! state and the partial request); the dispatcher restores it and answers on it. The guard
//! sits on `lo` as it sits on an agent host's interface.
#![allow(clippy::unwrap_used)]

use crate::common;
use std::io::{Read, Write};
use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::OwnedFd;
use std::time::Duration;

use refract_agent::serve_with;
use refract_blob::{pattern, serve as blob_serve, BlobServer};
use refract_handover::control::{ChannelOptions, ControlChannel, ControlKey};
use refract_handover::{discard, restore, snapshot, FlowKey, Guard, Msg, Serving, Socket, Transfer};

const KEY: &str = "agent test key, sixteen+ bytes";

fn root_or_skip(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    let _ = writeln!(std::io::stderr(), "SKIP {test}: needs root (network namespace, TCP_REPAIR)");
    false
}

fn v4(a: SocketAddr) -> SocketAddrV4 {
    match a {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(_) => panic!("ipv4 only"),
    }
}

fn get(bytes: u64, seed: u64) -> String {
    format!("GET /blob?bytes={bytes}&seed={seed} HTTP/1.1\r\nhost: t\r\n\r\n")
}

/// Reads one Content-Length response from a blocking socket.
fn response(s: &mut std::net::TcpStream, buf: &mut Vec<u8>) -> (String, Vec<u8>) {
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        if let Some(h) = refract_http::ResponseHead::parse(buf, 1 << 16, false).unwrap() {
            let refract_http::BodyKind::Length(n) = h.body else { panic!("not content-length") };
            while buf.len() < h.len + n as usize {
                let k = s.read(&mut chunk).unwrap();
                assert!(k > 0, "eof");
                buf.extend_from_slice(&chunk[..k]);
            }
            let head = String::from_utf8_lossy(&buf[..h.len]).to_string();
            let body = buf[h.len..h.len + n as usize].to_vec();
            buf.drain(..h.len + n as usize);
            return (head, body);
        }
        let k = s.read(&mut chunk).unwrap();
        assert!(k > 0, "eof before a head");
        buf.extend_from_slice(&chunk[..k]);
    }
}

#[test]
fn a_restored_connection_is_served_and_handed_back() {
    if !root_or_skip("a_restored_connection_is_served_and_handed_back") {
        return;
    }
    std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        assert!(std::process::Command::new("ip").args(["link", "set", "lo", "up"]).status().unwrap().success());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(scenario());
    })
    .join()
    .unwrap_or_else(|p| std::panic::resume_unwind(p));
}

async fn scenario() {
    // The agent host's guard, as in production: a client segment that arrives between the
    // agent's discard and the stand-in dispatcher's restore (a window update while the client
    // still reads) finds no socket here, and must be dropped, not answered with RST.
    let guard = Guard::attach("lo", std::net::Ipv4Addr::LOCALHOST, 16).unwrap();
    let bl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = bl.local_addr().unwrap();
    tokio::spawn(blob_serve(bl, BlobServer::new("b1".into(), 0, 0)));
    let cl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let control = cl.local_addr().unwrap();
    let opts = ChannelOptions {
        heartbeat: Duration::from_millis(100),
        dead_after: Duration::from_secs(5),
        ..Default::default()
    };
    let backend_opts = common::local_options(backend);
    tokio::spawn(serve_with(cl, ControlKey::try_new(KEY).unwrap(), opts, Some(backend_opts)));

    // The client (blocking, on its own thread) and the dispatcher's accepted socket.
    let vip = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let vip_addr = vip.local_addr().unwrap();
    let partial = b"GET /blob?bytes=9 HT".to_vec();
    let sent = [get(2 << 20, 3).into_bytes(), get(777, 4).into_bytes(), partial.clone()].concat();
    let sent_len = sent.len();
    let client = std::thread::spawn(move || {
        let mut c = std::net::TcpStream::connect(vip_addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        c.write_all(&sent).unwrap();
        let mut buf = Vec::new();
        let mut heads = Vec::new();
        for (n, seed) in [(2u64 << 20, 3u64), (777, 4)] {
            let (head, body) = response(&mut c, &mut buf);
            assert_eq!(body.len() as u64, n);
            assert_eq!(pattern::first_mismatch(&body, 0, seed), None);
            heads.push(head);
        }
        // The dispatcher's answer on the restored socket (maybe already read into `buf`).
        while buf.len() < 25 {
            let mut chunk = [0u8; 64];
            let k = c.read(&mut chunk).unwrap();
            assert!(k > 0, "eof before the dispatcher's answer");
            buf.extend_from_slice(&chunk[..k]);
        }
        assert_eq!(&buf[..25], b"HTTP/1.1 204 No Content\r\n");
        heads
    });
    let (mut server, peer) = vip.accept().unwrap();
    let mut pending = vec![0u8; sent_len];
    server.read_exact(&mut pending).unwrap();

    let mut ch = ControlChannel::connect(control, &ControlKey::try_new(KEY).unwrap(), opts).await.unwrap();
    let fd = OwnedFd::from(server);
    let tcp_state = snapshot(&fd).unwrap();
    discard(fd).unwrap();
    let flow = FlowKey::new(v4(peer), v4(vip_addr));
    let socket = Socket::Repair { flow, tcp_state };
    let t = Transfer { conn: 1, epoch: 1, socket, pending, serving: Serving { idle_ms: 0, backend: None }, sent: 0 };
    ch.send(&Msg::HandOff(Box::new(t))).await.unwrap();
    assert_eq!(ch.recv().await.unwrap(), Msg::HandOffOk { conn: 1, epoch: 1 });
    // The pipelined second request is asked about before it is served.
    assert_eq!(ch.recv().await.unwrap(), Msg::Next { conn: 1, request: 1, bytes: get(777, 4).into_bytes() });
    ch.send(&Msg::Serve { conn: 1, request: 1 }).await.unwrap();
    let Msg::HandBack(back) = ch.recv().await.unwrap() else { panic!("expected HandBack") };
    assert_eq!((back.conn, back.epoch, &back.pending), (1, 2, &partial));
    let Socket::Repair { tcp_state: back_state, .. } = &back.socket else { panic!("a hand-back without its state") };
    let mut restored = std::net::TcpStream::from(restore(back_state).unwrap());
    ch.send(&Msg::HandBackOk { conn: 1, epoch: 2 }).await.unwrap();
    restored.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap();
    let heads = tokio::task::spawn_blocking(move || client.join().unwrap()).await.unwrap();
    for h in heads {
        assert!(h.contains("x-refract-handover: 1"), "{h}");
    }
    drop(guard);
}
