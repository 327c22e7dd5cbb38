//! Prepared-statement identity through refract in transaction mode, against a real primary +
//! replica with one server connection per server, so clients take turns on it: the unnamed
//! statement, statements under different `search_path`s, and SQL `PREPARE` / `EXECUTE` /
//! `DEALLOCATE [ALL]` answered exactly as PostgreSQL answers them (compared with a direct
//! connection to the primary).
#![allow(clippy::unwrap_used)]

use crate::pg_common;

use bytes::Bytes;
use pg_common::{Answer, Client, Fixture};
use refract_pg::frontend::{Bind, Target};
use refract_pg::FrontendMessage;
use refract_testkit::{self as testkit, DATABASE, PASSWORD, USER};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, Weak};

static SHARED: Mutex<Weak<Fixture>> = Mutex::new(Weak::new());

/// refract with one connection per server (shared by the tests of this binary running at once).
fn fixture() -> Arc<Fixture> {
    crate::pg_common::shared_in(&SHARED, "pool_size = 1\nmin_idle = 1")
}

fn connect(f: &Fixture) -> Client {
    Client::connect(f.addr(), USER, PASSWORD).unwrap()
}

/// A client connected to the primary directly, to see what PostgreSQL itself answers.
fn direct(f: &Fixture) -> Client {
    Client::connect(f.cluster.primary.addr(), USER, PASSWORD).unwrap()
}

fn parse(name: &str, query: &str) -> FrontendMessage {
    FrontendMessage::Parse { name: name.into(), query: query.into(), param_types: vec![] }
}

fn bind(statement: &str, params: &[&str]) -> FrontendMessage {
    FrontendMessage::Bind(Bind {
        portal: String::new(),
        statement: statement.into(),
        param_formats: vec![],
        params: params.iter().map(|p| Some(Bytes::from(p.to_string()))).collect(),
        result_formats: vec![],
    })
}

fn execute() -> FrontendMessage {
    FrontendMessage::Execute { portal: String::new(), max_rows: 0 }
}

fn run(c: &mut Client, msgs: &[FrontendMessage]) -> Answer {
    c.send(msgs);
    c.until_ready()
}

/// Bind of the unnamed statement, Execute, Sync: what a driver sends after preparing it.
fn bind_execute(c: &mut Client, params: &[&str]) -> Answer {
    run(c, &[bind("", params), execute(), FrontendMessage::Sync])
}

fn error_of(a: &Answer) -> (Option<String>, Option<String>) {
    let e = a.error.as_ref();
    (e.and_then(|e| e.code()).map(str::to_owned), e.and_then(|e| e.message()).map(str::to_owned))
}

/// pgx `QueryExecModeDescribeExec`, libpq `PQprepare(conn, "")` + `PQexecPrepared`: Parse and
/// Describe in one Sync, Bind and Execute in the next. Another client's unnamed statement,
/// parsed on the same server connection in between (with another parameter count), must not
/// be what runs.
#[test]
fn unnamed_statement_is_the_clients_own_across_syncs() {
    let f = fixture();
    let (mut y, mut x) = (connect(&f), connect(&f));
    for round in 0..3 {
        let a = run(
            &mut y,
            &[
                parse("", "SELECT 'y:' || $1::text"),
                FrontendMessage::Describe(Target::Statement, "".into()),
                FrontendMessage::Sync,
            ],
        );
        assert_eq!((a.code(), a.tags.as_str()), (None, "1tTZ"), "round {round}: {a:?}");
        let a = run(
            &mut x,
            &[
                parse("", "SELECT 'x:' || $1::text || $2::text"),
                bind("", &["1", "2"]),
                execute(),
                FrontendMessage::Sync,
            ],
        );
        assert_eq!((a.code(), a.value()), (None, "x:12"), "round {round}: {a:?}");
        let a = bind_execute(&mut y, &["1"]);
        assert_eq!((a.code(), a.value()), (None, "y:1"), "round {round}: Y runs its own statement: {a:?}");
        // Describe of the unnamed statement in a later Sync describes Y's (one parameter).
        let a = run(&mut x, &[parse("", "SELECT $1::int, $2::int, $3::int"), FrontendMessage::Sync]);
        assert_eq!(a.code(), None);
        y.send(&[FrontendMessage::Describe(Target::Statement, "".into()), FrontendMessage::Sync]);
        let first = y.recv().unwrap();
        assert!(
            matches!(&first, refract_pg::BackendMessage::ParameterDescription(p) if p.len() == 1),
            "round {round}: {first:?}"
        );
        assert_eq!(y.until_ready().code(), None);
    }
}

/// The silent variant: the other client's statement takes as many parameters, so before the
/// fix Y got X's rows without an error.
#[test]
fn unnamed_statement_with_the_same_parameter_count_gives_the_clients_own_rows() {
    let f = fixture();
    let (mut y, mut x) = (connect(&f), connect(&f));
    for round in 0..3 {
        let a = run(&mut y, &[parse("", "SELECT 'y:' || $1::text"), FrontendMessage::Sync]);
        assert_eq!(a.code(), None, "round {round}");
        let a =
            run(&mut x, &[parse("", "SELECT 'x:' || $1::text"), bind("", &["7"]), execute(), FrontendMessage::Sync]);
        assert_eq!((a.code(), a.value()), (None, "x:7"), "round {round}: {a:?}");
        let a = bind_execute(&mut y, &["1"]);
        assert_eq!((a.code(), a.value()), (None, "y:1"), "round {round}: {a:?}");
        let a = bind_execute(&mut x, &["8"]);
        assert_eq!((a.code(), a.value()), (None, "x:8"), "round {round}: {a:?}");
    }
}

/// A Bind of the unnamed statement by a client that never parsed one fails as on PostgreSQL
/// (26000), even when the server connection holds another client's unnamed statement.
#[test]
fn bind_of_an_unnamed_statement_never_parsed_is_26000() {
    let f = fixture();
    let want = bind_execute(&mut direct(&f), &[]);
    assert_eq!(error_of(&want), (Some("26000".into()), Some("unnamed prepared statement does not exist".into())));
    // X's unnamed statement on the primary, where a Bind of a statement refract does not know
    // is sent (it may write).
    let mut x = connect(&f);
    let sql = "/* refract: route=primary */ SELECT 'x'";
    let a = run(&mut x, &[parse("", sql), bind("", &[]), execute(), FrontendMessage::Sync]);
    assert_eq!(a.value(), "x");
    let mut y = connect(&f);
    let got = bind_execute(&mut y, &[]);
    assert_eq!((error_of(&got), got.rows.len()), (error_of(&want), 0), "{got:?}");
    let got = run(&mut y, &[FrontendMessage::Describe(Target::Statement, "".into()), FrontendMessage::Sync]);
    assert_eq!(error_of(&got), error_of(&want), "{got:?}");
}

/// A simple query drops the unnamed statement (PostgreSQL's `exec_simple_query`), even one
/// that runs on another server; so does a failed Parse of it and a Close.
#[test]
fn the_unnamed_statement_lives_until_a_simple_query_close_or_failed_parse() {
    let f = fixture();
    let cases: [(&str, &[FrontendMessage]); 3] = [
        ("simple query on the primary", &[FrontendMessage::Query("/* refract: route=primary */ SELECT 1".into())]),
        ("failed parse", &[parse("", "SELEC 1"), FrontendMessage::Sync]),
        ("close", &[FrontendMessage::Close(Target::Statement, "".into()), FrontendMessage::Sync]),
    ];
    for (what, msgs) in cases {
        let mut outcomes = vec![];
        for c in [&mut direct(&f), &mut connect(&f)] {
            assert_eq!(run(c, &[parse("", "SELECT 'kept'"), FrontendMessage::Sync]).code(), None);
            let between = run(c, msgs);
            let a = bind_execute(c, &[]);
            outcomes.push((between.code().map(str::to_owned), error_of(&a), a.value().to_owned()));
        }
        assert_eq!(outcomes[1], outcomes[0], "{what}: refract answers as PostgreSQL");
        assert_eq!(outcomes[1].1 .0.as_deref(), Some("26000"), "{what}");
    }
    // And without any of those it lives on, across Syncs.
    let mut c = connect(&f);
    assert_eq!(run(&mut c, &[parse("", "SELECT 'kept'"), FrontendMessage::Sync]).code(), None);
    for _ in 0..3 {
        assert_eq!(bind_execute(&mut c, &[]).value(), "kept");
    }
}

/// Schema-per-tenant: the same SQL prepared by two clients whose `search_path`s name tables
/// with different column types, on one server connection. Each gets its own rows; before,
/// they shared one server-side statement and the second got `0A000 cached plan must not
/// change result type`.
#[test]
fn the_same_statement_under_two_search_paths() {
    let f = fixture();
    f.psql(&[
        "CREATE SCHEMA sp_a",
        "CREATE TABLE sp_a.t (v int)",
        "INSERT INTO sp_a.t VALUES (1)",
        "CREATE SCHEMA sp_b",
        "CREATE TABLE sp_b.t (v text)",
        "INSERT INTO sp_b.t VALUES ('b')",
    ])
    .unwrap();
    f.replicated();
    let (mut a, mut b) = (connect(&f), connect(&f));
    assert_eq!(a.query("SET search_path = sp_a").code(), None);
    assert_eq!(b.query("SET search_path = sp_b").code(), None);
    for (c, want) in [(&mut a, "1"), (&mut b, "b")] {
        let got = run(c, &[parse("s", "SELECT v FROM t"), bind("s", &[]), execute(), FrontendMessage::Sync]);
        assert_eq!((got.code(), got.value()), (None, want), "{got:?}");
        assert_eq!(c.query("PREPARE p AS SELECT v FROM t").code(), None);
    }
    for round in 0..3 {
        for (c, want) in [(&mut a, "1"), (&mut b, "b")] {
            let got = run(c, &[bind("s", &[]), execute(), FrontendMessage::Sync]);
            assert_eq!((got.code(), got.value()), (None, want), "round {round}, protocol: {got:?}");
            let got = c.query("EXECUTE p");
            assert_eq!((got.code(), got.value()), (None, want), "round {round}, SQL: {got:?}");
        }
    }
}

/// psql (`-f -`) on `port`, stdout and stderr together, without stopping at errors.
fn psql_script(port: u16, script: &str) -> String {
    let out = tempfile_path();
    let file = std::fs::File::create(&out).unwrap();
    let mut child = Command::new(testkit::tool("psql").unwrap())
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", USER, "-d", DATABASE, "-XAtq", "-f", "-"])
        .env("PGPASSWORD", PASSWORD)
        .stdin(Stdio::piped())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), script.as_bytes()).unwrap();
    child.wait().unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    text
}

fn tempfile_path() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("refract-pg-statements-{}-{n}.out", std::process::id()))
}

/// Runs `script` with psql directly on the primary and through refract; the outputs (rows,
/// error messages and `LAST_ERROR_SQLSTATE`) must be the same. Returns refract's.
fn same_as_postgres(f: &Fixture, script: &str) -> String {
    let want = psql_script(f.cluster.primary.port, script);
    let got = psql_script(f.port, script);
    assert_eq!(got, want, "through refract vs PostgreSQL for:\n{script}");
    got
}

#[test]
fn execute_after_deallocate_is_26000() {
    let f = fixture();
    let out = same_as_postgres(
        &f,
        "PREPARE q AS SELECT 1;\nDEALLOCATE q;\nEXECUTE q;\n\\echo :LAST_ERROR_SQLSTATE\n\
         PREPARE q AS SELECT 2;\nEXECUTE q;\n",
    );
    assert_eq!(out.lines().filter(|l| *l == "26000").count(), 1, "{out}");
    assert!(out.contains("prepared statement \"q\" does not exist"), "{out}");
    assert!(out.ends_with("2\n"), "{out}");
}

#[test]
fn a_second_prepare_of_a_name_is_42p05() {
    let f = fixture();
    let out = same_as_postgres(
        &f,
        "PREPARE q AS SELECT 1;\nPREPARE q AS SELECT 2;\n\\echo :LAST_ERROR_SQLSTATE\nEXECUTE q;\n\
         BEGIN;\nPREPARE q AS SELECT 3;\n\\echo :LAST_ERROR_SQLSTATE\nSELECT 4;\n\\echo :LAST_ERROR_SQLSTATE\n\
         ROLLBACK;\nEXECUTE q;\n",
    );
    assert_eq!(out.lines().filter(|l| *l == "42P05").count(), 2, "{out}");
    assert!(out.contains("prepared statement \"q\" already exists"), "{out}");
    assert!(out.contains("\n25P02\n"), "the transaction failed: {out}");
    assert!(out.ends_with("1\n"), "{out}");
}

#[test]
fn deallocate_of_an_unknown_name_is_26000() {
    let f = fixture();
    let out = same_as_postgres(
        &f,
        "DEALLOCATE nope;\n\\echo :LAST_ERROR_SQLSTATE\nPREPARE q AS SELECT 1;\nDEALLOCATE q;\nDEALLOCATE q;\n\
         \\echo :LAST_ERROR_SQLSTATE\nBEGIN;\nDEALLOCATE nope;\nSELECT 1;\n\\echo :LAST_ERROR_SQLSTATE\nROLLBACK;\n",
    );
    assert_eq!(out.lines().filter(|l| *l == "26000").count(), 2, "{out}");
    assert!(out.contains("prepared statement \"nope\" does not exist"), "{out}");
    assert!(out.contains("\n25P02\n"), "{out}");
}

/// `DEALLOCATE ALL` drops every prepared statement of the session: SQL ones and the ones
/// prepared with Parse.
#[test]
fn deallocate_all_drops_every_prepared_statement() {
    let f = fixture();
    let out = same_as_postgres(
        &f,
        "PREPARE q AS SELECT 1;\nPREPARE r AS SELECT 2;\nEXECUTE q;\nDEALLOCATE ALL;\nEXECUTE q;\n\
         \\echo :LAST_ERROR_SQLSTATE\nEXECUTE r;\n\\echo :LAST_ERROR_SQLSTATE\nPREPARE q AS SELECT 3;\nEXECUTE q;\n",
    );
    assert_eq!(out.lines().filter(|l| *l == "26000").count(), 2, "{out}");
    assert!(out.ends_with("3\n"), "{out}");
    let mut outcomes = vec![];
    for c in [&mut direct(&f), &mut connect(&f)] {
        assert_eq!(run(c, &[parse("s1", "SELECT 1"), FrontendMessage::Sync]).code(), None);
        assert_eq!(c.query("PREPARE q AS SELECT 1").code(), None);
        assert_eq!(c.query("DEALLOCATE ALL").code(), None);
        let bound = run(c, &[bind("s1", &[]), execute(), FrontendMessage::Sync]);
        let executed = c.query("EXECUTE s1");
        let sql = run(c, &[bind("q", &[]), execute(), FrontendMessage::Sync]);
        outcomes.push((error_of(&bound), error_of(&executed), error_of(&sql)));
    }
    assert_eq!(outcomes[1], outcomes[0]);
    assert_eq!(outcomes[1].0 .0.as_deref(), Some("26000"));
}

/// SQL-prepared names are the client's own: on a shared server connection a client never
/// EXECUTEs (or Binds) a statement another client PREPAREd under that name.
#[test]
fn sql_prepared_names_belong_to_their_client() {
    let f = fixture();
    let (mut a, mut b, mut c) = (connect(&f), connect(&f), connect(&f));
    assert_eq!(a.query("PREPARE own AS SELECT 'a'").code(), None);
    assert_eq!(a.query("EXECUTE own").value(), "a");
    let got = b.query("EXECUTE own");
    assert_eq!((got.code(), got.rows.len()), (Some("26000"), 0), "{got:?}");
    let got = run(&mut c, &[bind("own", &[]), execute(), FrontendMessage::Sync]);
    assert_eq!((got.code(), got.rows.len()), (Some("26000"), 0), "{got:?}");
    assert_eq!(b.query("PREPARE own AS SELECT 'b'").code(), None);
    for _ in 0..2 {
        assert_eq!(b.query("EXECUTE own").value(), "b");
        assert_eq!(a.query("EXECUTE own").value(), "a");
        assert_eq!(run(&mut b, &[bind("own", &[]), execute(), FrontendMessage::Sync]).value(), "b");
        assert_eq!(run(&mut a, &[bind("own", &[]), execute(), FrontendMessage::Sync]).value(), "a");
    }
}

/// `EXECUTE q(...)` sent through the extended protocol (asyncpg's `fetchval("EXECUTE q(1)")`,
/// a named Parse of that text, then Binds of it): each client runs its own `q`, also when the
/// clients take turns on one server connection and share the server-side `EXECUTE` statement.
#[test]
fn execute_of_a_sql_name_through_the_extended_protocol_runs_the_clients_own() {
    let f = fixture();
    let (mut a, mut b) = (connect(&f), connect(&f));
    assert_eq!(a.query("PREPARE xq (int) AS SELECT $1 + 100").code(), None);
    assert_eq!(b.query("PREPARE xq (int) AS SELECT $1 + 200").code(), None);
    for round in 0..3 {
        for (c, base) in [(&mut a, 100), (&mut b, 200)] {
            let got = run(
                c,
                &[
                    parse("drv", &format!("EXECUTE xq ({round})")),
                    FrontendMessage::Describe(Target::Statement, "drv".into()),
                    FrontendMessage::Sync,
                ],
            );
            assert_eq!(got.code(), None, "round {round}, Parse + Describe: {got:?}");
            let got = run(c, &[bind("drv", &[]), execute(), FrontendMessage::Sync]);
            assert_eq!(got.value(), (base + round).to_string(), "round {round}: {got:?}");
            assert_eq!(
                run(c, &[FrontendMessage::Close(Target::Statement, "drv".into()), FrontendMessage::Sync]).code(),
                None
            );
        }
    }
    // Deallocated: the server itself refuses the EXECUTE (26000), as PostgreSQL does.
    assert_eq!(a.query("DEALLOCATE xq").code(), None);
    let got = run(&mut a, &[parse("", "EXECUTE xq (1)"), bind("", &[]), execute(), FrontendMessage::Sync]);
    assert_eq!(got.code(), Some("26000"), "{got:?}");
}

/// SQL `PREPARE` / `DEALLOCATE` sent through the extended protocol (pgjdbc sends every
/// statement so): tracked like the simple-protocol ones, so clients taking turns on one server
/// connection each have their own `ep`, and the errors are PostgreSQL's (42P05, 26000).
#[test]
fn prepare_and_deallocate_through_the_extended_protocol_are_the_clients_own() {
    let f = fixture();
    let (mut a, mut b) = (connect(&f), connect(&f));
    let extended =
        |c: &mut Client, sql: &str| run(c, &[parse("", sql), bind("", &[]), execute(), FrontendMessage::Sync]);
    for (c, v) in [(&mut a, "a"), (&mut b, "b")] {
        let got = extended(c, &format!("PREPARE ep AS SELECT '{v}'"));
        assert_eq!(got.code(), None, "{v}: PREPARE: {got:?}");
    }
    for _ in 0..2 {
        for (c, v) in [(&mut a, "a"), (&mut b, "b")] {
            assert_eq!(c.query("EXECUTE ep").value(), v);
            assert_eq!(extended(c, "EXECUTE ep").value(), v);
        }
    }
    assert_eq!(extended(&mut a, "PREPARE ep AS SELECT 'again'").code(), Some("42P05"));
    assert_eq!(extended(&mut a, "DEALLOCATE ep").code(), None);
    assert_eq!(extended(&mut a, "EXECUTE ep").code(), Some("26000"));
    assert_eq!(a.query("EXECUTE ep").code(), Some("26000"));
    assert_eq!(b.query("EXECUTE ep").value(), "b", "b's own is untouched");
}

/// A named statement whose Parse failed, or was skipped after an earlier error in its batch,
/// does not exist (PostgreSQL: `26000` at its Bind), and a failed Parse of a name leaves no
/// statement that refract would prepare again behind the client's back.
#[test]
fn a_named_statement_whose_parse_failed_or_was_skipped_does_not_exist() {
    let f = fixture();
    let mut outcomes = vec![];
    for c in [&mut direct(&f), &mut connect(&f)] {
        let failed = run(c, &[parse("n_bad", "SELEC 'n_bad'"), FrontendMessage::Sync]);
        let bad = run(c, &[bind("n_bad", &[]), execute(), FrontendMessage::Sync]);
        let skipped = run(
            c,
            &[
                parse("n_first", "SELECT 1/0"),
                bind("n_first", &[]),
                execute(),
                parse("n_skipped", "SELECT 'n_skipped'"),
                FrontendMessage::Sync,
            ],
        );
        let after = run(c, &[bind("n_skipped", &[]), execute(), FrontendMessage::Sync]);
        outcomes.push((
            failed.code().map(str::to_owned),
            error_of(&bad),
            skipped.code().map(str::to_owned),
            error_of(&after),
        ));
    }
    assert_eq!(outcomes[1], outcomes[0], "refract answers as PostgreSQL");
    assert_eq!((outcomes[1].1 .0.as_deref(), outcomes[1].3 .0.as_deref()), (Some("26000"), Some("26000")));
}

/// A Parse of a name the client already has a statement under is refused with `42P05`, the
/// old statement staying, in and out of a transaction (which it fails), as on PostgreSQL.
#[test]
fn a_second_parse_of_a_name_is_42p05() {
    let f = fixture();
    let mut outcomes = vec![];
    for c in [&mut direct(&f), &mut connect(&f)] {
        let mut got = vec![];
        let mut note = |a: Answer| got.push((error_of(&a), a.value().to_owned(), a.status));
        note(run(c, &[parse("d", "SELECT 'd1'"), FrontendMessage::Sync]));
        note(run(c, &[parse("d", "SELECT 'd2'"), FrontendMessage::Sync]));
        note(run(c, &[bind("d", &[]), execute(), FrontendMessage::Sync]));
        note(run(c, &[parse("e", "SELECT 'e1'"), parse("e", "SELECT 'e2'"), FrontendMessage::Sync]));
        note(run(c, &[bind("e", &[]), execute(), FrontendMessage::Sync]));
        note(c.query("BEGIN"));
        note(run(c, &[parse("d", "SELECT 'd3'"), FrontendMessage::Sync]));
        note(c.query("SELECT 1"));
        note(c.query("ROLLBACK"));
        note(c.query("PREPARE q AS SELECT 'q'"));
        note(run(c, &[parse("q", "SELECT 'p'"), FrontendMessage::Sync]));
        note(c.query("EXECUTE q"));
        note(run(
            c,
            &[FrontendMessage::Close(Target::Statement, "d".into()), parse("d", "SELECT 'd4'"), FrontendMessage::Sync],
        ));
        note(run(c, &[bind("d", &[]), execute(), FrontendMessage::Sync]));
        outcomes.push(got);
    }
    assert_eq!(outcomes[1], outcomes[0], "refract answers as PostgreSQL");
    let codes: Vec<_> = outcomes[1].iter().map(|o| o.0 .0.as_deref()).collect();
    assert_eq!(codes.iter().filter(|c| **c == Some("42P05")).count(), 4, "{:?}", outcomes[1]);
    assert!(codes.contains(&Some("25P02")));
    assert_eq!(outcomes[1].last().unwrap().1, "d4");
}
