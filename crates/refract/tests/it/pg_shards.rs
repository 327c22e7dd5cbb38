//! A sharded cluster with the real binary and real PostgreSQL servers (the test kit's;
//! `max_prepared_transactions = 20`).
//!
//! A scatter ORDER BY over 2 × 1 M rows streams: every row in order, refract's peak RSS under
//! 64 MiB.
//!
//! Two-phase commit: a transaction that writes on two shards commits
//! on both; refract killed between PREPARE and COMMIT PREPARED (the `REFRACT_FAILPOINT` hook)
//! leaves the transaction prepared, and the next refract resolves it from its decision log —
//! committed on every shard when the decision was recorded, on none when it was not, no
//! prepared transaction left. Servers without prepared transactions, or no decision log:
//! the write on a second shard is refused with the reason.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::{bin, free_port, wait_listening};
use refract_shard::partition::{remainder, Key};
use refract_testkit::{self as testkit, PgCluster, PgServer, PASSWORD, USER};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// psql on `addr` running `sqls`, one `-c` each: (success, stdout + stderr).
fn psql(addr: SocketAddr, sqls: &[&str]) -> (bool, String) {
    let out = Command::new(testkit::tool("psql").unwrap())
        .args(["-XAt", "-v", "ON_ERROR_STOP=1", "-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args(["-U", USER, "-d", "postgres"])
        .args(sqls.iter().flat_map(|s| ["-c", s]))
        .env("PGPASSWORD", PASSWORD)
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn on(server: &PgServer, sql: &str) -> String {
    let (ok, text) = psql(server.addr(), &[sql]);
    assert!(ok, "{sql}: {text}");
    text.trim().to_owned()
}

/// A refract over `shards` with `extra` in `[postgres]`, `failpoint` set (or not).
fn refract(dir: &Path, shards: &[&PgServer], extra: &str, failpoint: Option<&str>) -> (Child, SocketAddr) {
    let (child, addr, _) = refract_admin(dir, shards, extra, failpoint);
    (child, addr)
}

/// [`refract`], with its admin address.
fn refract_admin(
    dir: &Path,
    shards: &[&PgServer],
    extra: &str,
    failpoint: Option<&str>,
) -> (Child, SocketAddr, SocketAddr) {
    let (port, admin) = (free_port(), free_port());
    let mut text = format!(
        "[listen]\nhttp = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:{}\"\n[admin]\ninsecure_loopback = true\n\
         [postgres]\nlisten = \"127.0.0.1:{port}\"\nserver_user = \"{USER}\"\nserver_password = \"{PASSWORD}\"\n\
         health_interval_ms = 200\n{extra}\n[[postgres.user]]\nname = \"{USER}\"\npassword = \"{PASSWORD}\"\n\
         [[postgres.sharded_table]]\nname = \"accounts\"\nkey = \"id\"\n\
         [[postgres.sharded_table]]\nname = \"big\"\nkey = \"id\"\n",
        admin
    );
    for (i, s) in shards.iter().enumerate() {
        text.push_str(&format!(
            "[[postgres.shard]]\nname = \"s{i}\"\n[[postgres.shard.server]]\nname = \"s{i}\"\naddr = \"{}\"\nrole = \"primary\"\n",
            s.addr()
        ));
    }
    let path = dir.join(format!("refract-{port}.toml"));
    std::fs::write(&path, text).unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["dispatch", "--config", path.to_str().unwrap()]).env("RUST_LOG", "warn").stdin(Stdio::null());
    if let Some(f) = failpoint {
        cmd.env("REFRACT_FAILPOINT", f);
    }
    let child = cmd.spawn().unwrap();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    wait_listening(addr);
    (child, addr, ([127, 0, 0, 1], admin).into())
}

/// Waits until the dispatcher with admin address `admin` is in touch with etcd and sees `n`
/// dispatchers.
fn wait_clustered(admin: SocketAddr, n: usize) {
    until("the dispatcher in touch with etcd", || {
        // The admin listener without a token answers requests naming a loopback host.
        let mut c = std::net::TcpStream::connect(admin).unwrap();
        std::io::Write::write_all(&mut c, b"GET /cluster HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
            .unwrap();
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut c, &mut text);
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        text.starts_with("HTTP/1.1 200")
            && v["etcd"] == "up"
            && v["dispatchers"].as_array().is_some_and(|d| d.len() == n)
    });
}

/// An id on shard `want` of 2.
fn id_on(want: u64, from: i64) -> i64 {
    (from..).find(|i| remainder(&[Key::Int8(*i)], 2) == want).unwrap()
}

fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Kills refract at `failpoint` during the COMMIT of a transaction writing on both shards;
/// returns after a fresh refract resolved it (no prepared transaction left), with the names.
fn crash_and_recover(failpoint: &str, name: &str) -> (String, String) {
    let mut cluster = PgCluster::start_with_replicas(0).expect("PostgreSQL test cluster");
    let i = cluster.add_standalone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("twophase.log");
    let extra = format!("twophase_log = \"{}\"", log.display());
    let (s0, s1) = (&cluster.primary, &cluster.standalone[i]);
    let (a, b) = (id_on(0, 1), id_on(1, 1));
    {
        let (mut child, addr) = refract(dir.path(), &[s0, s1], &extra, None);
        let load = format!("insert into accounts values ({a}, 'a'), ({b}, 'b')");
        let (ok, text) = psql(addr, &["create table accounts (id int8 primary key, name text)", &load]);
        assert!(ok, "{text}");
        let _ = child.kill();
        let _ = child.wait();
    }
    let (mut child, addr) = refract(dir.path(), &[s0, s1], &extra, Some(failpoint));
    let (u0, u1) = (
        format!("update accounts set name = '{name}' where id = {a}"),
        format!("update accounts set name = '{name}' where id = {b}"),
    );
    let (ok, text) = psql(addr, &["begin", &u0, &u1, "commit"]);
    assert!(!ok, "refract died in the commit: {text}");
    let _ = child.wait();
    let prepared = "select count(*) from pg_prepared_xacts";
    assert_eq!((on(s0, prepared).as_str(), on(s1, prepared).as_str()), ("1", "1"), "both shards prepared");
    let (mut child, addr) = refract(dir.path(), &[s0, s1], &extra, None);
    until("recovery", || on(s0, prepared) == "0" && on(s1, prepared) == "0");
    let (ok, text) = psql(addr, &[&format!("select id, name from accounts where id in ({a}, {b}) order by id")]);
    assert!(ok, "{text}");
    let _ = child.kill();
    let _ = child.wait();
    (
        on(s0, &format!("select name from accounts where id = {a}")),
        on(s1, &format!("select name from accounts where id = {b}")),
    )
}

#[test]
fn a_crash_after_the_decision_commits_on_every_shard() {
    let (n0, n1) = crash_and_recover("2pc-after-decision", "after");
    assert_eq!((n0.as_str(), n1.as_str()), ("after", "after"));
}

#[test]
fn a_crash_before_the_decision_commits_on_no_shard() {
    let (n0, n1) = crash_and_recover("2pc-before-decision", "before");
    assert_eq!((n0.as_str(), n1.as_str()), ("a", "b"));
}

/// A dispatcher process killed when dropped, so that a failing test leaves none behind.
struct Killed(Child);

impl Killed {
    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Two dispatchers sharing decisions in etcd: the one deciding dies at `failpoint` during the
/// commit; the survivor finishes its prepared transactions once its lease lapses (2 s). Returns
/// the names on each shard and how long after the death nothing was left prepared.
fn crash_and_survive(failpoint: &str, name: &str) -> (String, String, Duration) {
    let mut cluster = PgCluster::start_with_replicas(0).expect("PostgreSQL test cluster");
    let i = cluster.add_standalone().unwrap();
    let etcd = testkit::Etcd::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let node = |id: &str| format!("[cluster]\netcd = [\"{}\"]\nnode_id = \"{id}\"\nlease_ttl_s = 2\n", etcd.endpoint());
    let (s0, s1) = (&cluster.primary, &cluster.standalone[i]);
    let (a, b) = (id_on(0, 1), id_on(1, 1));
    let (survivor, at, survivor_admin) = refract_admin(dir.path(), &[s0, s1], &node("d2"), None);
    let mut survivor = Killed(survivor);
    wait_clustered(survivor_admin, 1);
    let load = format!("insert into accounts values ({a}, 'a'), ({b}, 'b')");
    let (ok, text) = psql(at, &["create table accounts (id int8 primary key, name text)", &load]);
    assert!(ok, "{text}");
    let (decider, addr, admin) = refract_admin(dir.path(), &[s0, s1], &node("d1"), Some(failpoint));
    let mut decider = Killed(decider);
    wait_clustered(admin, 2);
    let (u0, u1) = (
        format!("update accounts set name = '{name}' where id = {a}"),
        format!("update accounts set name = '{name}' where id = {b}"),
    );
    let (ok, text) = psql(addr, &["begin", &u0, &u1, "commit"]);
    assert!(!ok, "the deciding dispatcher died in the commit: {text}");
    let _ = decider.0.wait();
    let died = Instant::now();
    let prepared = "select count(*) from pg_prepared_xacts";
    assert_eq!((on(s0, prepared).as_str(), on(s1, prepared).as_str()), ("1", "1"), "both shards prepared");
    until("the survivor's recovery", || on(s0, prepared) == "0" && on(s1, prepared) == "0");
    let took = died.elapsed();
    survivor.stop();
    (
        on(s0, &format!("select name from accounts where id = {a}")),
        on(s1, &format!("select name from accounts where id = {b}")),
        took,
    )
}

#[test]
fn a_dead_dispatchers_decided_commit_is_finished_by_another() {
    let (n0, n1, took) = crash_and_survive("2pc-after-decision", "after");
    assert_eq!((n0.as_str(), n1.as_str()), ("after", "after"));
    println!("the survivor finished the commit {took:?} after the decider died (lease 2 s)");
    assert!(took < Duration::from_millis(4500), "not within the lease time and a recovery pass: {took:?}");
}

#[test]
fn a_dead_dispatchers_undecided_commit_is_rolled_back_by_another() {
    let (n0, n1, took) = crash_and_survive("2pc-before-decision", "before");
    assert_eq!((n0.as_str(), n1.as_str()), ("a", "b"));
    assert!(took < Duration::from_millis(4500), "{took:?}");
}

#[test]
fn a_second_shard_needs_prepared_transactions_and_the_log() {
    let mut cluster = PgCluster::start_with_replicas(0).expect("PostgreSQL test cluster");
    let i = cluster.add_standalone_with("max_prepared_transactions = 0").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (s0, s1) = (&cluster.primary, &cluster.standalone[i]);
    let (a, b) = (id_on(0, 1), id_on(1, 1));
    let log = format!("twophase_log = \"{}\"", dir.path().join("twophase.log").display());
    let (mut child, addr) = refract(dir.path(), &[s0, s1], &log, None);
    let load = format!("insert into accounts values ({a}, 'a'), ({b}, 'b')");
    let (ok, text) = psql(addr, &["create table accounts (id int8 primary key, name text)", &load]);
    assert!(ok, "{text}");
    let (u0, u1) = (
        format!("update accounts set name = 'x' where id = {a}"),
        format!("update accounts set name = 'x' where id = {b}"),
    );
    let (ok, text) = psql(addr, &["begin", &u0, &u1, "commit"]);
    assert!(!ok && text.contains("max_prepared_transactions = 0"), "{text}");
    // The transaction failed as a whole: shard 0's update is rolled back too.
    assert_eq!(on(s0, &format!("select name from accounts where id = {a}")), "a");
    // One shard at a time still works.
    let (ok, text) = psql(addr, &["begin", &u0, "commit"]);
    assert!(ok, "{text}");
    let _ = child.kill();
    let _ = child.wait();
    let (mut child, addr) = refract(dir.path(), &[s0, s0], "", None);
    let (ok, text) = psql(addr, &["begin", &u0, &u1, "commit"]);
    assert!(!ok && text.contains("twophase_log"), "{text}");
    let _ = child.kill();
    let _ = child.wait();
}

/// `VmHWM` (peak resident set) of process `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_scatter_order_by_over_two_million_rows_streams_in_bounded_memory() {
    let mut cluster = PgCluster::start_with_replicas(0).expect("PostgreSQL test cluster");
    let i = cluster.add_standalone().unwrap();
    let (s0, s1) = (&cluster.primary, &cluster.standalone[i]);
    // Shard 0 holds the even ids, shard 1 the odd ones: the merge interleaves them row by row.
    for (s, parity) in [(s0, 0), (s1, 1)] {
        on(s, "create table big (id int8 primary key, pad text)");
        on(s, &format!("insert into big select 2 * g + {parity}, repeat('x', 40) from generate_series(0, 999999) g"));
        on(s, "analyze big");
    }
    let dir = tempfile::tempdir().unwrap();
    let (mut child, addr) = refract(dir.path(), &[s0, s1], "", None);
    let before = peak_rss_kib(child.id());
    let out = Command::new(testkit::tool("psql").unwrap())
        .args(["-XAt", "-v", "ON_ERROR_STOP=1", "-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args(["-U", USER, "-d", "postgres", "-c", "select id, pad from big order by id"])
        .env("PGPASSWORD", PASSWORD)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let peak = peak_rss_kib(child.id());
    let _ = child.kill();
    let _ = child.wait();
    let mut n = 0i64;
    for line in out.stdout.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let id: i64 = std::str::from_utf8(line.split(|b| *b == b'|').next().unwrap()).unwrap().parse().unwrap();
        assert_eq!(id, n, "row {n} out of order");
        n += 1;
    }
    assert_eq!(n, 2_000_000, "every row, once");
    eprintln!("refract peak RSS: {before} KiB at start, {peak} KiB after 2 x 1 M rows merged");
    assert!(peak < 64 * 1024, "refract's peak RSS {peak} KiB is not under 64 MiB");
}
