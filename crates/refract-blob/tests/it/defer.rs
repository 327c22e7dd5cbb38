//! The deferred-body protocol (`refract_http::defer`) against a real blob server on a Unix
//! socket, with the agent's side played by hand: a large result waits for its destination;
//! passed a client socket, the server writes the body into it and reports; told `HERE`, it
//! writes the body on the Unix connection; small results and plain requests are not deferred.
#![allow(clippy::unwrap_used)]

use std::os::fd::AsFd;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use refract_blob::{pattern, BlobServer};
use refract_http::{defer, BodyKind, ResponseHead};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};

async fn server(tag: &str) -> (UnixStream, Arc<BlobServer>, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!("rf-defer-{}-{tag}.sock", std::process::id()));
    let l = refract_blob::bind_unix(&path).unwrap();
    let srv = Arc::new(BlobServer::new("b1".into(), 0, 0));
    tokio::spawn(refract_blob::serve_unix(l, srv.clone()));
    (UnixStream::connect(&path).await.unwrap(), srv, path)
}

fn deferrable(bytes: u64, seed: u64, at_least: u64) -> String {
    format!("GET /blob?bytes={bytes}&seed={seed} HTTP/1.1\r\nhost: t\r\n{}: {at_least}\r\n\r\n", defer::DEFER)
}

/// Reads a response head off `u`; returns it and the bytes read past it.
async fn head(u: &mut UnixStream) -> (ResponseHead, String, Vec<u8>) {
    let mut buf = Vec::new();
    loop {
        if let Some(h) = ResponseHead::parse(&buf, 1 << 16, false).unwrap() {
            let text = String::from_utf8_lossy(&buf[..h.len]).to_string();
            let rest = buf[h.len..].to_vec();
            return (h, text, rest);
        }
        let mut chunk = [0u8; 4096];
        let n = u.read(&mut chunk).await.unwrap();
        assert!(n > 0, "eof before the head");
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (b, _) = l.accept().await.unwrap();
    (a, b)
}

async fn send_sink(u: &UnixStream, client: &TcpStream) {
    u.writable().await.unwrap();
    let sent = u
        .try_io(tokio::io::Interest::WRITABLE, || {
            refract_handover::send_with_fd(u.as_fd(), client.as_fd(), &defer::SINK)
        })
        .unwrap();
    assert_eq!(sent, 4);
}

async fn report(u: &mut UnixStream) -> (bool, u64) {
    let mut r = [0u8; defer::REPORT_LEN];
    u.read_exact(&mut r).await.unwrap();
    defer::parse_report(&r).unwrap()
}

#[tokio::test]
async fn a_passed_client_socket_gets_the_body_and_the_connection_goes_on() {
    let (mut u, srv, path) = server("sink").await;
    for (i, size) in [(0u64, 3u64 << 20), (1, 200_000)] {
        u.write_all(deferrable(size, i, 65536).as_bytes()).await.unwrap();
        let (h, text, rest) = head(&mut u).await;
        assert_eq!(h.body, BodyKind::Length(size), "{text}");
        assert!(text.contains("x-refract-deferred: 1\r\n"), "{text}");
        assert!(rest.is_empty(), "no body byte before the answer");
        let (client_end, ours) = tcp_pair().await;
        send_sink(&u, &ours).await;
        drop(ours); // the server holds its own copy now
        let reader = tokio::spawn(async move {
            let mut body = Vec::new();
            let mut c = client_end;
            c.read_to_end(&mut body).await.unwrap();
            body
        });
        assert_eq!(report(&mut u).await, (true, size));
        let body = reader.await.unwrap();
        assert_eq!((body.len() as u64, pattern::first_mismatch(&body, 0, i)), (size, None));
    }
    assert_eq!(srv.stats.passed.load(Relaxed), 2);
    // The same connection then serves an ordinary request.
    u.write_all(b"GET /blob?bytes=5 HTTP/1.1\r\nhost: t\r\n\r\n").await.unwrap();
    let (h, text, _) = head(&mut u).await;
    assert!(h.body == BodyKind::Length(5) && !text.contains("deferred"), "{text}");
    let _ = std::fs::remove_file(path);
}

#[tokio::test]
async fn told_here_the_body_comes_on_the_connection() {
    let (mut u, srv, path) = server("here").await;
    u.write_all(deferrable(100_000, 7, 65536).as_bytes()).await.unwrap();
    let (_, text, mut body) = head(&mut u).await;
    assert!(text.contains("x-refract-deferred"), "{text}");
    u.write_all(&defer::HERE).await.unwrap();
    while body.len() < 100_000 {
        let mut chunk = vec![0u8; 65536];
        let n = u.read(&mut chunk).await.unwrap();
        assert!(n > 0);
        body.extend_from_slice(&chunk[..n]);
    }
    assert_eq!((body.len(), pattern::first_mismatch(&body, 0, 7)), (100_000, None));
    assert_eq!(srv.stats.passed.load(Relaxed), 0);
    let _ = std::fs::remove_file(path);
}

#[tokio::test]
async fn results_below_the_bound_are_not_deferred() {
    let (mut u, _srv, path) = server("small").await;
    u.write_all(deferrable(100_000, 0, 100_001).as_bytes()).await.unwrap();
    let (h, text, _) = head(&mut u).await;
    assert!(h.body == BodyKind::Length(100_000) && !text.contains("deferred"), "{text}");
    let _ = std::fs::remove_file(path);
}

#[tokio::test]
async fn a_client_gone_mid_body_is_reported_as_a_failure() {
    let (mut u, srv, path) = server("fail").await;
    u.write_all(deferrable(64 << 20, 0, 65536).as_bytes()).await.unwrap();
    let _ = head(&mut u).await;
    let (client_end, ours) = tcp_pair().await;
    send_sink(&u, &ours).await;
    drop(ours);
    drop(client_end); // the client closes without reading: the server's writes fail
    let (done, wrote) = report(&mut u).await;
    assert!(!done && wrote < 64 << 20, "reported {done} after {wrote} bytes");
    assert_eq!(srv.stats.passed.load(Relaxed), 0);
    let _ = std::fs::remove_file(path);
}

#[tokio::test]
async fn a_pipelined_deferrable_request_is_refused() {
    let (mut u, _srv, path) = server("pipe").await;
    let two = [deferrable(100_000, 0, 65536), deferrable(100_000, 0, 65536)].concat();
    u.write_all(two.as_bytes()).await.unwrap();
    let (h, text, _) = head(&mut u).await;
    assert_eq!(h.status, 400, "{text}");
    let _ = std::fs::remove_file(path);
}
