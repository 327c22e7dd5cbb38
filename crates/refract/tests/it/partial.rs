//! Partial replicas for the HTTP front end, against real blob servers: a primary and two
//! replicas holding {a, b} and {b, c}; a Hyrise-R read plan goes only to a backend holding
//! every table its operators name (the primary when none does), in `[[share]]` proportions
//! when configured; other reads are balanced as before.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::*;
use std::collections::BTreeMap;

/// A read plan over `tables`: one GetTable each, joined, then scanned.
fn read_of(tables: &[&str]) -> String {
    let mut ops: Vec<String> =
        tables.iter().enumerate().map(|(i, t)| format!(r#""{i}":{{"type":"GetTable","name":"{t}"}}"#)).collect();
    let last = if tables.len() > 1 { "JoinScan" } else { "SimpleTableScan" };
    ops.push(format!(r#""{}":{{"type":"{last}"}}"#, tables.len()));
    format!(r#"{{"operators":{{{}}}}}"#, ops.join(","))
}

/// A primary p and replicas r1 {a, b}, r2 {b, c}; `extra` is appended to the config.
fn cluster(extra: &str) -> (Vec<Proc>, Dispatcher) {
    let (p, r1, r2) = (blob("p"), blob("r1"), blob("r2"));
    let http = ([127, 0, 0, 1], free_port()).into();
    let admin = ([127, 0, 0, 1], free_port()).into();
    let text = config(http, admin, &[("p", p.addr, "primary")], "")
        + &format!("[[backend]]\nname = \"r1\"\naddr = \"{}\"\nrole = \"replica\"\ntables = [\"a\", \"b\"]\n", r1.addr)
        + &format!("[[backend]]\nname = \"r2\"\naddr = \"{}\"\nrole = \"replica\"\ntables = [\"b\", \"c\"]\n", r2.addr)
        + extra;
    (vec![p, r1, r2], dispatcher_with(&text, http, admin))
}

/// Who served `n` plans, by name (one keep-alive connection).
fn served_by(d: &Dispatcher, plan: &str, n: usize) -> BTreeMap<String, usize> {
    let mut c = Client::connect(d.proc.addr);
    let mut out = BTreeMap::new();
    for _ in 0..n {
        c.send(&raw_request("POST", "/query", &[], &plan_body(plan)));
        let r = c.read_response(false).unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        *out.entry(r.json()["served_by"].as_str().unwrap().to_string()).or_insert(0) += 1;
    }
    out
}

fn only(name: &str, n: usize) -> BTreeMap<String, usize> {
    BTreeMap::from([(name.to_string(), n)])
}

#[test]
fn a_read_plan_goes_only_to_a_backend_holding_its_tables() {
    let (_blobs, d) = cluster("[balance]\npolicy = \"round-robin\"\n");
    assert_eq!(served_by(&d, &read_of(&["a"]), 20), only("r1", 20), "only r1 holds a");
    assert_eq!(served_by(&d, &read_of(&["c"]), 20), only("r2", 20), "only r2 holds c");
    assert_eq!(served_by(&d, &read_of(&["a", "c"]), 10), only("p", 10), "no replica holds a and c");
    let b = served_by(&d, &read_of(&["b"]), 20);
    assert_eq!((b.get("r1"), b.get("r2")), (Some(&10), Some(&10)), "both hold b: {b:?}");
    // Hyrise-R looks an operator's `input` up by name too.
    let input = r#"{"operators":{"0":{"type":"ProjectionScan","input":["c"],"fields":[0]}}}"#;
    assert_eq!(served_by(&d, input, 5), only("r2", 5));
    // An index scan names an index, not a table: only a backend holding everything runs it.
    let index = r#"{"operators":{"0":{"type":"GetTable","name":"a"},"1":{"type":"IndexScan","index":"i"}}}"#;
    assert_eq!(served_by(&d, index, 5), only("p", 5));
    // A read that is no plan is balanced over the replicas as before.
    let mut seen = BTreeMap::new();
    for _ in 0..10 {
        *seen.entry(get(d.proc.addr, "/blob?bytes=1").header("x-served-by").unwrap()).or_insert(0) += 1;
    }
    assert_eq!((seen.get("r1"), seen.get("r2")), (Some(&5), Some(&5)), "{seen:?}");
    // Writes and a TableLoad are unchanged; a plan that is no JSON goes to the primary.
    let write = r#"{"operators":{"0":{"type":"GetTable","name":"a"},"1":{"type":"InsertScan"}}}"#;
    assert_eq!(served_by(&d, write, 2), only("p", 2));
    let r = request(d.proc.addr, "POST", "/query", &[], b"query=%7Bnot json");
    assert_eq!(r.json()["served_by"], "p");
    let r = request(d.proc.addr, "POST", "/query", &[], &plan_body(TABLE_LOAD));
    assert_eq!((r.status, r.json()["served_by"].as_str()), (200, Some("p")));
}

#[test]
fn a_read_plan_falls_back_to_the_primary_when_its_replica_is_down() {
    let (mut blobs, d) = cluster("[health]\ninterval_ms = 100\n");
    drop(blobs.remove(1)); // r1, the only replica holding a
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let views = admin_get(d.admin, "/backends").json();
        if views[1]["state"] == "down" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "r1 never marked down: {views}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(served_by(&d, &read_of(&["a"]), 5), only("p", 5), "not r2, which lacks a");
    assert_eq!(served_by(&d, &read_of(&["c"]), 5), only("r2", 5));
}

#[test]
fn shares_spread_a_class_of_reads_within_ten_percent() {
    let share = "[[share]]\ntables = [\"b\"]\nbackends = { p = 1, r1 = 1, r2 = 2 }\n";
    let (_blobs, d) = cluster(share);
    let got = served_by(&d, &read_of(&["b"]), 1000);
    for (name, want) in [("p", 250.0), ("r1", 250.0), ("r2", 500.0)] {
        let n = *got.get(name).unwrap_or(&0) as f64;
        assert!((n - want).abs() <= want * 0.1, "{name}: {n} of 1000, want {want} ± 10 %: {got:?}");
    }
    // Another class is balanced over the replicas holding it; the primary the share names
    // takes none of it.
    let a = served_by(&d, &read_of(&["a"]), 20);
    assert_eq!(a, only("r1", 20));
}

#[test]
fn the_admin_view_shows_the_tables_each_backend_holds() {
    let (_blobs, d) = cluster("[balance]\npolicy = \"round-robin\"\n");
    let views = admin_get(d.admin, "/backends").json();
    let tables: Vec<_> = views.as_array().unwrap().iter().map(|v| (v["name"].clone(), v["tables"].clone())).collect();
    let want = serde_json::json!([["p", null], ["r1", ["a", "b"]], ["r2", ["b", "c"]]]);
    assert_eq!(serde_json::json!(tables), want);
    // A replica added at runtime may hold some tables too.
    let r3 = blob("r3");
    let def = format!(r#"{{"name":"r3","addr":"{}","role":"replica","tables":["c"]}}"#, r3.addr);
    assert_eq!(admin(d.admin, "POST", "/backends", def.as_bytes()).status, 201);
    let views = admin_get(d.admin, "/backends").json();
    assert_eq!(views[3]["tables"], serde_json::json!(["c"]));
    let c = served_by(&d, &read_of(&["c"]), 20);
    assert_eq!((c.get("r2"), c.get("r3"), c.len()), (Some(&10), Some(&10), 2), "{c:?}");
}

#[test]
fn a_reload_applies_changed_tables_and_shares() {
    let (_blobs, d) = cluster("[balance]\npolicy = \"round-robin\"\n");
    assert_eq!(served_by(&d, &read_of(&["a"]), 4), only("r1", 4));
    let text = std::fs::read_to_string(d.config_path()).unwrap();
    let share = "[[share]]\ntables = [\"c\"]\nbackends = { p = 1, r2 = 1 }\n";
    let next = text.replace("tables = [\"a\", \"b\"]", "tables = [\"b\"]") + share;
    std::fs::write(d.config_path(), next).unwrap();
    let r = admin(d.admin, "POST", "/reload", b"{}");
    assert_eq!(r.json()["reloaded"], "changed r1, shares", "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(served_by(&d, &read_of(&["a"]), 4), only("p", 4), "r1 no longer holds a");
    let c = served_by(&d, &read_of(&["c"]), 100);
    let p = *c.get("p").unwrap_or(&0);
    assert!((45..=55).contains(&p) && p + c.get("r2").unwrap_or(&0) == 100, "the share names the primary: {c:?}");
}
