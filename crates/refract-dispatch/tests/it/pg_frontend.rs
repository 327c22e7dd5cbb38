//! The PostgreSQL front end against a real primary + streaming replica: routing, pinning,
//! SET replay, prepared statements in transaction mode, COPY, cancel, errors, bad input.
#![allow(clippy::unwrap_used)]

use crate::pg_common;

use bytes::BytesMut;
use pg_common::{shared, Client};
use refract_pg::frontend::{Bind, Target};
use refract_pg::FrontendMessage;
use refract_testkit::{PASSWORD, USER};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

#[test]
fn reads_go_to_the_replica_and_writes_to_the_primary() {
    let f = shared();
    let (primary, replica) = (f.cluster.primary.port, f.cluster.replica().port);
    let got = f.psql(&["SELECT pg_is_in_recovery(), inet_server_port()"]).unwrap();
    assert_eq!(got, format!("t|{replica}"));
    f.psql(&["CREATE TABLE t_route (port int)"]).unwrap();
    let got = f.psql(&["INSERT INTO t_route SELECT inet_server_port() RETURNING port"]).unwrap();
    assert_eq!(got, primary.to_string());
    f.replicated();
    let got = f.psql(&["SELECT port, pg_is_in_recovery() FROM t_route"]).unwrap();
    assert_eq!(got, format!("{primary}|t"), "the row written on the primary, read on the replica");
    let hinted = f.psql(&["/* refract: route=primary */ SELECT pg_is_in_recovery()"]).unwrap();
    assert_eq!(hinted, "f");
    let set = f.psql(&["SET refract.route = 'primary'", "SELECT pg_is_in_recovery()"]).unwrap();
    assert_eq!(set, "f");
}

#[test]
fn transactions_are_pinned_and_read_only_ones_may_use_the_replica() {
    let f = shared();
    let primary = f.cluster.primary.port.to_string();
    let got = f.psql(&["BEGIN", "SELECT pg_is_in_recovery()", "SELECT inet_server_port()", "COMMIT"]).unwrap();
    assert_eq!(got, format!("f\n{primary}"));
    let got = f.psql(&["BEGIN READ ONLY", "SELECT pg_is_in_recovery()", "COMMIT"]).unwrap();
    assert_eq!(got, "t");
    let got = f.psql(&["SELECT pg_is_in_recovery()", "BEGIN", "SELECT pg_is_in_recovery()", "ROLLBACK"]).unwrap();
    assert_eq!(got, "t\nf", "same session: a read outside, then the pinned transaction");
}

#[test]
fn nextval_runs_on_the_primary() {
    let f = shared();
    f.psql(&["CREATE SEQUENCE s_next"]).unwrap();
    f.replicated();
    assert_eq!(f.psql(&["SELECT nextval('s_next'), pg_is_in_recovery()"]).unwrap(), "1|f");
    assert_eq!(f.psql(&["SELECT nextval('s_next')"]).unwrap(), "2");
}

#[test]
fn set_follows_the_session_across_server_connections() {
    let f = shared();
    let got = f
        .psql(&[
            "SET application_name = 'refract_test'",
            "SHOW application_name",
            "BEGIN",
            "SELECT current_setting('application_name'), pg_is_in_recovery()",
            "COMMIT",
            "SET statement_timeout = '4321ms'",
            "SHOW statement_timeout",
        ])
        .unwrap();
    assert_eq!(got, "refract_test\nrefract_test|f\n4321ms");
    // Another session does not inherit them from the pooled connections.
    assert_eq!(f.psql(&["SHOW statement_timeout", "BEGIN", "SHOW statement_timeout", "COMMIT"]).unwrap(), "0\n0");
}

/// Two sessions with different SET state take turns on one server connection per server: each
/// sees its own values (startup `application_name`, SETs, a parameter only one has), by simple
/// query and by the extended protocol, in and out of transactions.
#[test]
fn sessions_taking_turns_on_one_connection_keep_their_own_settings() {
    let f = pg_common::Fixture::start("pool_size = 1\nmin_idle = 1");
    let connect = |app: &str| Client::connect_with(f.addr(), USER, PASSWORD, &[("application_name", app)]).unwrap();
    let (mut a, mut b) = (connect("client_a"), connect("client_b"));
    assert_eq!(a.query("SET search_path = a_schema, public").code(), None);
    assert_eq!(b.query("SET statement_timeout = '1234ms'").code(), None);
    let show = |c: &mut Client, sql: &str| {
        let got = c.query(sql);
        assert_eq!(got.error, None, "{sql}");
        got.rows.iter().map(|r| r[0].clone().unwrap_or_default()).collect::<Vec<_>>().join("|")
    };
    let extended = |c: &mut Client| {
        let parse = FrontendMessage::Parse {
            name: String::new(),
            query: "SELECT current_setting('application_name') || ' ' || current_setting('search_path')".into(),
            param_types: vec![],
        };
        let exec = FrontendMessage::Execute { portal: String::new(), max_rows: 0 };
        c.send(&[parse, FrontendMessage::Bind(Bind::default()), exec, FrontendMessage::Sync]);
        let got = c.until_ready();
        assert_eq!(got.error, None);
        got.value().to_owned()
    };
    for round in 0..3 {
        assert_eq!(show(&mut a, "SHOW application_name"), "client_a", "round {round}");
        assert_eq!(show(&mut b, "SHOW application_name"), "client_b", "round {round}");
        assert_eq!(show(&mut a, "SHOW search_path"), "a_schema, public", "round {round}");
        assert_eq!(show(&mut b, "SHOW search_path"), "\"$user\", public", "round {round}");
        assert_eq!(show(&mut a, "SHOW statement_timeout"), "0", "round {round}");
        assert_eq!(show(&mut b, "SHOW statement_timeout"), "1234ms", "round {round}");
        assert_eq!(extended(&mut a), "client_a a_schema, public", "round {round}");
        assert_eq!(extended(&mut b), "client_b \"$user\", public", "round {round}");
        // On the primary, in a transaction.
        assert_eq!(show(&mut a, "BEGIN; SHOW search_path; COMMIT"), "a_schema, public", "round {round}");
        assert_eq!(show(&mut b, "BEGIN; SHOW application_name; COMMIT"), "client_b", "round {round}");
    }
    // A change in a rolled-back transaction does not stick; a committed one does.
    assert_eq!(show(&mut a, "BEGIN; SET application_name = 'gone'; ROLLBACK"), "");
    assert_eq!(show(&mut b, "SHOW application_name"), "client_b");
    assert_eq!(show(&mut a, "SHOW application_name"), "client_a");
    assert_eq!(show(&mut a, "BEGIN; SET application_name = 'kept'; COMMIT"), "");
    assert_eq!(show(&mut b, "SHOW application_name"), "client_b");
    assert_eq!(show(&mut a, "SHOW application_name"), "kept");
    // RESET: back to the server's default for this session only.
    assert_eq!(show(&mut a, "RESET search_path"), "");
    assert_eq!(show(&mut a, "SHOW search_path"), "\"$user\", public");
    assert_eq!(show(&mut b, "SET search_path = b_schema"), "");
    assert_eq!(show(&mut a, "SHOW search_path"), "\"$user\", public");
    assert_eq!(show(&mut b, "SHOW search_path"), "b_schema");
}

#[test]
fn copy_in_and_out() {
    let f = shared();
    f.psql(&["CREATE TABLE t_copy (a int, b text)"]).unwrap();
    let rows: String = (1..=20_000).map(|i| format!("{i}\trow {i}\n")).collect();
    f.psql_as(USER, PASSWORD, &["COPY t_copy FROM STDIN"], Some(&rows)).unwrap();
    let out = f.psql(&["COPY t_copy TO STDOUT"]).unwrap();
    assert_eq!(out.lines().count(), 20_000);
    assert_eq!(out.lines().last(), Some("20000\trow 20000"));
    f.replicated();
    assert_eq!(f.psql(&["SELECT count(*), sum(a) FROM t_copy"]).unwrap(), "20000|200010000");
    // A COPY that fails on the server relays the error and leaves the session usable.
    let bad = f.psql_as(USER, PASSWORD, &["COPY t_copy FROM STDIN"], Some("x\ty\n"));
    assert!(bad.unwrap_err().contains("invalid input syntax"));
}

#[test]
fn prepared_statements_move_between_servers() {
    let f = shared();
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    let parse =
        FrontendMessage::Parse { name: "s1".into(), query: "SELECT pg_is_in_recovery()".into(), param_types: vec![] };
    c.send(&[parse, FrontendMessage::Describe(Target::Statement, "s1".into()), FrontendMessage::Sync]);
    assert_eq!(c.until_ready().tags, "1tTZ");
    let bind = || FrontendMessage::Bind(Bind { statement: "s1".into(), ..Bind::default() });
    let exec = FrontendMessage::Execute { portal: String::new(), max_rows: 0 };
    for _ in 0..3 {
        c.send(&[bind(), exec.clone(), FrontendMessage::Sync]);
        let a = c.until_ready();
        assert_eq!((a.tags.as_str(), a.value()), ("2DCZ", "t"), "{a:?}");
    }
    assert_eq!(c.query("BEGIN").code(), None);
    c.send(&[bind(), exec.clone(), FrontendMessage::Sync]);
    let a = c.until_ready();
    assert_eq!((a.tags.as_str(), a.value()), ("2DCZ", "f"), "prepared again on the primary: {a:?}");
    assert_eq!(c.query("COMMIT").code(), None);
    c.send(&[FrontendMessage::Close(Target::Statement, "s1".into()), FrontendMessage::Sync]);
    assert_eq!(c.until_ready().tags, "3Z");
    c.send(&[bind(), exec, FrontendMessage::Sync]);
    assert_eq!(c.until_ready().code(), Some("26000"), "closed: the server says it does not exist");
    // SQL-level PREPARE / EXECUTE too (a new session: the failed Bind above counted as a
    // write, so read-your-writes would keep this one on the primary for a moment).
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    assert_eq!(c.query("PREPARE q(int) AS SELECT $1 + 1, pg_is_in_recovery()").code(), None);
    let a = c.query("EXECUTE q(41)");
    assert_eq!((a.value(), a.rows[0][1].as_deref()), ("42", Some("t")), "{a:?}");
}

/// asyncpg's `copy_records_to_table`: Parse + Describe of a read, Flush (no Sync), then a COPY
/// on the same connection. The described read bound a replica; the COPY must still run on the
/// primary (it failed with 25006 "cannot execute COPY during recovery").
#[test]
fn a_write_after_a_flushed_describe_of_a_read_runs_on_the_primary() {
    let f = shared();
    f.psql(&["CREATE TABLE t_flush_copy (a int, b text)"]).unwrap();
    f.replicated();
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    for round in 0..3 {
        let parse = FrontendMessage::Parse {
            name: String::new(),
            query: "SELECT * FROM t_flush_copy LIMIT 1".into(),
            param_types: vec![],
        };
        c.send(&[parse, FrontendMessage::Describe(Target::Statement, String::new()), FrontendMessage::Flush]);
        let tags: String = (0..3).map(|_| c.recv().expect("answer").tag() as char).collect();
        assert_eq!(tags, "1tT", "round {round}: Parse, Describe answered before the COPY");
        c.send(&[FrontendMessage::Query("COPY t_flush_copy FROM STDIN".into())]);
        let first = c.recv().expect("answer to COPY");
        assert_eq!(first.tag(), b'G', "round {round}: CopyInResponse, got {first:?}");
        c.send(&[
            FrontendMessage::CopyData(bytes::Bytes::from(format!("{round}\trow {round}\n"))),
            FrontendMessage::CopyDone,
        ]);
        let a = c.until_ready();
        assert_eq!(a.tags, "CZ", "round {round}: {a:?}");
    }
    assert_eq!(c.query("SELECT count(*), pg_is_in_recovery() FROM t_flush_copy").value(), "3");
}

/// RESET of a parameter the client gave at startup goes back to the client's value, as on
/// PostgreSQL (pgjdbc: `RESET application_name` showed refract's own), by simple query and
/// through the extended protocol, and RESET ALL / DISCARD ALL too; in the same transaction and
/// in the next one.
#[test]
fn reset_goes_back_to_the_clients_startup_value() {
    let f = shared();
    let mut c = Client::connect_with(f.addr(), USER, PASSWORD, &[("application_name", "startup_app")]).unwrap();
    let show = |c: &mut Client| c.query("SHOW application_name").value().to_string();
    for reset in ["RESET application_name", "RESET ALL", "DISCARD ALL"] {
        assert_eq!(c.query("SET application_name = 'changed'").code(), None);
        assert_eq!(show(&mut c), "changed");
        assert_eq!(c.query(reset).code(), None, "{reset}");
        assert_eq!(show(&mut c), "startup_app", "after {reset}");
        if reset == "DISCARD ALL" {
            continue; // not allowed in a transaction block (25001)
        }
        assert_eq!(c.query("BEGIN").code(), None);
        assert_eq!(c.query("SET application_name = 'in_tx'").code(), None);
        assert_eq!(c.query(reset).code(), None, "{reset} in a transaction");
        assert_eq!(show(&mut c), "startup_app", "after {reset} in the same transaction");
        assert_eq!(c.query("COMMIT").code(), None);
        assert_eq!(show(&mut c), "startup_app", "after {reset}, committed");
    }
    // Through the extended protocol.
    assert_eq!(c.query("SET application_name = 'changed'").code(), None);
    let parse =
        FrontendMessage::Parse { name: String::new(), query: "RESET application_name".into(), param_types: vec![] };
    let bind = FrontendMessage::Bind(Bind { statement: String::new(), ..Bind::default() });
    let exec = FrontendMessage::Execute { portal: String::new(), max_rows: 0 };
    c.send(&[parse, bind, exec, FrontendMessage::Sync]);
    assert!(c.until_ready().error.is_none());
    assert_eq!(show(&mut c), "startup_app", "after an extended RESET");
}

/// The ParameterStatus set at login is the one PostgreSQL sends a direct connection with the
/// same startup settings (libpq sends `PGTZ`, `PGDATESTYLE`, `PGCLIENTENCODING` and `PGAPPNAME`
/// as `timezone`, `datestyle`, `client_encoding` and `application_name`): the server's spelling
/// of each value, `application_name` reported, empty when not given; `SHOW` agrees; a value
/// the server refuses at startup is refused with its SQLSTATE. Each set of settings logs in
/// twice (the second greeting is the one refract kept).
#[test]
fn login_parameter_status_is_the_servers_for_the_clients_settings() {
    let f = shared();
    let cases: &[&[(&str, &str)]] = &[
        &[],
        &[("application_name", "my_app")],
        &[("application_name", "")],
        &[("client_encoding", "utf-8")],
        &[("client_encoding", "euc-jp")],
        &[("timezone", "europe/rome")],
        &[("datestyle", "sql,dmy")],
        &[
            ("timezone", "europe/rome"),
            ("datestyle", "sql,dmy"),
            ("client_encoding", "euc-jp"),
            ("application_name", "a"),
        ],
        &[("datestyle", "postgres"), ("intervalstyle", "iso_8601"), ("extra_float_digits", "2")],
        &[("options", "-c DateStyle=german -c TimeZone=utc"), ("work_mem", "5000kB")],
    ];
    let sorted = |c: &Client| {
        let mut p = c.params.clone();
        p.sort();
        p
    };
    for extra in cases {
        let mut direct = Client::connect_with(f.cluster.primary.addr(), USER, PASSWORD, extra).unwrap();
        for login in ["asked", "kept"] {
            let mut through = Client::connect_with(f.addr(), USER, PASSWORD, extra).unwrap();
            assert_eq!(sorted(&through), sorted(&direct), "{login}: {extra:?}");
            for name in ["application_name", "client_encoding", "TimeZone", "DateStyle", "IntervalStyle"] {
                let show = format!("SHOW {name}");
                assert_eq!(through.query(&show).value(), direct.query(&show).value(), "{login}: {show} with {extra:?}");
            }
        }
    }
    for extra in [("client_encoding", "no_such_encoding"), ("timezone", "no/where"), ("datestyle", "sideways")] {
        let direct = Client::connect_with(f.cluster.primary.addr(), USER, PASSWORD, &[extra]).err();
        let through = Client::connect_with(f.addr(), USER, PASSWORD, &[extra]).err();
        let code = |e: Option<refract_pg::ErrorFields>| e.and_then(|e| e.code().map(str::to_owned));
        let want = code(direct);
        assert!(want.is_some(), "PostgreSQL refuses {extra:?}");
        assert_eq!(code(through), want, "{extra:?}");
    }
}

#[test]
fn pgbench_prepared_in_transaction_mode() {
    let f = shared();
    f.pgbench(&["-i", "-s", "1", "-q"]).unwrap();
    f.replicated();
    for args in [
        &["-M", "prepared", "-c", "4", "-j", "2", "-t", "50"][..],
        &["-M", "prepared", "-S", "-c", "4", "-j", "2", "-t", "200"],
    ] {
        let out = f.pgbench(args).unwrap();
        assert!(out.contains("number of failed transactions: 0"), "{out}");
    }
    let out = f.pgbench(&["-M", "extended", "-c", "2", "-t", "50"]).unwrap();
    assert!(out.contains("number of failed transactions: 0"), "{out}");
}

/// The BackendKeyData process id is above every real one (Linux pids are below 2^22) and still
/// cancels the client's statement.
#[test]
fn a_long_query_is_cancelled() {
    let f = shared();
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    assert!(c.key.0 >= 1 << 22, "pid {} could be a real process's", c.key.0);
    let other = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    assert_ne!(other.key.0, c.key.0);
    // Passed to the server, it names no backend (PostgreSQL warns and answers false).
    let a = c.query(&format!("/* refract: route=primary */ SELECT pg_terminate_backend({})", c.key.0));
    assert_eq!((a.value(), a.tags.contains('N')), ("f", true), "{a:?}");
    c.send(&[FrontendMessage::Query("SELECT pg_sleep(30)".into())]);
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    c.cancel(f.addr());
    let a = c.until_ready();
    assert_eq!(a.code(), Some("57014"), "{a:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(c.query("SELECT 1").value(), "1", "the session goes on");
}

#[test]
fn server_errors_are_relayed_with_their_sqlstate() {
    let f = shared();
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    assert_eq!(c.query("SELECT 1/0").code(), Some("22012"));
    assert_eq!(c.query("SELECT * FROM no_such_table").code(), Some("42P01"));
    assert_eq!(c.query("INSERT INTO no_such_table VALUES (1)").code(), Some("42P01"));
    assert_eq!(c.query("SELEC 1").code(), Some("42601"));
    let a = c.query("BEGIN; SELECT 1/0");
    assert_eq!((a.code(), a.status), (Some("22012"), Some(refract_pg::TxStatus::Failed)));
    assert_eq!(c.query("SELECT 1").code(), Some("25P02"), "still pinned to the failed transaction");
    assert_eq!(c.query("ROLLBACK").code(), None);
    let a = c.query("DO $$ BEGIN RAISE NOTICE 'hello'; END $$");
    assert!(a.tags.starts_with('N'), "notice relayed: {a:?}");
    assert_eq!(c.query("SELECT 41 + 1").value(), "42");
    let psql = f.psql(&["SELECT 1/0"]).unwrap_err();
    assert!(psql.contains("division by zero"), "{psql}");
}

#[test]
fn logins_with_each_method_and_bad_credentials() {
    let f = shared();
    assert_eq!(f.psql_as("md5user", "md5pass", &["SELECT 1"], None).unwrap(), "1");
    assert_eq!(f.psql_as("trusted", "", &["SELECT 2"], None).unwrap(), "2");
    let wrong = Client::connect(f.addr(), USER, "wrong").err().unwrap();
    assert_eq!(wrong.code(), Some("28P01"));
    let unknown = Client::connect(f.addr(), "nobody_here", "x").err().unwrap();
    assert_eq!(unknown.code(), Some("28P01"));
    let md5_wrong = f.psql_as("md5user", "nope", &["SELECT 1"], None).unwrap_err();
    assert!(md5_wrong.contains("password authentication failed"), "{md5_wrong}");
}

/// Sends raw bytes on a fresh connection; returns what came back until close.
fn raw_exchange(f: &pg_common::Fixture, bytes: &[u8]) -> Vec<u8> {
    let mut c = Client::raw(f.addr());
    c.stream.write_all(bytes).unwrap();
    let _ = c.stream.shutdown(std::net::Shutdown::Write);
    let mut got = vec![];
    let _ = c.stream.read_to_end(&mut got);
    got
}

fn error_code(bytes: &[u8]) -> Option<String> {
    let (msg, _) = refract_pg::BackendMessage::parse(bytes, &Default::default()).ok()??;
    match msg {
        refract_pg::BackendMessage::ErrorResponse(e) => e.code().map(str::to_owned),
        _ => None,
    }
}

#[test]
fn bad_input_gets_an_error_and_never_a_panic() {
    let f = shared();
    // Negative length, absurd length, unsupported protocol, truncated packet.
    assert_eq!(error_code(&raw_exchange(&f, &[0xff, 0xff, 0xff, 0xf0, 0, 3, 0, 0])).as_deref(), Some("08P01"));
    assert_eq!(error_code(&raw_exchange(&f, &[0x7f, 0, 0, 0, 0, 3, 0, 0])).as_deref(), Some("08P01"));
    // Protocol 9.0: PostgreSQL's own refusal (pg_wire compares it with PostgreSQL's).
    assert_eq!(error_code(&raw_exchange(&f, &[0, 0, 0, 8, 0, 9, 0, 0])).as_deref(), Some("0A000"));
    assert!(raw_exchange(&f, &[0, 0, 0, 40, 0, 3, 0, 0, b'u']).is_empty(), "truncated: closed quietly");
    // SSLRequest is refused with 'N', then a bad startup.
    let got = raw_exchange(&f, &[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f, 0, 0, 0, 9, 0, 3, 0, 0, 0]);
    assert_eq!(got.first(), Some(&b'N'));
    assert_eq!(error_code(&got[1..]).as_deref(), Some("28000"), "no user name");
    // A wrong database.
    let mut out = BytesMut::new();
    let params = vec![("user".into(), USER.into()), ("database".into(), "nope".into())];
    refract_pg::StartupPacket::Startup(refract_pg::Startup { protocol: 196_608, params }).encode(&mut out);
    assert_eq!(error_code(&raw_exchange(&f, &out)).as_deref(), Some("3D000"));
    // After login: a message with a broken length, and a Query without its terminator.
    for bad in [&b"Q\0\0\0\x02"[..], &b"Q\0\0\0\x07abc"[..]] {
        let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
        c.stream.write_all(bad).unwrap();
        let msg = c.recv();
        assert!(
            matches!(&msg, Some(refract_pg::BackendMessage::ErrorResponse(e)) if e.code() == Some("08P01")),
            "{msg:?}"
        );
        assert!(c.recv().is_none(), "closed after a protocol violation");
    }
    assert_eq!(f.psql(&["SELECT 'still serving'"]).unwrap(), "still serving");
}

/// Whether `python3 -c "import psycopg2"` works; says why not otherwise.
fn psycopg2_available() -> bool {
    match std::process::Command::new("python3").args(["-c", "import psycopg2"]).output() {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            eprintln!("skipped: psycopg2 is not importable: {}", String::from_utf8_lossy(&o.stderr).trim());
            false
        }
        Err(e) => {
            eprintln!("skipped: python3 cannot be run: {e}");
            false
        }
    }
}

#[test]
fn psycopg2_routes_parameters_transactions_and_errors() {
    if !psycopg2_available() {
        return;
    }
    let f = shared();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/pg_common/psycopg_check.py");
    let ports = [f.port, f.cluster.primary.port, f.cluster.replica().port].map(|p| p.to_string());
    let out = std::process::Command::new("python3").arg(script).args(&ports).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "psycopg2 script failed:\n{stdout}\n{stderr}");
    assert!(stdout.trim_end().ends_with("done"), "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("ok ")).count(), 9, "{stdout}");
}

#[test]
fn session_mode_keeps_session_state_and_resets_it_after() {
    let f = shared();
    let primary = f.cluster.primary.port.to_string();
    let default_work_mem = f.psql(&["SHOW work_mem"]).unwrap();
    let mut c = Client::connect(f.addr(), "sessionuser", "sessionpass").unwrap();
    for sql in [
        "CREATE TEMP TABLE tt_session AS SELECT 7 AS x",
        "SET work_mem = '7MB'",
        "BEGIN",
        "DECLARE held CURSOR WITH HOLD FOR SELECT g FROM generate_series(1, 3) g",
        "COMMIT",
        "SELECT pg_advisory_lock(4242)",
    ] {
        assert_eq!(c.query(sql).code(), None, "{sql}");
    }
    // Later statements, outside any transaction, still see the session's state.
    assert_eq!(c.query("SELECT x FROM tt_session").value(), "7");
    assert_eq!(c.query("SHOW work_mem").value(), "7MB");
    assert_eq!(c.query("FETCH 2 FROM held").rows.len(), 2);
    let a = c.query("SELECT pg_is_in_recovery(), inet_server_port()");
    assert_eq!((a.value(), a.rows[0][1].as_deref()), ("f", Some(primary.as_str())), "reads stay on the primary");
    // The advisory lock is the session's: another session cannot take it meanwhile.
    assert_eq!(f.psql(&["SELECT pg_try_advisory_lock(4242)"]).unwrap(), "f");
    // A transaction-mode user goes on routing per statement.
    assert_eq!(f.psql(&["SELECT pg_is_in_recovery()"]).unwrap(), "t");
    let pid = c.query("SELECT pg_backend_pid()").value().to_owned();
    assert_eq!(c.query("SELECT pg_backend_pid()").value(), pid, "one server connection throughout");
    c.send(&[FrontendMessage::Terminate]);
    assert!(c.recv().is_none());
    // After the session: DISCARD ALL released the lock and dropped its temp table and SETs.
    let deadline = Instant::now() + Duration::from_secs(10);
    let take_and_give = "SELECT CASE WHEN pg_try_advisory_lock(4242) THEN pg_advisory_unlock(4242) ELSE false END";
    while f.psql(&[take_and_give]).unwrap() != "t" {
        assert!(Instant::now() < deadline, "the advisory lock was never released");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut c = Client::connect(f.addr(), "sessionuser", "sessionpass").unwrap();
    assert_eq!(c.query("SELECT x FROM tt_session").code(), Some("42P01"));
    assert_eq!(c.query("SHOW work_mem").value(), default_work_mem);
    let got = f.psql_as("sessionuser", "sessionpass", &["SELECT pg_is_in_recovery()"], None).unwrap();
    assert_eq!(got, "f");
}

#[test]
fn admin_views_show_pools_clients_and_servers() {
    let f = shared();
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    assert_eq!(c.query("BEGIN").code(), None);
    assert_eq!(c.query("SELECT 1").value(), "1");
    let port = c.stream.local_addr().unwrap().to_string();
    let clients = f.admin_json("/pg/clients");
    let me = clients.as_array().unwrap().iter().find(|x| x["remote"] == port.as_str()).unwrap().clone();
    assert_eq!(me["user"], USER);
    assert_eq!(me["database"], "postgres");
    assert_eq!(me["pool_mode"], "transaction");
    assert_eq!(me["state"], "in-transaction");
    assert_eq!(me["server"], "primary");
    assert_eq!(me["tls"], false);
    assert!(me["id"].as_u64().is_some(), "{me}");

    let pools = f.admin_json("/pg/pools");
    let primary = pools.as_array().unwrap().iter().find(|p| p["name"] == "primary").unwrap().clone();
    assert_eq!(primary["address"], f.cluster.primary.addr().to_string());
    assert_eq!((primary["role"].as_str(), primary["healthy"].as_bool()), (Some("primary"), Some(true)));
    assert!(primary["busy"].as_u64().unwrap() >= 1, "{primary}");
    for key in ["idle", "waiting"] {
        assert!(primary[key].as_u64().is_some(), "{key}: {primary}");
    }
    assert_eq!(primary["pool_size"], 20);

    // The first probe may still be under way when this test starts.
    let deadline = Instant::now() + Duration::from_secs(10);
    let replica = loop {
        let servers = f.admin_json("/pg/servers");
        let replica = servers.as_array().unwrap().iter().find(|s| s["role"] == "replica").unwrap().clone();
        if replica["last_check_unix_ms"].as_u64().unwrap() > 1_600_000_000_000 {
            break replica;
        }
        assert!(Instant::now() < deadline, "never probed: {replica}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(replica["address"], f.cluster.replica().addr().to_string());
    assert_eq!(replica["healthy"], true);
    assert!(replica["lag_bytes"].as_u64().is_some() && replica["lag_seconds"].as_f64().is_some(), "{replica}");

    assert_eq!(c.query("COMMIT").code(), None);
    // The session releases its connection just after relaying ReadyForQuery: allow a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let clients = f.admin_json("/pg/clients");
        let me = clients.as_array().unwrap().iter().find(|x| x["remote"] == port.as_str()).unwrap().clone();
        if (me["state"].as_str(), me["server"].is_null()) == (Some("idle"), true) {
            break;
        }
        assert!(Instant::now() < deadline, "still bound after COMMIT: {me}");
        std::thread::sleep(Duration::from_millis(20));
    }

    let metrics = f.metrics();
    for want in [
        r#"refract_pg_pool_idle{backend="primary"}"#,
        r#"refract_pg_pool_busy{backend="replica"}"#,
        r#"refract_pg_pool_waiting{backend="primary"}"#,
        r#"refract_pg_clients{state="idle"}"#,
        r#"refract_pg_replica_lag_seconds{backend="replica"}"#,
        r#"refract_pg_replica_lag_bytes{backend="replica"}"#,
    ] {
        assert!(metrics.contains(want), "{want} missing from {metrics}");
    }
}
