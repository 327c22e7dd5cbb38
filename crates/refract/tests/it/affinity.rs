//! The affinity policy for the HTTP front end, against real blob servers: under `[balance]
//! policy = "affinity"` every Hyrise-R read of one table by one predicate value goes to one
//! replica, two dispatchers in front of the same backends send it to the same one, and a
//! replica that leaves moves only its own keys (docs/routing.md, "Affinity").
#![allow(clippy::unwrap_used)]

use crate::common;
use common::*;
use std::collections::BTreeSet;

/// A read of table `t` looking up `id = value`.
fn read_of(value: u32) -> String {
    format!(
        r#"{{"operators":{{"0":{{"type":"GetTable","name":"t"}},"1":{{"type":"SimpleTableScan","predicates":[{{"type":"EQ","in":0,"f":"id","vtype":0,"value":{value}}}]}}}},"edges":[["0","1"]]}}"#
    )
}

/// Who served each of `n` reads of `plan` (one keep-alive connection).
fn served(d: &Dispatcher, plan: &str, n: usize) -> BTreeSet<String> {
    let mut c = Client::connect(d.proc.addr);
    let mut out = BTreeSet::new();
    for _ in 0..n {
        c.send(&raw_request("POST", "/query", &[], &plan_body(plan)));
        let r = c.read_response(false).unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        out.insert(r.json()["served_by"].as_str().unwrap().to_string());
    }
    out
}

/// The one backend that served every read of value `v` (10 of them).
fn owner(d: &Dispatcher, v: u32) -> String {
    let by = served(d, &read_of(v), 10);
    assert_eq!(by.len(), 1, "value {v} went to {by:?}");
    by.into_iter().next().unwrap()
}

/// A primary and three replicas.
fn backends() -> Vec<Proc> {
    ["p", "r1", "r2", "r3"].into_iter().map(blob).collect()
}

fn affine(b: &[Proc]) -> Dispatcher {
    let list = [("p", b[0].addr, "primary"), ("r1", b[1].addr, "replica"), ("r2", b[2].addr, "replica")];
    let list = [&list[..], &[("r3", b[3].addr, "replica")]].concat();
    dispatcher(&list, "[balance]\npolicy = \"affinity\"\n")
}

const VALUES: u32 = 24;

#[test]
fn reads_of_one_value_go_to_one_replica_and_two_dispatchers_agree() {
    let b = backends();
    let (d1, d2) = (affine(&b), affine(&b));
    let placed: Vec<String> = (0..VALUES).map(|v| owner(&d1, v)).collect();
    for (v, name) in (0..VALUES).zip(&placed) {
        assert_eq!(&owner(&d2, v), name, "the other dispatcher sends value {v} elsewhere");
    }
    let used: BTreeSet<&String> = placed.iter().collect();
    assert!(used.len() >= 2 && !used.contains(&"p".to_string()), "values spread over the replicas: {placed:?}");
    // One after the other, no owner is ever busy: every read went to its owner.
    let owned = u64::from(VALUES) * 10;
    assert_eq!(metric(d1.admin, r#"refract_balance_affinity_total{outcome="owner"}"#), owned);
    assert_eq!(metric(d1.admin, r#"refract_balance_affinity_total{outcome="spilled"}"#), 0);
    // A read without a predicate value: its table alone is its key.
    let table = r#"{"operators":{"0":{"type":"GetTable","name":"t"},"1":{"type":"SimpleTableScan"}}}"#;
    assert_eq!(served(&d1, table, 10), served(&d2, table, 1));
}

#[test]
fn a_replica_that_leaves_moves_only_its_own_values() {
    let b = backends();
    let d = affine(&b);
    let before: Vec<String> = (0..VALUES).map(|v| owner(&d, v)).collect();
    let gone = before.iter().find(|n| n.starts_with('r')).unwrap().clone();
    assert_eq!(admin(d.admin, "DELETE", &format!("/backends/{gone}"), b"").status, 200);
    let after: Vec<String> = (0..VALUES).map(|v| owner(&d, v)).collect();
    for (was, is) in before.iter().zip(&after) {
        assert!(if *was == gone { *is != gone } else { is == was }, "{was} -> {is}");
    }
    // Back again (at the end of the list): its values come back to it.
    let i = ["p", "r1", "r2", "r3"].iter().position(|n| *n == gone).unwrap();
    let def = format!(r#"{{"name":"{gone}","addr":"{}","role":"replica"}}"#, b[i].addr);
    assert_eq!(admin(d.admin, "POST", "/backends", def.as_bytes()).status, 201);
    assert_eq!((0..VALUES).map(|v| owner(&d, v)).collect::<Vec<_>>(), before);
}
