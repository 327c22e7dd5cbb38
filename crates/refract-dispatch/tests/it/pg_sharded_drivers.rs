//! Real PostgreSQL drivers through SHARDED refract, as an application uses them with their
//! defaults (docs/sharding.md, "Drivers"): refract over two standalone PostgreSQL shards
//! (customers sharded by `id`, orders by `customer_id`, both hash; products replicated;
//! two-phase commit on, `[postgres] twophase_log` set and the test kit's servers have
//! `max_prepared_transactions = 20`) and, as the oracle, one plain PostgreSQL. Each suite
//! (`tests/drivers/python/sharded_*.py`, `tests/drivers/go/sharded/main.go`) loads the same schema
//! and rows into both, runs every check's driver calls on both and compares the answers: the
//! same rows (ordered where the ORDER BY says), row counts and status, SQLSTATE on errors. A
//! refusal is compared with the documented one (0A000, `refract: ...`), and at the end the
//! shard servers are read directly: every row sits on the shard PostgreSQL's `PARTITION BY
//! HASH` names, and the shards' rows together are the oracle's.
//!
//! A suite prints `ok NAME` or `FAIL NAME: reason` per check and `done`. Its test fails when a
//! check fails that is not in [`PENDING`]; a PENDING check that passes is printed as a hint
//! (remove it from the list). Which drivers run and how the venv and the Go build are found
//! is as in pg_drivers.rs: the Python venv of `tests/drivers/setup-python.sh` is required
//! (unless `REFRACT_DRIVERS_OPTIONAL=1`), the pgx binary of `tests/drivers/setup-all.sh` is
//! skipped when not built (required with `REFRACT_DRIVERS=all`).
#![allow(clippy::unwrap_used)]

use crate::pg_common;
use pg_common::drivers::{self, drivers_dir, flag, python, target_dir, Ran};

use pg_common::{shard_config, until, Client, Fixture};
use refract_testkit::{PgCluster, PgServer, PASSWORD, USER};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// The checks every suite runs, in order (each compares refract with the oracle).
const CHECKS: &[&str] = &[
    "setup",
    "keyed_read",
    "in_list",
    "any_array",
    "scatter_count",
    "scatter_where",
    "scatter_order_limit",
    "group_by_aggregates",
    "group_by_avg",
    "distinct",
    "colocated_join",
    "replicated_read",
    "insert_one",
    "insert_many",
    "keyed_update",
    "keyed_delete",
    "replicated_write",
    "tx_one_shard_commit",
    "tx_one_shard_rollback",
    "tx_two_shards_commit",
    "tx_two_shards_rollback",
    "tx_scatter_read",
    "unique_violation",
    "refused_window",
    "placement",
    "tables_equal",
];

/// Checks known to fail, as `driver:check`, each with the reason: a check listed here that
/// passes is reported as a hint (`hint: ... passes now`), a check not listed that fails fails
/// its test.
const PENDING: &[&str] = &[];

/// Longest a suite may run before it is killed and its test fails.
const SUITE_TIMEOUT: Duration = Duration::from_secs(600);

/// Shard names.
const NAMES: [&str; 2] = ["alpha", "bravo"];

/// The sharded tables and their keys.
const SHARDED: [(&str, &str); 2] = [("customers", "id"), ("orders", "customer_id")];

/// refract over two shards, with the decision log of two-phase commit.
struct Sharded {
    fixture: Fixture,
    log: PathBuf,
}

impl Drop for Sharded {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.log);
    }
}

static FIXTURE: Mutex<Weak<Sharded>> = Mutex::new(Weak::new());
/// One suite at a time: they share the tables.
static SERIAL: Mutex<()> = Mutex::new(());

/// The fixture shared by the tests running at the same time: a fresh cluster whose primary is
/// the oracle and whose two standalone servers are the shards.
fn fixture() -> Arc<Sharded> {
    let mut slot = FIXTURE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(f) = slot.upgrade() {
        return f;
    }
    let mut cluster = PgCluster::start_with_replicas(0).expect("PostgreSQL test cluster");
    for _ in NAMES {
        cluster.add_standalone().unwrap();
    }
    let log = std::env::temp_dir().join(format!("refract-sharded-drivers-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let servers: Vec<&PgServer> = cluster.standalone.iter().collect();
    let config = shard_config(&NAMES, &servers, &SHARDED);
    let fixture = Fixture::start_servers(cluster, &format!("twophase_log = \"{}\"", log.display()), &config);
    until("refract answers through its shards", || {
        Client::connect(fixture.addr(), USER, PASSWORD).is_ok_and(|mut c| c.query("SELECT 1").error.is_none())
    });
    let f = Arc::new(Sharded { fixture, log });
    *slot = Arc::downgrade(&f);
    f
}

/// Whether `path` (what the suite needs) exists; panics when it is `required` and does not.
fn ready(driver: &str, path: &Path, required: bool, how: &str) -> bool {
    if path.exists() {
        return true;
    }
    let why = format!("{driver}: {} is missing; run {how}", path.display());
    assert!(!required, "{why}");
    println!("skipped: {why}");
    false
}

/// What a suite reported for one check.
#[derive(Debug, PartialEq)]
enum Seen {
    Ok,
    Failed(String),
    Absent,
}

/// What the suite's output says of `check`.
fn seen(stdout: &str, check: &str) -> Seen {
    for line in stdout.lines() {
        if line.strip_prefix("ok ").is_some_and(|l| l.split(' ').next() == Some(check)) {
            return Seen::Ok;
        }
        if let Some(reason) = line.strip_prefix("FAIL ").and_then(|l| l.strip_prefix(check)) {
            if let Some(reason) = reason.strip_prefix(": ") {
                return Seen::Failed(reason.to_owned());
            }
        }
    }
    Seen::Absent
}

/// Runs `cmd REFRACT_PORT ORACLE_PORT SHARD_PORT...` and judges its checks (`checks`) against
/// [`PENDING`].
fn run_suite(driver: &str, mut cmd: Command, checks: &[&str]) {
    let f = fixture();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = &f.fixture.cluster;
    cmd.arg(f.fixture.port.to_string()).arg(cluster.primary.port.to_string());
    cmd.args(cluster.standalone.iter().map(|s| s.port.to_string()));
    let Ran { status, stdout, stderr } = drivers::run(driver, cmd, SUITE_TIMEOUT);
    let report = format!("{driver} suite:\n{stdout}\n--- stderr:\n{stderr}");
    let Some(status) = status else { panic!("{driver}: killed after {SUITE_TIMEOUT:?}\n{report}") };
    assert_eq!(stdout.lines().last(), Some("done"), "{driver}: the suite did not finish\n{report}");

    let (mut unexpected, mut hints, mut pending) = (vec![], vec![], vec![]);
    for check in checks {
        let key = format!("{}:{check}", driver_key(driver));
        let listed = PENDING.contains(&key.as_str());
        match (seen(&stdout, check), listed) {
            (Seen::Ok, false) => {}
            (Seen::Ok, true) => hints.push(key),
            (Seen::Failed(why), true) => pending.push(format!("{key}: {why}")),
            (Seen::Absent, true) => pending.push(format!("{key}: not reported")),
            (Seen::Failed(why), false) => unexpected.push(format!("{key}: {why}")),
            (Seen::Absent, false) => unexpected.push(format!("{key}: not reported")),
        }
    }
    let unknown: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("FAIL "))
        .filter(|l| !checks.iter().any(|c| l.split(':').next() == Some(c)))
        .collect();
    for key in &hints {
        println!("hint: {key} passes now: remove it from PENDING (once it passes in every run)");
    }
    for p in &pending {
        println!("pending {p}");
    }
    assert!(unknown.is_empty(), "{driver}: failures of unknown checks: {unknown:?}\n{report}");
    assert!(
        unexpected.is_empty(),
        "{driver}: {} check(s) failed that are not PENDING:\n{}\n\n{report}",
        unexpected.len(),
        unexpected.join("\n")
    );
    if pending.is_empty() {
        assert!(status.success(), "{driver}: exit status {status}\n{report}");
    }
}

/// The driver's name in [`PENDING`].
fn driver_key(driver: &str) -> &str {
    match driver {
        "psycopg 3" => "psycopg3",
        "pgx v5" => "pgx",
        other => other,
    }
}

fn python_suite(driver: &str, script: &str, checks: &[&str]) {
    let how = "tests/drivers/setup-python.sh";
    if !ready(driver, &python(), !flag("REFRACT_DRIVERS_OPTIONAL", "1"), how) {
        return;
    }
    let mut cmd = Command::new(python());
    cmd.arg(drivers_dir().join("python").join(script));
    run_suite(driver, cmd, checks);
}

#[test]
fn asyncpg_sharded_suite_answers_as_one_postgres() {
    python_suite("asyncpg", "sharded_asyncpg.py", CHECKS);
}

#[test]
fn psycopg3_sharded_suite_answers_as_one_postgres() {
    python_suite("psycopg 3", "sharded_psycopg3.py", CHECKS);
}

#[test]
fn psycopg2_sharded_suite_answers_as_one_postgres() {
    // psycopg2 also batches with `execute_batch` (many statements in one Query).
    let mut checks = CHECKS.to_vec();
    checks.insert(checks.iter().position(|c| *c == "insert_many").unwrap() + 1, "insert_batch");
    python_suite("psycopg2", "sharded_psycopg2.py", &checks);
}

#[test]
fn pgx_sharded_suite_answers_as_one_postgres() {
    let binary = target_dir().join("drivers/pgx-sharded-suite");
    if !ready("pgx v5", &binary, flag("REFRACT_DRIVERS", "all"), "tests/drivers/setup-all.sh (make test-drivers)") {
        return;
    }
    run_suite("pgx v5", Command::new(&binary), CHECKS);
}
