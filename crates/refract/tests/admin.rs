//! The admin listener: runtime membership and metrics.
#![allow(clippy::unwrap_used)]

mod common;
use common::*;

#[test]
fn backends_can_be_added_and_removed_at_runtime() {
    let (b1, b2, b3) = (blob("b1"), blob("b2"), blob("b3"));
    let d = dispatcher(&[("b1", b1.addr, "primary"), ("b2", b2.addr, "replica")], "");
    let def = format!(r#"{{"name":"b3","addr":"{}","role":"replica"}}"#, b3.addr);
    let r = request(d.admin, "POST", "/backends", &[("content-type", "application/json")], def.as_bytes());
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(request(d.admin, "POST", "/backends", &[], def.as_bytes()).status, 409);
    assert_eq!(request(d.admin, "POST", "/backends", &[], b"{nope").status, 400);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..10 {
        seen.insert(get(d.proc.addr, "/blob?bytes=1").header("x-served-by").unwrap());
    }
    assert!(seen.contains("b3"), "{seen:?}");
    assert_eq!(request(d.admin, "DELETE", "/backends/b2", &[], b"").status, 200);
    assert_eq!(request(d.admin, "DELETE", "/backends/b2", &[], b"").status, 404);
    for _ in 0..6 {
        assert_eq!(get(d.proc.addr, "/blob?bytes=1").header("x-served-by").as_deref(), Some("b3"));
    }
    let list = get(d.admin, "/backends").json();
    let names: Vec<_> = list.as_array().unwrap().iter().map(|b| b["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["b1", "b3"]);
    assert!(list[1]["served"].as_u64().unwrap() >= 6);
}

#[test]
fn metrics_count_requests_bytes_and_errors() {
    let (b1, b2) = (blob("b1"), blob("b2"));
    let d = dispatcher(&[("b1", b1.addr, "primary"), ("b2", b2.addr, "replica")], "");
    for _ in 0..3 {
        get(d.proc.addr, "/blob?bytes=1000");
    }
    request(d.proc.addr, "POST", "/blob", &[], b"abc");
    let _ = get(d.proc.addr, "/blob?bytes=1\x01");
    let text = String::from_utf8(get(d.admin, "/metrics").body).unwrap();
    assert!(text.contains(r#"refract_requests_total{class="read",backend="b2"} 3"#), "{text}");
    assert!(text.contains(r#"refract_requests_total{class="write",backend="b1"} 1"#), "{text}");
    assert!(text.contains(r#"refract_errors_total{kind="bad_request"} 1"#), "{text}");
    assert!(text.contains(r#"refract_backend_up{backend="b2"} 1"#), "{text}");
    assert!(text.contains("refract_request_duration_seconds_bucket"), "{text}");
    let to_client = text.lines().find(|l| l.starts_with(r#"refract_bytes_total{direction="to_client"}"#)).unwrap();
    let n: u64 = to_client.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= 3000, "{to_client}");
    assert_eq!(get(d.admin, "/health").status, 200);
    assert_eq!(get(d.admin, "/nope").status, 404);
}
