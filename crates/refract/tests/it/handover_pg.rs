//! The PostgreSQL result hand-over across hosts (TCP_REPAIR over the control channel), in a
//! throw-away network namespace (root only): a real PostgreSQL server (refract-testkit),
//! the agent in front of it and the dispatcher are the real binary on one kernel, the agent's
//! guard on `lo` drops the client's segments during the two gaps. A large result is handed
//! over at the agent's `WANT`, restored there, written to the client and handed back; psql
//! reads exactly what PostgreSQL gives it directly, and the session goes on.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::{dispatcher_with, free_port, metric, wait_metric};
use refract_testkit::{self as testkit, postgres_section, PgCluster, PASSWORD, USER};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const VIP: &str = "198.18.5.101";
const KEY: &str = "pg hand-over test key, 16+ bytes";

/// psql's unaligned output of `sqls` at `host:port`, one `-c` (one Query message) each.
fn psql(host: &str, port: u16, sqls: &[&str]) -> String {
    let out = Command::new(testkit::tool("psql").unwrap())
        .args(["-XAt", "-v", "ON_ERROR_STOP=1", "-h", host, "-p", &port.to_string(), "-U", USER, "-d", "postgres"])
        .args(sqls.iter().flat_map(|sql| ["-c", sql]))
        .env("PGPASSWORD", PASSWORD)
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "psql: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn scenario() {
    let cluster = PgCluster::start().expect("PostgreSQL test cluster");
    let server = cluster.primary.addr();
    let dir = tempfile::tempdir().unwrap();
    let control: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let through: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let text = format!(
        "backend = \"{server}\"\npostgres_listen = \"{through}\"\ncontrol = \"{control}\"\nvip = \"{VIP}\"\n\
         interface = \"lo\"\nkey = \"{KEY}\"\nmap_capacity = 64\n"
    );
    let _agent = common::start_agent(dir.path(), &text, control);
    common::wait_listening(control);
    common::wait_listening(through);

    let key_file = dir.path().join("control.key");
    std::fs::write(&key_file, format!("{KEY}\n")).unwrap();
    let http: SocketAddr = format!("{VIP}:8080").parse().unwrap();
    let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let postgres = postgres_section(&format!("{VIP}:6432"), "");
    let text = format!(
        r#"
[listen]
http = "{http}"
admin = "{admin}"

[admin]
insecure_loopback = true

{postgres}
[[postgres.server]]
name = "primary"
addr = "{server}"
through = "{through}"
role = "primary"

[handover]
mode = "hybrid"
postgres_threshold = 65536
key_file = "{}"
agents = {{ primary = "{control}" }}
"#,
        key_file.display()
    );
    let d = dispatcher_with(&text, http, admin);
    common::wait_listening(format!("{VIP}:6432").parse().unwrap());

    let large = "select n, md5(n::text) from generate_series(1, 20000) n";
    let direct = psql(&server.ip().to_string(), server.port(), &[large]);
    assert_eq!(psql(VIP, 6432, &[large]), direct, "the handed-over result reads as PostgreSQL's");
    assert_eq!(metric(d.admin, r#"refract_handover_total{backend="primary",front="postgres",result="ok"}"#), 1);
    // psql quits right after its result: its Terminate and FIN may reach the agent before the
    // hand-back (a socket in CLOSE_WAIT cannot be moved), so that connection ends either way.
    let handback = r#"refract_handback_total{backend="primary",front="postgres"}"#;
    let closed = r#"refract_handover_ended_total{backend="primary",front="postgres",end="closed"}"#;
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(d.admin, handback) + metric(d.admin, closed) < 1 {
        assert!(Instant::now() < deadline, "the handed-over connection neither came back nor ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = metric(d.admin, handback);
    // One session, one statement per Query: a small one, the large one, a small one again. The
    // last is sent only after the large result ended, so it is served after the hand-back.
    let session = ["select 1", large, "select 2"];
    let want = psql(&server.ip().to_string(), server.port(), &session);
    assert_eq!(psql(VIP, 6432, &session), want);
    wait_metric(d.admin, handback, before + 1);
    assert_eq!(metric(d.admin, r#"refract_handover_total{backend="primary",front="postgres",result="ok"}"#), 2);
}

#[test]
fn pg_large_result_handed_over_across_hosts() {
    common::in_netns("pg_large_result_handed_over_across_hosts", VIP, scenario);
}
