//! Two cluster handles on one real etcd: they see each other, share entries within the 1 s
//! the design promises, keep their view through an etcd outage (refusing writes), converge
//! when it is back, and see a stopped peer leave at once.

use refract_cluster::{Cluster, ClusterConfig, ClusterError, View};
use refract_testkit::Etcd;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

fn config(etcd: &Etcd, node_id: &str) -> ClusterConfig {
    let text = format!("etcd = [\"{}\"]\nnode_id = \"{node_id}\"\nlease_ttl_s = 2\n", etcd.endpoint());
    toml::from_str::<ClusterConfig>(&text).expect("parses").validate().expect("valid")
}

fn join(etcd: &Etcd, node_id: &str) -> (Arc<Cluster>, CancellationToken) {
    let stop = CancellationToken::new();
    let info = serde_json::json!({ "admin": format!("{node_id}.example:9000") });
    (Cluster::start(config(etcd, node_id), info, stop.clone()), stop)
}

/// Waits up to `within` for `cluster`'s view to satisfy `ok`; returns how long it took.
async fn until(cluster: &Cluster, within: Duration, ok: impl Fn(&View) -> bool) -> Duration {
    let start = Instant::now();
    let mut rx = cluster.subscribe();
    let waited = tokio::time::timeout(within, rx.wait_for(|v| ok(v))).await;
    assert!(matches!(waited, Ok(Ok(_))), "not within {within:?}: {:?}", cluster.view());
    start.elapsed()
}

#[tokio::test]
async fn peers_and_shared_entries_reach_every_dispatcher_within_a_second() {
    let etcd = Etcd::start().expect("etcd");
    let (a, _stop_a) = join(&etcd, "d1");
    let (b, stop_b) = join(&etcd, "d2");
    until(&a, Duration::from_secs(5), |v| v.is_up() && v.peers.len() == 2).await;
    until(&b, Duration::from_secs(5), |v| v.is_up() && v.peers.len() == 2).await;
    assert_eq!(b.view().peers["d1"].info["admin"], "d1.example:9000");

    a.put("members/b7", "{\"drained\":true}").await.expect("put");
    assert_eq!(a.view().shared["members/b7"], "{\"drained\":true}", "the writer reads its own write at once");
    let took = until(&b, Duration::from_secs(1), |v| v.shared.contains_key("members/b7")).await;
    println!("a shared write reached the other dispatcher {took:?} after the writer had it");
    b.delete("members/b7").await.expect("delete");
    until(&a, Duration::from_secs(1), |v| v.shared.is_empty()).await;

    stop_b.cancel();
    let took = until(&a, Duration::from_secs(1), |v| !v.peers.contains_key("d2")).await;
    println!("a stopped dispatcher left its peers' view in {took:?}");
}

#[tokio::test]
async fn an_etcd_outage_keeps_the_view_refuses_writes_and_converges_after() {
    let mut etcd = Etcd::start().expect("etcd");
    let (a, _sa) = join(&etcd, "d1");
    let (b, _sb) = join(&etcd, "d2");
    until(&a, Duration::from_secs(5), |v| v.is_up() && v.peers.len() == 2).await;
    until(&b, Duration::from_secs(5), |v| v.is_up() && v.peers.len() == 2).await;
    a.put("members/x", "1").await.expect("put");
    until(&b, Duration::from_secs(1), |v| v.shared.contains_key("members/x")).await;

    etcd.stop().expect("stop etcd");
    until(&a, Duration::from_secs(5), |v| !v.is_up()).await;
    until(&b, Duration::from_secs(5), |v| !v.is_up()).await;
    assert_eq!(b.view().shared["members/x"], "1", "the last state is served while etcd is away");
    let refused = a.put("members/y", "2").await.expect_err("no etcd, no shared write");
    assert!(matches!(refused, ClusterError::Unavailable(_)), "{refused}");

    etcd.resume().expect("etcd back");
    until(&a, Duration::from_secs(10), |v| v.is_up()).await;
    until(&b, Duration::from_secs(10), |v| v.is_up()).await;
    a.put("members/y", "2").await.expect("put after the outage");
    until(&b, Duration::from_secs(1), |v| v.shared.get("members/y").map(String::as_str) == Some("2")).await;
    until(&b, Duration::from_secs(5), |v| v.peers.len() == 2).await;
}

#[tokio::test]
async fn a_node_id_in_use_is_refused_until_its_holder_leaves() {
    let etcd = Etcd::start().expect("etcd");
    let (first, stop_first) = join(&etcd, "d1");
    until(&first, Duration::from_secs(5), |v| v.is_up()).await;
    let (second, _s) = join(&etcd, "d1");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let v = second.view();
    assert!(!v.is_up(), "a second dispatcher with the same node_id must not register: {v:?}");
    assert!(matches!(&v.link, refract_cluster::Link::Down { error, .. } if error.contains("node_id")), "{v:?}");
    stop_first.cancel();
    until(&second, Duration::from_secs(5), |v| v.is_up()).await;
}
