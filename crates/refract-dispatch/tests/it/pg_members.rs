//! PostgreSQL servers as members of the engine, against a real primary + replica: listed in
//! `/backends` beside the HTTP backends, a replica joining, drained and leaving at run time,
//! a slow replica ejected by the engine's latency outlier check, and reads balanced by the
//! engine's `[balance]` (a slow replica gets few; `read_from_primary` lets the primary serve).
#![allow(clippy::unwrap_used)]

use crate::pg_common;

use pg_common::{slow_proxy, until, Client, Fixture};
use refract_testkit::{PASSWORD, USER};
use std::time::{Duration, Instant};

/// The state `/backends` gives member `name` (`None`: not listed).
fn state(f: &Fixture, name: &str) -> Option<String> {
    let list = f.admin_json("/backends");
    let m = list.as_array().unwrap().iter().find(|m| m["name"] == name)?.clone();
    assert_eq!(m["front"], "postgres", "{m}");
    Some(m["state"].as_str().unwrap().to_owned())
}

/// What `/backends` says member `name` served so far.
fn served(f: &Fixture, name: &str) -> u64 {
    let list = f.admin_json("/backends");
    list.as_array().unwrap().iter().find(|m| m["name"] == name).unwrap()["served"].as_u64().unwrap()
}

/// Top-level sections for [`Fixture::start_with`], whose first argument ends `[listen]`.
fn sections(text: &str) -> String {
    format!("\n{text}\n")
}

#[test]
fn postgres_servers_are_members_that_join_drain_leave_and_are_ejected_when_slow() {
    // Round robin: the slow replica must take reads for the outlier check to see it (the
    // default peak-EWMA policy would give it hardly any; see the next tests).
    let f = Fixture::start_with(&sections("[balance]\npolicy = \"round-robin\""), "");
    until("both servers up in /backends", || {
        state(&f, "primary").as_deref() == Some("up") && state(&f, "replica").as_deref() == Some("up")
    });

    // Drained, the replica takes no reads: they go to the primary; undrained, back.
    assert_eq!(f.admin_call("POST", "/backends/pg:replica/drain", "").0, 200);
    assert_eq!(f.psql(&["SELECT pg_is_in_recovery()"]).unwrap(), "f");
    assert_eq!(f.admin_call("POST", "/backends/pg:replica/undrain", "").0, 200);
    assert_eq!(f.psql(&["SELECT pg_is_in_recovery()"]).unwrap(), "t");

    // A second replica joins: the same server behind a proxy that adds 150 ms to each answer.
    let slow = slow_proxy(f.cluster.replica().addr(), Duration::from_millis(150));
    let def = format!(r#"{{"name": "pg:slow", "addr": "{slow}", "role": "replica"}}"#);
    assert_eq!(f.admin_call("POST", "/backends", &def).0, 201);
    assert_eq!(f.admin_call("POST", "/backends", &def).0, 409, "its name is taken now");
    let primary = format!(r#"{{"name": "pg:p2", "addr": "{slow}", "role": "primary"}}"#);
    assert_eq!(f.admin_call("POST", "/backends", &primary).0, 409, "no second primary");
    until("the new replica passes its probe", || state(&f, "slow").as_deref() == Some("up"));

    // Reads alternate over the two replicas until the outlier check ejects the slow one.
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    until("the slow replica ejected", || {
        assert_eq!(c.query("SELECT 1").value(), "1");
        state(&f, "slow").as_deref() == Some("ejected")
    });
    assert_eq!(state(&f, "replica").as_deref(), Some("up"), "the fast replica stays");
    // Ejected, it takes no reads: each now answers without the proxy's delay.
    for _ in 0..5 {
        let t = Instant::now();
        assert_eq!(c.query("SELECT 1").value(), "1");
        assert!(t.elapsed() < Duration::from_millis(150), "a read took {:?}", t.elapsed());
    }

    // It leaves; the primary cannot.
    assert_eq!(f.admin_call("DELETE", "/backends/pg:slow", "").0, 200);
    assert_eq!(state(&f, "slow"), None);
    assert_eq!(f.admin_call("DELETE", "/backends/pg:slow", "").0, 404);
    assert_eq!(f.admin_call("DELETE", "/backends/pg:primary", "").0, 409);
    assert_eq!(c.query("SELECT 1").value(), "1");
}

#[test]
fn reads_go_mostly_to_the_faster_replica_by_the_engines_balance_policy() {
    // The outlier check is off: the balancer alone must keep reads off the slow replica.
    let f = Fixture::start_with(&sections("[overload]\neject_slow_factor = 0"), "");
    until("both servers up", || state(&f, "replica").as_deref() == Some("up"));
    let slow = slow_proxy(f.cluster.replica().addr(), Duration::from_millis(100));
    let def = format!(r#"{{"name": "pg:slow", "addr": "{slow}", "role": "replica"}}"#);
    assert_eq!(f.admin_call("POST", "/backends", &def).0, 201);
    until("the slow replica passes its probe", || state(&f, "slow").as_deref() == Some("up"));

    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    let (slow_before, fast_before) = (served(&f, "slow"), served(&f, "replica"));
    for _ in 0..40 {
        assert_eq!(c.query("SELECT 1").value(), "1");
    }
    let on_slow = served(&f, "slow") - slow_before;
    let on_fast = served(&f, "replica") - fast_before;
    // Round robin would give each half; peak-EWMA cost gives the slow one its first reads
    // (no latency known yet) and then hardly any.
    assert_eq!(on_slow + on_fast, 40, "every read on a replica");
    assert!(on_slow <= 8, "the slow replica served {on_slow} of 40 reads");
}

#[test]
fn with_read_from_primary_the_primary_and_the_replica_both_serve_reads() {
    let f = Fixture::start_with(&sections("[balance]\nread_from_primary = true"), "");
    until("both servers up", || {
        state(&f, "primary").as_deref() == Some("up") && state(&f, "replica").as_deref() == Some("up")
    });
    // Four clients at once: each read holds its server 50 ms, so the in-flight count in the
    // balancer's cost spreads them over both servers.
    let addr = f.addr();
    let clients: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr, USER, PASSWORD).unwrap();
                let q = "SELECT pg_is_in_recovery() FROM pg_sleep(0.05)";
                (0..6).map(|_| c.query(q).value().to_owned()).collect::<Vec<_>>()
            })
        })
        .collect();
    let seen: Vec<String> = clients.into_iter().flat_map(|t| t.join().unwrap()).collect();
    assert!(seen.iter().any(|v| v == "t"), "the replica served none: {seen:?}");
    assert!(seen.iter().any(|v| v == "f"), "the primary served none: {seen:?}");
}

#[test]
fn postgres_servers_are_named_plainly_and_a_name_is_unique_across_both_front_ends() {
    let f = Fixture::start("");
    until("the replica up", || state(&f, "replica").as_deref() == Some("up"));

    // Drained and undrained by its plain name.
    assert_eq!(f.admin_call("POST", "/backends/replica/drain", "").0, 200);
    assert_eq!(f.psql(&["SELECT pg_is_in_recovery()"]).unwrap(), "f");
    assert_eq!(f.admin_call("POST", "/backends/replica/undrain", "").0, 200);
    assert_eq!(f.psql(&["SELECT pg_is_in_recovery()"]).unwrap(), "t");

    // A replica joins, defined as a PostgreSQL server; its name is then taken for both.
    let proxy = slow_proxy(f.cluster.replica().addr(), Duration::ZERO);
    let def = format!(r#"{{"front": "postgres", "name": "extra", "addr": "{proxy}", "role": "replica"}}"#);
    assert_eq!(f.admin_call("POST", "/backends", &def).0, 201);
    assert_eq!(f.admin_call("POST", "/backends", &def).0, 409, "its name is taken now");
    let http = r#"{"name": "extra", "addr": "127.0.0.1:9", "role": "replica"}"#;
    assert_eq!(f.admin_call("POST", "/backends", http).0, 409, "an HTTP backend may not take it");
    let http = r#"{"name": "primary", "addr": "127.0.0.1:9", "role": "replica"}"#;
    assert_eq!(f.admin_call("POST", "/backends", http).0, 409, "nor a configured server's");
    let odd = r#"{"front": "ftp", "name": "x", "addr": "127.0.0.1:9", "role": "replica"}"#;
    assert_eq!(f.admin_call("POST", "/backends", odd).0, 400);
    until("the new replica passes its probe", || state(&f, "extra").as_deref() == Some("up"));

    // It leaves by its plain name; the primary cannot.
    assert_eq!(f.admin_call("DELETE", "/backends/extra", "").0, 200);
    assert_eq!(state(&f, "extra"), None);
    assert_eq!(f.admin_call("DELETE", "/backends/extra", "").0, 404);
    assert_eq!(f.admin_call("DELETE", "/backends/primary", "").0, 409);
}
