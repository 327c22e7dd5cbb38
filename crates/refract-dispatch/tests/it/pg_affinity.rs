//! Cache-affinity routing (`[balance] policy = "affinity"`) against a real primary and replica,
//! with three replica members (the replica, and two proxies in front of it that join through
//! the admin API): a key's reads all land on one member, by the simple and the extended
//! protocol and with pgbench's prepared statements, until that member is loaded past the bound
//! or leaves; other keys stay where they were when it leaves.
#![allow(clippy::unwrap_used)]

use crate::pg_common;

use pg_common::{slow_proxy, until, Client, Fixture};
use refract_testkit::{PASSWORD, USER};
use std::collections::HashMap;
use std::time::Duration;

const REPLICAS: [&str; 3] = ["replica", "r2", "r3"];

/// What `/backends` says each replica member served so far.
fn served(f: &Fixture) -> HashMap<String, u64> {
    let list = f.admin_json("/backends");
    let list = list.as_array().unwrap();
    let of = |name: &str| list.iter().find(|m| m["name"] == name).map_or(0, |m| m["served"].as_u64().unwrap());
    REPLICAS.iter().map(|n| (n.to_string(), of(n))).collect()
}

/// The members that served anything between `before` and now, with how much.
fn since(f: &Fixture, before: &HashMap<String, u64>) -> HashMap<String, u64> {
    served(f).into_iter().map(|(n, s)| (n.clone(), s - before[&n])).filter(|(_, d)| *d > 0).collect()
}

/// The one member that served `n` runs of `read`, asserting there is exactly one.
fn owner(f: &Fixture, n: usize, mut read: impl FnMut()) -> String {
    let before = served(f);
    (0..n).for_each(|_| read());
    let by = since(f, &before);
    assert_eq!(by.len(), 1, "one member serves a key's reads: {by:?}");
    assert_eq!(by.values().sum::<u64>(), n as u64, "{by:?}");
    by.into_keys().next().unwrap()
}

fn fixture() -> Fixture {
    let listen = "\n[balance]\npolicy = \"affinity\"\n\n[overload]\neject_slow_factor = 0\n";
    let extra = "[[postgres.affinity]]\ntable = \"rf_aff\"\ncolumn = \"id\"\nbucket = 1";
    let f = Fixture::start_with(listen, extra);
    f.psql(&[
        "CREATE TABLE rf_aff (id int PRIMARY KEY, v text)",
        "INSERT INTO rf_aff SELECT g, 'v' || g FROM generate_series(1, 100) g",
    ])
    .unwrap();
    f.replicated();
    for name in &REPLICAS[1..] {
        let proxy = slow_proxy(f.cluster.replica().addr(), Duration::ZERO);
        let def = format!(r#"{{"front": "postgres", "name": "{name}", "addr": "{proxy}", "role": "replica"}}"#);
        assert_eq!(f.admin_call("POST", "/backends", &def).0, 201);
    }
    until("three replica members up", || {
        let list = f.admin_json("/backends");
        REPLICAS.iter().all(|n| list.as_array().unwrap().iter().any(|m| m["name"] == *n && m["state"] == "up"))
    });
    f
}

#[test]
fn a_keys_reads_land_on_one_replica_until_it_is_loaded_past_the_bound_or_leaves() {
    let f = fixture();
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    let read = |c: &mut Client, id: u32| {
        assert_eq!(c.query(&format!("SELECT v FROM rf_aff WHERE id = {id}")).value(), format!("v{id}"))
    };

    // One key: one member, by either protocol, and by pgbench's prepared statements (a
    // parameter bound in text), whichever way the value is written.
    let of_7 = owner(&f, 10, || read(&mut c, 7));
    let extended = owner(&f, 10, || assert_eq!(c.extended("SELECT v FROM rf_aff WHERE id = '7'").value(), "v7"));
    assert_eq!(extended, of_7);
    let script = std::env::temp_dir().join(format!("rf_aff_{}.sql", std::process::id()));
    std::fs::write(&script, "\\set id 7\nSELECT v FROM rf_aff WHERE id = :id;\n").unwrap();
    let before = served(&f);
    f.pgbench(&["-n", "-M", "prepared", "-t", "20", "-f", script.to_str().unwrap()]).unwrap();
    let by = since(&f, &before);
    // Its PQprepare (Parse and Sync, no value yet) reads the table: keyed by the table alone.
    assert_eq!(by.get(&of_7), Some(&20), "pgbench's 20 reads of key 7: {by:?}");
    assert!(by.values().sum::<u64>() <= 21, "{by:?}");
    std::fs::remove_file(&script).unwrap();

    // Keys spread over the members.
    let owners: HashMap<u32, String> = (1..=30).map(|id| (id, owner(&f, 2, || read(&mut c, id)))).collect();
    let used: std::collections::HashSet<&String> = owners.values().collect();
    assert!(used.len() >= 2, "30 keys all on one member: {owners:?}");

    // Loaded past the bound (six reads of one key at once, each held 300 ms, while the other
    // members have none in flight): the next member on the ring takes some.
    let addr = f.addr();
    let before = served(&f);
    let slow: Vec<_> = (0..6)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr, USER, PASSWORD).unwrap();
                assert_eq!(c.query("SELECT v FROM rf_aff, pg_sleep(0.3) WHERE id = 7").value(), "v7");
            })
        })
        .collect();
    slow.into_iter().for_each(|t| t.join().unwrap());
    let by = since(&f, &before);
    assert!(by.len() >= 2 && by[&of_7] >= 2, "the owner takes its share, the next the rest: {by:?}");
    assert!(f.metrics().lines().any(|l| l.starts_with("refract_balance_affinity_total{outcome=\"spilled\"")));

    // The owner of key 7 leaves: its keys move, reads keep succeeding; no other key moves.
    assert_eq!(f.admin_call("DELETE", &format!("/backends/{of_7}"), "").0, 200);
    let moved = owner(&f, 10, || read(&mut c, 7));
    assert_ne!(moved, of_7);
    for (id, was) in owners.iter().filter(|(_, o)| **o != of_7) {
        assert_eq!(&owner(&f, 2, || read(&mut c, *id)), was, "key {id} stays on {was}");
    }
}
