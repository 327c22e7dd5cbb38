//! The test kit itself: a real primary and streaming replica, a write seen on the replica.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use refract_testkit::PgCluster;

#[test]
fn replica_sees_writes_on_the_primary() {
    let cluster = PgCluster::start().unwrap();
    let (p, r) = (&cluster.primary, cluster.replica());
    assert_ne!(p.port, r.port);
    assert_eq!(cluster.psql(p, "SELECT pg_is_in_recovery()").unwrap(), "f");
    assert_eq!(cluster.psql(r, "SELECT pg_is_in_recovery()").unwrap(), "t");
    cluster.psql(p, "CREATE TABLE kit (id int PRIMARY KEY, note text); INSERT INTO kit VALUES (1, 'hello')").unwrap();
    cluster.wait_for(r, "SELECT note FROM kit WHERE id = 1", "hello", Duration::from_secs(30)).unwrap();
    cluster.psql(p, "INSERT INTO kit VALUES (2, 'again')").unwrap();
    cluster.wait_replicated(Duration::from_secs(30)).unwrap();
    assert_eq!(cluster.psql(r, "SELECT count(*) FROM kit").unwrap(), "2");
    let err = cluster.psql(r, "INSERT INTO kit VALUES (3, 'no')").unwrap_err().to_string();
    assert!(err.contains("read-only transaction"), "{err}");
}

#[test]
fn everything_is_removed_on_drop() {
    let cluster = PgCluster::start_with_replicas(0).unwrap();
    let data = cluster.primary.data_dir().to_path_buf();
    let addr = cluster.primary.addr();
    assert!(data.exists());
    drop(cluster);
    assert!(!data.exists(), "{data:?} left behind");
    assert!(std::net::TcpStream::connect(addr).is_err(), "server still listening on {addr}");
}
