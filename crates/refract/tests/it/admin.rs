//! The admin listener: runtime membership, drain, metrics, and who may use it.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::*;

#[test]
fn backends_can_be_added_and_removed_at_runtime() {
    let ([_b1, _b2], d) = cluster().backends(2).dispatcher("").with(Binary::default()).run().split();
    let b3 = blob("b3");
    let def = format!(r#"{{"name":"b3","addr":"{}","role":"replica"}}"#, b3.addr);
    let r = admin(d.admin, "POST", "/backends", def.as_bytes());
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(admin(d.admin, "POST", "/backends", def.as_bytes()).status, 409);
    assert_eq!(admin(d.admin, "POST", "/backends", b"{nope").status, 400);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..10 {
        seen.insert(get(d.proc.addr, "/blob?bytes=1").header("x-served-by").unwrap());
    }
    assert!(seen.contains("b3"), "{seen:?}");
    assert_eq!(admin(d.admin, "DELETE", "/backends/b2", b"").status, 200);
    assert_eq!(admin(d.admin, "DELETE", "/backends/b2", b"").status, 404);
    for _ in 0..6 {
        assert_eq!(get(d.proc.addr, "/blob?bytes=1").header("x-served-by").as_deref(), Some("b3"));
    }
    let list = admin_get(d.admin, "/backends").json();
    let names: Vec<_> = list.as_array().unwrap().iter().map(|b| b["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["b1", "b3"]);
    assert!(list[1]["served"].as_u64().unwrap() >= 6);
}

/// docs/config.md: a second primary, a taken name or a taken address is a conflict with the
/// current membership (409); a malformed definition is 400.
#[test]
fn status_codes_are_the_documented_ones() {
    let ([_b1, b2], d) = cluster().backends(2).dispatcher("").with(Binary::default()).run().split();
    let post = |def: String| admin(d.admin, "POST", "/backends", def.as_bytes());
    let second = post(r#"{"name":"p2","addr":"127.0.0.1:9","role":"primary"}"#.into());
    assert_eq!(second.status, 409, "{second:?}");
    assert!(String::from_utf8_lossy(&second.body).contains("already a primary"), "{second:?}");
    assert_eq!(post(format!(r#"{{"name":"b9","addr":"{}","role":"replica"}}"#, b2.addr)).status, 409);
    assert_eq!(post(r#"{"name":"bad name","addr":"127.0.0.1:9","role":"replica"}"#.into()).status, 400);
    assert_eq!(post(r#"{"name":"b9","addr":"127.0.0.1:9","role":"boss"}"#.into()).status, 400);
    assert_eq!(admin(d.admin, "POST", "/backends/nope/drain", b"").status, 404);
}

#[test]
fn the_admin_api_needs_the_token_json_writes_and_no_foreign_origin() {
    let ([_b1, _b2], d) = cluster().backends(2).dispatcher("").with(Binary::default()).run().split();
    let none = get(d.admin, "/backends");
    assert_eq!(none.status, 401, "{none:?}");
    assert_eq!(none.header("www-authenticate").as_deref(), Some("Bearer realm=\"refract-admin\""));
    let wrong = request(d.admin, "GET", "/backends", &[("authorization", "Bearer test-token-0123456788")], b"");
    assert_eq!(wrong.status, 401);
    assert_eq!(request(d.admin, "GET", "/pg/pools", &[], b"").status, 401, "the PostgreSQL views too");
    let auth = format!("Bearer {TOKEN}");
    let def = br#"{"name":"b1","addr":"127.0.0.1:9","role":"primary"}"#;
    let delete = request(d.admin, "DELETE", "/backends/b1", &[], b"");
    assert_eq!(delete.status, 401, "no token, no removal");
    let plain = request(d.admin, "POST", "/backends", &[("authorization", &auth), ("content-type", "text/plain")], def);
    assert_eq!(plain.status, 415, "{plain:?}");
    let form = [("authorization", auth.as_str()), ("content-type", "application/x-www-form-urlencoded")];
    assert_eq!(request(d.admin, "POST", "/backends/b2/drain", &form, b"").status, 415);
    let foreign =
        [("authorization", auth.as_str()), ("content-type", "application/json"), ("origin", "http://evil.example")];
    assert_eq!(request(d.admin, "DELETE", "/backends/b1", &foreign, b"").status, 403);
    assert_eq!(request(d.admin, "GET", "/backends", &foreign, b"").status, 403);
    // Nothing above changed the membership.
    let list = admin_get(d.admin, "/backends").json();
    assert_eq!(list.as_array().unwrap().len(), 2, "{list}");
    assert_eq!(list[1]["drained"], false);
    // Scrapers and health checkers need no token.
    assert_eq!(get(d.admin, "/metrics").status, 200);
    assert_eq!(get(d.admin, "/health").status, 200);
}

#[test]
fn a_drained_backend_takes_no_new_requests_until_undrained() {
    let build = cluster().backends(2).backend("b3", &["--delay-ms", "800"]);
    let ([_b1, _b2, _b3], d) =
        build.dispatcher("[balance]\npolicy = \"round-robin\"\n").with(Binary::default()).run().split();
    // Two reads at once: round robin puts one on b3 (800 ms), in flight when b3 is drained.
    let mut slow: Vec<Client> = (0..2).map(|_| Client::connect(d.proc.addr)).collect();
    for c in &mut slow {
        c.send(&raw_request("GET", "/blob?bytes=100&seed=3", &[], b""));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while admin_get(d.admin, "/backends").json()[2]["in_flight"] != 1 {
        assert!(std::time::Instant::now() < deadline, "no read in flight on b3");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let r = admin(d.admin, "POST", "/backends/b3/drain", b"");
    assert_eq!(r.status, 200, "{r:?}");
    for _ in 0..8 {
        assert_eq!(get(d.proc.addr, "/blob?bytes=1").header("x-served-by").as_deref(), Some("b2"));
    }
    let list = admin_get(d.admin, "/backends").json();
    assert_eq!((list[1]["drained"].as_bool(), list[2]["drained"].as_bool()), (Some(false), Some(true)));
    assert_eq!(metric(d.admin, r#"refract_backend_drained{backend="b3"}"#), 1);
    let served: Vec<_> = slow.iter_mut().map(|c| c.read_response(false).unwrap()).collect();
    assert!(served.iter().all(|r| r.status == 200 && r.body.len() == 100), "{served:?}");
    assert!(
        served.iter().any(|r| r.header("x-served-by").as_deref() == Some("b3")),
        "the read in flight on b3 finished"
    );
    assert_eq!(admin(d.admin, "POST", "/backends/b3/undrain", b"").status, 200);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..6 {
        seen.insert(get(d.proc.addr, "/blob?bytes=1").header("x-served-by").unwrap());
    }
    assert!(seen.contains("b3") && seen.contains("b2"), "{seen:?}");
    assert_eq!(metric(d.admin, r#"refract_backend_drained{backend="b3"}"#), 0);
}

#[test]
fn metrics_count_requests_bytes_and_errors() {
    let ([_b1, _b2], d) = cluster().backends(2).dispatcher("").with(Binary::default()).run().split();
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
    assert_eq!(admin_get(d.admin, "/nope").status, 404);
}

/// One request over the Unix admin socket (the connection closes after it); status and body.
fn over_socket(path: &std::path::Path, method: &str, target: &str, extra: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
    let req = format!(
        "{method} {target} HTTP/1.1\r\nhost: localhost\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split(' ').nth(1).unwrap().parse().unwrap();
    (status, out.split_once("\r\n\r\n").unwrap().1.to_string())
}

#[test]
fn the_unix_admin_socket_needs_no_token_and_only_its_owner_may_open_it() {
    use std::os::unix::fs::PermissionsExt;
    let kit = Binary { listen: "admin_socket = \"admin.sock\"", ..Binary::default() };
    let ([_b1, _b2], mut d) = cluster().backends(2).dispatcher("").with(kit).run().split();
    let text = std::fs::read_to_string(d.config_path()).unwrap();
    let sock = d.config_path().with_file_name("admin.sock");
    assert_eq!(std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777, 0o600);
    let (status, body) = over_socket(&sock, "GET", "/backends", "", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"b2\""), "{body}");
    let json = "content-type: application/json\r\n";
    assert_eq!(over_socket(&sock, "POST", "/backends/b2/drain", json, "{}").0, 200);
    assert_eq!(admin_get(d.admin, "/backends").json()[1]["drained"], true, "the same dispatcher");
    assert_eq!(over_socket(&sock, "POST", "/backends/b2/undrain", "content-type: text/plain\r\n", "x").0, 415);
    // `refract reload` goes through the socket: it needs no token, so a new one in the file
    // is taken even though the running dispatcher does not know it yet.
    let renewed = "another-token-0123456789";
    std::fs::write(d.config_path(), text.replace(TOKEN, renewed)).unwrap();
    let out = std::process::Command::new(bin())
        .args(["reload", "--config", d.config_path().to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(admin_get(d.admin, "/backends").status, 401, "the old token is gone");
    let bearer = format!("Bearer {renewed}");
    assert_eq!(request(d.admin, "GET", "/backends", &[("authorization", &bearer)], b"").status, 200);
    // Another user cannot open it (as root, the test can be someone else: nobody); and if the
    // file's mode is widened behind the dispatcher's back, it still refuses that user.
    if is_root() {
        std::fs::set_permissions(sock.parent().unwrap(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(as_nobody(&sock), "refused");
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(as_nobody(&sock), "closed");
        assert_eq!(over_socket(&sock, "GET", "/health", "", "").0, 200, "its owner still may");
    }
    d.proc.signal("TERM");
    d.wait_exit();
    assert!(!sock.exists(), "the socket file goes with the dispatcher");
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
}

/// Connects to `sock` as user nobody and asks for /backends: "refused" (no permission to
/// connect), "closed" (connected, no answer) or "answered".
fn as_nobody(sock: &std::path::Path) -> String {
    use std::os::unix::process::CommandExt;
    const SCRIPT: &str = "import socket,sys\n\
        s=socket.socket(socket.AF_UNIX)\n\
        try: s.connect(sys.argv[1])\n\
        except PermissionError: print('refused'); sys.exit()\n\
        try: s.sendall(b'GET /backends HTTP/1.1\\r\\nhost: localhost\\r\\n\\r\\n'); got=s.recv(100)\n\
        except OSError: got=b''\n\
        print('answered' if got else 'closed')\n";
    let out =
        std::process::Command::new("python3").args(["-c", SCRIPT, sock.to_str().unwrap()]).uid(65534).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn a_reload_cannot_take_the_token_from_the_running_admin_listener() {
    let ([_b1, _b2], d) = cluster().backends(2).dispatcher("").with(Binary::default()).run().split();
    // Without the admin line and the token the file is valid, but the listener keeps running.
    let text = std::fs::read_to_string(d.config_path()).unwrap();
    let open = text.replace(&format!("admin = \"{}\"\n", d.admin), "").replace(&format!("token = \"{TOKEN}\"\n"), "");
    assert_ne!(open, text);
    std::fs::write(d.config_path(), open).unwrap();
    let auth = format!("Bearer {TOKEN}");
    let json = [("authorization", auth.as_str()), ("content-type", "application/json")];
    let r = request(d.admin, "POST", "/reload", &json, b"{}");
    assert_eq!(r.status, 400, "{r:?}");
    assert!(String::from_utf8_lossy(&r.body).contains("needs [admin] token"), "{r:?}");
    assert_eq!(get(d.admin, "/backends").status, 401, "still guarded");
}

/// `/backends` lists every member by its plain name with its front end (`"http"`, then
/// `"postgres"`), and `/metrics` labels a PostgreSQL server by its plain name too: with
/// `front="postgres"` in the families HTTP backends have as well (a name both front ends have,
/// which the configuration files allow, stays two series), alone in the front end's own
/// `refract_pg_*`. The servers need not answer for that.
#[test]
fn postgres_servers_are_listed_and_labelled_by_their_plain_name_and_front() {
    let b1 = blob("b1");
    let port = |p: u16| format!("127.0.0.1:{p}");
    let servers = format!(
        "[[postgres.server]]\nname = \"db\"\naddr = \"{}\"\nrole = \"primary\"\n\
         [[postgres.server]]\nname = \"b1\"\naddr = \"{}\"\nrole = \"replica\"\n",
        port(free_port()),
        port(free_port()),
    );
    let extra = refract_testkit::postgres_section(&port(free_port()), "") + &servers;
    let d = dispatcher(&[("b1", b1.addr, "primary")], &extra);

    let list = admin_get(d.admin, "/backends").json();
    let members: Vec<_> =
        list.as_array().unwrap().iter().map(|m| (m["name"].as_str().unwrap(), m["front"].as_str().unwrap())).collect();
    assert_eq!(members, [("b1", "http"), ("db", "postgres"), ("b1", "postgres")], "{list}");
    assert_eq!(list[1]["role"], "primary", "{list}");
    assert!(list[1]["lag_bytes"].is_u64(), "{list}");

    let text = String::from_utf8(get(d.admin, "/metrics").body).unwrap();
    for series in [
        r#"refract_backend_up{backend="b1"} 1"#,
        r#"refract_backend_up{backend="db",front="postgres"} "#,
        r#"refract_backend_up{backend="b1",front="postgres"} "#,
        r#"refract_backend_concurrency_limit{backend="db",front="postgres"} "#,
        r#"refract_requests_total{class="read",backend="db",front="postgres"} 0"#,
        r#"refract_pg_pool_idle{backend="db"} "#,
        r#"refract_pg_replica_lag_bytes{backend="b1"} "#,
    ] {
        assert!(text.lines().any(|l| l.starts_with(series)), "{series} missing from\n{text}");
    }
    assert!(!text.contains("pg:"), "no prefixed name:\n{text}");
}
