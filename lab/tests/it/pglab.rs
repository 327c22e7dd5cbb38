//! The PostgreSQL lab cluster end to end (root only): `lab up --cluster --db postgres` brings up
//! a primary on rf-b1, its streaming replica on rf-b2, refract hybrid (VIP:6432) and relay-only
//! (VIP:6433) and PgBouncer (198.18.0.2:6434), an agent in front of each server; from the
//! client hosts psql, pgbench and psycopg2 reach them; a row written through refract is read
//! back through refract from the replica; a 4 MiB result through hybrid is handed over (by both
//! agents) and reads as through the relay and directly; `lab status` lists every piece; `lab
//! down` leaves no namespace, no PostgreSQL process and no data of the lab.
//!
//! It needs PostgreSQL's server and client programs, PgBouncer and a built refract binary
//! (`$REFRACT_BIN`, else `refract` in this test's target directory, which `cargo test
//! --workspace` builds); without them, or not as root, it says why and passes.

use crate::common;

use common::{lab_in_use, refract_bin, skip, Down};
use refract_lab::fabric::{self, congestion};
use refract_lab::lab::{self, Db};
use refract_lab::pglab::{self, layout, pgbouncer};
use refract_lab::support::sh::{self, cmd};
use refract_lab::support::units::Rate;
use std::time::{Duration, Instant};

/// Why the test cannot run here, if it cannot.
fn skip_reason() -> Option<String> {
    if !sh::is_root() {
        return Some("not root (network namespaces need CAP_NET_ADMIN)".into());
    }
    for tool in ["ip", "tc", "runuser", pgbouncer::BINARY] {
        if !sh::have(tool) {
            return Some(format!("{tool} is not installed"));
        }
    }
    for tool in ["initdb", "pg_ctl", "pg_basebackup", "psql", "pgbench"] {
        if !refract_testkit::tool(tool).is_ok_and(|p| p.exists()) {
            return Some(format!("PostgreSQL's {tool} is not installed"));
        }
    }
    if refract_bin().is_none() {
        return Some("no refract binary: build it (cargo build -p refract) or set REFRACT_BIN".into());
    }
    lab_in_use()
}

fn psql(ns: &str, addr: &str, sql: &str) -> String {
    pglab::psql(ns, addr, sql).unwrap_or_else(|e| panic!("psql from {ns} to {addr}: {e:#}"))
}

/// The congestion control the lab must have put in its namespaces (as fabric/congestion.rs
/// decides: the one asked for if the kernel has it, else the host's default).
fn expected_cc() -> String {
    let wanted = congestion::requested(None);
    let available = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control").unwrap_or_default();
    if available.split_whitespace().any(|a| a == wanted) {
        return wanted;
    }
    let host = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").expect("host default");
    host.trim().to_string()
}

/// Polls through refract's relay until a read served by the replica returns `token`; a read
/// before the replica replayed the table fails (no such table), and counts as "not yet".
fn read_back_on_replica(token: &str) -> usize {
    let (relay, deadline) = (layout::vip(6433), Instant::now() + Duration::from_secs(30));
    let sql = "SELECT pg_is_in_recovery(), (SELECT v FROM rf_lab_check WHERE id = 1)";
    for attempt in 1.. {
        let got = pglab::psql("rf-c1", &relay, sql);
        if got.as_ref().is_ok_and(|o| *o == format!("t|{token}")) {
            return attempt;
        }
        assert!(Instant::now() < deadline, "no read through {relay} reached the replica with the row in 30 s: {got:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    unreachable!("the loop returns or fails")
}

/// A Python with psycopg2 (Debian's python3-psycopg2 is in /usr/bin/python3), if any.
fn python_with_psycopg2() -> Option<&'static str> {
    ["python3", "/usr/bin/python3"].into_iter().find(|p| sh::ok(cmd(None, p, &["-c", "import psycopg2"])))
}

fn clients_connect() {
    let script = tempfile::NamedTempFile::new().expect("script");
    std::fs::write(script.path(), "SELECT 1;\n").expect("write script");
    let pgbench = refract_testkit::tool("pgbench").expect("pgbench").to_string_lossy().into_owned();
    let file = script.path().to_string_lossy().into_owned();
    let args =
        ["-n", "-h", "198.18.0.100", "-p", "6432", "-U", "refract", "-f", &file, "-t", "20", "-c", "2", "postgres"];
    let mut c = cmd(Some("rf-c2"), &pgbench, &args);
    c.env("PGPASSWORD", "refract");
    let out = sh::run(c).expect("pgbench from rf-c2 through refract hybrid");
    assert!(out.contains("number of failed transactions: 0"), "{out}");
    let Some(python) = python_with_psycopg2() else {
        skip("the psycopg2 check: no python3 with psycopg2 (apt-get install python3-psycopg2)");
        return;
    };
    for (host, port) in [("198.18.0.100", 6433), ("198.18.0.2", 6434)] {
        let code = format!(
            "import psycopg2\nc = psycopg2.connect(host='{host}', port={port}, user='refract', password='refract', \
             dbname='postgres')\ncur = c.cursor()\ncur.execute('SELECT 6 * 7')\nprint(cur.fetchone()[0])"
        );
        let out = sh::run(cmd(Some("rf-c2"), python, &["-c", &code])).expect("psycopg2 from rf-c2");
        assert_eq!(out.trim(), "42", "psycopg2 through {host}:{port}");
    }
}

/// The md5 of psql's unaligned output of `sql` at `addr`, run in rf-c1.
fn psql_md5(addr: &str, sql: &str) -> String {
    let psql = refract_testkit::tool("psql").expect("psql").to_string_lossy().into_owned();
    let (host, port) = addr.rsplit_once(':').expect("IP:PORT");
    let script = format!(
        "set -o pipefail; PGPASSWORD=refract {psql} -XAt -v ON_ERROR_STOP=1 -h {host} -p {port} -U refract \
         -d postgres -c \"{sql}\" | md5sum"
    );
    let out = sh::run(cmd(Some("rf-c1"), "bash", &["-c", &script])).unwrap_or_else(|e| panic!("{addr}: {e:#}"));
    out.split_whitespace().next().expect("md5sum output").to_string()
}

/// The hybrid dispatcher's hand-over series (its admin `/metrics`).
fn handover_metrics() -> String {
    let body = sh::run(cmd(Some("rf-d"), "curl", &["-sf", "http://198.18.0.2:6532/metrics"])).expect("/metrics");
    body.lines().filter(|l| l.starts_with("refract_hand")).collect::<Vec<_>>().join("\n")
}

/// `refract_handover_total{backend="NAME",front="postgres",result="ok"}` on the hybrid dispatcher's admin.
fn handovers_ok(name: &str) -> u64 {
    let body = handover_metrics();
    let series = format!("refract_handover_total{{backend=\"{name}\",front=\"postgres\",result=\"ok\"}} ");
    body.lines().find_map(|l| l.strip_prefix(&series)).map_or(0, |v| v.trim().parse::<f64>().unwrap_or(0.0) as u64)
}

/// A 4 MiB result (4 rows of 1 MiB) from rf-c1: through hybrid it is handed over, by both
/// agents within a few runs (reads are balanced over the servers), and every copy reads as
/// through the relay and straight from the primary.
fn large_result_handed_over() {
    let sql = "select repeat('x', 1048576) || n from generate_series(1, 4) n";
    let direct = psql_md5(&layout::SERVERS[0].listen_addr(), sql);
    assert_eq!(psql_md5(&layout::vip(6433), sql), direct, "through the relay");
    let before = [handovers_ok("b1"), handovers_ok("b2")];
    let mut after = before;
    for run in 0..12 {
        assert_eq!(psql_md5(&layout::vip(6432), sql), direct, "through hybrid, run {run}");
        after = [handovers_ok("b1"), handovers_ok("b2")];
        if run >= 1 && after[0] > before[0] && after[1] > before[1] {
            eprintln!("hand-overs by b1, b2: {before:?} → {after:?} in {} runs", run + 1);
            return;
        }
    }
    panic!("hand-overs by b1, b2: {before:?} → {after:?} in 12 runs:\n{}", handover_metrics());
}

#[test]
fn postgres_lab_up_query_replicate_status_down() {
    let _lab = crate::common::lab_lock();
    if let Some(why) = skip_reason() {
        skip(&why);
        return;
    }
    let bin = refract_bin().expect("refract binary");
    let started = Instant::now();
    let down = Down;
    let gbit = Rate::parse("1gbit").expect("rate");
    lab::up_with(gbit, Some(Db::Postgres), &congestion::requested(None), &bin).expect("lab up --db postgres");
    eprintln!("up in {:?}", started.elapsed());
    let cc = expected_cc();
    for ns in ["rf-c1", "rf-c2", "rf-d", "rf-b1", "rf-b2"] {
        assert_eq!(congestion::in_namespace(ns), Some(cc.clone()), "congestion control in {ns}");
    }

    for addr in [layout::vip(6432), layout::vip(6433), layout::pgbouncer_addr()] {
        assert_eq!(psql("rf-c1", &addr, "SELECT current_database() || '/' || current_user"), "postgres/refract");
    }
    let token = format!("t{}-{}", std::process::id(), started.elapsed().as_nanos());
    let write = format!(
        "CREATE TABLE rf_lab_check (id int PRIMARY KEY, v text); INSERT INTO rf_lab_check VALUES (1, '{token}')"
    );
    psql("rf-c1", &layout::vip(6432), &write);
    let primary = layout::SERVERS[0].listen_addr();
    assert_eq!(psql("rf-c1", &primary, "SELECT v FROM rf_lab_check"), token, "the write went to the primary");
    let attempts = read_back_on_replica(&token);
    eprintln!("read back on the replica after {attempts} read(s)");
    clients_connect();
    large_result_handed_over();

    let status = lab::status_text().expect("lab status");
    assert!(status.contains("postgres cluster (`lab up --cluster --db postgres`): ready"), "{status}");
    for (name, port) in [
        ("pg-b1", "198.18.0.21:5432"),
        ("pg-b2", "198.18.0.22:5432"),
        ("pg-agent-b1", "198.18.0.21:6543"),
        ("pg-agent-b2", "198.18.0.22:6543"),
        ("refract-pg-hybrid", "198.18.0.100:6432"),
        ("refract-pg-relay", "198.18.0.100:6433"),
        ("pgbouncer", "198.18.0.2:6434"),
    ] {
        let line = status
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name}: {status}"));
        let pid: u32 = line.split_whitespace().nth(3).and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{line}"));
        assert!(line.contains(" running ") && line.contains(port) && sh::alive(pid), "{line}");
    }
    assert!(!pglab::lab_pids().is_empty(), "the lab's PostgreSQL processes are found");

    drop(down);
    assert_eq!(fabric::lab_namespaces().expect("list"), Vec::<String>::new(), "no rf-* namespace left");
    assert_eq!(pglab::lab_pids(), Vec::<u32>::new(), "no process of the PostgreSQL lab left");
    assert!(!layout::pg_dir().exists(), "the data is deleted");
    eprintln!("whole test {:?}", started.elapsed());
}
