//! PostgreSQL statements pass admission control (`refract-front-pg/src/admit.rs`), against a real primary and
//! replica: a limit of one unit of work per server and a queue of one, so that one open
//! transaction on the primary fills its slot and one waiting statement fills its queue.
#![allow(clippy::unwrap_used)]

use crate::pg_common;

use pg_common::{Client, Fixture};
use refract_pg::TxStatus;
use refract_testkit::{PASSWORD, USER};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// One unit of work in flight per server, one waiting; refusals and waits are what is tested.
/// `lowuser` has the low admission priority.
const EXTRA: &str =
    "pool_size = 4\n\n[[postgres.user]]\nname = \"lowuser\"\npassword = \"lowpass\"\npriority = \"low\"\n\n\
                     [overload]\nmax_concurrency = 1\ninitial_concurrency = 1\nmax_queue = 1\n";

static FIXTURE: Mutex<Weak<Fixture>> = Mutex::new(Weak::new());
/// The tests share the primary's single slot: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn fixture() -> Arc<Fixture> {
    pg_common::shared_in(&FIXTURE, EXTRA)
}

fn connect(f: &Fixture) -> Client {
    Client::connect(f.addr(), USER, PASSWORD).unwrap()
}

/// The primary's admission state from `/pg/servers`: (in flight, queued).
fn primary_admission(f: &Fixture) -> (u64, u64) {
    let servers = f.admin_json("/pg/servers");
    let p = servers.as_array().unwrap().iter().find(|s| s["name"] == "primary").unwrap().clone();
    (p["in_flight"].as_u64().unwrap(), p["queued"].as_u64().unwrap())
}

/// Waits (at most 20 s) until the primary's admission state is `want`.
fn wait_primary(f: &Fixture, want: (u64, u64)) {
    pg_common::until(&format!("primary admission at {want:?}"), || primary_admission(f) == want);
}

/// A client's thread: its answer's SQLSTATE (`None`: served), how long it took, and the client.
type Waiter = std::thread::JoinHandle<(Option<String>, Duration, Client)>;

/// A client (in its own thread) whose write waits in the primary's queue; returns its answer's
/// SQLSTATE (`None`: served), how long it took, and the client.
fn queue_a_write(f: &Arc<Fixture>) -> Waiter {
    queue_a_write_as(f, USER, PASSWORD)
}

/// [`queue_a_write`] as `user`.
fn queue_a_write_as(f: &Arc<Fixture>, user: &'static str, password: &'static str) -> Waiter {
    let f = f.clone();
    std::thread::spawn(move || {
        let mut c = Client::connect(f.addr(), user, password).unwrap();
        let started = Instant::now();
        let code = c.query("SELECT txid_current()").code().map(str::to_owned);
        (code, started.elapsed(), c)
    })
}

/// Lets the primary's queue leave the overload mode an earlier test may have left it in: one
/// quiet interval with a statement in it ends it (the queue's state is shared by the tests).
fn calm(f: &Fixture) {
    let mut c = connect(f);
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(150));
        assert!(c.query("SELECT txid_current()").error.is_none());
        let servers = f.admin_json("/pg/servers");
        if servers.as_array().unwrap().iter().all(|s| s["overloaded"] == false) {
            return;
        }
    }
    panic!("the queue stayed in overload mode");
}

/// One test at a time on the shared fixture, its queue calm: the guard of [`SERIAL`] (held as
/// long as the test keeps it) and the fixture.
fn serial() -> (MutexGuard<'static, ()>, Arc<Fixture>) {
    let one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let f = fixture();
    calm(&f);
    (one, f)
}

/// A client whose open transaction holds the primary's slot.
fn hold_the_slot(f: &Fixture) -> Client {
    let mut holder = connect(f);
    assert_eq!(holder.query("BEGIN").status, Some(TxStatus::InTransaction));
    holder
}

/// [`hold_the_slot`], and a write waiting in the primary's queue behind it ([`queue_a_write`]):
/// the holder and the waiter.
fn hold_the_slot_and_queue_a_write(f: &Arc<Fixture>) -> (Client, Waiter) {
    let holder = hold_the_slot(f);
    let waiter = queue_a_write(f);
    wait_primary(f, (1, 1));
    (holder, waiter)
}

#[test]
fn a_statement_refused_under_overload_gets_53300_and_the_session_goes_on() {
    let (_one, f) = serial();
    let (mut holder, first) = hold_the_slot_and_queue_a_write(&f);
    // The queue is full. Whether the newcomer is refused or, the queue being in overload mode
    // (two arrivals within an interval over a limit of one), pushes out the older waiter, one
    // of them gets 53300 at once.
    let second = queue_a_write(&f);
    let deadline = Instant::now() + Duration::from_secs(4);
    while !first.is_finished() && !second.is_finished() {
        assert!(Instant::now() < deadline, "nobody was refused");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(primary_admission(&f), (1, 1), "one waits; the transaction holds the slot");
    assert!(f.metrics().contains("refract_errors_total{kind=\"overloaded\"}"));
    assert!(f.metrics().contains("refract_backend_queued{backend=\"primary\",front=\"postgres\"} 1"));

    assert!(holder.query("COMMIT").error.is_none());
    let (mut a, mut b) = (first.join().unwrap(), second.join().unwrap());
    if a.0.is_none() {
        std::mem::swap(&mut a, &mut b);
    }
    let (code, took, mut refused) = a;
    assert_eq!(code.as_deref(), Some("53300"));
    assert!(took < Duration::from_secs(4), "refused at once, not after a wait: {took:?}");
    assert_eq!(b.0, None, "the other write ran once the slot freed");
    wait_primary(&f, (0, 0));
    let again = refused.query("SELECT 7");
    assert_eq!((again.code(), again.value()), (None, "7"), "the refused client's session goes on");
    assert_eq!(again.status, Some(TxStatus::Idle));
}

#[test]
fn a_statement_whose_deadline_passes_in_the_queue_gets_57014() {
    let (_one, f) = serial();
    let mut late = connect(&f);
    assert!(late.query("SET statement_timeout = 1500").error.is_none());
    let mut holder = hold_the_slot(&f);

    let started = Instant::now();
    let a = late.query("SELECT txid_current()");
    let waited = started.elapsed();
    assert_eq!(a.code(), Some("57014"), "{:?}", a.error);
    assert_eq!(a.status, Some(TxStatus::Idle));
    assert!(waited >= Duration::from_millis(1400), "it waited in the queue until its deadline: {waited:?}");
    assert!(waited < Duration::from_secs(10), "{waited:?}");

    assert!(holder.query("COMMIT").error.is_none());
    wait_primary(&f, (0, 0));
    let again = late.query("SELECT txid_current() > 0");
    assert_eq!((again.code(), again.value()), (None, "t"), "the session goes on");
}

#[test]
fn statements_of_an_open_transaction_are_never_refused_nor_queued() {
    let (_one, f) = serial();
    let (mut holder, waiter) = hold_the_slot_and_queue_a_write(&f);
    // The slot is taken and the queue full: a new unit would be refused, but these statements
    // belong to the transaction holding the slot (were they queued behind the waiter, which
    // waits for this transaction, they would never run).
    let (ok, failed) = (TxStatus::InTransaction, TxStatus::Failed);
    let steps = [
        ("SELECT txid_current()", None, ok),
        ("SAVEPOINT s", None, ok),
        ("SELECT 1/0", Some("22012"), failed),
        ("ROLLBACK TO SAVEPOINT s", None, ok),
        ("SELECT 2", None, ok),
    ];
    for (sql, code, status) in steps {
        let a = holder.query(sql);
        assert_eq!((a.code(), a.status), (code, Some(status)), "{sql}: {:?}", a.error);
    }
    assert_eq!(holder.query("SELECT 1/0").status, Some(TxStatus::Failed));
    let end = holder.query("ROLLBACK");
    assert_eq!((end.code(), end.status), (None, Some(TxStatus::Idle)), "ROLLBACK is not refused");
    assert_eq!(waiter.join().unwrap().0, None);
    wait_primary(&f, (0, 0));
}

#[test]
fn a_low_priority_user_never_pushes_a_normal_users_statement_out_of_the_queue() {
    let (_one, f) = serial();
    let (mut holder, normal) = hold_the_slot_and_queue_a_write(&f);
    // The waiter has stood past the 5 ms target: the next arrival turns the queue to overload
    // mode, where a newcomer pushes out an older waiter of its own priority or lower. A
    // low-priority newcomer finds none to push out, so it is the one refused.
    std::thread::sleep(Duration::from_millis(50));
    let low = queue_a_write_as(&f, "lowuser", "lowpass");
    let (code, took, _) = low.join().unwrap();
    assert_eq!(code.as_deref(), Some("53300"), "the low-priority statement is refused");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(primary_admission(&f), (1, 1), "the normal statement still waits");
    assert!(holder.query("COMMIT").error.is_none());
    assert_eq!(normal.join().unwrap().0, None, "the normal statement ran once the slot freed");
    wait_primary(&f, (0, 0));
}
