//! Same-host adoption on loopback: a stand-in dispatcher hands an accepted client socket to
//! the agent with pipelined requests; the agent serves them byte-exact from a real blob server
//! and hands the socket back with the partial request it did not serve; stale epochs and
//! foreign backends are refused without touching the client.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Duration;

use refract_agent::{serve_local, LocalOptions};
use refract_blob::{pattern, serve as blob_serve, BlobServer};
use refract_handover::local::{LocalLink, LocalMsg};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener};

async fn blob() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(blob_serve(l, BlobServer::new("b1".into(), 0, 0)));
    addr
}

async fn agent(backend: SocketAddr, tag: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("rf-agent-{}-{tag}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let l = UnixListener::bind(&path).unwrap();
    tokio::spawn(serve_local(l, LocalOptions { backend, backend_timeout: Duration::from_secs(5), guard: None }));
    path
}

/// A client connected to a listener, and the accepted (dispatcher's) end.
async fn client_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (server, _) = l.accept().await.unwrap();
    (client, server)
}

fn get(bytes: u64, seed: u64) -> String {
    format!("GET /blob?bytes={bytes}&seed={seed} HTTP/1.1\r\nhost: t\r\n\r\n")
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
    let backend = blob().await;
    let path = agent(backend, "pipe").await;
    let (mut client, server) = client_pair().await;
    let mut link = LocalLink::connect(&path).await.unwrap();
    let partial = b"GET /blob?bytes=5 HT".to_vec();
    let pending = [get(3 << 20, 7).into_bytes(), get(1000, 1).into_bytes(), partial.clone()].concat();
    let adopt = LocalMsg::Adopt { conn: 9, epoch: 1, backend, idle_ms: 0, pending };
    link.send(&adopt, Some(server.as_fd())).await.unwrap();
    let (ok, _) = link.recv().await.unwrap();
    assert_eq!(ok, LocalMsg::AdoptOk { conn: 9, epoch: 1 });
    let mut buf = Vec::new();
    for (n, seed) in [(3u64 << 20, 7u64), (1000, 1)] {
        if seed == 1 {
            // The pipelined request is asked about before it is served.
            let (next, _) = link.recv().await.unwrap();
            assert_eq!(next, LocalMsg::Next { conn: 9, request: 1, bytes: get(1000, 1).into_bytes() });
            link.send(&LocalMsg::Serve { conn: 9, request: 1 }, None).await.unwrap();
        }
        let (head, body) = response(&mut client, &mut buf).await;
        assert!(head.contains("x-refract-handover: 1"), "{head}");
        assert_eq!(body.len() as u64, n);
        assert_eq!(pattern::first_mismatch(&body, 0, seed), None);
    }
    let (back, fd) = link.recv().await.unwrap();
    let LocalMsg::HandBack { conn: 9, epoch: 2, sent, pending } = back else { panic!("{back:?}") };
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
    let stale = LocalMsg::Adopt { conn: 9, epoch: 1, backend, idle_ms: 0, pending: get(1, 0).into_bytes() };
    link.send(&stale, Some(server.as_fd())).await.unwrap();
    assert!(matches!(link.recv().await.unwrap().0, LocalMsg::AdoptErr { conn: 9, epoch: 1, .. }));
    let fresh = LocalMsg::Adopt { conn: 9, epoch: 3, backend, idle_ms: 0, pending: get(1, 0).into_bytes() };
    link.send(&fresh, Some(server.as_fd())).await.unwrap();
    assert_eq!(link.recv().await.unwrap().0, LocalMsg::AdoptOk { conn: 9, epoch: 3 });
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
    let backend = blob().await;
    let path = agent(backend, "return").await;
    let (mut client, server) = client_pair().await;
    let mut link = LocalLink::connect(&path).await.unwrap();
    let post = b"POST /blob HTTP/1.1\r\ncontent-length: 3\r\n\r\nabc".to_vec();
    let pending = [get(100_000, 2).into_bytes(), post.clone()].concat();
    let adopt = LocalMsg::Adopt { conn: 4, epoch: 1, backend, idle_ms: 5000, pending };
    link.send(&adopt, Some(server.as_fd())).await.unwrap();
    assert_eq!(link.recv().await.unwrap().0, LocalMsg::AdoptOk { conn: 4, epoch: 1 });
    let (_, body) = response(&mut client, &mut Vec::new()).await;
    assert_eq!(pattern::first_mismatch(&body, 0, 2), None);
    assert_eq!(link.recv().await.unwrap().0, LocalMsg::Next { conn: 4, request: 1, bytes: post.clone() });
    link.send(&LocalMsg::Return { conn: 4, request: 1 }, None).await.unwrap();
    let (back, fd) = link.recv().await.unwrap();
    assert!(fd.is_some());
    let LocalMsg::HandBack { conn: 4, epoch: 2, pending, .. } = back else { panic!("{back:?}") };
    assert_eq!(pending, post, "the write travels back unserved");
    let stats = stats(backend).await;
    assert!(stats.contains("\"writes\":0"), "the agent's backend saw no write: {stats}");
}

#[tokio::test]
async fn the_agent_waits_for_the_next_request_and_loses_no_byte() {
    let backend = blob().await;
    let path = agent(backend, "idle").await;
    let (mut client, server) = client_pair().await;
    let mut link = LocalLink::connect(&path).await.unwrap();
    let adopt = LocalMsg::Adopt { conn: 5, epoch: 1, backend, idle_ms: 300, pending: get(5000, 1).into_bytes() };
    link.send(&adopt, Some(server.as_fd())).await.unwrap();
    assert_eq!(link.recv().await.unwrap().0, LocalMsg::AdoptOk { conn: 5, epoch: 1 });
    let mut buf = Vec::new();
    response(&mut client, &mut buf).await;
    // The next request arrives after the response, in two pieces, within the idle bound.
    let next = get(7000, 2);
    client.write_all(&next.as_bytes()[..7]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    client.write_all(&next.as_bytes()[7..]).await.unwrap();
    assert_eq!(link.recv().await.unwrap().0, LocalMsg::Next { conn: 5, request: 1, bytes: next.into_bytes() });
    link.send(&LocalMsg::Serve { conn: 5, request: 1 }, None).await.unwrap();
    let (head, body) = response(&mut client, &mut buf).await;
    assert!(head.contains("x-refract-handover: 1"), "{head}");
    assert_eq!(pattern::first_mismatch(&body, 0, 2), None);
    // Then only part of one: after the idle bound the connection comes back with those bytes.
    let started = std::time::Instant::now();
    client.write_all(b"GET /blob?by").await.unwrap();
    let (back, _fd) = link.recv().await.unwrap();
    let waited = started.elapsed();
    let LocalMsg::HandBack { conn: 5, epoch: 2, pending, .. } = back else { panic!("{back:?}") };
    assert_eq!(pending, b"GET /blob?by", "what the agent read while it waited goes back");
    assert!(waited >= Duration::from_millis(200), "waited {waited:?}");
}

#[tokio::test]
async fn a_foreign_backend_or_a_dead_one_is_refused_before_any_byte() {
    let backend = blob().await;
    let path = agent(backend, "foreign").await;
    let (mut client, server) = client_pair().await;
    let mut link = LocalLink::connect(&path).await.unwrap();
    let other: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let adopt = LocalMsg::Adopt { conn: 1, epoch: 1, backend: other, idle_ms: 0, pending: get(10, 0).into_bytes() };
    link.send(&adopt, Some(server.as_fd())).await.unwrap();
    assert!(matches!(link.recv().await.unwrap().0, LocalMsg::AdoptErr { conn: 1, epoch: 1, .. }));
    // An agent whose backend is down refuses too.
    let dead = agent(other, "dead").await;
    let mut link = LocalLink::connect(&dead).await.unwrap();
    let adopt = LocalMsg::Adopt { conn: 1, epoch: 1, backend: other, idle_ms: 0, pending: get(10, 0).into_bytes() };
    link.send(&adopt, Some(server.as_fd())).await.unwrap();
    assert!(matches!(link.recv().await.unwrap().0, LocalMsg::AdoptErr { .. }));
    let mut probe = [0u8; 1];
    let r = tokio::time::timeout(Duration::from_millis(100), client.read(&mut probe)).await;
    assert!(r.is_err(), "nothing reached the client");
}

#[tokio::test]
async fn connection_close_ends_with_closed() {
    let backend = blob().await;
    let path = agent(backend, "close").await;
    let (mut client, server) = client_pair().await;
    let mut link = LocalLink::connect(&path).await.unwrap();
    let req = "GET /blob?bytes=100&seed=3 HTTP/1.1\r\nconnection: close\r\n\r\n";
    let adopt = LocalMsg::Adopt { conn: 2, epoch: 1, backend, idle_ms: 0, pending: req.as_bytes().to_vec() };
    link.send(&adopt, Some(server.as_fd())).await.unwrap();
    assert_eq!(link.recv().await.unwrap().0, LocalMsg::AdoptOk { conn: 2, epoch: 1 });
    let (_, body) = response(&mut client, &mut Vec::new()).await;
    assert_eq!(pattern::first_mismatch(&body, 0, 3), None);
    assert!(matches!(link.recv().await.unwrap().0, LocalMsg::Closed { conn: 2, epoch: 1, .. }));
}

#[test]
fn the_same_host_example_parses() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agent-local.toml");
    let cfg = refract_agent::AgentConfig::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
    assert!(cfg.local.is_some() && cfg.control.is_none());
    cfg.control_key().unwrap();
}
