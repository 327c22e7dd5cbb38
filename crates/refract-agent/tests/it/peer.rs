//! Who may use the same-host link (issue 21, item 9): the socket file is 0600, and a peer
//! whose uid is not allowed (SO_PEERCRED) is refused before a message is read — a raw `Forward`
//! from uid 65534 reaches no backend, with the file mode relaxed so the uid check is what
//! refuses. The peer runs as this test binary re-run with `Command::uid` (needs root; skipped
//! otherwise). The agent's own uid still forwards.
#![allow(clippy::unwrap_used)]

use crate::common;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use refract_agent::{bind_local, serve_local};
use refract_handover::local::LocalLink;
use refract_handover::Msg;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const PEER_ENV: &str = "RF_AGENT_PEER_SOCKET";
const NOBODY: u32 = 65534;

fn forward() -> Msg {
    let get = b"GET /blob?bytes=10&seed=1 HTTP/1.1\r\nhost: t\r\n\r\n".to_vec();
    Msg::Forward { conn: 1, request: 1, threshold: 1 << 20, bytes: get }
}

/// The peer's half (run in the child as uid 65534): connect, send a `Forward`, wait for an
/// answer. Exit code: 2 connect failed, 3 the agent answered, 0 the link was closed unanswered.
#[test]
fn peer_child() {
    let Ok(path) = std::env::var(PEER_ENV) else { return };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let code = rt.block_on(async {
        let Ok(mut link) = LocalLink::connect(Path::new(&path)).await else { return 2 };
        let _ = link.send(&forward(), None).await;
        match tokio::time::timeout(Duration::from_secs(5), link.recv()).await {
            Ok(Ok(_)) => 3,
            _ => 0,
        }
    });
    std::process::exit(code);
}

/// Runs [`peer_child`] as uid 65534 against `path`; its exit code.
fn peer_as_nobody(path: &Path) -> i32 {
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "peer::peer_child", "--nocapture", "--test-threads=1"])
        .env(PEER_ENV, path)
        .uid(NOBODY)
        .gid(NOBODY)
        .status()
        .unwrap();
    status.code().unwrap()
}

/// A backend that records whether anyone connected, answering one tiny response if so.
async fn recording_backend() -> (std::net::SocketAddr, tokio::sync::mpsc::UnboundedReceiver<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = tx.send(());
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        }
    });
    (addr, rx)
}

async fn agent(tag: &str) -> (PathBuf, tokio::sync::mpsc::UnboundedReceiver<()>) {
    let (backend, rx) = recording_backend().await;
    let path = std::env::temp_dir().join(format!("rf-agent-peer-{}-{tag}.sock", std::process::id()));
    let l = bind_local(&path, None).unwrap();
    let opts = common::local_options(backend);
    tokio::spawn(serve_local(l, opts));
    (path, rx)
}

#[tokio::test]
async fn another_uid_is_refused_by_mode_and_by_credentials() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to run a peer as uid {NOBODY}");
        return;
    }
    let (path, mut backend) = agent("uid").await;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket file mode {mode:o}");
    let p = path.clone();
    let code = tokio::task::spawn_blocking(move || peer_as_nobody(&p)).await.unwrap();
    assert_eq!(code, 2, "uid {NOBODY} must not open a 0600 socket");
    // With the mode relaxed, the uid check is what refuses.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    let p = path.clone();
    let code = tokio::task::spawn_blocking(move || peer_as_nobody(&p)).await.unwrap();
    assert_eq!(code, 0, "the agent answered a peer running as uid {NOBODY}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(backend.try_recv().is_err(), "a refused peer's Forward reached the backend");
    // The agent's own uid still forwards.
    let mut link = LocalLink::connect(&path).await.unwrap();
    link.send(&forward(), None).await.unwrap();
    match link.recv().await.unwrap().0 {
        Msg::Response { conn: 1, request: 1, last: true, bytes, .. } => assert!(bytes.ends_with(b"ok")),
        other => panic!("expected a Response, got {other:?}"),
    }
    assert!(backend.try_recv().is_ok());
    let _ = std::fs::remove_file(&path);
}
