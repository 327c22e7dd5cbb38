//! The PostgreSQL front end's wire handling against a real primary + replica: protocol
//! negotiation with 3.2 clients, large rows relayed in bounded memory, non-UTF-8 client
//! encodings, and the login timeout.
#![allow(clippy::unwrap_used)]

use crate::pg_common;

use bytes::BytesMut;
use md5::{Digest, Md5};
use pg_common::{columns, raw_message, Client, Fixture};
use refract_pg::auth::{ClientAuth, ClientStep};
use refract_pg::{BackendMessage, FrontendMessage, Startup, StartupPacket};
use refract_testkit::{DATABASE, PASSWORD, USER};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

static SHARED: Mutex<Weak<Fixture>> = Mutex::new(Weak::new());

/// One cluster with refract in front for the tests of this file that run at the same time.
fn shared() -> Arc<Fixture> {
    crate::pg_common::shared_in(&SHARED, "")
}

/// Sends a StartupMessage asking for `protocol` with `extra` parameters; returns the raw bytes
/// of the first message the server answers with, and the client (mid-login).
fn start(addr: SocketAddr, protocol: i32, extra: &[(&str, &str)]) -> (Client, Vec<u8>) {
    let mut c = Client::raw(addr);
    let mut params = vec![("user".to_owned(), USER.to_owned()), ("database".to_owned(), DATABASE.to_owned())];
    params.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    let mut out = BytesMut::new();
    StartupPacket::Startup(Startup { protocol, params }).encode(&mut out);
    c.stream.write_all(&out).unwrap();
    let mut head = [0u8; 5];
    c.stream.read_exact(&mut head).unwrap();
    let len = usize::try_from(i32::from_be_bytes([head[1], head[2], head[3], head[4]])).unwrap();
    let mut first = head.to_vec();
    first.resize(len + 1, 0);
    c.stream.read_exact(&mut first[5..]).unwrap();
    (c, first)
}

/// Finishes a login started by [`start`] whose first answer was not the authentication request
/// (`pending`: that request, if it was).
fn finish_login(c: &mut Client, pending: Option<BackendMessage>) {
    let mut auth = ClientAuth::new(USER, Some(PASSWORD));
    let mut next = pending;
    loop {
        match next.take().or_else(|| c.recv()).expect("message during login") {
            BackendMessage::Authentication(a) => {
                if let ClientStep::Send(b) = auth.step(&a).unwrap() {
                    c.stream.write_all(&b).unwrap();
                }
            }
            BackendMessage::ErrorResponse(e) => panic!("login refused: {e:?}"),
            BackendMessage::ReadyForQuery(_) => return,
            _ => {}
        }
    }
}

/// NegotiateProtocolVersion: newest version 3.0 (196608), one unrecognised option `_pq_.x`.
const NEGOTIATE_3_0_PQ_X: &[u8] = b"v\0\0\0\x13\0\x03\0\0\0\0\0\x01_pq_.x\0";

#[test]
fn a_protocol_3_2_client_is_offered_3_0_and_told_its_unknown_options_as_postgresql_does() {
    let f = shared();
    let direct = start(f.cluster.primary.addr(), refract_pg::startup::PROTOCOL_3_2, &[("_pq_.x", "1")]).1;
    assert_eq!(direct, NEGOTIATE_3_0_PQ_X, "PostgreSQL itself (the fixture of this test)");
    let (mut c, first) = start(f.addr(), refract_pg::startup::PROTOCOL_3_2, &[("_pq_.x", "1")]);
    assert_eq!(first, direct, "refract answers as PostgreSQL does");
    finish_login(&mut c, None);
    assert_eq!(c.query("SELECT 41 + 1").value(), "42", "the session works at 3.0");
    // 3.0 without options: no negotiation, authentication comes first.
    let (mut c, first) = start(f.addr(), refract_pg::startup::PROTOCOL_3_0, &[]);
    assert_eq!(first[0], b'R');
    let (pending, _) = BackendMessage::parse(&first, &refract_pg::Limits::default()).unwrap().unwrap();
    finish_login(&mut c, Some(pending));
    // 3.0 with an option: negotiation too (version 3.0, the option refused).
    let (mut c, first) = start(f.addr(), refract_pg::startup::PROTOCOL_3_0, &[("_pq_.x", "y")]);
    assert_eq!(first, NEGOTIATE_3_0_PQ_X);
    finish_login(&mut c, None);
}

/// LATIN1 bytes of `text` (which must be in its repertoire).
fn latin1(text: &str) -> Vec<u8> {
    text.chars().map(|c| u8::try_from(u32::from(c)).unwrap()).collect()
}

/// What a query answered, as raw bytes: rows, and the SQLSTATE and message of an error.
type RawAnswer = (Vec<Vec<Option<Vec<u8>>>>, Option<(Vec<u8>, Vec<u8>)>);

/// Runs `sql` (bytes as they are, in whatever encoding); the answer as raw bytes.
fn raw_rows(c: &mut Client, sql: &[u8]) -> RawAnswer {
    let mut msg = vec![b'Q'];
    msg.extend_from_slice(&i32::try_from(sql.len() + 5).unwrap().to_be_bytes());
    msg.extend_from_slice(sql);
    msg.push(0);
    c.stream.write_all(&msg).unwrap();
    let (mut rows, mut error) = (vec![], None);
    loop {
        match raw_message(&mut c.stream) {
            (b'D', body) => rows.push(columns(&body)),
            (b'E', body) => {
                let field = |f: u8| {
                    body.split(|&b| b == 0).find(|x| x.first() == Some(&f)).map(|x| x[1..].to_vec()).unwrap_or_default()
                };
                error = Some((field(b'C'), field(b'M')));
            }
            (b'Z', _) => return (rows, error),
            _ => {}
        }
    }
}

#[test]
fn latin1_text_is_relayed_as_sent_and_answered_as_postgresql_answers() {
    let f = shared();
    let login = |addr| Client::connect_with(addr, USER, PASSWORD, &[("client_encoding", "LATIN1")]).unwrap();
    let (mut direct, mut through) = (login(f.cluster.primary.addr()), login(f.addr()));
    let queries = [
        latin1("SELECT 'café' AS v, length('café'), upper('été'), octet_length('é')"),
        latin1("SELECT 'é'::int"),
        latin1("SELECT E'\\xe9' = 'é', 'naïve' || chr(233)"),
    ];
    for q in &queries {
        let want = raw_rows(&mut direct, q);
        assert_eq!(raw_rows(&mut through, q), want, "{}", String::from_utf8_lossy(q));
    }
    let (rows, _) = raw_rows(&mut through, &queries[0]);
    assert_eq!(rows[0][0].as_deref(), Some(&b"caf\xe9"[..]), "LATIN1 bytes back");
    let (_, error) = raw_rows(&mut through, &queries[1]);
    let (code, message) = error.unwrap();
    assert_eq!((code, message), (b"22P02".to_vec(), b"invalid input syntax for type integer: \"\xe9\"".to_vec()));
    // Writes and reads with such text: the reads go to the primary (refract cannot read them).
    let ddl = raw_rows(&mut through, b"CREATE TABLE t_latin1 (v text); INSERT INTO t_latin1 VALUES ('\xe9t\xe9')");
    assert_eq!(ddl.1, None);
    let (rows, error) = raw_rows(&mut through, b"SELECT v, pg_is_in_recovery() FROM t_latin1 WHERE v = '\xe9t\xe9'");
    assert_eq!(error, None);
    assert_eq!(rows, vec![vec![Some(b"\xe9t\xe9".to_vec()), Some(b"f".to_vec())]]);
    // The session goes on, with plain text too.
    assert_eq!(through.query("SELECT 'still here'").value(), "still here");
    assert_eq!(through.query("SHOW client_encoding").value(), "LATIN1");
}

/// A non-UTF-8 SET is not tracked: the server connection it ran on is reset before another
/// client gets it, so no other client sees it.
#[test]
fn an_untracked_latin1_set_does_not_reach_other_clients() {
    let f = Fixture::start("pool_size = 1\nmin_idle = 1");
    let mut b = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    let app = "/* refract: route=primary */ SHOW application_name";
    let own_app = b.query(app).value().to_owned();
    let mut a = Client::connect_with(f.addr(), USER, PASSWORD, &[("client_encoding", "LATIN1")]).unwrap();
    let (rows, error) =
        raw_rows(&mut a, b"SET application_name = 'caf\xe9'; SET statement_timeout = '4567ms'; SHOW statement_timeout");
    assert_eq!((rows, error), (vec![vec![Some(b"4567ms".to_vec())]], None), "a's SET ran");
    for sql in ["/* refract: route=primary */ SHOW statement_timeout", "BEGIN; SHOW statement_timeout; COMMIT"] {
        let got = b.query(sql);
        assert_eq!((got.code(), got.value()), (None, "0"), "{sql}");
    }
    let got = b.query(app);
    assert_eq!(got.value(), own_app, "b's own application_name, not a's");
}

#[test]
fn a_client_that_never_finishes_login_is_closed_after_login_timeout_ms() {
    let f = Fixture::start("login_timeout_ms = 1500");
    for partial in [&b""[..], &b"\0\0\0\x28\0\x03\0\0user\0"[..]] {
        let mut s = TcpStream::connect(f.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(partial).unwrap();
        let t0 = Instant::now();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(1300) && waited < Duration::from_secs(6), "closed after {waited:?}");
        let (msg, _) = BackendMessage::parse(&got, &refract_pg::Limits::default()).unwrap().unwrap();
        let BackendMessage::ErrorResponse(e) = msg else { panic!("not an error: {msg:?}") };
        assert_eq!((e.code(), e.message()), (Some("08P01"), Some("login timed out")));
    }
    // A prompt login is not affected.
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    assert_eq!(c.query("SELECT 1").value(), "1");
}

/// A field from /proc/self/status, in bytes.
fn status_kib(field: &str) -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() * 1024
}

/// Reads `n` bytes from `s` in small pieces into `hash`.
fn hash_stream(s: &mut TcpStream, n: usize, hash: &mut Md5) {
    let (mut left, mut piece) = (n, vec![0u8; 64 * 1024]);
    while left > 0 {
        let k = left.min(piece.len());
        s.read_exact(&mut piece[..k]).unwrap();
        hash.update(&piece[..k]);
        left -= k;
    }
}

/// Runs `sql`, which returns one value (one row of one column, or COPY TO STDOUT data), reading
/// it in small pieces as it arrives (this client never holds it); returns its length and md5.
fn stream_one_value(addr: SocketAddr, sql: &str) -> (usize, String) {
    let c = Client::connect(addr, USER, PASSWORD).unwrap();
    let mut s = c.stream;
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut out = BytesMut::new();
    FrontendMessage::Query(sql.into()).encode(&mut out);
    s.write_all(&out).unwrap();
    let (mut total, mut hash) = (0, Md5::new());
    loop {
        let mut head = [0u8; 5];
        s.read_exact(&mut head).unwrap();
        let len = usize::try_from(i32::from_be_bytes([head[1], head[2], head[3], head[4]])).unwrap() - 4;
        match head[0] {
            b'D' => {
                let mut cols = [0u8; 6];
                s.read_exact(&mut cols).unwrap();
                let n = usize::try_from(i32::from_be_bytes([cols[2], cols[3], cols[4], cols[5]])).unwrap();
                assert_eq!((cols[..2].to_vec(), n), (vec![0, 1], len - 6), "one column");
                hash_stream(&mut s, n, &mut hash);
                total += n;
            }
            b'd' => {
                hash_stream(&mut s, len, &mut hash);
                total += len;
            }
            tag => {
                let mut body = vec![0u8; len];
                s.read_exact(&mut body).unwrap();
                assert_ne!(tag, b'E', "error: {}", String::from_utf8_lossy(&body));
                if tag == b'Z' {
                    return (total, format!("{:x}", hash.finalize()));
                }
            }
        }
    }
}

/// Four clients each read a 200 MiB row at once: refract relays them in pieces, so the
/// process (refract runs in it) grows by less than 64 MiB, and gives it back after.
#[test]
fn four_200_mib_rows_at_once_go_through_in_bounded_memory() {
    if !pg_common::alone("four_200_mib_rows_at_once_go_through_in_bounded_memory") {
        return;
    }
    let f = shared();
    const ROW: usize = 200 * 1024 * 1024;
    let value = |i: usize| format!("repeat(md5('client {i}'), {})", ROW / 32);
    let mut direct = Client::connect(f.cluster.primary.addr(), USER, PASSWORD).unwrap();
    let want: Vec<String> =
        (0..4).map(|i| direct.query(&format!("SELECT md5({})", value(i))).value().to_owned()).collect();
    // Warm up the path (pools, classifier) so that what follows measures the rows alone.
    assert_eq!(stream_one_value(f.addr(), "SELECT repeat('x', 1000)").0, 1000);
    let before = status_kib("VmRSS:");
    std::fs::write("/proc/self/clear_refs", "5").unwrap(); // resets VmHWM to the current RSS
    let readers: Vec<_> = (0..4)
        .map(|i| {
            let (addr, sql) = (f.addr(), format!("SELECT {}", value(i)));
            std::thread::spawn(move || stream_one_value(addr, &sql))
        })
        .collect();
    let got: Vec<(usize, String)> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let peak = status_kib("VmHWM:");
    let after = status_kib("VmRSS:");
    for (i, (len, md5)) in got.iter().enumerate() {
        assert_eq!((*len, md5.as_str()), (ROW, want[i].as_str()), "client {i}");
    }
    let mib = |b: usize| b / (1024 * 1024);
    assert!(peak < before + 64 * 1024 * 1024, "peak RSS {} MiB, {} MiB before", mib(peak), mib(before));
    assert!(after < before + 16 * 1024 * 1024, "RSS after {} MiB, {} MiB before", mib(after), mib(before));
}

/// COPY FROM STDIN with one 100 MiB line (one CopyData from psql), then COPY TO STDOUT of
/// it: both directions stream in bounded memory, the line arrives intact.
#[test]
fn a_100_mib_copy_line_goes_both_ways_in_bounded_memory() {
    if !pg_common::alone("a_100_mib_copy_line_goes_both_ways_in_bounded_memory") {
        return;
    }
    let f = shared();
    const LINE: usize = 100 * 1024 * 1024;
    const PATTERN: &str = "0123456789abcdef";
    let mut hash = Md5::new();
    (0..LINE / PATTERN.len()).for_each(|_| hash.update(PATTERN));
    let line_md5 = format!("{:x}", hash.clone().finalize());
    hash.update("\n");
    let copied_md5 = format!("{:x}", hash.finalize());
    f.psql(&["CREATE TABLE t_big_copy (v text)"]).unwrap();
    let before = status_kib("VmRSS:");
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let copy = format!(
        "yes {PATTERN} | tr -d '\\n' | head -c {LINE} | {{ cat; echo; }} | {} -h 127.0.0.1 -p {} -U {USER} -d {DATABASE} \
         -XAtq -v ON_ERROR_STOP=1 -c 'COPY t_big_copy FROM STDIN'",
        refract_testkit::tool("psql").unwrap().display(),
        f.port
    );
    let status = std::process::Command::new("sh").args(["-c", &copy]).env("PGPASSWORD", PASSWORD).status().unwrap();
    assert!(status.success(), "{copy}");
    let mut direct = Client::connect(f.cluster.primary.addr(), USER, PASSWORD).unwrap();
    let stored = direct.query("SELECT md5(v) || ' ' || length(v) FROM t_big_copy");
    assert_eq!(stored.value(), format!("{line_md5} {LINE}"), "the line as stored");
    let out = stream_one_value(f.addr(), "COPY t_big_copy TO STDOUT");
    assert_eq!(out, (LINE + 1, copied_md5), "the line as copied out");
    let peak = status_kib("VmHWM:");
    assert!(peak < before + 64 * 1024 * 1024, "peak RSS {} MiB, {} MiB before", peak >> 20, before >> 20);
}

/// libpq 18 asking for the newest protocol (3.2) through refract, as psycopg runs it. Needs a
/// Python whose psycopg has libpq 18 or newer: the one named by `REFRACT_TEST_PYTHON`, else the
/// driver venv `make test` sets up (`target/pyenv`, psycopg 3.3 with libpq 18), else `python3`;
/// skipped, saying so, without one.
#[test]
fn libpq_18_with_max_protocol_version_latest_connects_as_to_postgresql() {
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/pyenv/bin/python");
    let python = std::env::var("REFRACT_TEST_PYTHON").unwrap_or_else(|_| {
        if venv.exists() {
            venv.display().to_string()
        } else {
            "python3".into()
        }
    });
    let probe = std::process::Command::new(&python)
        .args(["-c", "import psycopg; print(psycopg.pq.version())"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<u32>().unwrap_or(0));
    match probe {
        Ok(v) if v >= 180_000 => {}
        other => {
            eprintln!("SKIPPED: no psycopg with libpq >= 18 in {python} ({other:?}); set REFRACT_TEST_PYTHON");
            return;
        }
    }
    let f = shared();
    let script = "import psycopg, sys\n\
                  with psycopg.connect(sys.argv[1]) as c:\n\
                  \x20   print(c.execute('SELECT 40 + 2').fetchone()[0], c.pgconn.protocol_version)";
    let run = |port: u16, max: &str| {
        let conninfo = format!(
            "host=127.0.0.1 port={port} user={USER} password={PASSWORD} dbname={DATABASE} max_protocol_version={max}"
        );
        let out = std::process::Command::new(&python).args(["-c", script, &conninfo]).output().unwrap();
        format!("{}{}", String::from_utf8_lossy(&out.stdout).trim(), String::from_utf8_lossy(&out.stderr).trim())
    };
    for max in ["latest", "3.2"] {
        let direct = run(f.cluster.primary.port, max);
        assert_eq!(direct, "42 3", "PostgreSQL 15 itself, max_protocol_version={max}");
        assert_eq!(run(f.port, max), direct, "through refract, max_protocol_version={max}");
    }
}

/// A StartupMessage for protocol 4.0 is refused as PostgreSQL refuses it (FATAL 0A000).
#[test]
fn a_protocol_4_client_is_refused_as_postgresql_refuses_it() {
    let f = shared();
    let refusal = |addr| {
        let (mut c, first) = start(addr, 4 << 16, &[]);
        let mut rest = Vec::new();
        let _ = c.stream.read_to_end(&mut rest);
        let (msg, _) = BackendMessage::parse(&first, &refract_pg::Limits::default()).unwrap().unwrap();
        let BackendMessage::ErrorResponse(e) = msg else { panic!("not an error: {msg:?}") };
        (e.severity().map(str::to_owned), e.code().map(str::to_owned), e.message().map(str::to_owned), rest.len())
    };
    let direct = refusal(f.cluster.primary.addr());
    assert_eq!(direct.1.as_deref(), Some("0A000"), "PostgreSQL itself: {direct:?}");
    assert_eq!(refusal(f.addr()), direct);
    // A bare 9.0 packet (no parameters at all) too.
    let bare = |addr| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&[0, 0, 0, 8, 0, 9, 0, 0]).unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        let (msg, _) = BackendMessage::parse(&got, &refract_pg::Limits::default()).unwrap().unwrap();
        let BackendMessage::ErrorResponse(e) = msg else { panic!("not an error: {msg:?}") };
        (e.code().map(str::to_owned), e.message().map(str::to_owned))
    };
    let direct = bare(f.cluster.primary.addr());
    assert_eq!(direct.0.as_deref(), Some("0A000"), "PostgreSQL itself: {direct:?}");
    assert_eq!(bare(f.addr()), direct);
}

/// The server connection dies while a large row streams through: the client's stream cannot be
/// completed, so refract closes it (no ErrorResponse spliced into the half-sent row), and
/// serves the next client.
#[test]
fn a_server_failing_mid_row_closes_the_client_and_nothing_else() {
    let f = shared();
    let c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    let mut s = c.stream;
    let sql = "/* refract: route=primary */ SELECT 'mid-row victim', repeat('y', 100 * 1024 * 1024)";
    let mut out = BytesMut::new();
    FrontendMessage::Query(sql.into()).encode(&mut out);
    s.write_all(&out).unwrap();
    let mut head = vec![0u8; 2 * 1024 * 1024];
    s.read_exact(&mut head).unwrap(); // RowDescription and the start of the DataRow
    let mut direct = Client::connect(f.cluster.primary.addr(), USER, PASSWORD).unwrap();
    let killed = direct.query(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE query LIKE '%mid-row victim%' AND pid <> pg_backend_pid()",
    );
    assert_eq!(killed.value(), "1");
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(head.len() + rest.len() < 100 * 1024 * 1024, "the row was cut, the connection closed");
    let tail = &rest[rest.len().saturating_sub(64)..];
    assert!(tail.iter().all(|&b| b == b'y'), "nothing but row bytes before the close: {tail:?}");
    let mut next = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    assert_eq!(next.query("/* refract: route=primary */ SELECT 7").value(), "7");
}

/// A client that leaves in the middle of a large CopyData (streamed to the server) ends its
/// own session only: nothing is counted against the server, which keeps serving.
#[test]
fn a_client_leaving_mid_copy_data_is_not_the_servers_fault() {
    let f = Fixture::start("");
    f.psql(&["CREATE TABLE t_copy_cut (v text)"]).unwrap();
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    c.send(&[FrontendMessage::Query("COPY t_copy_cut FROM STDIN".into())]);
    assert_eq!(c.recv().map(|m| m.tag()), Some(b'G'));
    let mut msg = vec![b'd'];
    msg.extend_from_slice(&(4 + 1024 * 1024i32).to_be_bytes());
    msg.extend_from_slice(&[b'x'; 256 * 1024]);
    c.stream.write_all(&msg).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(c);
    std::thread::sleep(Duration::from_millis(300));
    let metrics = f.metrics();
    assert!(!metrics.contains(r#"kind="pg_server""#), "counted as a server failure:\n{metrics}");
    assert_eq!(f.psql(&["INSERT INTO t_copy_cut VALUES ('next') RETURNING v"]).unwrap(), "next");
}

/// libpq's pipeline mode sends statements with neither Sync nor Flush and waits: PostgreSQL runs
/// each message as it arrives and flushes an error at once, so the client sees it before it
/// sends its Sync; refract runs what it holds once the client goes quiet.
#[test]
fn a_pipelined_error_comes_before_the_sync_as_on_postgresql() {
    let f = shared();
    let direct = pipeline_until_error(f.cluster.primary.addr());
    assert!(direct.ends_with('E'), "PostgreSQL sends the error before any Sync: {direct}");
    assert_eq!(pipeline_until_error(f.addr()), direct, "through refract as directly");
}

/// Sends two statements (the second fails) without Sync or Flush; returns the message types
/// received up to the error (within 2 s), after checking that the rest of the pipeline is
/// skipped up to its Sync and the session goes on.
fn pipeline_until_error(addr: SocketAddr) -> String {
    let mut c = Client::connect(addr, USER, PASSWORD).unwrap();
    let statement = |sql: &str| {
        vec![
            FrontendMessage::Parse { name: String::new(), query: sql.into(), param_types: vec![] },
            FrontendMessage::Bind(Default::default()),
            FrontendMessage::Execute { portal: String::new(), max_rows: 0 },
        ]
    };
    let mut msgs = statement("SELECT 1");
    msgs.extend(statement("SELECT 1/0"));
    let started = Instant::now();
    c.send(&msgs);
    let mut tags = String::new();
    loop {
        let m = c.recv().expect("the error arrives before any Sync");
        tags.push(char::from(m.tag()));
        if let BackendMessage::ErrorResponse(e) = &m {
            assert_eq!(e.code(), Some("22012"));
            break;
        }
    }
    assert!(started.elapsed() < Duration::from_secs(2), "within {:?}", started.elapsed());
    let mut more = statement("SELECT 2");
    more.push(FrontendMessage::Sync);
    c.send(&more);
    let a = c.until_ready();
    assert_eq!(a.tags, "Z", "skipped to the Sync: {a:?}");
    assert_eq!(c.query("SELECT 3").value(), "3");
    tags
}
