//! Two dispatchers sharing one etcd (`[cluster]`): a membership change or a reload made
//! through either one's admin API reaches the other within 1 s; with etcd away both keep
//! serving, say so and refuse changes; with etcd back they converge. Real etcd, real HTTP
//! backends (the blob server), the dispatcher as a library.

use refract_blob::{serve as blob_serve, BlobServer};
use refract_dispatch::{config, Dispatcher};
use refract_testkit::{free_port, Etcd};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A blob server on a free port; its address.
async fn backend(name: &str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(blob_serve(listener, BlobServer::new(name.into(), 0, 64)));
    addr
}

struct Node {
    dispatcher: Dispatcher,
    http: SocketAddr,
    admin: SocketAddr,
}

async fn node(etcd: &Etcd, node_id: &str, b0: SocketAddr, dir: &std::path::Path) -> Node {
    let (http, admin) = (free_port(), free_port());
    let text = format!(
        "[http]\nlisten = \"127.0.0.1:{http}\"\n[listen]\nadmin = \"127.0.0.1:{admin}\"\n\
         [admin]\ninsecure_loopback = true\n\
         [[backend]]\nname = \"b0\"\naddr = \"{b0}\"\nrole = \"primary\"\n\
         [cluster]\netcd = [\"{}\"]\nnode_id = \"{node_id}\"\nlease_ttl_s = 2\n",
        etcd.endpoint()
    );
    let path = dir.join(format!("{node_id}.toml"));
    std::fs::write(&path, &text).unwrap();
    let ctx = refract_dispatch::Ctx::new(config::load(&path).unwrap());
    let _ = ctx.config_path.set(path);
    let dispatcher = Dispatcher::start_on(ctx).await.unwrap();
    Node { http: dispatcher.http_addr().unwrap(), admin: dispatcher.admin_addr().unwrap(), dispatcher }
}

/// One HTTP/1.1 exchange (connection: close); the status and the body.
async fn call(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

async fn json(addr: SocketAddr, path: &str) -> serde_json::Value {
    let (status, body) = call(addr, "GET", path, "").await;
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// Polls `what` until `ok` holds, at most `within`; returns how long it took.
async fn until(within: Duration, what: &str, mut ok: impl AsyncFnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !ok().await {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

async fn backend_view(n: &Node, name: &str) -> Option<serde_json::Value> {
    let all = json(n.admin, "/backends").await;
    all.as_array().unwrap().iter().find(|b| b["name"] == name).cloned()
}

/// What every test starts with: dispatchers d1 and d2 sharing etcd, both in front of the blob
/// server b0 (b1, another, is for the test to add), their config files in `dir`; returned once
/// both see etcd up. A test binds the fields in the order they were started (etcd first), so
/// that they are dropped the other way round.
struct Two {
    d1: Node,
    d2: Node,
    b0: SocketAddr,
    b1: SocketAddr,
    dir: tempfile::TempDir,
    etcd: Etcd,
}

async fn two_dispatchers() -> Two {
    let etcd = Etcd::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (b0, b1) = (backend("b0").await, backend("b1").await);
    let d1 = node(&etcd, "d1", b0, dir.path()).await;
    let d2 = node(&etcd, "d2", b0, dir.path()).await;
    for n in [&d1, &d2] {
        until(Duration::from_secs(5), "up", async || json(n.admin, "/cluster").await["etcd"] == "up").await;
    }
    Two { d1, d2, b0, b1, dir, etcd }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_changes_reach_the_other_dispatcher_within_a_second() {
    let Two { etcd, dir, b0, b1, d1, d2 } = two_dispatchers().await;
    for n in [&d1, &d2] {
        until(Duration::from_secs(5), "both registered", async || {
            let c = json(n.admin, "/cluster").await;
            c["etcd"] == "up" && c["dispatchers"].as_array().unwrap().len() == 2
        })
        .await;
    }

    let def = format!("{{\"name\": \"b1\", \"addr\": \"{b1}\", \"role\": \"replica\"}}");
    let (status, body) = call(d1.admin, "POST", "/backends", &def).await;
    assert_eq!(status, 201, "{body}");
    let took = until(Duration::from_secs(1), "b1 joins d2", async || backend_view(&d2, "b1").await.is_some()).await;
    println!("join reached the other dispatcher in {took:?}");

    let (status, body) = call(d2.admin, "POST", "/backends/b1/drain", "").await;
    assert_eq!(status, 200, "{body}");
    until(Duration::from_secs(1), "b1 drained on d1", async || {
        backend_view(&d1, "b1").await.is_some_and(|b| b["drained"] == true)
    })
    .await;

    let (status, body) = call(d1.admin, "DELETE", "/backends/b1", "").await;
    assert_eq!(status, 200, "{body}");
    until(Duration::from_secs(1), "b1 leaves d2", async || backend_view(&d2, "b1").await.is_none()).await;

    // A dispatcher started later reads what the others decided.
    let (status, body) = call(d1.admin, "POST", "/backends/b0/drain", "").await;
    assert_eq!(status, 200, "{body}");
    let d3 = node(&etcd, "d3", b0, dir.path()).await;
    until(Duration::from_secs(5), "a late dispatcher follows the shared drain", async || {
        backend_view(&d3, "b0").await.is_some_and(|b| b["drained"] == true)
    })
    .await;

    for n in [d1, d2, d3] {
        n.dispatcher.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_etcd_both_serve_and_refuse_changes_then_converge() {
    let Two { mut etcd, dir: _dir, b1, d1, d2, .. } = two_dispatchers().await;

    etcd.stop().unwrap();
    for n in [&d1, &d2] {
        until(Duration::from_secs(5), "etcd seen down", async || json(n.admin, "/cluster").await["etcd"] == "down")
            .await;
        let (status, health) = call(n.admin, "GET", "/health", "").await;
        assert_eq!(status, 200, "a dispatcher without etcd still serves");
        assert!(health.contains("etcd: unreachable"), "{health}");
        let (_, metrics) = call(n.admin, "GET", "/metrics", "").await;
        assert!(metrics.contains("refract_cluster_etcd_up 0"), "{metrics}");
        let (status, _) = call(n.http, "GET", "/stats", "").await;
        assert_eq!(status, 200, "clients are served with the last state");
    }
    let def = format!("{{\"name\": \"b1\", \"addr\": \"{b1}\", \"role\": \"replica\"}}");
    let (status, body) = call(d1.admin, "POST", "/backends", &def).await;
    assert_eq!(status, 503, "a change that cannot be shared is refused: {body}");
    assert!(body.contains("etcd"), "{body}");
    assert!(backend_view(&d1, "b1").await.is_none(), "and not made here either");

    etcd.resume().unwrap();
    for n in [&d1, &d2] {
        until(Duration::from_secs(10), "etcd back", async || json(n.admin, "/cluster").await["etcd"] == "up").await;
    }
    let (status, body) = call(d1.admin, "POST", "/backends", &def).await;
    assert_eq!(status, 201, "{body}");
    until(Duration::from_secs(1), "converged", async || backend_view(&d2, "b1").await.is_some()).await;
    let (_, metrics) = call(d2.admin, "GET", "/metrics", "").await;
    assert!(metrics.contains("refract_cluster_etcd_up 1"), "{metrics}");
    assert!(metrics.contains("refract_cluster_dispatchers 2"), "{metrics}");
    for n in [d1, d2] {
        n.dispatcher.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_asked_of_one_dispatcher_reloads_every_one() {
    let Two { etcd: _etcd, dir, b1, d1, d2, .. } = two_dispatchers().await;
    // d2's own file gains a backend; the reload is asked of d1.
    let path = dir.path().join("d2.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let more = format!("[[backend]]\nname = \"b1\"\naddr = \"{b1}\"\nrole = \"replica\"\n");
    std::fs::write(&path, text.replace("[cluster]", &format!("{more}[cluster]"))).unwrap();
    let (status, body) = call(d1.admin, "POST", "/reload", "{}").await;
    assert_eq!(status, 200, "{body}");
    until(Duration::from_secs(1), "d2 reloaded its file", async || backend_view(&d2, "b1").await.is_some()).await;
    assert!(backend_view(&d1, "b1").await.is_none(), "each dispatcher reloads its own file");
    for n in [d1, d2] {
        n.dispatcher.shutdown().await;
    }
}
