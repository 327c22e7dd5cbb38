//! Hybrid over the control channel, without root: a raw dispatcher forwards requests to the agent
//! (`serve_with` in front of a blob server) and checks the answers — small results in `Response`
//! frames, `WantConnection` for large ones, the held result relayed on `RelayInstead`, a stale
//! `HandOff` refused, heartbeats while the backend is slow.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::common;

use common::hand_off;
use refract_agent::serve_with;
use refract_blob::{pattern, serve as blob_serve, BlobServer};
use refract_handover::control::{ChannelOptions, ControlChannel, ControlKey};
use refract_handover::Msg;
use tokio::net::TcpListener;

const KEY: &str = "agent test key, sixteen+ bytes";
const CONN: u64 = 42;

fn opts() -> ChannelOptions {
    ChannelOptions {
        heartbeat: Duration::from_millis(50),
        dead_after: Duration::from_millis(300),
        handshake_timeout: Duration::from_secs(2),
    }
}

/// An agent in front of a blob server that spends `delay_ms` per query; a channel to it.
async fn setup(delay_ms: u64) -> ControlChannel {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = l.local_addr().unwrap();
    tokio::spawn(blob_serve(l, BlobServer::new("b".into(), delay_ms, 0)));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let local = common::local_options(backend);
    tokio::spawn(serve_with(l, ControlKey::try_new(KEY).unwrap(), opts(), Some(local)));
    ControlChannel::connect(addr, &ControlKey::try_new(KEY).unwrap(), opts()).await.unwrap()
}

fn forward(request: u64, bytes: u64, seed: u64, threshold: u64) -> Msg {
    let get = format!("GET /blob?bytes={bytes}&seed={seed} HTTP/1.1\r\nhost: t\r\n\r\n");
    Msg::Forward { conn: CONN, request, threshold, bytes: get.into_bytes() }
}

/// Collects `Response` frames of `request` up to the last; returns the bytes, the frame count
/// and the `keep` flag.
async fn frames(d: &mut ControlChannel, request: u64) -> (Vec<u8>, usize, bool) {
    let (mut out, mut n) = (Vec::new(), 0);
    loop {
        match d.recv().await.unwrap() {
            Msg::Response { conn: CONN, request: r, last, keep, bytes } if r == request => {
                out.extend_from_slice(&bytes);
                n += 1;
                if last {
                    return (out, n, keep);
                }
            }
            other => panic!("expected a Response, got {other:?}"),
        }
    }
}

/// The response in `raw` is a 200 with `bytes` of the seed's pattern and no hand-over tag.
fn check(raw: &[u8], bytes: u64, seed: u64) {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&raw[..end]).to_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(!head.contains("x-refract-handover"), "{head}");
    assert_eq!(raw.len() - end, bytes as usize, "{head}");
    assert_eq!(pattern::first_mismatch(&raw[end..], 0, seed), None);
}

#[tokio::test]
async fn small_results_come_back_in_frames() {
    let mut d = setup(0).await;
    d.send(&forward(1, 1000, 1, 64 << 10)).await.unwrap();
    let (raw, n, keep) = frames(&mut d, 1).await;
    check(&raw, 1000, 1);
    assert_eq!((n, keep), (1, true));
    // Below a high threshold but above a frame: several frames, on the kept backend connection.
    d.send(&forward(2, 700_000, 2, 1 << 20)).await.unwrap();
    let (raw, n, keep) = frames(&mut d, 2).await;
    check(&raw, 700_000, 2);
    assert!(n >= 3 && keep, "{n} frames, keep {keep}");
}

#[tokio::test]
async fn a_large_result_is_held_and_relayed_when_told() {
    let mut d = setup(0).await;
    d.send(&forward(1, 65536, 3, 65536)).await.unwrap();
    assert_eq!(d.recv().await.unwrap(), Msg::WantConnection { conn: CONN, request: 1 });
    d.send(&Msg::RelayInstead { conn: CONN, request: 1, reason: "not quiescent".into() }).await.unwrap();
    let (raw, _, keep) = frames(&mut d, 1).await;
    check(&raw, 65536, 3);
    assert!(keep);
    // The channel goes on.
    d.send(&forward(2, 10, 4, 65536)).await.unwrap();
    check(&frames(&mut d, 2).await.0, 10, 4);
}

#[tokio::test]
async fn a_stale_hand_off_after_asking_is_refused() {
    let mut d = setup(0).await;
    d.send(&forward(1, 1 << 20, 5, 65536)).await.unwrap();
    assert_eq!(d.recv().await.unwrap(), Msg::WantConnection { conn: CONN, request: 1 });
    d.send(&hand_off(CONN, 0, b"")).await.unwrap(); // epoch 0: never newer than the current one
    match d.recv().await.unwrap() {
        Msg::HandOffErr { conn: CONN, epoch: 0, reason } => assert!(reason.contains("stale"), "{reason}"),
        other => panic!("expected HandOffErr, got {other:?}"),
    }
    d.send(&forward(2, 100, 6, 65536)).await.unwrap();
    check(&frames(&mut d, 2).await.0, 100, 6);
}

#[tokio::test]
async fn a_slow_backend_keeps_the_channel_alive() {
    // The backend takes more than twice the dead bound: the agent beats meanwhile.
    let mut d = setup(700).await;
    d.send(&forward(1, 100, 7, 65536)).await.unwrap();
    check(&frames(&mut d, 1).await.0, 100, 7);
}

#[tokio::test]
async fn a_forwarded_request_that_does_not_parse_ends_the_channel() {
    let mut d = setup(0).await;
    let bad = Msg::Forward { conn: CONN, request: 1, threshold: 1, bytes: b"\x00\x01 not http".to_vec() };
    d.send(&bad).await.unwrap();
    assert!(d.recv().await.is_err(), "the dispatcher relays the request itself");
}
