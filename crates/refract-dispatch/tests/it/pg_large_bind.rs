//! Large Bind messages through the PostgreSQL front end, against a real primary + replica: a
//! 50 MiB parameter streamed to the server in bounded memory and stored byte for byte, another
//! client served meanwhile, and a client that leaves in the middle of one.
#![allow(clippy::unwrap_used)]

use crate::pg_common;

use md5::{Digest, Md5};
use pg_common::{Client, Fixture};
use refract_pg::FrontendMessage;
use refract_testkit::{PASSWORD, USER};
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The large parameter's size.
const PARAM: usize = 50 * 1024 * 1024;
/// bytea's type OID.
const BYTEA: u32 = 17;

/// A field from /proc/self/status, in bytes (refract runs in this process).
fn status_bytes(field: &str) -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() * 1024
}

/// The parameter's bytes from offset `at` (every byte value, no long runs).
fn fill(at: usize, buf: &mut [u8]) {
    for (k, b) in buf.iter_mut().enumerate() {
        *b = ((at + k) % 251) as u8 ^ ((at + k) >> 16) as u8;
    }
}

/// Writes a Bind of `statement` (unnamed portal) with one binary parameter of `len` bytes, made
/// piece by piece so that this client never holds it; stops after `send` parameter bytes.
/// Returns the md5 of the bytes sent.
fn send_large_bind(s: &mut TcpStream, statement: &str, len: usize, send: usize) -> String {
    let body = 1 + statement.len() + 1 + 4 + 2 + 4 + len + 2;
    let mut head = vec![b'B'];
    head.extend_from_slice(&i32::try_from(body + 4).unwrap().to_be_bytes());
    head.push(0);
    head.extend_from_slice(statement.as_bytes());
    head.push(0);
    head.extend_from_slice(&[0, 1, 0, 1, 0, 1]); // one format: binary; one parameter
    head.extend_from_slice(&i32::try_from(len).unwrap().to_be_bytes());
    s.write_all(&head).unwrap();
    let (mut hash, mut piece, mut at) = (Md5::new(), vec![0u8; 64 * 1024], 0);
    while at < send {
        let k = piece.len().min(send - at);
        fill(at, &mut piece[..k]);
        s.write_all(&piece[..k]).unwrap();
        hash.update(&piece[..k]);
        at += k;
    }
    if send == len {
        s.write_all(&[0, 0]).unwrap(); // no result formats
    }
    format!("{:x}", hash.finalize())
}

/// Another client's own statements, run until `done`: each answers its own value.
fn run_others(addr: std::net::SocketAddr, done: Arc<AtomicBool>) -> usize {
    let mut c = Client::connect(addr, USER, PASSWORD).unwrap();
    let mut n = 0;
    while !done.load(Ordering::Relaxed) && n < 100_000 {
        let got = c.query(&format!("SELECT {n} + 1"));
        assert_eq!((got.code(), got.value()), (None, (n + 1).to_string().as_str()));
        c.send(&[
            FrontendMessage::Parse { name: String::new(), query: format!("SELECT {n} * 2"), param_types: vec![] },
            FrontendMessage::Bind(Default::default()),
            FrontendMessage::Execute { portal: String::new(), max_rows: 0 },
            FrontendMessage::Sync,
        ]);
        let got = c.until_ready();
        assert_eq!((got.code(), got.value()), (None, (n * 2).to_string().as_str()));
        n += 1;
    }
    n
}

/// A 50 MiB bytea parameter: inserted and read back (as md5 on the server) byte for byte,
/// refract's memory grows far less than the parameter, and another client runs its own
/// statements meanwhile.
#[test]
fn a_50_mib_bytea_parameter_is_streamed_to_the_server_in_bounded_memory() {
    if !pg_common::alone("a_50_mib_bytea_parameter_is_streamed_to_the_server_in_bounded_memory") {
        return;
    }
    let f = Fixture::start("");
    f.psql(&["CREATE TABLE t_big_bind (id int, v bytea)"]).unwrap();
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    assert_eq!(c.query("SELECT 'warm'").value(), "warm");
    let done = Arc::new(AtomicBool::new(false));
    let other = {
        let (addr, done) = (f.addr(), done.clone());
        std::thread::spawn(move || run_others(addr, done))
    };
    std::thread::sleep(Duration::from_millis(200));
    let before = status_bytes("VmRSS:");
    std::fs::write("/proc/self/clear_refs", "5").unwrap(); // resets VmHWM to the current RSS
    let insert = "INSERT INTO t_big_bind VALUES (1, $1)";
    c.send(&[FrontendMessage::Parse { name: "ins".into(), query: insert.into(), param_types: vec![BYTEA] }]);
    let sent = send_large_bind(&mut c.stream, "ins", PARAM, PARAM);
    c.send(&[FrontendMessage::Execute { portal: String::new(), max_rows: 0 }, FrontendMessage::Sync]);
    let got = c.until_ready();
    assert_eq!((got.error.as_ref().map(|e| e.message()), got.tags.as_str()), (None, "12CZ"), "{got:?}");
    // A read with a large parameter, and the unnamed statement, in a batch of a few messages.
    let read = "SELECT md5($1), length($1)";
    c.send(&[FrontendMessage::Parse { name: String::new(), query: read.into(), param_types: vec![BYTEA] }]);
    let sent_again = send_large_bind(&mut c.stream, "", PARAM, PARAM);
    c.send(&[FrontendMessage::Execute { portal: String::new(), max_rows: 0 }, FrontendMessage::Sync]);
    let got = c.until_ready();
    let peak = status_bytes("VmHWM:");
    done.store(true, Ordering::Relaxed);
    assert!(other.join().unwrap() > 0, "the other client ran statements meanwhile");
    assert_eq!(sent_again, sent);
    assert_eq!((got.code(), got.rows.clone()), (None, vec![vec![Some(sent.clone()), Some(PARAM.to_string())]]));
    let stored = c.query("SELECT md5(v), length(v) FROM t_big_bind WHERE id = 1");
    assert_eq!(stored.rows, vec![vec![Some(sent), Some(PARAM.to_string())]], "stored byte for byte");
    let mib = |b: usize| b >> 20;
    eprintln!("peak RSS {} MiB, {} MiB before the two 50 MiB Binds", mib(peak), mib(before));
    assert!(peak < before + 24 * 1024 * 1024, "peak RSS {} MiB, {} MiB before", mib(peak), mib(before));
}

/// Errors and statement names around a large Bind behave as around a small one: a Bind of a
/// statement the client does not have fails with 26000 and the rest of the batch is skipped to
/// Sync; a large Bind of a read runs where a write after it in the same batch can run too.
#[test]
fn a_large_bind_keeps_names_errors_and_routing() {
    let f = Fixture::start("");
    f.psql(&["CREATE TABLE t_bind_route (v int)"]).unwrap();
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    send_large_bind(&mut c.stream, "missing", 1 << 20, 1 << 20);
    c.send(&[FrontendMessage::Execute { portal: String::new(), max_rows: 0 }, FrontendMessage::Sync]);
    let got = c.until_ready();
    assert_eq!((got.code(), got.tags.as_str()), (Some("26000"), "EZ"), "{got:?}");
    // A read bound large, then a write parsed and run in the same batch.
    let read = "SELECT length($1)";
    c.send(&[FrontendMessage::Parse { name: String::new(), query: read.into(), param_types: vec![BYTEA] }]);
    send_large_bind(&mut c.stream, "", 1 << 20, 1 << 20);
    c.send(&[
        FrontendMessage::Execute { portal: String::new(), max_rows: 0 },
        FrontendMessage::Parse {
            name: "w".into(),
            query: "INSERT INTO t_bind_route VALUES (1) RETURNING pg_is_in_recovery()".into(),
            param_types: vec![],
        },
        FrontendMessage::Bind(refract_pg::frontend::Bind { statement: "w".into(), ..Default::default() }),
        FrontendMessage::Execute { portal: String::new(), max_rows: 0 },
        FrontendMessage::Sync,
    ]);
    let got = c.until_ready();
    assert_eq!(got.code(), None, "{got:?}");
    assert_eq!(got.rows, vec![vec![Some((1 << 20).to_string())], vec![Some("f".into())]]);
    assert_eq!(c.query("SELECT count(*) FROM t_bind_route").value(), "1");
}

/// A client that sends half of a large Bind and leaves: the server connection holding half a
/// message is closed, not reused (one connection per server here), and the next client is
/// served as before.
#[test]
fn a_client_leaving_mid_bind_leaves_refract_serving_others() {
    let f = Fixture::start("pool_size = 1\nmin_idle = 1");
    f.psql(&["CREATE TABLE t_bind_cut (v bytea)"]).unwrap();
    for round in 0..2 {
        let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
        let insert = "INSERT INTO t_bind_cut VALUES ($1)";
        c.send(&[FrontendMessage::Parse { name: String::new(), query: insert.into(), param_types: vec![BYTEA] }]);
        send_large_bind(&mut c.stream, "", 16 << 20, 4 << 20);
        std::thread::sleep(Duration::from_millis(300));
        drop(c);
        let mut next = Client::connect(f.addr(), USER, PASSWORD).unwrap();
        let got = next.query("INSERT INTO t_bind_cut VALUES ('\\x01') RETURNING length(v)");
        assert_eq!((got.code(), got.value()), (None, "1"), "round {round}");
        let got = next.query("/* refract: route=primary */ SELECT count(*) FROM t_bind_cut");
        assert_eq!(got.value(), (round + 1).to_string(), "nothing of the half Bind was stored");
    }
    let metrics = f.metrics();
    assert!(!metrics.contains(r#"kind="pg_server""#), "counted as a server failure:\n{metrics}");
}
