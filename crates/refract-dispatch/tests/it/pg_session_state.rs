//! Session state under transaction pooling, against a real primary + streaming replica: state
//! a statement leaves on its server connection (temp tables, `set_config(..., false)`, session
//! advisory locks, `WITH HOLD` cursors) pins the client to that connection until released;
//! LISTEN/NOTIFY through refract's own listener; SET through the extended protocol and
//! startup `options` follow the client.
//!
//! Most tests use a pool of one connection per server, so that two clients would share one
//! server connection if refract let them: the second client then either sees the first's state
//! (the bug) or waits for the pinned connection and gets `53300` (pinning).
#![allow(clippy::unwrap_used)]

use crate::pg_common;

use pg_common::{Answer, Client, Fixture};
use refract_pg::frontend::Bind;
use refract_pg::{BackendMessage, FrontendMessage};
use refract_testkit::{PASSWORD, USER};
use std::time::{Duration, Instant};

/// One connection per server; a checkout gives up quickly.
fn pool_of_one() -> Fixture {
    Fixture::start("pool_size = 1\nmin_idle = 1\ncheckout_timeout_ms = 300")
}

fn connect(f: &Fixture) -> Client {
    Client::connect(f.addr(), USER, PASSWORD).unwrap()
}

fn ok(c: &mut Client, sql: &str) -> Answer {
    let a = c.query(sql);
    assert_eq!(a.error, None, "{sql}");
    a
}

/// `sql` did not run: the only server connection is pinned by another client.
fn waits_for_pinned(c: &mut Client, sql: &str) {
    let a = c.query(sql);
    assert_eq!(a.code(), Some("53300"), "{sql} must not run on another client's pinned connection: {a:?}");
    assert!(a.rows.is_empty(), "{sql}: {a:?}");
}

/// Parse/Bind/Execute/Sync of `sql` as the unnamed statement (how pgjdbc sends everything).
fn extended(c: &mut Client, sql: &str) -> Answer {
    let parse = FrontendMessage::Parse { name: String::new(), query: sql.into(), param_types: vec![] };
    let exec = FrontendMessage::Execute { portal: String::new(), max_rows: 0 };
    c.send(&[parse, FrontendMessage::Bind(Bind::default()), exec, FrontendMessage::Sync]);
    c.until_ready()
}

#[test]
fn a_temp_table_pins_the_client_until_discard_temp() {
    let f = pool_of_one();
    let (mut a, mut b) = (connect(&f), connect(&f));
    ok(&mut a, "CREATE TEMP TABLE t_pin (x int)");
    ok(&mut a, "INSERT INTO t_pin VALUES (40)");
    assert_eq!(ok(&mut a, "SELECT x FROM t_pin").value(), "40", "a read goes where the temp table is");
    waits_for_pinned(&mut b, "/* refract: route=primary */ SELECT x FROM t_pin");
    assert_eq!(ok(&mut a, "BEGIN; SELECT count(*) FROM t_pin; COMMIT").value(), "1");
    ok(&mut a, "DISCARD TEMP");
    let got = b.query("/* refract: route=primary */ SELECT x FROM t_pin");
    assert_eq!(got.code(), Some("42P01"), "released after DISCARD TEMP, without the table: {got:?}");
}

#[test]
fn set_config_outside_a_transaction_pins_the_client_until_reset_all() {
    let f = pool_of_one();
    let (mut a, mut b) = (connect(&f), connect(&f));
    ok(&mut a, "SELECT set_config('app.secret', 'a-secret', false)");
    assert_eq!(ok(&mut a, "SELECT current_setting('app.secret', true)").value(), "a-secret");
    waits_for_pinned(&mut b, "/* refract: route=primary */ SELECT current_setting('app.secret', true)");
    // A transaction-local set_config leaves nothing behind.
    ok(&mut a, "RESET ALL");
    let got = ok(&mut b, "/* refract: route=primary */ SELECT coalesce(current_setting('app.secret', true), '')");
    assert_eq!(got.value(), "", "another client never sees it");
    ok(&mut a, "SELECT set_config('app.local', 'x', true)");
    ok(&mut b, "/* refract: route=primary */ SELECT 1");
}

#[test]
fn a_session_advisory_lock_pins_the_client_until_unlocked() {
    let f = pool_of_one();
    let (mut a, mut b) = (connect(&f), connect(&f));
    assert_eq!(ok(&mut a, "SELECT pg_advisory_lock(4242)").rows.len(), 1);
    waits_for_pinned(&mut b, "SELECT pg_try_advisory_xact_lock(4242)");
    assert_eq!(ok(&mut a, "SELECT pg_advisory_unlock(4242)").value(), "t");
    assert_eq!(ok(&mut b, "SELECT pg_try_advisory_xact_lock(4242)").value(), "t");
    // A failed try does not pin; a successful one does, until pg_advisory_unlock_all().
    assert_eq!(ok(&mut a, "SELECT pg_try_advisory_lock(4243)").value(), "t");
    waits_for_pinned(&mut b, "SELECT pg_try_advisory_xact_lock(4243)");
    ok(&mut a, "SELECT pg_advisory_unlock_all()");
    assert_eq!(ok(&mut b, "SELECT pg_try_advisory_xact_lock(4243)").value(), "t");
}

#[test]
fn a_with_hold_cursor_pins_the_client_until_closed() {
    let f = pool_of_one();
    let (mut a, mut b) = (connect(&f), connect(&f));
    ok(&mut a, "DECLARE c_pin CURSOR WITH HOLD FOR SELECT generate_series(1, 3)");
    assert_eq!(ok(&mut a, "FETCH 1 FROM c_pin").value(), "1");
    waits_for_pinned(&mut b, "FETCH 1 FROM c_pin");
    assert_eq!(ok(&mut a, "FETCH 1 FROM c_pin").value(), "2", "the cursor is the client's alone");
    ok(&mut a, "CLOSE c_pin");
    assert_eq!(b.query("FETCH 1 FROM c_pin").code(), Some("34000"), "released and gone");
}

#[test]
fn a_pinned_client_that_leaves_hands_back_a_reset_connection() {
    let f = pool_of_one();
    let mut a = connect(&f);
    ok(&mut a, "CREATE TEMP TABLE t_gone (x int)");
    ok(&mut a, "SELECT pg_advisory_lock(77), set_config('app.left', 'behind', false)");
    ok(&mut a, "DECLARE c_gone CURSOR WITH HOLD FOR SELECT 1");
    a.send(&[FrontendMessage::Terminate]);
    assert!(a.recv().is_none());
    let mut b = connect(&f);
    let deadline = Instant::now() + Duration::from_secs(10);
    let got = loop {
        let got = b.query(
            "/* refract: route=primary */ SELECT (SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema()), \
             (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'), (SELECT count(*) FROM pg_cursors), \
             coalesce(current_setting('app.left', true), '')",
        );
        if got.code() != Some("53300") || Instant::now() > deadline {
            break got;
        }
    };
    assert_eq!(got.error, None);
    assert_eq!(got.rows, vec![vec![Some("0".into()), Some("0".into()), Some("0".into()), Some(String::new())]]);
}

#[test]
fn pinned_clients_are_counted_and_shown() {
    let f = pool_of_one();
    // refract checks the connection right after relaying ReadyForQuery: allow it a moment.
    let gauge = |f: &Fixture, want: &str| {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let m = f.metrics();
            let line = m.lines().find(|l| l.starts_with("refract_pg_pinned_clients ")).map(str::to_owned);
            let got = line.and_then(|l| l.split_whitespace().nth(1).map(str::to_owned));
            let got = got.unwrap_or_else(|| panic!("no gauge in {m}"));
            if got == want || Instant::now() > deadline {
                return got;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    assert_eq!(gauge(&f, "0"), "0");
    let mut a = connect(&f);
    ok(&mut a, "CREATE TEMP TABLE t_count (x int)");
    assert_eq!(gauge(&f, "1"), "1");
    let clients = f.admin_json("/pg/clients");
    let me = clients.as_array().unwrap().iter().find(|c| c["pinned"].as_array().is_some_and(|p| !p.is_empty()));
    let me = me.unwrap_or_else(|| panic!("no pinned client in {clients}"));
    assert_eq!(me["pinned"], serde_json::json!(["temp_objects"]));
    assert_eq!(me["server"], "primary", "it keeps its connection between statements");
    ok(&mut a, "DROP TABLE t_count");
    assert_eq!(gauge(&f, "0"), "0");
    let clients = f.admin_json("/pg/clients");
    assert!(clients.as_array().unwrap().iter().all(|c| c["pinned"] == serde_json::json!([])), "{clients}");
}

/// The next NotificationResponse within `wait`, if any (other messages are an error).
fn notification(c: &mut Client, wait: Duration) -> Option<(String, String)> {
    c.stream.set_read_timeout(Some(wait)).unwrap();
    let got = c.recv();
    c.stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    match got? {
        BackendMessage::NotificationResponse { channel, payload, .. } => Some((channel, payload)),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn notifications_reach_only_the_clients_that_listen_even_while_idle() {
    let f = pool_of_one();
    let (mut a, mut b, mut c) = (connect(&f), connect(&f), connect(&f));
    let got = ok(&mut a, "LISTEN chan_a");
    assert_eq!(got.tags, "CZ");
    for i in 0..5 {
        ok(&mut c, &format!("NOTIFY chan_a, 'n{i}'"));
        ok(&mut b, "/* refract: route=primary */ SELECT 1");
        assert_eq!(ok(&mut b, "SELECT 2").tags, "TDCZ", "b never listened");
        let got = notification(&mut a, Duration::from_secs(5));
        assert_eq!(got, Some(("chan_a".to_owned(), format!("n{i}"))), "a gets it while idle");
    }
    assert_eq!(notification(&mut b, Duration::from_millis(300)), None);
    ok(&mut c, "SELECT pg_notify('chan_a', 'by function')");
    assert_eq!(notification(&mut a, Duration::from_secs(5)), Some(("chan_a".into(), "by function".into())));
    ok(&mut c, "NOTIFY other_channel, 'not for a'");
    assert_eq!(notification(&mut a, Duration::from_millis(300)), None);
    // Its own NOTIFY comes back to it before its ReadyForQuery, as on PostgreSQL.
    assert_eq!(a.query("NOTIFY chan_a, 'self'").tags, "CAZ");
    // The extended protocol, as pgjdbc sends LISTEN.
    let got = extended(&mut b, "LISTEN chan_b");
    assert_eq!((got.tags.as_str(), got.error), ("12CZ", None));
    ok(&mut c, "NOTIFY chan_b, 'to b'");
    assert_eq!(notification(&mut b, Duration::from_secs(5)), Some(("chan_b".into(), "to b".into())));
    assert_eq!(notification(&mut a, Duration::from_millis(300)), None);
    assert_eq!(ok(&mut a, "UNLISTEN *").tags, "CZ");
    ok(&mut c, "NOTIFY chan_a, 'after unlisten'");
    assert_eq!(notification(&mut a, Duration::from_millis(500)), None);
}

/// Sends `msgs` and reads to ReadyForQuery: the message types and the notifications' payloads.
fn with_notifications(c: &mut Client, msgs: &[FrontendMessage]) -> (String, Vec<String>) {
    c.send(msgs);
    let (mut tags, mut payloads) = (String::new(), vec![]);
    loop {
        let msg = c.recv().unwrap_or_else(|| panic!("the connection ended after {tags:?}"));
        tags.push(char::from(msg.tag()));
        match msg {
            BackendMessage::NotificationResponse { payload, .. } => payloads.push(payload),
            BackendMessage::ReadyForQuery(_) => return (tags, payloads),
            _ => {}
        }
    }
}

/// A client's own notifications are there when the ReadyForQuery of the transaction that sent
/// them arrives, as on PostgreSQL (whose listener connection refract must have caught up
/// with): 30 of them, each checked at its ReadyForQuery: NOTIFY, `pg_notify`, in a
/// transaction block (nothing before COMMIT), through the extended protocol.
#[test]
fn own_notifications_arrive_before_their_ready_for_query() {
    let f = pool_of_one();
    let mut a = connect(&f);
    ok(&mut a, "LISTEN own_chan");
    let q = |sql: String| vec![FrontendMessage::Query(sql)];
    let mut late = vec![];
    for i in 0..30 {
        let payload = format!("n{i}");
        let (msgs, want_tags) = match i % 4 {
            0 => (q(format!("NOTIFY own_chan, '{payload}'")), "CAZ"),
            1 => (q(format!("SELECT pg_notify('own_chan', '{payload}')")), "TDCAZ"),
            2 => {
                assert_eq!(ok(&mut a, "BEGIN").tags, "CZ");
                let (tags, got) = with_notifications(&mut a, &q(format!("NOTIFY own_chan, '{payload}'")));
                assert_eq!((tags.as_str(), got.len()), ("CZ", 0), "not before COMMIT");
                (q("COMMIT".into()), "CAZ")
            }
            _ => {
                let sql = format!("NOTIFY own_chan, '{payload}'");
                let parse = FrontendMessage::Parse { name: String::new(), query: sql, param_types: vec![] };
                let exec = FrontendMessage::Execute { portal: String::new(), max_rows: 0 };
                (vec![parse, FrontendMessage::Bind(Bind::default()), exec, FrontendMessage::Sync], "12CAZ")
            }
        };
        let (tags, got) = with_notifications(&mut a, &msgs);
        if got != [payload.clone()] || tags != want_tags {
            late.push(format!("{payload}: {tags} {got:?}"));
        }
    }
    assert_eq!(late, Vec::<String>::new(), "{} of 30 not there at their ReadyForQuery", late.len());
    assert_eq!(notification(&mut a, Duration::from_millis(300)), None, "none twice");
}

#[test]
fn set_through_the_extended_protocol_follows_the_client() {
    let f = pool_of_one();
    let (mut a, mut b) = (connect(&f), connect(&f));
    let got = extended(&mut a, "SET statement_timeout = '4321ms'");
    assert_eq!((got.tags.as_str(), got.error), ("12CZ", None));
    assert_eq!(extended(&mut a, "SET search_path TO app_schema, public").error, None);
    // A read: the replica's connection, not the one the SETs ran on.
    assert_eq!(ok(&mut a, "SHOW statement_timeout").value(), "4321ms");
    assert_eq!(ok(&mut a, "BEGIN; SHOW search_path; COMMIT").value(), "app_schema, public");
    assert_eq!(ok(&mut b, "SHOW statement_timeout").value(), "0", "not another client's");
    assert_eq!(ok(&mut b, "BEGIN; SHOW statement_timeout; COMMIT").value(), "0");
    // A SET in a failed implicit transaction is rolled back, as on PostgreSQL.
    let parse = |q: &str| FrontendMessage::Parse { name: String::new(), query: q.into(), param_types: vec![] };
    let exec = || FrontendMessage::Execute { portal: String::new(), max_rows: 0 };
    a.send(&[
        parse("SET statement_timeout = '999ms'"),
        FrontendMessage::Bind(Bind::default()),
        exec(),
        parse("SELECT 1/0"),
        FrontendMessage::Bind(Bind::default()),
        exec(),
        FrontendMessage::Sync,
    ]);
    assert_eq!(a.until_ready().code(), Some("22012"));
    assert_eq!(ok(&mut a, "SHOW statement_timeout").value(), "4321ms");
    assert_eq!(ok(&mut a, "BEGIN; SHOW statement_timeout; COMMIT").value(), "4321ms");
}

#[test]
fn startup_options_become_session_settings() {
    let f = pool_of_one();
    let options = [("options", "-c statement_timeout=1234ms --search_path=opt_schema,public -c app.x=a\\ b")];
    let mut a = Client::connect_with(f.addr(), USER, PASSWORD, &options).unwrap();
    assert_eq!(ok(&mut a, "SHOW statement_timeout").value(), "1234ms");
    // As the server shows a `-c search_path=...` value: as given.
    assert_eq!(ok(&mut a, "BEGIN; SHOW search_path; COMMIT").value(), "opt_schema,public");
    assert_eq!(ok(&mut a, "SELECT current_setting('app.x')").value(), "a b");
    let mut b = connect(&f);
    assert_eq!(ok(&mut b, "SHOW statement_timeout").value(), "0");
    // Refused as PostgreSQL refuses them.
    for (options, code) in
        [("-c statement_timeout", "42601"), ("-c no_such_parameter=1", "42704"), ("-c statement_timeout=soon", "22023")]
    {
        let bad = Client::connect_with(f.addr(), USER, PASSWORD, &[("options", options)]);
        assert_eq!(bad.err().and_then(|e| e.code().map(str::to_owned)).as_deref(), Some(code), "{options}");
    }
    assert_eq!(ok(&mut b, "SHOW statement_timeout").value(), "0", "nothing left behind");
    // Any other startup parameter is a setting too (asyncpg's `server_settings`).
    let mut c = Client::connect_with(f.addr(), USER, PASSWORD, &[("work_mem", "2050kB")]).unwrap();
    assert_eq!(ok(&mut c, "SHOW work_mem").value(), "2050kB");
    assert_eq!(ok(&mut c, "BEGIN; SHOW work_mem; COMMIT").value(), "2050kB");
    let bad = Client::connect_with(f.addr(), USER, PASSWORD, &[("no_such_parameter", "1")]);
    assert_eq!(bad.err().and_then(|e| e.code().map(str::to_owned)).as_deref(), Some("42704"));
    assert_eq!(ok(&mut b, "SHOW work_mem").value(), "4MB");
}

/// The server connection dies while the client's extended protocol is unsynced (a Flush-ended
/// batch whose statement ends its own backend on the replica, then a Query on the dead
/// connection): the
/// client gets `08006` and a ReadyForQuery, and its session goes on synced, so its next
/// LISTEN (extended protocol, transaction mode) is refract's own, as for any synced client,
/// and pins nothing.
#[test]
fn a_lost_server_leaves_the_session_synced() {
    let f = Fixture::start("");
    let mut c = connect(&f);
    let parse = FrontendMessage::Parse {
        name: String::new(),
        query: "/* refract: route=replica */ SELECT pg_terminate_backend(pg_backend_pid())".into(),
        param_types: vec![],
    };
    let exec = FrontendMessage::Execute { portal: String::new(), max_rows: 0 };
    c.send(&[parse, FrontendMessage::Bind(Bind::default()), exec, FrontendMessage::Flush]);
    let mut tags = String::new();
    while !tags.ends_with('E') {
        let msg = c.recv().unwrap_or_else(|| panic!("the connection ended after {tags:?}"));
        tags.push(char::from(msg.tag()));
    }
    assert!(tags.starts_with("12"), "the backend's own FATAL, relayed: {tags}");
    let lost = c.query("SELECT 1");
    assert_eq!(lost.code(), Some("08006"), "{lost:?}");
    let got = extended(&mut c, "LISTEN chan_lost");
    assert_eq!((got.tags.as_str(), got.error), ("12CZ", None));
    ok(&mut c, "/* refract: route=primary */ SELECT 1"); // after any check of the connection
    let clients = f.admin_json("/pg/clients");
    assert!(clients.as_array().unwrap().iter().all(|c| c["pinned"] == serde_json::json!([])), "{clients}");
    let mut other = connect(&f);
    ok(&mut other, "NOTIFY chan_lost, 'still heard'");
    assert_eq!(notification(&mut c, Duration::from_secs(5)), Some(("chan_lost".into(), "still heard".into())));
}

/// `sql` on the primary (the hint keeps reads off the replica, so two clients meet on the one
/// pooled primary connection).
fn primary(c: &mut Client, sql: &str) -> Answer {
    ok(c, &format!("/* refract: route=primary */ {sql}"))
}

#[test]
fn a_role_or_session_authorization_never_reaches_another_client() {
    let f = pool_of_one();
    let (mut a, mut b) = (connect(&f), connect(&f));
    ok(&mut a, "CREATE ROLE regress_rf_x");
    ok(&mut a, "SET ROLE regress_rf_x");
    assert_eq!(primary(&mut a, "SELECT current_user").value(), "regress_rf_x");
    assert_eq!(primary(&mut b, "SELECT current_user || ' ' || session_user").value(), format!("{USER} {USER}"));
    assert_eq!(primary(&mut a, "SELECT current_user").value(), "regress_rf_x", "the role follows its client");
    // RESET ALL leaves the role (PostgreSQL's GUC_NO_RESET_ALL): for the client, not for others.
    ok(&mut a, "RESET ALL");
    assert_eq!(primary(&mut a, "SELECT current_user").value(), "regress_rf_x");
    assert_eq!(primary(&mut b, "SELECT current_user").value(), USER);
    ok(&mut a, "SET SESSION AUTHORIZATION regress_rf_x");
    assert_eq!(primary(&mut a, "SELECT session_user || ' ' || current_user").value(), "regress_rf_x regress_rf_x");
    // Not in a new client's greeting either (session_authorization is a reported parameter),
    // asked on the connection a just used.
    // (settings no login had before, so refract asks a server for this greeting)
    let greeted = Client::connect_with(f.addr(), USER, PASSWORD, &[("application_name", "greeted")]).unwrap();
    let reported = greeted.params.iter().find(|(n, _)| n == "session_authorization").map(|(_, v)| v.as_str());
    assert_eq!(reported, Some(USER), "{:?}", greeted.params);
    assert_eq!(primary(&mut b, "SELECT session_user || ' ' || current_user").value(), format!("{USER} {USER}"));
    drop(a); // gone: its connection must come back clean too
    let mut c = connect(&f);
    assert_eq!(primary(&mut c, "SELECT session_user || ' ' || current_user").value(), format!("{USER} {USER}"));
    // A role set where refract cannot track it (set_config) pins the client while it lasts,
    // RESET ALL or not.
    ok(&mut c, "SELECT set_config('role', 'regress_rf_x', false)");
    ok(&mut c, "RESET ALL");
    assert_eq!(primary(&mut c, "SELECT current_user").value(), "regress_rf_x");
    waits_for_pinned(&mut b, "/* refract: route=primary */ SELECT current_user");
    ok(&mut c, "RESET ROLE");
    assert_eq!(primary(&mut b, "SELECT current_user").value(), USER);
}

#[test]
fn transaction_local_settings_end_with_their_transaction() {
    let f = pool_of_one();
    let (mut a, mut b) = (connect(&f), connect(&f));
    let default = primary(&mut b, "SHOW search_path").value().to_owned();
    primary(&mut a, "BEGIN");
    primary(&mut a, "SET LOCAL search_path = pg_catalog");
    primary(&mut a, "SELECT set_config('work_mem', '7MB', true)");
    primary(&mut a, "SET LOCAL ROLE NONE");
    assert_eq!(primary(&mut a, "SHOW work_mem").value(), "7MB");
    primary(&mut a, "COMMIT");
    assert_eq!(primary(&mut b, "SHOW search_path").value(), default);
    assert_ne!(primary(&mut b, "SHOW work_mem").value(), "7MB");
    assert_eq!(primary(&mut a, "SHOW search_path").value(), default, "nor for the client after COMMIT");
    // A SET rolled back with its transaction is gone too.
    primary(&mut a, "BEGIN");
    primary(&mut a, "SET search_path = pg_catalog");
    primary(&mut a, "ROLLBACK");
    assert_eq!(primary(&mut a, "SHOW search_path").value(), default);
    assert_eq!(primary(&mut b, "SHOW search_path").value(), default);
}

#[test]
fn partial_and_custom_settings_are_carried_as_postgresql_keeps_them() {
    let f = pool_of_one();
    let (mut a, mut b) = (connect(&f), connect(&f));
    let default = primary(&mut b, "SHOW datestyle").value().to_owned();
    ok(&mut a, "SET datestyle = German");
    ok(&mut b, "SET datestyle TO ymd");
    // b's connection carried a's German: b must see its own default style with YMD.
    let style = default.split_once(", ").unwrap().0;
    assert_eq!(primary(&mut b, "SHOW datestyle").value(), format!("{style}, YMD"));
    assert_eq!(ok(&mut b, "SHOW datestyle").value(), format!("{style}, YMD"), "on the replica too");
    assert_eq!(primary(&mut a, "SHOW datestyle").value(), "German, DMY", "GERMAN sets DMY too");
    ok(&mut a, "SET datestyle TO ymd");
    assert_eq!(ok(&mut a, "SHOW datestyle").value(), "German, YMD");
    // A custom parameter stays defined (empty) after its RESET, on whichever connection.
    ok(&mut a, "SET custom.rf_x = 'one'");
    ok(&mut a, "RESET custom.rf_x");
    assert_eq!(ok(&mut a, "SHOW custom.rf_x").value(), "");
    assert_eq!(primary(&mut a, "SHOW custom.rf_x").value(), "");
}

#[test]
fn a_cancel_ends_a_wait_for_a_server_connection() {
    // One connection per server, and a checkout that would wait 5 s for it.
    let f = Fixture::start("pool_size = 1\nmin_idle = 1\ncheckout_timeout_ms = 5000");
    let (mut a, mut b) = (connect(&f), connect(&f));
    primary(&mut a, "BEGIN"); // holds the primary's only connection
    b.send(&[FrontendMessage::Query("/* refract: route=primary */ SELECT 1".into())]);
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    b.cancel(f.addr());
    let answer = b.until_ready();
    assert_eq!(answer.code(), Some("57014"), "cancelled while waiting: {answer:?}");
    assert!(started.elapsed() < Duration::from_secs(2), "at once, not at the checkout timeout");
    primary(&mut a, "COMMIT");
    assert_eq!(primary(&mut b, "SELECT 1").value(), "1", "the session goes on");
}

/// The warning PostgreSQL gives when a library reserves the prefix of a parameter the session set.
fn removed(a: &Answer, name: &str) -> bool {
    let message = format!("invalid configuration parameter name \"{name}\", removing it");
    a.notices.iter().any(|n| n.code() == Some("42602") && n.message() == Some(message.as_str()))
}

#[test]
fn a_custom_setting_whose_prefix_a_library_reserved_leaves_the_session_as_on_postgresql() {
    let f = pool_of_one();
    let (mut a, mut b) = (connect(&f), connect(&f));
    ok(&mut a, "SET plpgsql.rf_gone = 'on'"); // plpgsql is not loaded in that server process yet
    ok(&mut a, "SET work_mem = '3MB'");
    // Another client loads plpgsql in the primary's only connection, which a uses next: the
    // replay of plpgsql.rf_gone fails there. a's statement still runs with its other settings,
    // and a is told what PostgreSQL tells a session that loads the library.
    primary(&mut b, "LOAD 'plpgsql'");
    let answer = primary(&mut a, "SHOW work_mem");
    assert_eq!(answer.value(), "3MB", "the statement runs with the session's settings");
    assert!(removed(&answer, "plpgsql.rf_gone"), "{answer:?}");
    assert_eq!(a.query("/* refract: route=primary */ SHOW plpgsql.rf_gone").code(), Some("42704"));
    // The client's own LOAD (on the replica's connection, where plpgsql was not loaded)
    // removes its placeholder there, with the server's warning: refract no longer carries it,
    // so the client is not told again on its next connection.
    ok(&mut a, "/* refract: route=replica */ SET plpgsql.rf_own = 'on'");
    assert!(removed(&ok(&mut a, "/* refract: route=replica */ LOAD 'plpgsql'"), "plpgsql.rf_own"));
    let next = primary(&mut a, "SHOW work_mem");
    assert_eq!(next.value(), "3MB");
    assert!(next.notices.is_empty(), "told once, as on PostgreSQL: {next:?}");
}

#[test]
fn a_setting_the_server_refuses_on_replay_refuses_the_statement_and_leaves_the_session() {
    let f = pool_of_one();
    let (mut a, mut b) = (connect(&f), connect(&f));
    primary(&mut a, "CREATE TABLE rf_replay_refused (n int)");
    primary(&mut a, "CREATE ROLE regress_rf_dropped SUPERUSER");
    ok(&mut a, "SET ROLE regress_rf_dropped");
    ok(&mut a, "SET work_mem = '3MB'");
    primary(&mut b, "DROP ROLE regress_rf_dropped");
    // The role's SET fails on the next connection a gets: the insert must not run without it.
    let refused = a.query("/* refract: route=primary */ INSERT INTO rf_replay_refused VALUES (1)");
    assert_eq!(refused.code(), Some("22023"), "the server's own error: {refused:?}");
    assert!(refused.error.as_ref().unwrap().get(b'W').is_some_and(|w| w.starts_with("refract:")), "{refused:?}");
    assert_eq!(primary(&mut b, "SELECT count(*) FROM rf_replay_refused").value(), "0", "the statement did not run");
    // The refused setting is gone from the session; the others stay.
    assert_eq!(primary(&mut a, "SELECT current_user").value(), USER);
    assert_eq!(primary(&mut a, "SHOW work_mem").value(), "3MB");
    primary(&mut a, "DROP TABLE rf_replay_refused");
}

#[test]
fn a_prepared_statement_run_inside_another_statement_is_the_clients_own() {
    let f = pool_of_one();
    let (mut a, mut b, mut c) = (connect(&f), connect(&f), connect(&f));
    primary(&mut a, "PREPARE q AS SELECT 1 AS a_col");
    primary(&mut b, "PREPARE q AS SELECT 2 AS b_col");
    primary(&mut a, "CREATE TABLE ctas_a AS EXECUTE q");
    assert_eq!(primary(&mut a, "SELECT a_col FROM ctas_a").value(), "1");
    let plan = primary(&mut b, "EXPLAIN (VERBOSE, COSTS OFF) EXECUTE q");
    let text: Vec<_> = plan.rows.iter().filter_map(|r| r[0].clone()).collect();
    assert!(text.iter().any(|l| l.contains('2')), "b's own statement: {text:?}");
    let none = c.query("/* refract: route=primary */ EXPLAIN EXECUTE q");
    assert_eq!(none.code(), Some("26000"), "c has no q: {none:?}");
    let none = c.query("/* refract: route=primary */ CREATE TABLE ctas_c AS EXECUTE q");
    assert_eq!(none.code(), Some("26000"), "{none:?}");
}

#[test]
fn a_statement_that_cannot_be_prepared_again_reports_why() {
    let f = pool_of_one();
    let (mut a, mut b) = (connect(&f), connect(&f));
    primary(&mut a, "CREATE TABLE rp (x int)");
    primary(&mut a, "PREPARE rq AS SELECT x FROM rp");
    primary(&mut b, "PREPARE rq AS SELECT 2"); // takes the name on the one connection
    primary(&mut a, "DROP TABLE rp");
    let got = a.query("/* refract: route=primary */ EXECUTE rq");
    assert_eq!(got.code(), Some("42P01"), "PostgreSQL's own error, not 26000: {got:?}");
    assert_eq!(primary(&mut b, "EXECUTE rq").value(), "2");
}

#[test]
fn ddl_between_two_clients_parses_is_seen_as_on_postgresql() {
    let f = pool_of_one();
    let (mut a, mut b) = (connect(&f), connect(&f));
    primary(&mut a, "CREATE TABLE ddl_t (x int)");
    primary(&mut a, "INSERT INTO ddl_t VALUES (1)");
    let sql = "/* refract: route=primary */ SELECT * FROM ddl_t";
    let run = |c: &mut Client| {
        let parse = FrontendMessage::Parse { name: "s1".into(), query: sql.into(), param_types: vec![] };
        let bind = FrontendMessage::Bind(Bind { statement: "s1".into(), ..Bind::default() });
        let exec = FrontendMessage::Execute { portal: String::new(), max_rows: 0 };
        c.send(&[parse, bind, exec, FrontendMessage::Sync]);
        c.until_ready()
    };
    let first = run(&mut a);
    assert_eq!((first.error.as_ref(), first.rows[0].len()), (None, 1));
    primary(&mut a, "ALTER TABLE ddl_t ADD COLUMN y int DEFAULT 7");
    let second = run(&mut b);
    assert_eq!(second.error, None, "a new client's Parse after the DDL plans anew");
    assert_eq!(second.rows, vec![vec![Some("1".to_owned()), Some("7".to_owned())]]);
    // Inside a transaction too: DDL, then another client's Parse after the COMMIT.
    primary(&mut a, "BEGIN");
    primary(&mut a, "ALTER TABLE ddl_t ADD COLUMN z int DEFAULT 9");
    primary(&mut a, "COMMIT");
    let mut c = connect(&f);
    let third = run(&mut c);
    assert_eq!(third.error, None);
    assert_eq!(third.rows[0].len(), 3);
}

#[test]
fn ddl_outside_refract_is_learnt_from_the_stale_plan_error() {
    let f = pool_of_one();
    let (mut a, mut b) = (connect(&f), connect(&f));
    primary(&mut a, "CREATE TABLE ext_t (x int)");
    primary(&mut a, "INSERT INTO ext_t VALUES (1)");
    let sql = "/* refract: route=primary */ SELECT * FROM ext_t";
    let parse = FrontendMessage::Parse { name: "s1".into(), query: sql.into(), param_types: vec![] };
    let bind = FrontendMessage::Bind(Bind { statement: "s1".into(), ..Bind::default() });
    let exec = FrontendMessage::Execute { portal: String::new(), max_rows: 0 };
    a.send(&[parse.clone(), bind.clone(), exec.clone(), FrontendMessage::Sync]);
    assert_eq!(a.until_ready().rows[0].len(), 1);
    f.cluster.psql(&f.cluster.primary, "ALTER TABLE ext_t ADD COLUMN y int DEFAULT 7").unwrap();
    a.send(&[bind, exec.clone(), FrontendMessage::Sync]);
    let stale = a.until_ready();
    assert_eq!(stale.code(), Some("0A000"), "a's own statement, as on its own connection: {stale:?}");
    let b_bind = FrontendMessage::Bind(Bind { statement: "s1".into(), ..Bind::default() });
    b.send(&[parse, b_bind, exec, FrontendMessage::Sync]);
    let fresh = b.until_ready();
    assert_eq!(fresh.error, None, "b parses after the server said the plan was stale");
    assert_eq!(fresh.rows, vec![vec![Some("1".to_owned()), Some("7".to_owned())]]);
}

#[test]
fn large_objects_through_the_function_call_protocol() {
    let f = pool_of_one();
    let dir = std::env::temp_dir().join(format!("rf-lo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, dst) = (dir.join("in"), dir.join("out"));
    let data: String = (0..5000).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
    std::fs::write(&src, &data).unwrap();
    let last = "/* refract: route=primary */ SELECT max(oid) FROM pg_largeobject_metadata";
    let out = f.psql(&[&format!("\\lo_import {}", src.display()), last]).unwrap();
    let oid = out.trim().to_owned();
    assert!(oid.parse::<u32>().is_ok(), "{out}");
    f.psql(&[&format!("\\lo_export {oid} {}", dst.display())]).unwrap();
    assert_eq!(std::fs::read_to_string(&dst).unwrap(), data);
    f.psql(&[&format!("\\lo_unlink {oid}")]).unwrap();
    let count = format!("/* refract: route=primary */ SELECT count(*) FROM pg_largeobject_metadata WHERE oid = {oid}");
    let gone = f.psql(&[&count]).unwrap();
    assert_eq!(gone.trim(), "0");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One client's server connection ending (its own `pg_terminate_backend`, then
/// `idle_in_transaction_session_timeout`) costs that client its statement, with the server's
/// FATAL and `08006`, and nothing else: the server is not marked down, and another client
/// running statements on the primary meanwhile gets no error.
#[test]
fn a_server_connection_ending_leaves_the_server_up() {
    let f = Fixture::start("pool_size = 2\nmin_idle = 1\ncheckout_timeout_ms = 2000");
    let (addr, stop) = (f.addr(), std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)));
    let looping = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut b = Client::connect(addr, USER, PASSWORD).unwrap();
            let (mut ran, mut errors) = (0, vec![]);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for sql in ["/* refract: route=primary */ SELECT 1", "SELECT 1"] {
                    let got = b.query(sql);
                    ran += 1;
                    if got.error.is_some() || got.value() != "1" {
                        errors.push(format!("{sql}: {got:?}"));
                    }
                }
            }
            (ran, errors)
        })
    };
    let mut a = connect(&f);
    for round in 0..3 {
        let got = a.query("/* refract: route=primary */ SELECT pg_terminate_backend(pg_backend_pid())");
        assert_eq!(got.tags.matches('E').count(), 2, "round {round}: the server's FATAL, then 08006: {got:?}");
        assert_eq!(got.code(), Some("08006"), "round {round}: {got:?}");
        assert_eq!(ok(&mut a, "SELECT 2").value(), "2", "round {round}: the session goes on");
    }
    ok(&mut a, "SET idle_in_transaction_session_timeout = '200ms'");
    ok(&mut a, "BEGIN; SELECT 1");
    std::thread::sleep(Duration::from_millis(700));
    let got = a.query("SELECT 1");
    assert_eq!(got.code(), Some("08006"), "the transaction's connection timed out: {got:?}");
    ok(&mut a, "RESET idle_in_transaction_session_timeout");
    assert_eq!(ok(&mut a, "/* refract: route=primary */ SELECT 3").value(), "3");
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ran, errors) = looping.join().unwrap();
    assert!(ran > 10, "the other client ran only {ran} statements");
    assert_eq!(errors, Vec::<String>::new(), "the other client got errors ({ran} statements)");
    let servers = f.admin_json("/pg/servers");
    assert!(servers.as_array().unwrap().iter().all(|s| s["healthy"] == serde_json::json!(true)), "{servers}");
}

#[test]
fn a_statistics_object_in_the_temp_schema_pins_the_client() {
    let f = pool_of_one();
    let (mut a, mut b) = (connect(&f), connect(&f));
    ok(&mut a, "CREATE TABLE st_t (a int, b int)");
    ok(&mut a, "CREATE STATISTICS pg_temp.st_s ON a, b FROM st_t");
    waits_for_pinned(&mut b, "/* refract: route=primary */ SELECT 1");
    ok(&mut a, "DROP STATISTICS pg_temp.st_s");
    assert_eq!(primary(&mut b, "SELECT 1").value(), "1", "released once the object is gone");
}

#[test]
fn pg_prepared_statements_shows_the_clients_own_statements_only() {
    let f = pool_of_one();
    let (mut a, mut b) = (connect(&f), connect(&f));
    ok(&mut a, "PREPARE pa(int) AS SELECT $1;");
    ok(&mut b, "PREPARE pb AS SELECT 2");
    // a protocol-level statement of b's is on the server connection too
    let parse = FrontendMessage::Parse { name: "sb".into(), query: "SELECT 3".into(), param_types: vec![] };
    b.send(&[parse, FrontendMessage::Sync]);
    assert_eq!(b.until_ready().error, None);
    let view = "/* refract: route=primary */ SELECT name, statement FROM pg_prepared_statements ORDER BY name";
    let rows = |c: &mut Client| ok(c, view).rows;
    let own = |name: &str, text: &str| vec![Some(name.to_owned()), Some(text.to_owned())];
    assert_eq!(rows(&mut a), vec![own("pa", "PREPARE pa(int) AS SELECT $1;")], "the text as the client sent it");
    assert_eq!(rows(&mut b), vec![own("pb", "PREPARE pb AS SELECT 2")]);
    // A PREPARE refused as a duplicate, then a DEALLOCATE refract answers itself: the name is
    // gone from the view too.
    primary(&mut a, "PREPARE dup AS SELECT 1");
    assert_eq!(a.query("/* refract: route=primary */ PREPARE dup AS SELECT 2").code(), Some("42P05"));
    ok(&mut a, "DEALLOCATE dup");
    assert_eq!(rows(&mut a), vec![own("pa", "PREPARE pa(int) AS SELECT $1;")]);
    assert_eq!(primary(&mut a, "EXECUTE pa(5)").value(), "5");
    let direct = ok(&mut b, "/* refract: route=primary */ SELECT count(*) FROM pg_catalog.pg_prepared_statements");
    assert_eq!(direct.value(), "1");
}

#[test]
fn session_mode_leaves_the_clients_prepared_statements_alone() {
    let f = Fixture::start("pool_mode = \"session\"\npool_size = 2\nmin_idle = 1");
    let mut a = connect(&f);
    ok(&mut a, "PREPARE q3(int, int) AS SELECT $1 + $2;");
    let when = "SELECT prepare_time::text, statement FROM pg_prepared_statements WHERE name = 'q3'";
    let before = ok(&mut a, when).rows;
    assert_eq!(a.query("EXECUTE q3(1)").code(), Some("42601"), "wrong number of parameters");
    assert_eq!(a.query("EXECUTE q3(1, 2, 3)").code(), Some("42601"));
    assert_eq!(ok(&mut a, "EXECUTE q3(1, 2)").value(), "3");
    assert_eq!(ok(&mut a, when).rows, before, "never prepared again: same text, same prepare_time");
}

#[test]
fn a_prepared_name_used_in_dynamic_sql_is_the_clients_own() {
    let f = pool_of_one();
    let mut a = connect(&f);
    ok(&mut a, "PREPARE dq AS SELECT 'client a secret'");
    drop(a); // its statement must not stay behind for the next client of the connection
    let mut b = connect(&f);
    let run = "DO $$ DECLARE r text; BEGIN EXECUTE 'EXECUTE dq' INTO r; RAISE NOTICE 'got %', r; END $$";
    let got = b.query(run);
    assert_eq!(got.code(), Some("26000"), "b has no dq, whatever the connection held: {got:?}");
    ok(&mut b, "PREPARE dq AS SELECT 'client b own'");
    let mut c = connect(&f);
    ok(&mut c, "PREPARE other AS SELECT 1"); // c takes the one connection in between
    let fn_sql = "CREATE FUNCTION run_dq() RETURNS text LANGUAGE plpgsql AS $$ DECLARE r text; \
                  BEGIN EXECUTE 'EXECUTE dq' INTO r; RETURN r; END $$";
    ok(&mut b, fn_sql);
    assert_eq!(primary(&mut b, "SELECT run_dq()").value(), "client b own", "b's own, through a function");
}
