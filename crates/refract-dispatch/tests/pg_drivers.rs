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

mod pg_common;

use pg_common::Fixture;
use std::io::Read;
use std::path::{Path, PathBuf};
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

/// The repository (two levels above this crate).
fn repo() -> PathBuf {
    let krate = Path::new(env!("CARGO_MANIFEST_DIR"));
    krate.ancestors().nth(2).unwrap_or(krate).to_path_buf()
}

fn drivers_dir() -> PathBuf {
    repo().join("tests/drivers")
}

/// Where build outputs live: `$CARGO_TARGET_DIR`, else the repository's `target/`.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| repo().join("target"))
}

fn flag(name: &str, value: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == value)
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

/// The venv's interpreter.
fn python() -> PathBuf {
    let venv = std::env::var_os("REFRACT_PYENV").map(PathBuf::from).unwrap_or_else(|| target_dir().join("pyenv"));
    venv.join("bin/python")
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
    let started = Instant::now();
    let mut child = cmd
        .arg(port.to_string())
        .current_dir(drivers_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{driver}: cannot start {cmd:?}: {e}"));
    let out = drain(child.stdout.take().unwrap());
    let err = drain(child.stderr.take().unwrap());
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if started.elapsed() > SUITE_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (stdout, stderr) = (out.join().unwrap(), err.join().unwrap());
    println!("{driver} suite ({:.1} s):\n{stdout}", started.elapsed().as_secs_f64());
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

/// Reads a child's pipe to the end on a thread.
fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
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
