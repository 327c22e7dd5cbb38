//! A client that stops reading a large response served by the agent (hand-over) holds neither
//! the agent nor its backend connection past `write_stall_ms`: the connection ends at the agent
//! (`Closed`), the backend connection is closed, and the next adoption is served. Both ways a
//! body reaches the client are covered: spliced (known length) and copied (chunked).
#![allow(clippy::unwrap_used)]

use crate::common;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use refract_agent::LocalOptions;
use refract_handover::local::LocalLink;
use refract_handover::{Msg, Serving, Socket, Transfer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// A same-host `HandOff` of `conn` at `epoch` to be served from `backend`: the client socket
/// goes beside it.
fn passed_hand_off(conn: u64, epoch: u64, backend: SocketAddr, idle_ms: u32, pending: Vec<u8>) -> Msg {
    let serving = Serving { idle_ms, backend: Some(backend) };
    Msg::HandOff(Box::new(Transfer { conn, epoch, socket: Socket::Passed, pending, serving, sent: 0 }))
}

/// The bound the agent is given: small, so the test is fast.
const STALL: Duration = Duration::from_millis(500);
/// Generous: the agent must give up well before this (CI under load).
const WITHIN: Duration = Duration::from_secs(15);

/// A backend answering `GET /?bytes=N[&chunked]` with N bytes of `x` (in 64 KiB chunks when
/// chunked), on as many connections as come; each connection's end (the peer closed it or a
/// write failed) is reported on the channel.
async fn backend() -> (SocketAddr, mpsc::UnboundedReceiver<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            let tx = tx.clone();
            tokio::spawn(async move {
                serve(s).await;
                let _ = tx.send(());
            });
        }
    });
    (addr, rx)
}

/// Serves requests on `s` until it fails or closes.
async fn serve(mut s: TcpStream) {
    let mut req = Vec::new();
    let mut b = [0u8; 1024];
    loop {
        let Some(end) = req.windows(4).position(|w| w == b"\r\n\r\n") else {
            match s.read(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(k) => req.extend_from_slice(&b[..k]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&req[..end]).to_string();
        req.drain(..end + 4);
        let bytes: usize = head.split(['=', ' ', '&']).nth(2).unwrap().parse().unwrap();
        if respond(&mut s, bytes, head.contains("chunked")).await.is_err() {
            return;
        }
    }
}

async fn respond(s: &mut TcpStream, bytes: usize, chunked: bool) -> std::io::Result<()> {
    let chunk = vec![b'x'; 1 << 16];
    if chunked {
        s.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").await?;
    } else {
        s.write_all(format!("HTTP/1.1 200 OK\r\ncontent-length: {bytes}\r\n\r\n").as_bytes()).await?;
    }
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len());
        if chunked {
            s.write_all(format!("{n:x}\r\n").as_bytes()).await?;
        }
        s.write_all(&chunk[..n]).await?;
        if chunked {
            s.write_all(b"\r\n").await?;
        }
        left -= n;
    }
    if chunked {
        s.write_all(b"0\r\n\r\n").await?;
    }
    Ok(())
}

/// An agent in front of `backend` whose write stall is [`STALL`].
fn agent(backend: SocketAddr) -> PathBuf {
    common::agent(LocalOptions { write_stall: STALL, ..common::local_options(backend) })
}

/// Hands a fresh client connection to the agent on `link` as connection `conn` with
/// `request` pending; returns the client's end and the dispatcher's copy.
async fn adopt(link: &mut LocalLink, backend: SocketAddr, conn: u64, request: &str) -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (server, _) = l.accept().await.unwrap();
    let adopt = passed_hand_off(conn, 1, backend, 0, request.as_bytes().to_vec());
    link.send(&adopt, Some(server.as_fd())).await.unwrap();
    assert_eq!(link.recv().await.unwrap().0, Msg::HandOffOk { conn, epoch: 1 });
    (client, server)
}

/// A client asks for 64 MiB (more than the sockets buffer) and reads none of it.
async fn a_stalled_client_is_ended_within_the_bound(query: &str) {
    let (addr, mut ends) = backend().await;
    let path = agent(addr);
    let mut link = LocalLink::connect(&path).await.unwrap();
    let request = format!("GET /?bytes={}{query} HTTP/1.1\r\nhost: t\r\n\r\n", 64 << 20);
    let started = Instant::now();
    let (client, server) = adopt(&mut link, addr, 1, &request).await;
    let closed = tokio::time::timeout(WITHIN, link.recv()).await.expect("the agent ends a stalled client");
    let took = started.elapsed();
    let Msg::Closed { conn: 1, epoch: 1, sent, reason } = closed.unwrap().0 else { panic!("not Closed") };
    assert!(reason.contains("took no byte"), "{reason}");
    assert!(sent > 0 && sent < 64 << 20, "part of the body went: {sent}");
    assert!(took >= STALL, "ended after {took:?}, before the bound");
    // The agent's backend connection is closed, not left blocked behind the client.
    tokio::time::timeout(WITHIN, ends.recv()).await.expect("the backend connection is freed").unwrap();
    drop((client, server));
    // And the agent serves the next adoption on the same link.
    let (mut client, _server) = adopt(&mut link, addr, 2, "GET /?bytes=1000 HTTP/1.1\r\nhost: t\r\n\r\n").await;
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    while !got.ends_with(&[b'x'; 1000]) {
        let k = tokio::time::timeout(WITHIN, client.read(&mut b)).await.unwrap().unwrap();
        assert!(k > 0, "closed before the response");
        got.extend_from_slice(&b[..k]);
    }
    // Past the `Idle` the agent sends when it starts waiting for the client's next request.
    let mut back = tokio::time::timeout(WITHIN, link.recv()).await.unwrap().unwrap().0;
    while matches!(back, Msg::Idle { conn: 2, .. }) {
        back = tokio::time::timeout(WITHIN, link.recv()).await.unwrap().unwrap().0;
    }
    assert!(matches!(&back, Msg::HandBack(t) if t.conn == 2), "{back:?}");
}

#[tokio::test]
async fn a_client_that_stops_reading_a_spliced_body_is_ended_and_frees_the_backend() {
    a_stalled_client_is_ended_within_the_bound("").await;
}

#[tokio::test]
async fn a_client_that_stops_reading_a_copied_body_is_ended_and_frees_the_backend() {
    a_stalled_client_is_ended_within_the_bound("&chunked").await;
}
