//! What the servers' buffer caches do, as refract samples it on the health probes'
//! connections (`cache_stats_interval_ms`), against a real primary + replica: reads of a table
//! through refract show in the replica's `/pg/servers` `cache` (the database's blocks, the
//! table among its relations) and in `/metrics`; an undrained replica is `warming` until its
//! samples find its cache warm.
#![allow(clippy::unwrap_used)]

use crate::pg_common;

use pg_common::{until, Client, Fixture};
use refract_testkit::{PASSWORD, USER};
use serde_json::Value;

/// The replica's `cache` in `/pg/servers`.
fn replica_cache(f: &Fixture) -> Value {
    let servers = f.admin_json("/pg/servers");
    servers.as_array().unwrap().iter().find(|s| s["role"] == "replica").unwrap()["cache"].clone()
}

/// `t_cache` among `cache`'s relations.
fn table(cache: &Value) -> Option<Value> {
    cache["relations"].as_array()?.iter().find(|r| r["name"] == "t_cache").cloned()
}

/// One read of the table on the replica: a sequential scan and an index lookup.
fn read(c: &mut Client, i: u32) {
    let a = c.query("SELECT count(*), pg_is_in_recovery() FROM t_cache WHERE pad <> ''");
    assert_eq!((a.value(), a.rows[0][1].as_deref()), ("20000", Some("t")), "{a:?}");
    let a = c.query(&format!("SELECT id FROM t_cache WHERE id = {}", 1 + i % 20000));
    assert_eq!(a.value(), (1 + i % 20000).to_string());
}

#[test]
fn servers_show_their_cache_and_an_undrained_replica_warms() {
    let f = Fixture::start("cache_stats_interval_ms = 200\nread_your_writes = false");
    f.psql(&[
        "CREATE TABLE t_cache AS SELECT g AS id, repeat('x', 100) AS pad FROM generate_series(1, 20000) g",
        "ALTER TABLE t_cache ADD PRIMARY KEY (id)",
    ])
    .unwrap();
    f.replicated();
    until("a first cache sample of the replica", || replica_cache(&f)["sampled_unix_ms"].as_u64() > Some(0));
    let before = replica_cache(&f);
    assert_eq!(before["warming"], false, "{before}");
    let hit_before = before["blks_hit"].as_u64().unwrap();

    // Reads through refract (on the replica): the database's hits grow, the table is listed.
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    let mut i = 0;
    let mut seen = Value::Null;
    until("the replica's cache shows the reads of t_cache", || {
        read(&mut c, i);
        i += 1;
        seen = replica_cache(&f);
        seen["blks_hit"].as_u64() > Some(hit_before)
            && table(&seen).is_some_and(|t| t["interval_blks_hit"].as_u64() > Some(0))
    });
    let t = table(&seen).unwrap();
    let ratio = t["hit_ratio"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&ratio), "{t}");
    assert!(t["heap_blks_hit"].as_u64().unwrap() > 0, "{t}");
    let ratio = seen["hit_ratio"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&ratio), "{seen}");
    assert!(seen["relations"].as_array().unwrap().len() <= 20, "{seen}");
    assert!(seen["interval_seconds"].as_f64().unwrap() > 0.0, "{seen}");

    // The same in /metrics: the counters, and the ratio while the last interval read blocks.
    until("the replica's cache metrics", || {
        read(&mut c, i);
        i += 1;
        let m = f.metrics();
        m.contains(r#"refract_pg_server_blocks_hit_total{backend="replica"}"#)
            && m.contains(r#"refract_pg_server_blocks_read_total{backend="replica"}"#)
            && m.contains(r#"refract_pg_server_cache_hit_ratio{backend="replica"}"#)
            && m.contains(r#"refract_pg_server_cache_warming{backend="replica"} 0"#)
    });

    // Undrained, the replica takes reads again: warming, until an interval reads warm.
    assert_eq!(f.admin_call("POST", "/backends/replica/drain", "").0, 200);
    assert_eq!(f.psql(&["SELECT pg_is_in_recovery()"]).unwrap(), "f", "drained: reads on the primary");
    assert_eq!(f.admin_call("POST", "/backends/replica/undrain", "").0, 200);
    let warming = replica_cache(&f);
    assert_eq!(warming["warming"], true, "{warming}");
    assert!(warming["warming_since_unix_ms"].as_u64() > Some(0), "{warming}");
    assert!(f.metrics().contains(r#"refract_pg_server_cache_warming{backend="replica"} 1"#));
    until("the undrained replica's cache warm again", || {
        read(&mut c, i);
        i += 1;
        replica_cache(&f)["warming"] == false
    });
    let warm = replica_cache(&f);
    assert_eq!(warm["warming_since_unix_ms"], Value::Null, "{warm}");
}
