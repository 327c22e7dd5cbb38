//! Same-host adoption on loopback: a stand-in dispatcher hands an accepted client socket to
//! the agent with pipelined requests; the agent serves them byte-exact from a real blob server
//! and hands the socket back with the partial request it did not serve; stale epochs and
//! foreign backends are refused without touching the client.
#![allow(clippy::unwrap_used)]

use crate::common;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use refract_agent::LocalOptions;
use refract_blob::{pattern, BlobServer};
use refract_handover::local::LocalLink;
use refract_handover::{Msg, Serving, Socket, Transfer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A same-host `HandOff` of `conn` at `epoch` to be served from `backend`: the client socket
/// goes beside it.
fn passed_hand_off(conn: u64, epoch: u64, backend: SocketAddr, idle_ms: u32, pending: Vec<u8>) -> Msg {
    let serving = Serving { idle_ms, backend: Some(backend) };
    Msg::HandOff(Box::new(Transfer { conn, epoch, socket: Socket::Passed, pending, serving, sent: 0 }))
}

/// The link's next message, past the `Idle`s the agent sends when it starts waiting for the
/// client (`an_idle_client_is_announced` checks those).
trait RecvMsg {
    async fn recv_msg(&mut self) -> (Msg, Option<std::os::fd::OwnedFd>);
}

impl RecvMsg for LocalLink {
    async fn recv_msg(&mut self) -> (Msg, Option<std::os::fd::OwnedFd>) {
        loop {
            match self.recv().await.unwrap() {
                (Msg::Idle { .. }, None) => continue,
                other => return other,
            }
        }
    }
}

/// A client connected to a listener, and the accepted (dispatcher's) end.
async fn client_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (server, _) = l.accept().await.unwrap();
    (client, server)
}

/// Hands a fresh client connection to the agent at `path` (connection `conn`, epoch 1) with
/// `pending` request bytes, and checks that it took it. Returns the client's end, the
/// dispatcher's copy of the socket, and the link to the agent.
async fn adopted(
    path: &Path,
    backend: SocketAddr,
    conn: u64,
    idle_ms: u32,
    pending: Vec<u8>,
) -> (TcpStream, TcpStream, LocalLink) {
    let (client, server) = client_pair().await;
    let mut link = LocalLink::connect(path).await.unwrap();
    let adopt = passed_hand_off(conn, 1, backend, idle_ms, pending);
    link.send(&adopt, Some(server.as_fd())).await.unwrap();
    assert_eq!(link.recv_msg().await.0, Msg::HandOffOk { conn, epoch: 1 });
    (client, server, link)
}

fn get(bytes: u64, seed: u64) -> String {
    format!("GET /blob?bytes={bytes}&seed={seed} HTTP/1.1\r\nhost: t\r\n\r\n")
}

/// The agent reports the client's next request, `GET /blob?bytes={bytes}&seed={seed}` as
/// request `request` of `conn`; told to serve it, it answers the client with the pattern body.
/// Returns the response head.
async fn serve_next(
    link: &mut LocalLink,
    client: &mut TcpStream,
    buf: &mut Vec<u8>,
    (conn, request): (u64, u64),
    (bytes, seed): (u64, u64),
) -> String {
    assert_eq!(link.recv_msg().await.0, Msg::Next { conn, request, bytes: get(bytes, seed).into_bytes() });
    link.send(&Msg::Serve { conn, request }, None).await.unwrap();
    let (head, body) = response(client, buf).await;
    assert_eq!((body.len() as u64, pattern::first_mismatch(&body, 0, seed)), (bytes, None));
    head
}

/// Reads one Content-Length response; returns its head and body.
async fn response(s: &mut TcpStream, buf: &mut Vec<u8>) -> (String, Vec<u8>) {
    loop {
        if let Some(h) = refract_http::ResponseHead::parse(buf, 1 << 16, false).unwrap() {
            let refract_http::BodyKind::Length(n) = h.body else { panic!("not content-length") };
            while buf.len() < h.len + n as usize {
                let mut chunk = vec![0u8; 1 << 16];
                let k = s.read(&mut chunk).await.unwrap();
                assert!(k > 0, "eof");
                buf.extend_from_slice(&chunk[..k]);
            }
            let head = String::from_utf8_lossy(&buf[..h.len]).to_string();
            let body = buf[h.len..h.len + n as usize].to_vec();
            buf.drain(..h.len + n as usize);
            return (head, body);
        }
        let mut chunk = vec![0u8; 1 << 16];
        let k = s.read(&mut chunk).await.unwrap();
        assert!(k > 0, "eof before a response head");
        buf.extend_from_slice(&chunk[..k]);
    }
}

#[tokio::test]
async fn pipelined_requests_are_served_and_the_socket_comes_back() {
    let (backend, path) = common::blob_and_agent();
    let partial = b"GET /blob?bytes=5 HT".to_vec();
    let pending = [get(3 << 20, 7).into_bytes(), get(1000, 1).into_bytes(), partial.clone()].concat();
    let (mut client, server, mut link) = adopted(&path, backend, 9, 0, pending).await;
    let mut buf = Vec::new();
    for (n, seed) in [(3u64 << 20, 7u64), (1000, 1)] {
        if seed == 1 {
            // The pipelined request is asked about before it is served.
            let (next, _) = link.recv_msg().await;
            assert_eq!(next, Msg::Next { conn: 9, request: 1, bytes: get(1000, 1).into_bytes() });
            link.send(&Msg::Serve { conn: 9, request: 1 }, None).await.unwrap();
        }
        let (head, body) = response(&mut client, &mut buf).await;
        assert!(head.contains("x-refract-handover: 1"), "{head}");
        assert_eq!(body.len() as u64, n);
        assert_eq!(pattern::first_mismatch(&body, 0, seed), None);
    }
    let (back, fd) = link.recv_msg().await;
    let Msg::HandBack(t) = back else { panic!("{back:?}") };
    let Transfer { conn: 9, epoch: 2, sent, pending, .. } = *t else {
        panic!("a hand-back of another connection or epoch")
    };
    assert_eq!(pending, partial);
    let bodies = (3u64 << 20) + 1000;
    assert!(sent > bodies && sent < bodies + 1000, "the agent reports what it wrote (heads and bodies): {sent}");
    drop(fd);
    // The dispatcher's own copy still works: it answers the rest itself.
    let mut server = server;
    server.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await.unwrap();
    let mut got = [0u8; 25];
    client.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"HTTP/1.1 204 No Content\r\n");
    // A stale hand-off (epoch 1 again) is refused; the next one (3) is adopted.
    let stale = passed_hand_off(9, 1, backend, 0, get(1, 0).into_bytes());
    link.send(&stale, Some(server.as_fd())).await.unwrap();
    assert!(matches!(link.recv_msg().await.0, Msg::HandOffErr { conn: 9, epoch: 1, .. }));
    let fresh = passed_hand_off(9, 3, backend, 0, get(1, 0).into_bytes());
    link.send(&fresh, Some(server.as_fd())).await.unwrap();
    assert_eq!(link.recv_msg().await.0, Msg::HandOffOk { conn: 9, epoch: 3 });
}

/// The blob server's `/stats` JSON (`reads`, `writes`, …), asked directly.
async fn stats(backend: SocketAddr) -> String {
    let mut s = TcpStream::connect(backend).await.unwrap();
    s.write_all(b"GET /stats HTTP/1.1\r\nhost: t\r\n\r\n").await.unwrap();
    let (_, body) = response(&mut s, &mut Vec::new()).await;
    String::from_utf8(body).unwrap()
}

#[tokio::test]
async fn a_returned_request_goes_back_unserved() {
    let (backend, path) = common::blob_and_agent();
    let post = b"POST /blob HTTP/1.1\r\nhost: t\r\ncontent-length: 3\r\n\r\nabc".to_vec();
    let pending = [get(100_000, 2).into_bytes(), post.clone()].concat();
    let (mut client, _server, mut link) = adopted(&path, backend, 4, 5000, pending).await;
    let (_, body) = response(&mut client, &mut Vec::new()).await;
    assert_eq!(pattern::first_mismatch(&body, 0, 2), None);
    assert_eq!(link.recv_msg().await.0, Msg::Next { conn: 4, request: 1, bytes: post.clone() });
    link.send(&Msg::Return { conn: 4, request: 1 }, None).await.unwrap();
    let (back, fd) = link.recv_msg().await;
    assert!(fd.is_some());
    let Msg::HandBack(t) = back else { panic!("{back:?}") };
    let Transfer { conn: 4, epoch: 2, pending, .. } = *t else { panic!("a hand-back of another connection or epoch") };
    assert_eq!(pending, post, "the write travels back unserved");
    let stats = stats(backend).await;
    assert!(stats.contains("\"writes\":0"), "the agent's backend saw no write: {stats}");
}

#[tokio::test]
async fn the_agent_waits_for_the_next_request_and_loses_no_byte() {
    let (backend, path) = common::blob_and_agent();
    let (mut client, _server, mut link) = adopted(&path, backend, 5, 300, get(5000, 1).into_bytes()).await;
    let mut buf = Vec::new();
    response(&mut client, &mut buf).await;
    // The next request arrives after the response, in two pieces, within the idle bound.
    let next = get(7000, 2);
    client.write_all(&next.as_bytes()[..7]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    client.write_all(&next.as_bytes()[7..]).await.unwrap();
    assert_eq!(link.recv_msg().await.0, Msg::Next { conn: 5, request: 1, bytes: next.into_bytes() });
    link.send(&Msg::Serve { conn: 5, request: 1 }, None).await.unwrap();
    let (head, body) = response(&mut client, &mut buf).await;
    assert!(head.contains("x-refract-handover: 1"), "{head}");
    assert_eq!(pattern::first_mismatch(&body, 0, 2), None);
    // Then only part of one: after the idle bound the connection comes back with those bytes.
    let started = std::time::Instant::now();
    client.write_all(b"GET /blob?by").await.unwrap();
    let (back, _fd) = link.recv_msg().await;
    let waited = started.elapsed();
    let Msg::HandBack(t) = back else { panic!("{back:?}") };
    let Transfer { conn: 5, epoch: 2, pending, .. } = *t else { panic!("a hand-back of another connection or epoch") };
    assert_eq!(pending, b"GET /blob?by", "what the agent read while it waited goes back");
    assert!(waited >= Duration::from_millis(200), "waited {waited:?}");
}

#[tokio::test]
async fn a_foreign_backend_or_a_dead_one_is_refused_before_any_byte() {
    let (_backend, path) = common::blob_and_agent();
    let (mut client, server) = client_pair().await;
    let mut link = LocalLink::connect(&path).await.unwrap();
    let other: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let adopt = passed_hand_off(1, 1, other, 0, get(10, 0).into_bytes());
    link.send(&adopt, Some(server.as_fd())).await.unwrap();
    assert!(matches!(link.recv_msg().await.0, Msg::HandOffErr { conn: 1, epoch: 1, .. }));
    // An agent whose backend is down refuses too.
    let dead = common::agent(common::local_options(other));
    let mut link = LocalLink::connect(&dead).await.unwrap();
    let adopt = passed_hand_off(1, 1, other, 0, get(10, 0).into_bytes());
    link.send(&adopt, Some(server.as_fd())).await.unwrap();
    assert!(matches!(link.recv_msg().await.0, Msg::HandOffErr { .. }));
    let mut probe = [0u8; 1];
    let r = tokio::time::timeout(Duration::from_millis(100), client.read(&mut probe)).await;
    assert!(r.is_err(), "nothing reached the client");
}

#[tokio::test]
async fn connection_close_ends_with_closed() {
    let (backend, path) = common::blob_and_agent();
    let req = "GET /blob?bytes=100&seed=3 HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n";
    let (mut client, _server, mut link) = adopted(&path, backend, 2, 0, req.as_bytes().to_vec()).await;
    let (_, body) = response(&mut client, &mut Vec::new()).await;
    assert_eq!(pattern::first_mismatch(&body, 0, 3), None);
    assert!(matches!(link.recv_msg().await.0, Msg::Closed { conn: 2, epoch: 1, .. }));
}

/// Reads `n` bytes (or what comes before the end, if sooner); `None` after a timeout.
async fn read_upto(s: &mut TcpStream, n: usize, wait: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::with_capacity(n);
    let mut chunk = vec![0u8; 1 << 16];
    while got.len() < n {
        match tokio::time::timeout(wait, s.read(&mut chunk)).await.ok()?.unwrap() {
            0 => break,
            k => got.extend_from_slice(&chunk[..k]),
        }
    }
    Some(got)
}

#[tokio::test]
async fn large_bodies_are_spliced_byte_exact_and_counted() {
    // 8 MiB and 5 MiB go through the pipe (larger than it: many fills), reused for the second;
    // 1000 bytes are copied. What the agent reports sent is exactly what the client got.
    let (backend, path) = common::blob_and_agent();
    let sizes = [(8u64 << 20, 11u64), (5 << 20, 12), (1000, 13)];
    let reqs: Vec<String> = sizes.iter().map(|&(n, seed)| get(n, seed)).collect();
    let (mut client, _server, mut link) = adopted(&path, backend, 6, 0, reqs.concat().into_bytes()).await;
    let (mut buf, mut got) = (Vec::new(), 0u64);
    for (i, &(n, seed)) in sizes.iter().enumerate() {
        if i > 0 {
            let (next, _) = link.recv_msg().await;
            let want = Msg::Next { conn: 6, request: i as u64, bytes: reqs[i].clone().into_bytes() };
            assert_eq!(next, want);
            link.send(&Msg::Serve { conn: 6, request: i as u64 }, None).await.unwrap();
        }
        let (head, body) = response(&mut client, &mut buf).await;
        assert!(head.contains("x-refract-handover: 1"), "{head}");
        assert_eq!(body.len() as u64, n);
        assert_eq!(pattern::first_mismatch(&body, 0, seed), None, "response {i}");
        got += (head.len() + body.len()) as u64;
    }
    assert!(buf.is_empty(), "nothing after the last response: {} bytes", buf.len());
    let (back, _fd) = link.recv_msg().await;
    let Msg::HandBack(t) = back else { panic!("{back:?}") };
    let Transfer { conn: 6, epoch: 2, sent, .. } = *t else { panic!("a hand-back of another connection or epoch") };
    assert_eq!(sent, got, "sent counts every byte the client got, spliced or copied");
}

/// A backend that answers its first request with a head announcing 8 MiB, `part` bytes of the
/// blob (seed 0), then closes (`close`) or stalls.
async fn short_backend(part: usize, close: bool) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut req = Vec::new();
        while !req.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            s.read_exact(&mut b).await.unwrap();
            req.push(b[0]);
        }
        s.write_all(format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", 8u64 << 20).as_bytes()).await.unwrap();
        let body: Vec<u8> = (0..part as u64).map(|i| pattern::byte_at(i, 0)).collect();
        s.write_all(&body).await.unwrap();
        if !close {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
    });
    addr
}

/// Adopts a client for one request to `backend` (agent timeout `timeout`); returns what the
/// client got before the agent gave up, and the agent's `Closed`.
async fn cut_short(backend: SocketAddr, timeout: Duration) -> (Vec<u8>, Msg) {
    let path = common::agent(LocalOptions { backend_timeout: timeout, ..common::local_options(backend) });
    let (mut client, server, mut link) = adopted(&path, backend, 7, 0, get(8 << 20, 0).into_bytes()).await;
    let reader = tokio::spawn(async move { read_upto(&mut client, 9 << 20, Duration::from_secs(5)).await });
    let (closed, fd) = link.recv_msg().await;
    assert!(fd.is_none());
    // The dispatcher closes its copy on `Closed`; the agent closed its own: the client sees
    // the end of the connection, short of the announced length.
    drop(server);
    let got = reader.await.unwrap().expect("the connection ends");
    (got, closed)
}

#[tokio::test]
async fn a_backend_closing_mid_body_ends_the_connection() {
    let part = 3 << 20;
    let (got, closed) = cut_short(short_backend(part, true).await, Duration::from_secs(5)).await;
    let Msg::Closed { conn: 7, epoch: 1, sent, reason } = closed else { panic!("{closed:?}") };
    assert!(reason.contains("cut short"), "{reason}");
    assert_eq!(sent, got.len() as u64);
    let head = refract_http::ResponseHead::parse(&got, 1 << 16, false).unwrap().unwrap();
    assert_eq!(got.len() - head.len, part, "every byte the backend sent, and no more");
    assert_eq!(pattern::first_mismatch(&got[head.len..], 0, 0), None);
}

#[tokio::test]
async fn a_backend_stalling_mid_body_times_out() {
    let part = 1 << 20;
    let (got, closed) = cut_short(short_backend(part, false).await, Duration::from_millis(300)).await;
    let Msg::Closed { sent, reason, .. } = closed else { panic!("{closed:?}") };
    assert!(reason.contains("timed out"), "{reason}");
    assert_eq!(sent, got.len() as u64);
    let head = refract_http::ResponseHead::parse(&got, 1 << 16, false).unwrap().unwrap();
    assert_eq!(got.len() - head.len, part);
}

#[test]
fn the_same_host_example_parses() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agent-local.toml");
    let cfg = refract_agent::AgentConfig::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
    assert!(cfg.local.is_some() && cfg.control.is_none());
    cfg.control_key().unwrap();
}

#[test]
fn the_postgres_example_parses() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agent-postgres.toml");
    let cfg = refract_agent::AgentConfig::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
    assert!(cfg.local.is_some() && cfg.postgres_listen.is_some());
    cfg.control_key().unwrap();
}

/// A blob server on a Unix socket only; its TCP identity (`backend`) has no listener.
async fn unix_blob(tag: &str) -> (PathBuf, std::sync::Arc<BlobServer>) {
    let path = std::env::temp_dir().join(format!("rf-blob-{}-{tag}.sock", std::process::id()));
    let l = refract_blob::bind_unix(&path).unwrap();
    let srv = std::sync::Arc::new(BlobServer::new("b1".into(), 0, 0));
    tokio::spawn(refract_blob::serve_unix(l, srv.clone()));
    (path, srv)
}

/// An agent in front of `backend` reached over the Unix socket `socket`, passing the client's
/// socket to it or not.
fn agent_passing(backend: SocketAddr, socket: PathBuf, pass_socket: bool) -> PathBuf {
    common::agent(LocalOptions { backend_socket: Some(socket), pass_socket, ..common::local_options(backend) })
}

#[tokio::test]
async fn a_backend_reached_over_its_unix_socket_serves_byte_exact() {
    // Nothing listens on the identity address: every byte must come over the Unix socket.
    let identity: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let (socket, srv) = unix_blob("serve").await;
    let path = agent_passing(identity, socket.clone(), false);
    let pending = [get(5 << 20, 3).into_bytes(), get(777, 4).into_bytes()].concat();
    let (mut client, _server, mut link) = adopted(&path, identity, 11, 0, pending).await;
    let mut buf = Vec::new();
    let (head, body) = response(&mut client, &mut buf).await;
    assert!(head.contains("x-refract-handover: 1"), "{head}");
    assert_eq!((body.len(), pattern::first_mismatch(&body, 0, 3)), (5 << 20, None), "spliced from the Unix socket");
    serve_next(&mut link, &mut client, &mut buf, (11, 1), (777, 4)).await;
    assert_eq!(srv.stats.reads.load(std::sync::atomic::Ordering::Relaxed), 2);
    let _ = std::fs::remove_file(socket);
}

#[tokio::test]
async fn a_backend_passed_the_client_socket_writes_large_bodies_itself() {
    let identity: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let (socket, srv) = unix_blob("pass").await;
    let path = agent_passing(identity, socket.clone(), true);
    let pending = [get(5 << 20, 3).into_bytes(), get(777, 4).into_bytes()].concat();
    let (mut client, _server, mut link) = adopted(&path, identity, 12, 2000, pending).await;
    let mut buf = Vec::new();
    let (head, body) = response(&mut client, &mut buf).await;
    assert!(head.contains("x-refract-handover: 1") && !head.contains("deferred"), "{head}");
    assert_eq!((body.len(), pattern::first_mismatch(&body, 0, 3)), (5 << 20, None));
    let passed = || srv.stats.passed.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(passed(), 1, "the backend wrote the large body itself");
    // A small result on the same backend connection, then a large one again.
    serve_next(&mut link, &mut client, &mut buf, (12, 1), (777, 4)).await;
    assert_eq!(passed(), 1, "a small result is not deferred");
    client.write_all(get(300_000, 5).as_bytes()).await.unwrap();
    let head = serve_next(&mut link, &mut client, &mut buf, (12, 2), (300_000, 5)).await;
    assert!(head.contains("x-refract-handover: 1"), "{head}");
    assert_eq!(passed(), 2);
    assert_eq!(srv.stats.reads.load(std::sync::atomic::Ordering::Relaxed), 3);
    let _ = std::fs::remove_file(socket);
}

#[tokio::test]
async fn the_idle_wait_counts_from_when_the_client_has_the_response() {
    // A client with a small receive buffer reading slowly: when the blob server reports the
    // body written, megabytes of it are still in the socket, and the client needs far longer
    // than `idle_ms` to take them before it can send its next request. (`idle_ms` is long
    // enough that the test's own thread, starved by a busy machine between two reads, does
    // not look like a client that stopped reading.)
    let identity: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let (socket, _srv) = unix_blob("slow").await;
    let path = agent_passing(identity, socket.clone(), true);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    s.set_recv_buffer_size(32 * 1024).unwrap();
    let mut client = s.connect(l.local_addr().unwrap()).await.unwrap();
    let (server, _) = l.accept().await.unwrap();
    let mut link = LocalLink::connect(&path).await.unwrap();
    let (conn, idle_ms, size) = (14, 200, 4u64 << 20);
    let adopt = passed_hand_off(conn, 1, identity, idle_ms, get(size, 6).into_bytes());
    link.send(&adopt, Some(server.as_fd())).await.unwrap();
    assert_eq!(link.recv_msg().await.0, Msg::HandOffOk { conn, epoch: 1 });
    let started = std::time::Instant::now();
    let mut got = Vec::new();
    let mut chunk = vec![0u8; 32 * 1024];
    let total = loop {
        let n = client.read(&mut chunk).await.unwrap();
        assert!(n > 0, "eof after {} bytes", got.len());
        got.extend_from_slice(&chunk[..n]);
        if let Some(h) = refract_http::ResponseHead::parse(&got, 1 << 16, false).unwrap() {
            if got.len() as u64 >= h.len as u64 + size {
                break h.len;
            }
        }
        tokio::time::sleep(Duration::from_millis(8)).await;
    };
    let took = started.elapsed();
    assert!(took > Duration::from_millis(4 * u64::from(idle_ms)), "read too fast to test anything: {took:?}");
    assert_eq!(pattern::first_mismatch(&got[total..], 0, 6), None);
    client.write_all(get(10, 1).as_bytes()).await.unwrap();
    let next = Msg::Next { conn, request: 1, bytes: get(10, 1).into_bytes() };
    assert_eq!(link.recv_msg().await.0, next, "handed back while the client was still reading ({took:?})");
    let _ = std::fs::remove_file(socket);
}

#[tokio::test]
async fn a_missing_backend_socket_is_refused_before_any_byte() {
    let identity: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let gone = std::env::temp_dir().join(format!("rf-blob-{}-gone.sock", std::process::id()));
    let _ = std::fs::remove_file(&gone);
    let path = agent_passing(identity, gone, false);
    let (mut client, server) = client_pair().await;
    let mut link = LocalLink::connect(&path).await.unwrap();
    let adopt = passed_hand_off(1, 1, identity, 0, get(10, 0).into_bytes());
    link.send(&adopt, Some(server.as_fd())).await.unwrap();
    let (reply, _) = link.recv_msg().await;
    let Msg::HandOffErr { reason, .. } = reply else { panic!("{reply:?}") };
    assert!(reason.contains("gone.sock"), "the refusal names the socket: {reason}");
    let mut probe = [0u8; 1];
    let r = tokio::time::timeout(Duration::from_millis(100), client.read(&mut probe)).await;
    assert!(r.is_err(), "nothing reached the client");
}

#[tokio::test]
async fn an_idle_client_is_announced() {
    let (backend, path) = common::blob_and_agent();
    let (mut client, _server, mut link) = adopted(&path, backend, 11, 1000, get(100, 3).into_bytes()).await;
    let mut buf = Vec::new();
    let (_, body) = response(&mut client, &mut buf).await;
    assert_eq!(body.len(), 100);
    // Response 0 is whole: the agent says it waits for the client, before asking about more.
    assert_eq!(link.recv().await.unwrap().0, Msg::Idle { conn: 11, request: 0 });
    client.write_all(get(10, 4).as_bytes()).await.unwrap();
    assert_eq!(link.recv().await.unwrap().0, Msg::Next { conn: 11, request: 1, bytes: get(10, 4).into_bytes() });
    link.send(&Msg::Serve { conn: 11, request: 1 }, None).await.unwrap();
    assert_eq!(response(&mut client, &mut buf).await.1.len(), 10);
    assert_eq!(link.recv().await.unwrap().0, Msg::Idle { conn: 11, request: 1 });
}
