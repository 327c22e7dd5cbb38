//! Replica lag, read-your-writes and primary failure, against a real primary + replica. One
//! test, in steps, because each step changes the cluster (replay paused, primary killed).
#![allow(clippy::unwrap_used)]

use crate::pg_common;

use pg_common::{Client, Fixture};
use refract_testkit::{PASSWORD, USER};
use std::time::{Duration, Instant};

/// Polls `sql` in fresh sessions until it gives `want`.
fn eventually(f: &Fixture, sql: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let got = f.psql(&[sql]);
        if got.as_deref() == Ok(want) {
            return;
        }
        assert!(Instant::now() < deadline, "`{sql}` still gives {got:?}, not {want:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn lag_bound_read_your_writes_and_primary_failure() {
    let mut f = Fixture::start("max_lag_bytes = 65536\nread_your_writes = true");
    f.psql(&["CREATE TABLE t_ryw (x int)"]).unwrap();
    f.replicated();
    eventually(&f, "SELECT pg_is_in_recovery()", "t");

    // Read-your-writes: with replay paused the replica cannot have the write.
    f.cluster.psql(f.cluster.replica(), "SELECT pg_wal_replay_pause()").unwrap();
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    assert_eq!(c.query("INSERT INTO t_ryw VALUES (1)").code(), None);
    let a = c.query("SELECT count(*), pg_is_in_recovery() FROM t_ryw");
    assert_eq!((a.value(), a.rows[0][1].as_deref()), ("1", Some("f")), "own write read on the primary");
    assert_eq!(f.psql(&["SELECT pg_is_in_recovery()"]).unwrap(), "t", "other sessions still read the replica");

    // Lag bound: write well past 64 KiB of WAL; the replica is skipped once a poll sees it.
    f.psql(&["CREATE TABLE t_big AS SELECT g, repeat('x', 100) AS pad FROM generate_series(1, 20000) g"]).unwrap();
    eventually(&f, "SELECT pg_is_in_recovery()", "f");
    f.cluster.psql(f.cluster.replica(), "SELECT pg_wal_replay_resume()").unwrap();
    f.replicated();
    eventually(&f, "SELECT pg_is_in_recovery()", "t");
    let a = c.query("SELECT count(*), pg_is_in_recovery() FROM t_ryw");
    let caught_up = Instant::now() + Duration::from_secs(10);
    let mut a = a;
    while a.rows[0][1].as_deref() != Some("t") && Instant::now() < caught_up {
        std::thread::sleep(Duration::from_millis(100));
        a = c.query("SELECT count(*), pg_is_in_recovery() FROM t_ryw");
    }
    assert_eq!((a.value(), a.rows[0][1].as_deref()), ("1", Some("t")), "replica caught up: reads go back");

    let metrics = f.metrics();
    for want in [r#"refract_pg_replica_lag_bytes{backend="replica"}"#, r#"backend="replica""#, "backend_up"] {
        assert!(metrics.contains(want), "{want} missing from {metrics}");
    }

    // Primary down: writes get a clear error (never the replica), reads go on.
    f.cluster.kill_primary().unwrap();
    for _ in 0..2 {
        let a = c.query("INSERT INTO t_ryw VALUES (2)");
        assert!(a.error.is_some(), "{a:?}");
        assert_eq!(a.status, Some(refract_pg::TxStatus::Idle));
    }
    let a = c.query("INSERT INTO t_ryw VALUES (3)");
    let message = a.error.as_ref().and_then(|e| e.message()).unwrap_or_default().to_owned();
    assert!(message.contains("no primary server is available"), "{message}");
    let got = f.psql(&["SELECT count(*), pg_is_in_recovery() FROM t_ryw"]).unwrap();
    assert_eq!(got, "1|t");
    let psql = f.psql(&["CREATE TABLE t_never (x int)"]).unwrap_err();
    assert!(psql.contains("writes are refused"), "{psql}");
}

#[test]
fn a_replica_behind_by_time_is_skipped_and_an_idle_one_is_not() {
    let f = Fixture::start("max_lag_bytes = 0\nmax_lag_ms = 1000\nread_your_writes = false");
    f.psql(&["CREATE TABLE t_lag_ms (x int)"]).unwrap();
    f.replicated();
    // Idle for longer than the bound: the last replayed commit is old, but nothing is pending.
    std::thread::sleep(Duration::from_millis(1500));
    eventually(&f, "SELECT pg_is_in_recovery()", "t");
    let replica = |f: &Fixture| {
        let servers = f.admin_json("/pg/servers");
        servers.as_array().unwrap().iter().find(|s| s["role"] == "replica").unwrap().clone()
    };
    assert_eq!(replica(&f)["lag_seconds"], 0.0, "an idle replica is not lagging");

    // Replay paused, then a commit: received but not replayed, and older than 1 s soon.
    f.cluster.psql(f.cluster.replica(), "SELECT pg_wal_replay_pause()").unwrap();
    f.psql(&["INSERT INTO t_lag_ms VALUES (1)"]).unwrap();
    eventually(&f, "SELECT pg_is_in_recovery()", "f");
    let r = replica(&f);
    assert!(r["lag_seconds"].as_f64().unwrap() > 1.0, "{r}");
    assert!(f.metrics().contains(r#"refract_pg_replica_lag_seconds{backend="replica"}"#));

    f.cluster.psql(f.cluster.replica(), "SELECT pg_wal_replay_resume()").unwrap();
    f.replicated();
    eventually(&f, "SELECT count(*), pg_is_in_recovery() FROM t_lag_ms", "1|t");
    assert_eq!(replica(&f)["lag_seconds"], 0.0);
}

/// Read-your-writes without waiting for the health probe: a session that writes several times
/// a second reads from the replica once the replica has replayed its write (the health probe
/// runs only every 5 s here, so only the fast WAL-position polling can tell).
#[test]
fn a_write_is_read_from_the_replica_once_it_caught_up() {
    let f = Fixture::start("read_your_writes = true\nhealth_interval_ms = 5000");
    f.psql(&["CREATE TABLE t_ryw_fast (x int)"]).unwrap();
    f.replicated();
    eventually(&f, "SELECT pg_is_in_recovery()", "t");
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    for i in 1..=5 {
        assert_eq!(c.query("INSERT INTO t_ryw_fast VALUES (1)").code(), None);
        std::thread::sleep(Duration::from_millis(200));
        let a = c.query("SELECT count(*), pg_is_in_recovery() FROM t_ryw_fast");
        assert_eq!((a.value(), a.rows[0][1].as_deref()), (i.to_string().as_str(), Some("t")), "write {i}: {a:?}");
    }
    // An explicit write transaction too.
    assert_eq!(c.query("BEGIN; INSERT INTO t_ryw_fast VALUES (1); COMMIT").code(), None);
    std::thread::sleep(Duration::from_millis(200));
    let a = c.query("SELECT count(*), pg_is_in_recovery() FROM t_ryw_fast");
    assert_eq!((a.value(), a.rows[0][1].as_deref()), ("6", Some("t")), "{a:?}");
}

#[test]
fn balanced_accept_spreads_postgres_clients_evenly_over_the_loops() {
    let f = Fixture::start_with("accept = \"balanced\"", "");
    let mut clients: Vec<Client> = (0..6).map(|_| Client::connect(f.addr(), USER, PASSWORD).unwrap()).collect();
    for (i, c) in clients.iter_mut().enumerate() {
        assert_eq!(c.query(&format!("SELECT {i}")).value(), i.to_string());
    }
    let view = f.admin_json("/pg/clients");
    let shards: Vec<u64> = view.as_array().unwrap().iter().map(|c| c["shard"].as_u64().unwrap()).collect();
    assert_eq!(shards.len(), 6, "{view}");
    let on_first = shards.iter().filter(|&&s| s == 0).count();
    assert_eq!(on_first, 3, "six clients split 3/3 over the two loops: {view}");
    drop(clients.pop());
    drop(clients.pop());
    // A loop's count drops when its client leaves, so the next one goes where there is room.
    let deadline = Instant::now() + Duration::from_secs(5);
    while f.admin_json("/pg/clients").as_array().unwrap().len() != 4 {
        assert!(Instant::now() < deadline, "the two closed clients never left");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut late: Vec<Client> = (0..2).map(|_| Client::connect(f.addr(), USER, PASSWORD).unwrap()).collect();
    for c in &mut late {
        assert_eq!(c.query("SELECT 1").value(), "1");
    }
    let view = f.admin_json("/pg/clients");
    let on_first = view.as_array().unwrap().iter().filter(|c| c["shard"] == 0).count();
    assert_eq!(on_first, 3, "still 3/3 after two left and two came: {view}");
}
