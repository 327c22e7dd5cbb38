//! The control listener on loopback: authentication, heartbeats, answers; the example config.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use crate::common;

use common::hand_off;
use refract_agent::{serve, AgentConfig, NOT_YET};
use refract_handover::control::{ChannelOptions, ControlChannel, ControlKey};
use refract_handover::Error;
use refract_handover::Msg;

/// What the dispatcher had read from the client when it handed the connection off.
const PENDING: &[u8] = b"GET /blob?bytes=1 HTTP/1.1\r\nhost: t\r\n\r\n";

const KEY: &str = "agent test key, sixteen+ bytes";

fn opts() -> ChannelOptions {
    ChannelOptions {
        heartbeat: Duration::from_millis(50),
        dead_after: Duration::from_millis(300),
        handshake_timeout: Duration::from_secs(2),
    }
}

async fn agent() -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(serve(l, ControlKey::try_new(KEY).unwrap(), opts()));
    addr
}

async fn dispatcher(addr: std::net::SocketAddr) -> ControlChannel {
    ControlChannel::connect(addr, &ControlKey::try_new(KEY).unwrap(), opts()).await.unwrap()
}

#[tokio::test]
async fn an_authenticated_dispatcher_is_answered_and_kept_alive() {
    let addr = agent().await;
    let mut d = dispatcher(addr).await;
    // Idle for four times the dead bound: the agent's heartbeats keep arriving.
    let idle = tokio::time::timeout(Duration::from_millis(1200), d.recv()).await;
    assert!(idle.is_err(), "{idle:?}");
    d.send(&hand_off(1, 1, PENDING)).await.unwrap();
    let want = Msg::HandOffErr { conn: 1, epoch: 1, reason: NOT_YET.into() };
    assert_eq!(d.recv().await.unwrap(), want);
    // A duplicate (stale epoch) is ignored; the next transfer is answered.
    d.send(&hand_off(1, 1, PENDING)).await.unwrap();
    d.send(&hand_off(1, 3, PENDING)).await.unwrap();
    assert!(matches!(d.recv().await.unwrap(), Msg::HandOffErr { conn: 1, epoch: 3, .. }));
}

#[tokio::test]
async fn a_wrong_key_is_refused() {
    let addr = agent().await;
    let wrong = ControlKey::try_new("another key of sixteen+ bytes").unwrap();
    let r = ControlChannel::connect(addr, &wrong, opts()).await;
    assert!(matches!(r, Err(Error::Auth)), "{r:?}");
    let _still_serving = dispatcher(addr).await;
}

#[tokio::test]
async fn a_silent_dispatcher_is_dropped() {
    let addr = agent().await;
    let mut d = dispatcher(addr).await;
    tokio::time::sleep(Duration::from_millis(700)).await; // no recv: no heartbeats from us
    let r = d.recv().await;
    assert!(matches!(r, Err(Error::Closed | Error::Io(_))), "the agent hung up: {r:?}");
}

#[test]
fn the_lab_examples_parse() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/lab");
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("agent-") && name.ends_with(".toml") {
            let cfg = AgentConfig::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
            cfg.control_key().unwrap();
            n += 1;
        }
    }
    assert!(n >= 1, "no examples/lab/agent-*.toml");
}
