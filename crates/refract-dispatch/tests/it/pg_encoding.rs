//! Text that is not UTF-8 (a LATIN1 `client_encoding`) in the extended protocol, CopyFail and
//! startup parameters, through refract and straight to PostgreSQL: answered the same, never a
//! FATAL.
#![allow(clippy::unwrap_used)]

use crate::pg_common;

use bytes::BytesMut;
use pg_common::{columns, raw_message, shared, Client};
use refract_pg::auth::{ClientAuth, ClientStep};
use refract_pg::BackendMessage;
use refract_testkit::{DATABASE, PASSWORD, USER};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};

/// A message of type `tag` whose body is `parts` one after the other.
fn msg(tag: u8, parts: &[&[u8]]) -> Vec<u8> {
    let body: Vec<u8> = parts.concat();
    let mut m = vec![tag];
    m.extend_from_slice(&i32::try_from(body.len() + 4).unwrap().to_be_bytes());
    m.extend_from_slice(&body);
    m
}

fn parse(name: &[u8], query: &[u8]) -> Vec<u8> {
    msg(b'P', &[name, b"\0", query, b"\0", &[0, 0]])
}

/// A Bind of `statement` to `portal` with text parameters.
fn bind(portal: &[u8], statement: &[u8], params: &[&[u8]]) -> Vec<u8> {
    let mut body = [portal, b"\0", statement, b"\0", &[0, 0]].concat();
    body.extend_from_slice(&u16::try_from(params.len()).unwrap().to_be_bytes());
    for p in params {
        body.extend_from_slice(&i32::try_from(p.len()).unwrap().to_be_bytes());
        body.extend_from_slice(p);
    }
    body.extend_from_slice(&[0, 0]);
    msg(b'B', &[&body])
}

fn execute(portal: &[u8]) -> Vec<u8> {
    msg(b'E', &[portal, b"\0", &[0, 0, 0, 0]])
}

fn close_statement(name: &[u8]) -> Vec<u8> {
    msg(b'C', &[b"S", name, b"\0"])
}

fn sync() -> Vec<u8> {
    msg(b'S', &[])
}

fn query(sql: &[u8]) -> Vec<u8> {
    msg(b'Q', &[sql, b"\0"])
}

/// What came back up to ReadyForQuery, raw: each message's tag, DataRow columns, and the
/// SQLSTATE and message of errors.
#[derive(Debug, PartialEq, Eq, Default)]
struct Raw {
    tags: String,
    rows: Vec<Vec<Option<Vec<u8>>>>,
    errors: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Sends `msgs` and reads the answers up to the `readies`-th ReadyForQuery.
fn run(s: &mut TcpStream, msgs: &[Vec<u8>], readies: usize) -> Raw {
    s.write_all(&msgs.concat()).unwrap();
    let (mut raw, mut left) = (Raw::default(), readies);
    while left > 0 {
        let (tag, body) = raw_message(s);
        raw.tags.push(char::from(tag));
        match tag {
            b'D' => raw.rows.push(columns(&body)),
            b'E' => {
                let field = |f: u8| {
                    body.split(|&b| b == 0).find(|x| x.first() == Some(&f)).map(|x| x[1..].to_vec()).unwrap_or_default()
                };
                raw.errors.push((field(b'C'), field(b'M')));
            }
            b'Z' => left -= 1,
            _ => {}
        }
    }
    raw
}

fn latin1_client(addr: SocketAddr) -> TcpStream {
    Client::connect_with(addr, USER, PASSWORD, &[("client_encoding", "LATIN1")]).unwrap().stream
}

/// Runs the same messages straight on the primary and through refract; both answers, which must
/// be equal. (The shared fixture lives while a test holds it: a test that creates a table
/// holds it too.)
fn both(msgs: &[Vec<u8>], readies: usize) -> Raw {
    let f = shared();
    let (mut direct, mut through) = (latin1_client(f.cluster.primary.addr()), latin1_client(f.addr()));
    let want = run(&mut direct, msgs, readies);
    let got = run(&mut through, msgs, readies);
    assert_eq!(got, want, "through refract as straight to PostgreSQL");
    // The session goes on.
    let after = run(&mut through, &[query(b"SELECT 'still here'")], 1);
    assert_eq!(after.rows, vec![vec![Some(b"still here".to_vec())]]);
    got
}

#[test]
fn parse_bind_execute_of_latin1_text_answers_its_bytes() {
    let q = parse(b"", b"SELECT 'caf\xe9' AS v, length('caf\xe9'), $1::text || '\xe9'");
    let got = both(&[q, bind(b"", b"", &[b"\xe9t\xe9"]), execute(b""), sync()], 1);
    assert_eq!(got.rows, vec![vec![Some(b"caf\xe9".to_vec()), Some(b"4".to_vec()), Some(b"\xe9t\xe9\xe9".to_vec())]]);
    // A write with such text goes to the primary (refract cannot read it) and is stored.
    let f = shared();
    f.psql(&["CREATE TABLE IF NOT EXISTS t_latin1_ext (v text)"]).unwrap();
    let mut c = latin1_client(f.addr());
    let ins = parse(b"", b"INSERT INTO t_latin1_ext VALUES ('na\xefve') RETURNING v, pg_is_in_recovery()");
    let got = run(&mut c, &[ins, bind(b"", b"", &[]), execute(b""), sync()], 1);
    assert_eq!(got.rows, vec![vec![Some(b"na\xefve".to_vec()), Some(b"f".to_vec())]], "{got:?}");
}

#[test]
fn a_statement_name_with_a_latin1_byte_is_prepared_run_and_closed() {
    let name = b"st\xe9";
    let got = both(
        &[
            parse(name, b"SELECT 'caf\xe9'"),
            sync(),
            bind(b"p\xe9", name, &[]),
            execute(b"p\xe9"),
            sync(),
            close_statement(name),
            sync(),
            bind(b"", name, &[]),
            execute(b""),
            sync(),
        ],
        4,
    );
    assert_eq!(got.rows, vec![vec![Some(b"caf\xe9".to_vec())]]);
    let missing = b"prepared statement \"st\xe9\" does not exist".to_vec();
    assert_eq!(got.errors, vec![(b"26000".to_vec(), missing)]);
}

#[test]
fn copy_fail_with_latin1_text_fails_the_copy_and_the_session_goes_on() {
    let f = shared(); // held: the table lives in this fixture's cluster
    f.psql(&["CREATE TABLE IF NOT EXISTS t_copy_fail (v text)"]).unwrap();
    f.replicated(); // the count below may run on the replica
    let got = both(&[query(b"COPY t_copy_fail FROM STDIN"), msg(b'd', &[b"x\n"]), msg(b'f', &[b"abandon \xe9\0"])], 1);
    let message = b"COPY from stdin failed: abandon \xe9".to_vec();
    assert_eq!(got.errors, vec![(b"57014".to_vec(), message)]);
    // Outside COPY, PostgreSQL ignores a CopyFail.
    let got = both(&[msg(b'f', &[b"stray \xe9\0"]), query(b"SELECT count(*) FROM t_copy_fail")], 1);
    assert_eq!(got.rows, vec![vec![Some(b"0".to_vec())]]);
}

/// Logs in with a raw StartupMessage whose `application_name` is LATIN1; the first answer to
/// `SHOW application_name`, raw, or the login error.
fn login_latin1_name(addr: SocketAddr) -> Result<Raw, (Vec<u8>, Vec<u8>)> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
    let params: &[&[u8]] = &[
        b"user\0",
        USER.as_bytes(),
        b"\0database\0",
        DATABASE.as_bytes(),
        b"\0client_encoding\0LATIN1\0application_name\0caf\xe9\0\0",
    ];
    let body = [&[0u8, 3, 0, 0][..], &params.concat()].concat();
    s.write_all(&[&i32::try_from(body.len() + 4).unwrap().to_be_bytes()[..], &body].concat()).unwrap();
    let mut auth = ClientAuth::new(USER, Some(PASSWORD));
    loop {
        let (tag, body) = raw_message(&mut s);
        let mut raw = BytesMut::from(&[tag][..]);
        raw.extend_from_slice(&i32::try_from(body.len() + 4).unwrap().to_be_bytes());
        raw.extend_from_slice(&body);
        match tag {
            b'R' => {
                let (m, _) = BackendMessage::parse(&raw, &refract_pg::Limits::default()).unwrap().unwrap();
                let BackendMessage::Authentication(a) = m else { unreachable!() };
                if let ClientStep::Send(b) = auth.step(&a).unwrap() {
                    s.write_all(&b).unwrap();
                }
            }
            b'E' => {
                let field = |f: u8| {
                    body.split(|&b| b == 0).find(|x| x.first() == Some(&f)).map(|x| x[1..].to_vec()).unwrap_or_default()
                };
                return Err((field(b'C'), field(b'M')));
            }
            b'Z' => break,
            _ => {}
        }
    }
    Ok(run(&mut s, &[query(b"SHOW application_name"), query(b"SELECT 'caf\xe9'")], 2))
}

#[test]
fn a_latin1_startup_parameter_connects() {
    let f = shared();
    let direct = login_latin1_name(f.cluster.primary.addr()).unwrap();
    assert!(direct.rows[0][0].as_ref().unwrap().starts_with(b"caf"), "PostgreSQL itself: {direct:?}");
    let got = login_latin1_name(f.addr()).unwrap();
    assert_eq!(got.errors, vec![]);
    let name = got.rows[0][0].clone().unwrap();
    assert!(name.starts_with(b"caf") && name.len() > 3, "{name:?}");
    assert_eq!(got.rows[1], vec![Some(b"caf\xe9".to_vec())], "the client's encoding is in force");
    // Other clients keep their own name.
    let mut other = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    let mine = other.query("/* refract: route=primary */ SHOW application_name");
    assert!(!mine.value().starts_with("caf"), "{:?}", mine.value());
}

#[test]
fn a_sql_prepare_under_a_latin1_name_is_never_another_clients() {
    // One server connection: the second client gets the first's connection as soon as the
    // first is not pinned to it.
    let f = pg_common::Fixture::start("pool_size = 1\nmin_idle = 1");
    let mut a = latin1_client(f.addr());
    let made = run(&mut a, &[query(b"PREPARE q\xe9 AS SELECT 'mine'")], 1);
    assert!(made.errors.is_empty(), "{made:?}");
    let addr = f.addr();
    let other = std::thread::spawn(move || run(&mut latin1_client(addr), &[query(b"EXECUTE q\xe9")], 1));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mine = run(&mut a, &[query(b"EXECUTE q\xe9")], 1);
    assert_eq!(mine.rows, vec![vec![Some(b"mine".to_vec())]], "{mine:?}");
    // The first client leaves (its connection is reset): the second runs on it, and finds
    // no statement of that name.
    a.write_all(&msg(b'X', &[])).unwrap();
    drop(a);
    let other = other.join().unwrap();
    assert!(other.rows.is_empty(), "another client ran the statement: {other:?}");
    let codes: Vec<Vec<u8>> = other.errors.iter().map(|(code, _)| code.clone()).collect();
    assert_eq!(codes, vec![b"26000".to_vec()], "{other:?}");
}
