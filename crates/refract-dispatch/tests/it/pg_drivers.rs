//! Real PostgreSQL drivers through refract (issue 20): each driver's suite under
//! `tests/drivers/` runs against refract in transaction mode in front of a real primary and
//! replica, with `pool_size = 4` per server so that the suites' 20 concurrent client
//! connections really share server connections. A suite prints `ok NAME` or
//! `FAIL NAME: reason` per check and `done`; its test passes when every expected check is `ok`.
//!
//! - psycopg 3, psycopg2, asyncpg, SQLAlchemy: in the venv `tests/drivers/setup-python.sh`
//!   makes (`target/pyenv`, or `$REFRACT_PYENV`). A missing venv fails these tests, naming the
//!   command, unless `REFRACT_DRIVERS_OPTIONAL=1`.
//! - pgx v5 (Go), node-postgres, pgjdbc: built by `tests/drivers/setup-all.sh`
//!   (`make test-drivers`); skipped with a printed reason when not built, unless
//!   `REFRACT_DRIVERS=all`, which makes them required.
//!
//! `REFRACT_DRIVERS_TARGET=direct` runs the suites against the primary itself instead, to show
//! that what they assert is PostgreSQL's own behaviour.
#![allow(clippy::unwrap_used)]

use crate::pg_common;
use pg_common::drivers::{self, drain, drivers_dir, flag, python, target_dir, Ran};

use pg_common::Fixture;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Small pools: 20 clients share 4 connections per server.
const POSTGRES: &str = "pool_size = 4\n";

/// Longest a suite may run before it is killed and its test fails.
const SUITE_TIMEOUT: Duration = Duration::from_secs(240);

/// Checks of the suites of drivers that offer every feature (psycopg 3, asyncpg, pgx, node-postgres,
/// pgjdbc).
const FULL: &[&str] = &[
    "connect",
    "prepared_concurrent",
    "unnamed_statement_concurrent",
    "sql_prepare_concurrent",
    "set_simple_concurrent",
    "set_extended_concurrent",
    "startup_options_concurrent",
    "set_config",
    "temp_table",
    "advisory_lock",
    "listen_notify",
    "copy_in",
    "copy_out",
    "cancel",
    "result_200mb",
    "errors",
];

static FIXTURE: Mutex<Weak<Fixture>> = Mutex::new(Weak::new());
/// One suite at a time: the machine is small, and each suite's concurrency is its own.
static SERIAL: Mutex<()> = Mutex::new(());

/// The fixture shared by the tests running at the same time (a waiting test holds it too, so
/// consecutive suites reuse one cluster).
fn fixture() -> Arc<Fixture> {
    pg_common::shared_in(&FIXTURE, POSTGRES)
}

static HYBRID: Mutex<Weak<Fixture>> = Mutex::new(Weak::new());

/// refract in hybrid mode, an agent in front of each server: large results are handed over.
fn hybrid_fixture() -> Arc<Fixture> {
    pg_common::shared_with(&HYBRID, || Fixture::start_hybrid(POSTGRES))
}

/// What a suite needs before it can run.
enum Needs {
    /// The Python venv (required unless `REFRACT_DRIVERS_OPTIONAL=1`).
    Python,
    /// A build output of `setup-all.sh` (required with `REFRACT_DRIVERS=all`).
    Built(PathBuf),
}

/// Whether the suite can run; panics (fails the test) when it is required and cannot.
fn ready(driver: &str, needs: &Needs) -> bool {
    let (path, required, how) = match needs {
        Needs::Python => (python(), !flag("REFRACT_DRIVERS_OPTIONAL", "1"), "tests/drivers/setup-python.sh"),
        Needs::Built(path) => {
            (path.clone(), flag("REFRACT_DRIVERS", "all"), "tests/drivers/setup-all.sh (make test-drivers)")
        }
    };
    if path.exists() {
        return true;
    }
    let why = format!("{driver}: {} is missing; run {how}", path.display());
    assert!(!required, "{why}");
    println!("skipped: {why}");
    false
}

/// Runs `cmd PORT` (refract's port, or the primary's with `REFRACT_DRIVERS_TARGET=direct`)
/// and asserts that it passed every check in `expected`.
fn run_suite(driver: &str, needs: Needs, mut cmd: Command, expected: &[&str]) {
    if !ready(driver, &needs) {
        return;
    }
    let f = fixture();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let port = if flag("REFRACT_DRIVERS_TARGET", "direct") { f.cluster.primary.port } else { f.port };
    cmd.arg(port.to_string());
    let Ran { status, stdout, stderr } = drivers::run(driver, cmd, SUITE_TIMEOUT);
    let report = format!("{driver} suite:\n{stdout}\n--- stderr:\n{stderr}");
    let Some(status) = status else { panic!("{driver}: killed after {SUITE_TIMEOUT:?}\n{report}") };
    let failed: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL ")).collect();
    assert!(failed.is_empty(), "{driver}: {} check(s) failed:\n{}\n\n{report}", failed.len(), failed.join("\n"));
    assert!(status.success(), "{driver}: exit status {status}\n{report}");
    let passed: Vec<&str> =
        stdout.lines().filter_map(|l| l.strip_prefix("ok ")).map(|l| l.split(' ').next().unwrap_or(l)).collect();
    let absent: Vec<&&str> = expected.iter().filter(|name| !passed.contains(name)).collect();
    assert!(absent.is_empty(), "{driver}: checks not reported ok: {absent:?}\n{report}");
    assert_eq!(stdout.lines().last(), Some("done"), "{report}");
}

fn python_suite(driver: &str, script: &str, expected: &[&str]) {
    let mut cmd = Command::new(python());
    cmd.arg(drivers_dir().join("python").join(script));
    run_suite(driver, Needs::Python, cmd, expected);
}

#[test]
fn psycopg3_suite_passes_through_refract() {
    python_suite("psycopg 3", "psycopg3_suite.py", FULL);
}

#[test]
fn psycopg2_suite_passes_through_refract() {
    // psycopg2 sends only simple queries: no protocol-level statements, no extended SET.
    let protocol_level = ["prepared_concurrent", "unnamed_statement_concurrent", "set_extended_concurrent"];
    let expected: Vec<&str> = FULL.iter().copied().filter(|c| !protocol_level.contains(c)).collect();
    python_suite("psycopg2", "psycopg2_suite.py", &expected);
}

#[test]
fn asyncpg_suite_passes_through_refract() {
    python_suite("asyncpg", "asyncpg_suite.py", FULL);
}

#[test]
fn sqlalchemy_suite_passes_through_refract() {
    let expected = [
        "orm_concurrent",
        "prepared_concurrent",
        "asyncpg_dialect_concurrent",
        "set_simple_concurrent",
        "set_extended_concurrent",
        "temp_table",
        "advisory_lock",
        "savepoint",
    ];
    python_suite("SQLAlchemy", "sqlalchemy_suite.py", &expected);
}

#[test]
fn pgx_suite_passes_through_refract() {
    let binary = target_dir().join("drivers/pgx-suite");
    let cmd = Command::new(&binary);
    run_suite("pgx v5", Needs::Built(binary), cmd, FULL);
}

#[test]
fn node_postgres_suite_passes_through_refract() {
    let mut cmd = Command::new("node");
    cmd.arg(drivers_dir().join("node/suite.js"));
    run_suite("node-postgres", Needs::Built(drivers_dir().join("node/node_modules/pg")), cmd, FULL);
}

#[test]
fn pgjdbc_suite_passes_through_refract() {
    let jar = drivers_dir().join("java/target/pgjdbc-suite.jar");
    let mut cmd = Command::new("java");
    cmd.arg("-jar").arg(&jar);
    run_suite("pgjdbc", Needs::Built(jar), cmd, FULL);
}

// Issue 23 groundwork: each driver fetches one large result through refract and directly; the
// digest it computes client-side (MD5 over the rows as `n|md5|xxx...` lines, what psql prints
// with `-XAt -F '|'`) must be the same both ways. psql and psycopg2 run in plain `make test`;
// psycopg 3, asyncpg and pgjdbc only with `REFRACT_DRIVERS=all` (`make test-drivers`).

/// MiB in the large result: `REFRACT_DRIVERS_RESULT_MIB`, 8 unless set (the documented run: 256).
fn result_mib() -> u64 {
    std::env::var("REFRACT_DRIVERS_RESULT_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(8)
}

/// Width of the padding column; rows are about `RESULT_WIDTH + 45` bytes. The fetchers
/// (python/large_result.py, java/.../LargeResult.java) compute the same row count.
const RESULT_WIDTH: u64 = 1000;

fn result_rows(mib: u64) -> u64 {
    (mib * 1024 * 1024 / (RESULT_WIDTH + 45)).max(1)
}

/// Runs `cmd` (a fetcher, given the port) to the end and returns its last line, `rows N md5 HEX`.
fn fetched(driver: &str, cmd: Command) -> String {
    let ran = drivers::run(driver, cmd, SUITE_TIMEOUT);
    let Some(status) = ran.status else { panic!("{driver}: killed after {SUITE_TIMEOUT:?}") };
    assert!(status.success(), "{driver}: exit status {status}\n{}\n--- stderr:\n{}", ran.stdout, ran.stderr);
    ran.stdout.lines().last().unwrap_or_default().to_owned()
}

/// psql's digest of the result at `port`, computed here over its output as it streams.
fn psql_digest(port: u16, mib: u64) -> String {
    use md5::{Digest, Md5};
    let sql =
        format!("select n, md5(n::text), repeat('x', {RESULT_WIDTH}) from generate_series(1, {}) n", result_rows(mib));
    let mut child = Command::new(refract_testkit::tool("psql").unwrap())
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", refract_testkit::USER])
        .args(["-d", refract_testkit::DATABASE, "-XAtq", "-F", "|", "-v", "ON_ERROR_STOP=1", "-c", &sql])
        .env("PGPASSWORD", refract_testkit::PASSWORD)
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = drain(child.stderr.take().unwrap());
    let mut stdout = child.stdout.take().unwrap();
    let (mut md5, mut lines, mut chunk) = (Md5::new(), 0u64, vec![0u8; 1 << 16]);
    loop {
        let n = stdout.read(&mut chunk).unwrap();
        if n == 0 {
            break;
        }
        md5.update(&chunk[..n]);
        lines += chunk[..n].iter().filter(|b| **b == b'\n').count() as u64;
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "psql: {status}: {}", err.join().unwrap());
    let hex: String = md5.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("rows {lines} md5 {hex}")
}

/// `fetch(port, mib)` through refract and straight from the primary: the same digest, of the
/// expected number of rows. `all_only` drivers run only with `REFRACT_DRIVERS=all`.
fn same_large_result(driver: &str, needs: Option<Needs>, all_only: bool, fetch: impl Fn(u16, u64) -> String) {
    if all_only && !flag("REFRACT_DRIVERS", "all") {
        println!("skipped: {driver} large result runs with REFRACT_DRIVERS=all (make test-drivers)");
        return;
    }
    if needs.is_some_and(|n| !ready(driver, &n)) {
        return;
    }
    let (f, h) = (fixture(), hybrid_fixture());
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mib = result_mib();
    let direct = fetch(f.cluster.primary.port, mib);
    assert!(direct.starts_with(&format!("rows {} md5 ", result_rows(mib))), "{driver}: {direct}");
    for (mode, fx) in [("relay", &f), ("hybrid", &h)] {
        let handed = pg_common::agent::handed_over(fx.admin);
        let started = Instant::now();
        let through = fetch(fx.port, mib);
        let took = started.elapsed();
        println!("{driver}: {mib} MiB through refract ({mode}) in {:.1} s: {through}", took.as_secs_f64());
        assert_eq!(through, direct, "{driver}: {mib} MiB through refract {mode} (left) and directly (right)");
        if mode == "hybrid" {
            let now = pg_common::agent::handed_over(fx.admin);
            assert!(now > handed, "{driver}: the {mib} MiB result was handed over");
        }
    }
}

fn python_fetch(driver: &'static str) -> impl Fn(u16, u64) -> String {
    move |port, mib| {
        let mut cmd = Command::new(python());
        cmd.arg(drivers_dir().join("python/large_result.py")).args([port.to_string(), driver.into(), mib.to_string()]);
        fetched(driver, cmd)
    }
}

#[test]
fn psql_large_result_same_through_refract() {
    same_large_result("psql", None, false, psql_digest);
}

#[test]
fn psycopg2_large_result_same_through_refract() {
    same_large_result("psycopg2", Some(Needs::Python), false, python_fetch("psycopg2"));
}

#[test]
fn psycopg3_large_result_same_through_refract() {
    same_large_result("psycopg 3", Some(Needs::Python), true, python_fetch("psycopg3"));
}

#[test]
fn asyncpg_large_result_same_through_refract() {
    same_large_result("asyncpg", Some(Needs::Python), true, python_fetch("asyncpg"));
}

#[test]
fn pgjdbc_large_result_same_through_refract() {
    let jar = drivers_dir().join("java/target/pgjdbc-suite.jar");
    let fetch = {
        let jar = jar.clone();
        move |port: u16, mib: u64| {
            let mut cmd = Command::new("java");
            cmd.arg("-cp").arg(&jar).arg("refract.LargeResult").args([port.to_string(), mib.to_string()]);
            fetched("pgjdbc", cmd)
        }
    };
    same_large_result("pgjdbc", Some(Needs::Built(jar)), true, fetch);
}
