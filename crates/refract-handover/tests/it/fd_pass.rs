//! Same-host hand-over: a live TCP connection moves to another process-side socket by
//! SCM_RIGHTS with its pending bytes, and keeps working (no root needed).
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use refract_handover::{recv_fd, send_fd};

#[test]
fn a_connection_and_its_pending_bytes_move_over_a_unix_socket() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (server, _) = listener.accept().unwrap();
    let (dispatcher, agent) = UnixStream::pair().unwrap();

    let receiver = std::thread::spawn(move || {
        let mut frames = Vec::new();
        for _ in 0..3 {
            frames.push(recv_fd(&agent, 1 << 20).unwrap());
        }
        frames
    });
    let pending = vec![7u8; 100_000]; // larger than one socket buffer write
    send_fd(&dispatcher, server.as_fd(), b"GET /big HTTP/1.1\r\n\r\n").unwrap();
    send_fd(&dispatcher, server.as_fd(), &pending).unwrap();
    send_fd(&dispatcher, server.as_fd(), b"").unwrap();
    drop(server); // the dispatcher's copy goes; the connection stays open

    let frames = receiver.join().unwrap();
    assert_eq!(frames[0].1, b"GET /big HTTP/1.1\r\n\r\n");
    assert_eq!(frames[1].1, pending);
    assert!(frames[2].1.is_empty());
    let mut moved = TcpStream::from(frames.into_iter().next().unwrap().0);
    moved.write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
    let mut buf = [0u8; 19];
    client.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"HTTP/1.1 200 OK\r\n\r\n");
    client.write_all(b"next").unwrap();
    let mut buf = [0u8; 4];
    moved.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"next");
}

#[test]
fn a_closed_peer_is_an_error_not_a_hang() {
    let (a, b) = UnixStream::pair().unwrap();
    drop(a);
    assert!(recv_fd(&b, 16).is_err());
}
