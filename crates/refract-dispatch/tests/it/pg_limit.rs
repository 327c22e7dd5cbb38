//! The adaptive concurrency limit of a PostgreSQL server (`refract-front-pg/src/admit/baseline.rs`,
//! `Server::learn`), against a real primary and replica with `pool_size = 8`: statements that
//! saturate the server's CPU bring the replica's limit (read from `/pg/servers`) below the pool
//! size; statements of very different costs that do not queue (`pg_sleep` beside `SELECT 1`)
//! leave it near the pool size. Each test has its own cluster, and they run one at a time (the
//! first loads the machine's CPU).
#![allow(clippy::unwrap_used)]

use crate::pg_common;

use pg_common::{Client, Fixture};
use refract_pg::frontend::Bind;
use refract_pg::FrontendMessage;
use refract_testkit::{PASSWORD, USER};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Eight server connections per server, so a limit of 8 to begin with.
const POOL: u64 = 8;

static SERIAL: Mutex<()> = Mutex::new(());

fn start() -> Fixture {
    Fixture::start(&format!("pool_size = {POOL}\nmin_idle = 1"))
}

/// The replica's concurrency limit (the reads go there).
fn replica_limit(f: &Fixture) -> u64 {
    let servers = f.admin_json("/pg/servers");
    let r = servers.as_array().unwrap().iter().find(|s| s["name"] == "replica").unwrap().clone();
    r["limit"].as_u64().unwrap()
}

/// Runs `step` on `n` clients (each set up by `setup` first), each in a loop, until `stop`.
fn load_with(
    f: &Fixture,
    n: usize,
    setup: fn(&mut Client),
    step: fn(&mut Client),
    stop: &Arc<AtomicBool>,
) -> Vec<JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let (addr, stop) = (f.addr(), stop.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(addr, USER, PASSWORD).unwrap();
                setup(&mut c);
                while !stop.load(Ordering::Relaxed) {
                    step(&mut c);
                }
            })
        })
        .collect()
}

/// Runs `sql` on `n` clients, each in a loop, until `stop`.
fn load(f: &Fixture, n: usize, sql: &'static str, stop: &Arc<AtomicBool>) -> Vec<JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let (addr, stop) = (f.addr(), stop.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(addr, USER, PASSWORD).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    let a = c.query(sql);
                    assert!(a.error.is_none(), "{sql}: {:?}", a.error);
                }
            })
        })
        .collect()
}

/// The lowest of `server`'s limit seen while polling for `secs` (or, with `below`, until it
/// drops below that).
fn lowest_limit(f: &Fixture, server: &str, secs: u64, below: Option<u64>) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut lowest = POOL;
    while Instant::now() < deadline && below.is_none_or(|b| lowest >= b) {
        std::thread::sleep(Duration::from_millis(50));
        let servers = f.admin_json("/pg/servers");
        let s = servers.as_array().unwrap().iter().find(|s| s["name"] == server).unwrap().clone();
        lowest = lowest.min(s["limit"].as_u64().unwrap());
    }
    lowest
}

/// Runs each of `sqls` a few times alone, so that each kind's no-load time is known before the
/// load comes (a kind first seen under load is read against a loaded time).
fn warm_up(f: &Fixture, sqls: &[&str]) {
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    for sql in sqls {
        for _ in 0..4 {
            assert!(c.query(sql).error.is_none());
        }
    }
}

fn stop_all(stop: &AtomicBool, threads: Vec<JoinHandle<()>>) {
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn statements_that_saturate_the_cpu_bring_the_limit_below_the_pool_size() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let f = start();
    // About 20–50 ms of CPU each; ten at once on a 2-core machine queue for its cores.
    const CPU: &str = "SELECT count(*) FROM generate_series(1, 300000)";
    warm_up(&f, &[CPU]);
    assert_eq!(replica_limit(&f), POOL, "the limit starts at the pool size");
    let stop = Arc::new(AtomicBool::new(false));
    let threads = load(&f, 10, CPU, &stop);
    let lowest = lowest_limit(&f, "replica", 30, Some(POOL));
    stop_all(&stop, threads);
    assert!(lowest < POOL, "the limit stayed at {lowest} while 10 clients saturated the CPU");
}

#[test]
fn statements_of_mixed_costs_that_do_not_queue_keep_the_limit_near_the_pool_size() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let f = start();
    const SLEEP: &str = "SELECT pg_sleep(0.02)";
    const CHEAP: &str = "SELECT 1";
    warm_up(&f, &[SLEEP, CHEAP]);
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = load(&f, 8, SLEEP, &stop);
    threads.extend(load(&f, 2, CHEAP, &stop));
    let lowest = lowest_limit(&f, "replica", 4, None);
    let end = replica_limit(&f);
    stop_all(&stop, threads);
    eprintln!("limit at the end {end}, lowest seen {lowest}");
    assert!(end >= POOL / 2, "a 0.1 ms and a 20 ms kind of statement read as queueing: limit {end}");
}

/// The statement of the CPU test, prepared once and run by Bind/Execute/Sync batches (as
/// `pgbench -M prepared` does): a batch's kind comes from its statement's text.
fn prepare_cpu(c: &mut Client) {
    let query = "SELECT count(*) FROM generate_series(1, 300000)".into();
    c.send(&[FrontendMessage::Parse { name: "cpu".into(), query, param_types: vec![] }, FrontendMessage::Sync]);
    assert!(c.until_ready().error.is_none());
}

fn execute_cpu(c: &mut Client) {
    let bind = FrontendMessage::Bind(Bind { statement: "cpu".into(), ..Bind::default() });
    c.send(&[bind, FrontendMessage::Execute { portal: String::new(), max_rows: 0 }, FrontendMessage::Sync]);
    let a = c.until_ready();
    assert!(a.error.is_none(), "{:?}", a.error);
}

#[test]
fn prepared_statements_that_saturate_the_cpu_bring_the_limit_below_the_pool_size() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let f = start();
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    prepare_cpu(&mut c);
    for _ in 0..4 {
        execute_cpu(&mut c);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let threads = load_with(&f, 10, prepare_cpu, execute_cpu, &stop);
    let lowest = lowest_limit(&f, "replica", 30, Some(POOL));
    stop_all(&stop, threads);
    assert!(lowest < POOL, "the limit stayed at {lowest} while 10 clients saturated the CPU");
}

/// 16 MB: more than the socket buffers between refract and the client hold.
const LARGE: &str = "SELECT repeat('x', 16000000)";

/// Sends the large query, then waits 300 ms before reading the answer.
fn read_slowly(c: &mut Client) {
    c.send(&[FrontendMessage::Query(LARGE.into())]);
    std::thread::sleep(Duration::from_millis(300));
    let a = c.until_ready();
    assert!(a.error.is_none(), "{:?}", a.error);
}

#[test]
fn answers_larger_than_a_socket_buffer_are_no_samples() {
    // Their time includes the client's reading: slow readers are no queue in the server.
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let f = start();
    warm_up(&f, &[LARGE]);
    let stop = Arc::new(AtomicBool::new(false));
    let threads = load_with(&f, 6, |_| {}, read_slowly, &stop);
    let lowest = lowest_limit(&f, "replica", 4, None);
    stop_all(&stop, threads);
    assert_eq!(lowest, POOL, "slow readers of large answers brought the limit down");
}

/// An UPDATE of the row another transaction holds, given up after 100 ms (`lock_timeout`).
fn update_locked(c: &mut Client) {
    let a = c.query("UPDATE limit_lock SET v = v + 1 WHERE id = 1");
    // 53300: refused by a limit that came down (the failure the test looks for, below).
    assert!(matches!(a.code(), Some("55P03" | "53300")), "{:?}", a.error);
}

#[test]
fn statements_that_fail_are_no_samples() {
    // Statements that wait for a lock and give up are no sign of a busy server.
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let f = start();
    let mut holder = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    let setup = "CREATE TABLE limit_lock (id int PRIMARY KEY, v int); INSERT INTO limit_lock VALUES (1, 0)";
    assert!(holder.query(setup).error.is_none());
    warm_up(&f, &["UPDATE limit_lock SET v = v + 1 WHERE id = 1"]);
    assert!(holder.query("BEGIN").error.is_none());
    assert!(holder.query("UPDATE limit_lock SET v = v + 1 WHERE id = 1").error.is_none());
    let stop = Arc::new(AtomicBool::new(false));
    let set = |c: &mut Client| assert!(c.query("SET lock_timeout = 100").error.is_none());
    let threads = load_with(&f, 7, set, update_locked, &stop);
    let lowest = lowest_limit(&f, "primary", 3, None);
    stop_all(&stop, threads);
    assert!(holder.query("COMMIT").error.is_none());
    assert_eq!(lowest, POOL, "statements that gave up on a lock brought the limit down");
}
