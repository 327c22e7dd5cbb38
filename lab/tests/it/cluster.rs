//! Several dispatchers behind one address in the lab (root only; `lab up --cluster
//! --dispatchers 2`): rf-r spreads connections over d1 and d2; a backend drained through d1's
//! admin API is drained on d2 within 1 s; hybrid streams through both survive on d1 when d2 is
//! killed, d2's end at once, new connections answer within 3 s, no flow entry is left; with
//! etcd stopped both dispatchers keep serving and say so, refuse admin changes, and converge
//! when it is back.

use crate::common;

use common::{lab_in_use, refract_bin, skip, Down};
use refract_lab::bench::cluster::failover;
use refract_lab::fabric::congestion;
use refract_lab::fabric::topology::{C1, VIP};
use refract_lab::lab::{self, Db};
use refract_lab::multi::{self, DISPATCHERS};
use refract_lab::support::sh::{self, cmd};
use refract_lab::support::units::Rate;
use std::time::{Duration, Instant};

const TOKEN: &str = "refract-lab-admin-token";

fn skip_reason() -> Option<String> {
    if !sh::is_root() {
        return Some("not root (network namespaces need CAP_NET_ADMIN)".into());
    }
    for tool in ["ip", "tc", "etcd", "curl"] {
        if !sh::have(tool) {
            return Some(format!("{tool} is not installed"));
        }
    }
    if refract_bin().is_none() {
        return Some("no refract binary: build it (cargo build -p refract) or set REFRACT_BIN".into());
    }
    lab_in_use()
}

/// `curl` from c1 to a dispatcher's admin listener: (status, body).
fn admin(method: &str, addr: &str, path: &str) -> (u16, String) {
    let url = format!("http://{addr}{path}");
    let auth = format!("authorization: Bearer {TOKEN}");
    let json = "content-type: application/json";
    let args = ["-s", "-m", "3", "-X", method, "-H", &auth, "-H", json, "-w", "\n%{http_code}", &url];
    let out = sh::run(cmd(Some(&C1.ns()), "curl", &args)).unwrap_or_default();
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// Whether `backend` shows drained in the relay dispatcher at `addr`'s `GET /backends`.
fn drained(addr: &str, backend: &str) -> Option<bool> {
    let (code, body) = admin("GET", addr, "/backends");
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let list = v.as_array().or_else(|| v["backends"].as_array())?;
    list.iter().find(|b| b["name"] == backend).and_then(|b| b["drained"].as_bool())
}

fn within(limit: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// A blob through the VIP's relay port from c1.
fn serves() -> bool {
    let url = format!("http://{VIP}:8081/blob?bytes=1000");
    sh::run(cmd(Some(&C1.ns()), "curl", &["-s", "-m", "3", "-o", "/dev/null", "-w", "%{http_code}", &url]))
        .is_ok_and(|c| c.trim() == "200")
}

#[test]
fn two_dispatchers_share_membership_survive_a_kill_and_an_etcd_outage() {
    let _lab = common::lab_lock();
    if let Some(why) = skip_reason() {
        skip(&why);
        return;
    }
    let bin = refract_bin().expect("refract binary");
    let _down = Down;
    let gbit = Rate::parse("1gbit").expect("rate");
    lab::up_with(gbit, Some(Db::Http), &congestion::requested(None), &bin).expect("lab up --cluster");
    lab::up_dispatchers(2, Db::Http, gbit, &bin).expect("lab up --dispatchers 2");
    assert_eq!(multi::next_hops(), ["198.18.0.3", "198.18.0.4"]);
    let [d1, d2] = [0, 1].map(|i| format!("{}:8181", DISPATCHERS[i].addr));
    let (code, body) = admin("GET", &d1, "/cluster");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("d1-relay") && body.contains("d2-relay"), "both registered: {body}");

    // A drain through d1 reaches d2 within 1 s; an undrain through d2 reaches d1.
    assert_eq!(drained(&d2, "b2"), Some(false));
    assert_eq!(admin("POST", &d1, "/backends/b2/drain").0, 200);
    let took = within(Duration::from_secs(1), || drained(&d2, "b2") == Some(true));
    assert!(took.is_some(), "d2 did not apply d1's drain within 1 s");
    assert_eq!(admin("POST", &d2, "/backends/b2/undrain").0, 200);
    assert!(within(Duration::from_secs(1), || drained(&d1, "b2") == Some(false)).is_some());

    // d2 killed under hybrid streams through both dispatchers.
    let f = failover(gbit, &bin).expect("failover run");
    assert_eq!(f.conns.len(), 8, "every connection reported");
    for (c, h, r) in &f.conns {
        if h.name == "d1" {
            assert!(r.error.is_none(), "{}:{} through d1 must see no error: {r:?}", c.name, r.port);
            assert!(r.responses > 0);
        } else if let Some(ms) = r.error_after_ms {
            let after_kill = ms as i64 - f.killed_at_ms as i64;
            assert!(after_kill < 3000, "{}:{} through d2 ended {after_kill} ms after the kill: a hang", c.name, r.port);
        }
    }
    for (i, ms) in f.new_connection_ms.iter().enumerate() {
        assert!(ms.is_some_and(|ms| ms <= 3000), "client {i}: a new connection after the kill: {ms:?}");
    }
    for (h, n) in &f.left {
        if let Some(n) = n {
            assert_eq!(*n, 0, "flow entries left on {}", h.name);
        }
    }

    // etcd stopped: both keep serving, say so, and refuse admin changes; back: they converge.
    multi::stop_etcd();
    assert!(
        within(Duration::from_secs(10), || admin("GET", &d1, "/health").1.contains("etcd: unreachable")).is_some(),
        "d1's /health: {}",
        admin("GET", &d1, "/health").1
    );
    for hops in [&DISPATCHERS[..1], &DISPATCHERS[1..]] {
        multi::route(hops).expect("route");
        assert!(serves(), "{} serves without etcd", hops[0].name);
    }
    multi::route(&DISPATCHERS).expect("route");
    let (code, body) = admin("POST", &d2, "/backends/b1/drain");
    assert_eq!(code, 503, "an admin change without etcd: {body}");
    let metrics = admin("GET", &d2, "/metrics").1;
    assert!(metrics.lines().any(|l| l == "refract_cluster_etcd_up 0"), "{metrics}");
    multi::start_etcd(false).expect("etcd back");
    assert!(within(Duration::from_secs(15), || admin("GET", &d2, "/health").1.contains("etcd: up")).is_some());
    assert_eq!(admin("POST", &d2, "/backends/b1/drain").0, 200);
    assert!(within(Duration::from_secs(1), || drained(&d1, "b1") == Some(true)).is_some(), "converged");
    assert_eq!(admin("POST", &d1, "/backends/b1/undrain").0, 200);
}

#[test]
fn pg_cancels_through_either_dispatcher_take_effect_within_a_second() {
    let _lab = common::lab_lock();
    if let Some(why) = skip_reason() {
        skip(&why);
        return;
    }
    for tool in ["initdb", "pg_ctl", "pg_basebackup"] {
        if !refract_testkit::tool(tool).is_ok_and(|p| p.exists()) {
            skip(&format!("PostgreSQL's {tool} is not installed"));
            return;
        }
    }
    if refract_lab::bench::cluster::cancels::python().is_none() {
        skip("no python3 with psycopg2 (apt-get install python3-psycopg2)");
        return;
    }
    let bin = refract_bin().expect("refract binary");
    let _down = Down;
    let gbit = Rate::parse("1gbit").expect("rate");
    lab::up_with(gbit, Some(Db::Postgres), &congestion::requested(None), &bin).expect("lab up --db postgres");
    lab::up_dispatchers(2, Db::Postgres, gbit, &bin).expect("lab up --dispatchers 2");
    // 100 clients, as the acceptance asks: each one's CancelRequest lands on either dispatcher.
    let results = refract_lab::bench::cluster::cancels::run(6432, 50).expect("cancels");
    assert_eq!(results.len(), 100);
    let late: Vec<_> =
        results.iter().filter(|r| r.code.as_deref() != Some("57014") || r.seconds.is_none_or(|s| s > 1.0)).collect();
    // What the dispatchers did with the cancels, to tell a lost forward from a late delivery.
    let counted = |d: usize| {
        let metrics = admin("GET", &format!("{}:6532", DISPATCHERS[d].addr), "/metrics").1;
        let lines = metrics.lines().filter(|l| l.starts_with("refract_cluster_cancels_total"));
        format!("{}: {}", DISPATCHERS[d].name, lines.collect::<Vec<_>>().join(", "))
    };
    assert!(
        late.is_empty(),
        "every statement cancelled within 1 s: {} not: {late:?}; {}; {}",
        late.len(),
        counted(0),
        counted(1)
    );
}
