//! Sharding through refract (issue 24, docs/sharding.md), against real PostgreSQL: the same
//! schema and data loaded through refract over 2 and over 3 shards (customers by `id`, orders
//! by `customer_id`, both hash; products replicated) and into one plain PostgreSQL directly.
//! Every statement of the suite (tests/it/pg_sharded_cases.rs) runs on both: the same columns, rows
//! (in order where the ORDER BY fixes it, as a multiset otherwise), CommandComplete tags,
//! SQLSTATE when the plain server fails, and transaction status. Statements refract cannot
//! answer exactly are refused with 0A000 and a reason. Afterwards the tables are compared
//! again, shard by shard, and every row must sit on the shard PostgreSQL's own hash
//! partitioning names (a `PARTITION BY HASH` table on the plain server is the oracle).
//! A last test checks `/* refract: explain */` and `GET /pg/shards`.
#![allow(clippy::unwrap_used)]

use crate::pg_common;
use crate::pg_sharded_cases;

use bytes::Bytes;
use pg_common::{shard_config, until, Client, Fixture, ADMIN_TOKEN};
use pg_sharded_cases::{shard_of, Case, Cmp, Keys, Refusal};
use refract_pg::frontend::{Bind, Target};
use refract_pg::{BackendMessage, FrontendMessage, TxStatus};
use refract_testkit::{PgCluster, PgServer, PASSWORD, USER};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::{Duration, Instant};

/// Shard names: distinctive, so that a route trace naming one is not read as naming another.
const NAMES: [&str; 3] = ["alpha", "bravo", "charlie"];

/// The sharded tables and their keys.
const SHARDED: [(&str, &str); 2] = [("customers", "id"), ("orders", "customer_id")];

/// The `[[postgres.shard]]` and `[[postgres.sharded_table]]` sections for `servers`, shard i
/// refract over `cluster.standalone[first..first + n]`... as shards: a fresh cluster whose
/// primary is the plain reference server and whose `n` standalone servers are the shards.
fn sharded(n: usize) -> Fixture {
    let mut cluster = PgCluster::start_with_replicas(0).expect("PostgreSQL test cluster");
    for _ in 0..n {
        cluster.add_standalone().unwrap();
    }
    let servers: Vec<&PgServer> = cluster.standalone.iter().collect();
    let config = shard_config(&NAMES, &servers, &SHARDED);
    let f = Fixture::start_servers(cluster, "", &config);
    until("refract answers through its shards", || {
        Client::connect(f.addr(), USER, PASSWORD).is_ok_and(|mut c| c.query("SELECT 1").error.is_none())
    });
    f
}

/// Everything one statement returned.
#[derive(Debug, Default, Clone)]
struct Outcome {
    /// Column names and type OIDs.
    columns: Vec<(String, u32)>,
    rows: Vec<Vec<Option<String>>>,
    tags: Vec<String>,
    /// SQLSTATE and message.
    error: Option<(String, String)>,
    /// The ReadyForQuery status; `None` when the connection closed first.
    status: Option<TxStatus>,
}

/// Reads to ReadyForQuery (or the end of the connection).
fn outcome(c: &mut Client) -> Outcome {
    let mut o = Outcome::default();
    while let Some(m) = c.recv() {
        match m {
            BackendMessage::RowDescription(f) => o.columns = f.into_iter().map(|f| (f.name, f.type_oid)).collect(),
            BackendMessage::DataRow(r) => {
                o.rows.push(r.into_iter().map(|v| v.map(|b| String::from_utf8_lossy(&b).into_owned())).collect())
            }
            BackendMessage::CommandComplete(t) => o.tags.push(t),
            // COPY ... TO STDOUT: each line a row of one column.
            BackendMessage::CopyData(line) => o.rows.push(vec![Some(String::from_utf8_lossy(&line).into_owned())]),
            BackendMessage::ErrorResponse(e) => {
                let code = e.code().unwrap_or_default().to_owned();
                o.error = Some((code, e.message().unwrap_or_default().to_owned()));
            }
            BackendMessage::ReadyForQuery(s) => {
                o.status = Some(s);
                break;
            }
            _ => {}
        }
    }
    o
}

fn simple(c: &mut Client, sql: &str) -> Outcome {
    c.send(&[FrontendMessage::Query(sql.into())]);
    outcome(c)
}

/// Parse, Bind (text parameters), Describe, Execute, Sync on the unnamed statement.
fn extended(c: &mut Client, sql: &str, params: &[String]) -> Outcome {
    let bind = Bind {
        portal: String::new(),
        statement: String::new(),
        param_formats: vec![],
        params: params.iter().map(|p| Some(Bytes::from(p.clone()))).collect(),
        result_formats: vec![],
    };
    c.send(&[
        FrontendMessage::Parse { name: String::new(), query: sql.into(), param_types: vec![] },
        FrontendMessage::Bind(bind),
        FrontendMessage::Describe(Target::Portal, String::new()),
        FrontendMessage::Execute { portal: String::new(), max_rows: 0 },
        FrontendMessage::Sync,
    ]);
    outcome(c)
}

/// `COPY ... FROM STDIN` with `data` in one CopyData; a COPY of a few rows that gets no
/// answer in 5 s gets none (the suite goes on sooner than after the usual 20 s).
fn copy_in(c: &mut Client, sql: &str, data: &str) -> Outcome {
    c.stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let o = copy_in_answer(c, sql, data);
    c.stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    o
}

fn copy_in_answer(c: &mut Client, sql: &str, data: &str) -> Outcome {
    copy_chunks(c, sql, data.as_bytes(), data.len().max(1))
}

fn run(c: &mut Client, case: &Case) -> Outcome {
    match (&case.params, &case.copy) {
        (_, Some(data)) => copy_in(c, &case.sql, data),
        (Some(p), None) => extended(c, &case.sql, p),
        (None, None) => simple(c, &case.sql),
    }
}

fn sorted(rows: &[Vec<Option<String>>]) -> Vec<Vec<Option<String>>> {
    let mut v = rows.to_vec();
    v.sort();
    v
}

/// How refract's answer (`got`) differs from the plain server's (`want`), if it does.
fn differs(cmp: Cmp, want: &Outcome, got: &Outcome) -> Option<String> {
    if want.status != got.status {
        return Some(format!("status {:?}, want {:?} (refract: {:?})", got.status, want.status, got.error));
    }
    if let Some((code, msg)) = &want.error {
        let same = got.error.as_ref().is_some_and(|(c, _)| c == code);
        return (!same).then(|| format!("want error {code} ({msg}), refract gave {:?} {:?}", got.error, got.tags));
    }
    if let Some((code, msg)) = &got.error {
        return Some(format!("refract error {code}: {msg}"));
    }
    if got.columns != want.columns {
        return Some(format!("columns {:?}, want {:?}", got.columns, want.columns));
    }
    if got.tags != want.tags {
        return Some(format!("tags {:?}, want {:?}", got.tags, want.tags));
    }
    let (g, w) = match cmp {
        Cmp::Ordered => (got.rows.clone(), want.rows.clone()),
        Cmp::Unordered => (sorted(&got.rows), sorted(&want.rows)),
    };
    (g != w).then(|| format!("{} rows, want {}: first difference {:?}", g.len(), w.len(), first_difference(&g, &w)))
}

fn first_difference(g: &[Vec<Option<String>>], w: &[Vec<Option<String>>]) -> String {
    let at = g.iter().zip(w).position(|(a, b)| a != b).unwrap_or(g.len().min(w.len()));
    format!("row {at}: refract {:?}, want {:?}", g.get(at), w.get(at))
}

/// The two sessions under comparison and what went wrong so far.
struct Differential {
    n: usize,
    addr: std::net::SocketAddr,
    refract: Client,
    plain: Client,
    failures: Vec<String>,
    /// Statements compared (transaction control not counted).
    compared: usize,
    /// `may_refuse` statements refract refused.
    refused_optional: Vec<String>,
}

impl Differential {
    fn new(f: &Fixture, n: usize) -> Differential {
        Differential {
            n,
            addr: f.addr(),
            refract: Client::connect(f.addr(), USER, PASSWORD).unwrap(),
            plain: Client::connect(f.cluster.primary.addr(), USER, PASSWORD).unwrap(),
            failures: vec![],
            compared: 0,
            refused_optional: vec![],
        }
    }

    fn fail(&mut self, sql: &str, why: String) {
        self.failures.push(format!("[{} shards] {sql}\n    {why}", self.n));
    }

    /// Runs `case` on both and records a difference; after one, both sessions are brought
    /// back out of any transaction (a new refract session if refract closed this one).
    fn check(&mut self, case: &Case) {
        let started = Instant::now();
        let mut got = run(&mut self.refract, case);
        if got.status.is_none() {
            // Closed, or no ReadyForQuery within the client's read timeout.
            let why = format!("no answer: the connection ended after {:.1} s", started.elapsed().as_secs_f64());
            got.error = Some(("(none)".into(), why));
        }
        if case.may_refuse && got.error.is_some() {
            // Not run on the plain server: both keep the same rows.
            match got.error.clone().unwrap_or_default() {
                (code, msg) if code == "0A000" && !msg.is_empty() => {
                    self.refused_optional.push(format!("{}: {msg}", case.sql));
                }
                (code, msg) => self.fail(&case.sql, format!("neither answered nor refused (0A000): {code} {msg}")),
            }
            return self.recover(&got);
        }
        let want = run(&mut self.plain, case);
        self.compared += usize::from(!case.is_control());
        let Some(why) = differs(case.cmp, &want, &got) else { return };
        self.fail(&case.sql, why);
        self.recover(&got);
    }

    /// Out of any transaction on both sessions, on a new refract session if refract ended
    /// this one.
    fn recover(&mut self, got: &Outcome) {
        if got.status.is_none() {
            self.refract = Client::connect(self.addr, USER, PASSWORD).unwrap();
        }
        for c in [&mut self.refract, &mut self.plain] {
            if simple(c, "SELECT 1").status != Some(TxStatus::Idle) {
                simple(c, "ROLLBACK");
            }
        }
    }

    /// `sql` (a plain statement) on both, compared.
    fn same(&mut self, sql: &str, cmp: Cmp) {
        self.check(&Case { sql: sql.into(), cmp, params: None, may_refuse: false, copy: None });
    }

    /// A refusal: `before` succeeds, `sql` fails with 0A000 and a reason (failing the
    /// transaction when in one), and the session goes on.
    fn refused(&mut self, r: &Refusal) {
        for sql in &r.before {
            if let Some((code, msg)) = simple(&mut self.refract, sql).error {
                self.fail(&r.sql, format!("leading statement {sql} failed: {code} {msg}"));
            }
        }
        let got = if r.extended { extended(&mut self.refract, &r.sql, &[]) } else { simple(&mut self.refract, &r.sql) };
        let want_status = if r.in_tx { TxStatus::Failed } else { TxStatus::Idle };
        match &got.error {
            Some((code, msg)) if code == "0A000" && !msg.trim().is_empty() => {
                if got.status != Some(want_status) {
                    self.fail(&r.sql, format!("refused, but status {:?}, want {want_status:?}", got.status));
                }
            }
            _ => self.fail(
                &r.sql,
                format!("not refused with 0A000 and a reason: {:?}, {} rows {:?}", got.error, got.rows.len(), got.tags),
            ),
        }
        if got.status.is_none() {
            self.refract = Client::connect(self.addr, USER, PASSWORD).unwrap();
        }
        if r.in_tx || got.status != Some(TxStatus::Idle) {
            let end = simple(&mut self.refract, "ROLLBACK");
            if end.status != Some(TxStatus::Idle) || end.error.is_some() {
                self.fail(&r.sql, format!("ROLLBACK after it: {:?} {:?}", end.error, end.status));
            }
        }
    }
}

/// Creates the tables through refract (and directly on the plain server) and loads the rows
/// in multi-row INSERTs that span the shards, comparing every answer.
fn load(d: &mut Differential) {
    for ddl in pg_sharded_cases::SCHEMA {
        d.same(ddl, Cmp::Ordered);
    }
    for (table, rows) in [
        ("customers", pg_sharded_cases::customers()),
        ("orders", pg_sharded_cases::orders()),
        ("products", pg_sharded_cases::products()),
    ] {
        for chunk in rows.chunks(40) {
            d.same(&format!("INSERT INTO {table} VALUES {}", chunk.join(", ")), Cmp::Ordered);
        }
    }
}

/// Every table through refract equals the plain server's.
fn compare_tables(d: &mut Differential) {
    d.same("SELECT * FROM customers ORDER BY id", Cmp::Ordered);
    d.same("SELECT * FROM orders", Cmp::Unordered);
    d.same("SELECT * FROM products ORDER BY id", Cmp::Ordered);
}

/// Rows of `sql` on `server` directly, as text.
fn direct(server: &PgServer, sql: &str) -> Result<Vec<Vec<Option<String>>>, String> {
    let mut c = Client::connect(server.addr(), USER, PASSWORD).map_err(|e| format!("{:?}", e.message()))?;
    let o = simple(&mut c, sql);
    match o.error {
        Some((code, msg)) => Err(format!("{sql}: {code} {msg}")),
        None => Ok(o.rows),
    }
}

/// Storage, server by server: the shards' rows together are the plain server's rows, each
/// shard holds a full copy of products, every shard holds some rows, and each row sits on
/// the shard whose number is the remainder PostgreSQL's `PARTITION BY HASH` gives its key.
fn storage(f: &Fixture, n: usize) -> Vec<String> {
    let mut failures = vec![];
    let shards = &f.cluster.standalone[..n];
    let plain = &f.cluster.primary;
    let mut check = |what: String, r: Result<(), String>| {
        if let Err(e) = r {
            failures.push(format!("[{n} shards] {what}\n    {e}"));
        }
    };
    for (table, _) in SHARDED {
        check(format!("{table}: the shards' rows together"), together(shards, plain, table));
    }
    for (i, s) in shards.iter().enumerate() {
        check(format!("products on shard {i}"), same_rows(s, plain, "SELECT * FROM products"));
        let count = direct(s, "SELECT count(*) FROM customers").map(|r| r[0][0].clone().unwrap_or_default());
        check(format!("customers on shard {i}"), count.and_then(|c| (c != "0").then_some(()).ok_or("empty".into())));
    }
    for (table, key) in SHARDED {
        check(format!("{table}: placement by {key}"), placement(shards, plain, table, key));
    }
    failures
}

fn same_rows(a: &PgServer, b: &PgServer, sql: &str) -> Result<(), String> {
    let (x, y) = (sorted(&direct(a, sql)?), sorted(&direct(b, sql)?));
    (x == y).then_some(()).ok_or_else(|| format!("{} rows, want {}: {}", x.len(), y.len(), first_difference(&x, &y)))
}

fn together(shards: &[PgServer], plain: &PgServer, table: &str) -> Result<(), String> {
    let sql = format!("SELECT * FROM {table}");
    let mut all = vec![];
    for s in shards {
        all.extend(direct(s, &sql)?);
    }
    let (got, want) = (sorted(&all), sorted(&direct(plain, &sql)?));
    (got == want)
        .then_some(())
        .ok_or_else(|| format!("{} rows, want {}: {}", got.len(), want.len(), first_difference(&got, &want)))
}

/// The keys each shard holds, put into `<table>_p PARTITION BY HASH (key)` with `MODULUS n`
/// on the plain server: partition i must hold exactly the keys of shard i (a multiset, NULL
/// keys included).
fn placement(shards: &[PgServer], plain: &PgServer, table: &str, key: &str) -> Result<(), String> {
    let n = shards.len();
    let mut ddl = format!("DROP TABLE IF EXISTS {table}_p; CREATE TABLE {table}_p (k int8) PARTITION BY HASH (k);");
    for i in 0..n {
        ddl +=
            &format!("CREATE TABLE {table}_p{i} PARTITION OF {table}_p FOR VALUES WITH (MODULUS {n}, REMAINDER {i});");
    }
    direct(plain, &ddl)?;
    let keys_sql = format!("SELECT {key} FROM {table} ORDER BY 1");
    let held: Vec<Vec<Vec<Option<String>>>> = shards.iter().map(|s| direct(s, &keys_sql)).collect::<Result<_, _>>()?;
    let values: Vec<String> = held.iter().flatten().map(|r| r[0].clone().unwrap_or_else(|| "NULL".into())).collect();
    if !values.is_empty() {
        direct(plain, &format!("INSERT INTO {table}_p VALUES ({})", values.join("), (")))?;
    }
    for (i, keys) in held.iter().enumerate() {
        let oracle = direct(plain, &format!("SELECT k FROM {table}_p{i} ORDER BY 1"))?;
        if &oracle != keys {
            let misplaced: Vec<_> = keys.iter().filter(|k| !oracle.contains(k)).take(5).collect();
            return Err(format!(
                "shard {i} holds {} keys, PostgreSQL's remainder {i} has {}; on shard {i} but not in remainder {i}: {misplaced:?}",
                keys.len(),
                oracle.len()
            ));
        }
    }
    Ok(())
}

/// The whole differential over `n` shards; panics listing every failure.
fn differential(n: usize) {
    let f = sharded(n);
    let keys = Keys::new(n as u64);
    assert!(shard_of(keys.a, n as u64) != shard_of(keys.b, n as u64), "{keys:?}");
    let mut d = Differential::new(&f, n);
    load(&mut d);
    let loaded = d.compared;
    for case in pg_sharded_cases::suite(&keys) {
        d.check(&case);
    }
    let suite = d.compared - loaded;
    for r in pg_sharded_cases::refusals(&keys) {
        d.refused(&r);
    }
    compare_tables(&mut d);
    let mut failures = std::mem::take(&mut d.failures);
    failures.extend(storage(&f, n));
    eprintln!(
        "{n} shards: {suite} statements compared ({loaded} loading), {} refusals, optional refusals: {:#?}",
        pg_sharded_cases::refusals(&keys).len(),
        d.refused_optional
    );
    assert!(suite >= 150, "only {suite} statements compared");
    assert!(failures.is_empty(), "{} failures over {n} shards:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn two_shards_answer_as_one_postgres() {
    differential(2);
}

#[test]
fn three_shards_answer_as_one_postgres() {
    differential(3);
}

/// `GET path` from the admin listener: (status, body).
fn admin_get(f: &Fixture, path: &str) -> (String, String) {
    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, f.admin)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN_TOKEN}\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (head.lines().next().unwrap_or_default().to_owned(), body.to_owned())
}

fn shards_view(f: &Fixture) -> serde_json::Value {
    let (status, body) = admin_get(f, "/pg/shards");
    assert!(status.contains(" 200"), "GET /pg/shards: {status} {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET /pg/shards: {e}: {body}"))
}

/// `/* refract: explain */` names the shard that holds the key and runs nothing (a sequence
/// it would advance stays put, a row it would delete stays); `GET /pg/shards` lists the shards
/// in order with their servers and hash remainders, the sharded tables, and counts. Every
/// check runs; the test fails listing all that did not hold.
#[test]
fn explain_names_the_shard_and_runs_nothing_and_admin_lists_the_shards() {
    let f = sharded(2);
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    for sql in [
        "CREATE TABLE customers (id int8 PRIMARY KEY, name text)",
        "CREATE TABLE orders (id int8, customer_id int8)",
        "CREATE SEQUENCE probe",
        "INSERT INTO customers VALUES (1, 'c1'), (2, 'c2'), (3, 'c3'), (4, 'c4'), (5, 'c5'), (6, 'c6'), (7, 'c7'), \
         (8, 'c8'), (9, 'c9'), (10, 'c10'), (11, 'c11'), (12, 'c12'), (13, 'c13'), (14, 'c14')",
    ] {
        let o = simple(&mut c, sql);
        assert!(o.error.is_none(), "{sql}: {:?}", o.error);
    }
    let holder = shard_of(7, 2) as usize;
    let (server, other) = (&f.cluster.standalone[holder], &f.cluster.standalone[1 - holder]);
    let at = |s: &PgServer, sql: &str| direct(s, sql).unwrap();
    let one = |v: &str| vec![vec![Some(v.to_owned())]];
    let mut problems: Vec<String> = vec![];
    let mut expect = |ok: bool, what: String| {
        if !ok {
            problems.push(what);
        }
    };
    // Rows placed by refract: the premise of what follows.
    assert_eq!(at(server, "SELECT count(*) FROM customers WHERE id = 7"), one("1"), "7 is on shard {holder}");

    let before = shards_view(&f);
    let e = simple(&mut c, "/* refract: explain */ select * from customers where id = 7");
    let text: Vec<String> = e.rows.iter().map(|r| r[0].clone().unwrap_or_default()).collect();
    expect(e.error.is_none(), format!("explain failed: {:?}", e.error));
    expect(
        e.columns == [("route".to_owned(), 25)],
        format!("explain: one text column named route, got {:?}", e.columns),
    );
    let named = text.iter().any(|l| l.contains(NAMES[holder]));
    expect(named, format!("explain names shard {}: {text:?}", NAMES[holder]));

    // Not run: neither a read's side effect nor a write happens.
    let seq = "SELECT last_value, is_called FROM probe";
    let probe = (at(server, seq), at(other, seq));
    for sql in [
        "/* refract: explain */ select nextval('probe') from customers where id = 7",
        "/* refract: explain */ delete from customers where id = 7",
        "/* refract: explain */ insert into customers values (1000, 'x')",
    ] {
        let e = simple(&mut c, sql);
        expect(e.error.is_none() && !e.rows.is_empty(), format!("{sql}: {:?} {:?}", e.error, e.rows));
    }
    expect((at(server, seq), at(other, seq)) == probe, "explain advanced the sequence".into());
    expect(at(server, "SELECT count(*) FROM customers WHERE id = 7") == one("1"), "explain deleted 7".into());
    for s in [server, other] {
        expect(at(s, "SELECT count(*) FROM customers WHERE id = 1000") == one("0"), "explain inserted 1000".into());
    }

    // /pg/shards: the shards in configuration order, with each table's hash remainder and servers.
    let shards = before["shards"].as_array().cloned().unwrap_or_default();
    expect(shards.len() == 2, format!("two shards: {before}"));
    for (i, s) in shards.iter().enumerate() {
        expect(s["name"] == NAMES[i], format!("shard {i} named {}: {s}", NAMES[i]));
        let holds = s["holds"].as_array().cloned().unwrap_or_default();
        let remainders = holds.iter().all(|h| h["hash"]["remainder"] == i && h["hash"]["modulus"] == 2);
        expect(holds.len() == 2 && remainders, format!("shard {i} holds hash remainder {i} of each table: {s}"));
        let server = format!("{}-primary", NAMES[i]);
        expect(s["servers"].to_string().contains(&server), format!("shard {i} lists {server}: {s}"));
        expect(s["statements"].is_u64() && s["rows_routed"].is_u64(), format!("shard {i} counts: {s}"));
    }
    let tables = before["tables"].to_string();
    let listed = before["tables"].is_array() && tables.contains("customers") && tables.contains("orders");
    expect(listed, format!("tables lists customers and orders: {before}"));
    // A keyed statement counts on its shard, a scatter in `scatters`.
    for _ in 0..3 {
        expect(simple(&mut c, "SELECT name FROM customers WHERE id = 7").error.is_none(), "keyed read".into());
    }
    expect(simple(&mut c, "SELECT count(*) FROM customers").error.is_none(), "scatter read".into());
    let after = shards_view(&f);
    let statements = |v: &serde_json::Value| v["shards"][holder]["statements"].as_u64().unwrap_or_default();
    expect(statements(&after) >= statements(&before) + 3, format!("keyed statements counted: {before}\n{after}"));
    let scattered = after["scatters"].as_u64() > before["scatters"].as_u64();
    expect(scattered, format!("scatters counted: {before}\n{after}"));
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}

/// `COPY ... FROM STDIN` with `data` cut into CopyData messages of `size` bytes (a row then
/// spans messages, and messages hold several rows).
fn copy_chunks(c: &mut Client, sql: &str, data: &[u8], size: usize) -> Outcome {
    c.send(&[FrontendMessage::Query(sql.into())]);
    loop {
        match c.recv() {
            Some(BackendMessage::CopyInResponse(_)) => {
                let mut msgs: Vec<FrontendMessage> =
                    data.chunks(size).map(|p| FrontendMessage::CopyData(Bytes::copy_from_slice(p))).collect();
                msgs.push(FrontendMessage::CopyDone);
                c.send(&msgs);
                return outcome(c);
            }
            Some(BackendMessage::ErrorResponse(e)) => {
                let mut o = outcome(c);
                o.error = Some((e.code().unwrap_or_default().into(), e.message().unwrap_or_default().into()));
                return o;
            }
            Some(_) => {}
            None => return Outcome::default(),
        }
    }
}

/// The one value `sql` gives on `server` directly.
fn value_on(server: &PgServer, sql: &str) -> String {
    let rows = direct(server, sql).unwrap_or_else(|e| panic!("{e}"));
    rows.first().and_then(|r| r.first().cloned().flatten()).unwrap_or_default()
}

/// The shard override: `/* refract: shard=N */` runs a statement on shard N alone (by name or
/// index; not when the "hint" is inside a string literal), `SET refract.shard` sends every
/// statement of the session there until RESET (or RESET ALL, DISCARD ALL), the hint beats the
/// SET, SHOW answers it, a bad shard is 22023 (failing a transaction), explain reports it, and
/// the extended protocol follows it. Every placement is checked on the shard servers directly.
#[test]
fn shard_override_runs_statements_on_the_named_shard() {
    let f = sharded(2);
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    let s = &f.cluster.standalone;
    let ok = |c: &mut Client, sql: &str| {
        let o = simple(c, sql);
        assert!(o.error.is_none(), "{sql}: {:?}", o.error);
        o
    };
    ok(&mut c, "CREATE TABLE customers (id int8 PRIMARY KEY, name text)");
    ok(&mut c, "CREATE TABLE products (id int8, name text)");
    let values: Vec<String> = (1..=20).map(|i| format!("({i}, 'c{i}')")).collect();
    ok(&mut c, &format!("INSERT INTO customers VALUES {}", values.join(", ")));
    let counts: Vec<String> = s.iter().map(|x| value_on(x, "SELECT count(*) FROM customers")).collect();
    assert!(counts.iter().all(|n| n != "0" && n != "20"), "both shards hold customers: {counts:?}");
    let products_on = |i: usize, id: i64| value_on(&s[i], &format!("SELECT count(*) FROM products WHERE id = {id}"));
    let count_of = |o: &Outcome| o.rows.first().and_then(|r| r[0].clone()).unwrap_or_default();

    // The hint: by name, by index, anywhere in the text; a replicated write lands on that shard only.
    ok(&mut c, "/* refract: shard=bravo */ INSERT INTO products VALUES (1, 'b')");
    ok(&mut c, "INSERT INTO products VALUES (2, 'a') /*refract:SHARD = 0*/");
    assert_eq!((products_on(0, 1), products_on(1, 1)), ("0".into(), "1".into()), "hint bravo");
    assert_eq!((products_on(0, 2), products_on(1, 2)), ("1".into(), "0".into()), "hint 0");
    let o = ok(&mut c, "SELECT count(*) FROM customers /* refract: shard=1 */");
    assert_eq!(count_of(&o), counts[1], "a scatter read on shard 1 only");
    // Not a hint: inside a string literal (an INSERT of a replicated table goes to every copy).
    ok(&mut c, "INSERT INTO products VALUES (3, '/* refract: shard=1 */')");
    assert_eq!((products_on(0, 3), products_on(1, 3)), ("1".into(), "1".into()), "literal, not a hint");

    // A COPY under a hint loads every row into that shard, even into a sharded table.
    let o = copy_in(&mut c, "/* refract: shard=1 */ COPY products FROM STDIN (FORMAT csv)", "6,x\n6,y\n");
    assert_eq!((o.error.clone(), o.tags.clone()), (None, vec!["COPY 2".to_owned()]), "{o:?}");
    assert_eq!((products_on(0, 6), products_on(1, 6)), ("0".into(), "2".into()), "COPY with a hint");
    let home = (1000..1100).find(|k| shard_of(*k, 2) == 0).unwrap();
    let o = copy_in(&mut c, "COPY customers FROM STDIN /* refract: shard=bravo */", &format!("{home}\tmisplaced\n"));
    assert_eq!(o.error, None, "{o:?}");
    let on = |i: usize| value_on(&s[i], &format!("SELECT count(*) FROM customers WHERE id = {home}"));
    assert_eq!((on(0), on(1)), ("0".into(), "1".into()), "the override places rows by hand, past the key");
    ok(&mut c, &format!("DELETE FROM customers WHERE id = {home} /* refract: shard=1 */"));

    // SET / SHOW / RESET.
    let o = ok(&mut c, "SET refract.shard = alpha");
    assert_eq!(o.tags, ["SET"]);
    let o = ok(&mut c, "SHOW refract.shard");
    assert_eq!((o.columns[0].0.as_str(), o.rows.clone()), ("refract.shard", vec![vec![Some("alpha".to_owned())]]));
    assert_eq!(count_of(&ok(&mut c, "SELECT count(*) FROM customers")), counts[0], "SET: shard alpha");
    let away = (1..100).find(|k| shard_of(*k, 2) == 1).unwrap();
    let keyed = ok(&mut c, &format!("SELECT count(*) FROM customers WHERE id = {away}"));
    assert_eq!(count_of(&keyed), "0", "key routing skipped: {away} is on bravo");
    ok(&mut c, "INSERT INTO products VALUES (4, 'a')");
    assert_eq!((products_on(0, 4), products_on(1, 4)), ("1".into(), "0".into()), "SET alpha");
    let o = ok(&mut c, "/* refract: shard=bravo */ SELECT count(*) FROM customers");
    assert_eq!(count_of(&o), counts[1], "the hint beats the SET");
    // SQL PREPARE / EXECUTE, refused without an override, run on the override's shard.
    ok(&mut c, "PREPARE q AS SELECT count(*) FROM customers");
    assert_eq!(count_of(&ok(&mut c, "EXECUTE q")), counts[0], "EXECUTE under SET");
    ok(&mut c, "DEALLOCATE q");
    let e = ok(&mut c, "/* refract: explain */ SELECT count(*) FROM customers");
    let text = format!("{:?}", e.rows);
    assert!(text.contains("alpha") && text.contains("SET refract.shard"), "explain: {text}");
    let e = ok(&mut c, "/* refract: explain */ /* refract: shard=1 */ SELECT 1");
    assert!(format!("{:?}", e.rows).contains("bravo"), "explain of a hint: {:?}", e.rows);
    // A transaction follows the override.
    ok(&mut c, "BEGIN");
    ok(&mut c, "INSERT INTO products VALUES (5, 'tx')");
    ok(&mut c, "COMMIT");
    assert_eq!((products_on(0, 5), products_on(1, 5)), ("1".into(), "0".into()), "transaction on alpha");
    // An override to another shard inside a transaction follows the keyed rules: without
    // two-phase commit (this cluster has no twophase_log) it is refused and the transaction fails.
    ok(&mut c, "BEGIN");
    ok(&mut c, "SELECT count(*) FROM customers");
    let o = simple(&mut c, "/* refract: shard=bravo */ SELECT 1");
    let code = o.error.as_ref().map(|e| e.0.as_str());
    assert_eq!((code, o.status), (Some("0A000"), Some(TxStatus::Failed)), "second shard: {o:?}");
    assert_eq!(simple(&mut c, "ROLLBACK").status, Some(TxStatus::Idle));
    // The extended protocol too.
    let o = extended(&mut c, "SELECT count(*) FROM customers", &[]);
    assert_eq!((o.error.clone(), count_of(&o)), (None, counts[0].clone()), "extended under SET");
    let o = extended(&mut c, "/* refract: shard=bravo */ SELECT count(*) FROM customers WHERE id > $1", &["0".into()]);
    assert_eq!((o.error.clone(), count_of(&o)), (None, counts[1].clone()), "extended hint");
    let o = ok(&mut c, "RESET refract.shard");
    assert_eq!(o.tags, ["RESET"]);
    assert_eq!(ok(&mut c, "SHOW refract.shard").rows, [[Some(String::new())]], "unset: empty");
    assert_eq!(count_of(&ok(&mut c, "SELECT count(*) FROM customers")), "20", "scatter again");
    for clear in ["SET refract.shard TO DEFAULT", "RESET ALL", "DISCARD ALL"] {
        ok(&mut c, "SET refract.shard TO 'bravo'");
        ok(&mut c, clear);
        assert_eq!(ok(&mut c, "SHOW refract.shard").rows, [[Some(String::new())]], "{clear} clears it");
    }

    // Refusals.
    for sql in ["SET refract.shard = nowhere", "SET refract.shard = 2", "/* refract: shard=7 */ SELECT 1"] {
        let o = simple(&mut c, sql);
        let (code, msg) = o.error.clone().unwrap_or_default();
        assert_eq!(code, "22023", "{sql}: {o:?}");
        assert!(msg.contains("alpha") && msg.contains("bravo"), "{sql}: names the shards: {msg}");
        assert_eq!(o.status, Some(TxStatus::Idle));
    }
    ok(&mut c, "BEGIN");
    ok(&mut c, "SELECT count(*) FROM customers WHERE id = 1");
    let o = simple(&mut c, "SET refract.shard = 9");
    assert_eq!((o.error.map(|e| e.0), o.status), (Some("22023".into()), Some(TxStatus::Failed)));
    let o = simple(&mut c, "ROLLBACK");
    assert_eq!(o.status, Some(TxStatus::Idle));
    let o = simple(&mut c, "SET LOCAL refract.shard = 1");
    assert_eq!(o.error.map(|e| e.0), Some("0A000".into()));
    assert_eq!(ok(&mut c, "SHOW refract.shard").rows, [[Some(String::new())]], "refusals set nothing");
}

/// CSV rows ending `\r\n` (PostgreSQL wants one style throughout), with quoted delimiters,
/// doubled quotes, quoted newlines and NULLs; a header; the keys 1..=n.
fn csv_rows(n: i64) -> String {
    let mut out = String::from("id,name,note\r\n");
    for i in 1..=n {
        let note = match i % 5 {
            0 => String::new(), // NULL
            1 => format!("\"a, \"\"quoted\"\" {i}\""),
            2 => format!("\"two\nlines {i}\""),
            3 => "\"\"".to_owned(), // an empty string
            _ => format!("plain {i}"),
        };
        out += &format!("{i},\"name {i}\",{note}\r\n");
    }
    out
}

/// `COPY ... FROM STDIN (FORMAT csv ...)` through refract over 2 shards: every row on the shard
/// PostgreSQL's hash partitioning names, the rows equal to a plain PostgreSQL's loaded with the
/// same COPY, the tag `COPY n`; rows spanning CopyData messages at every cut; HEADER seen once
/// per shard; custom DELIMITER / QUOTE / ESCAPE / NULL; text with a custom delimiter; a NULL
/// key fails as on one server; the end marker `\.`.
#[test]
fn csv_copy_is_split_by_key_as_postgresql_partitions_it() {
    let f = sharded(2);
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    let mut plain = Client::connect(f.cluster.primary.addr(), USER, PASSWORD).unwrap();
    let ddl = "CREATE TABLE customers (id int8 PRIMARY KEY, name text, note text)";
    for cl in [&mut c, &mut plain] {
        let o = simple(cl, ddl);
        assert!(o.error.is_none(), "{o:?}");
    }
    let shards = &f.cluster.standalone[..2];
    let mut problems = vec![];
    let mut load = |c: &mut Client, plain: &mut Client, sql: &str, data: &[u8], size: usize, want: &str| {
        let got = copy_chunks(c, sql, data, size);
        let reference = copy_chunks(plain, sql, data, data.len().max(1));
        if got.tags != [want] || got.error.is_some() || reference.tags != [want] {
            problems.push(format!("{sql} in {size}-byte pieces: {got:?}, plain: {reference:?}"));
        }
    };
    let csv = csv_rows(120);
    let header = "COPY customers (id, name, note) FROM STDIN (FORMAT csv, HEADER true)";
    load(&mut c, &mut plain, header, csv.as_bytes(), 7, "COPY 120");
    // Custom options and an end marker (what follows it is ignored by both).
    let custom = "COPY customers FROM STDIN (FORMAT csv, DELIMITER ';', QUOTE '''', ESCAPE '\\', NULL 'NULL')";
    let data = "121;'it\\'s; here';NULL\n122;'x\n\\. y';'NULL'\n'123';\"b\";''\n\\.\n";
    load(&mut c, &mut plain, custom, data.as_bytes(), 1, "COPY 3");
    // Text with a custom delimiter and NULL.
    let text = "COPY customers FROM STDIN (DELIMITER '|', NULL '-')";
    load(&mut c, &mut plain, text, b"124|a\\|b|-\n125|c|d\n", 3, "COPY 2");
    // Every cut of a small CSV load: same rows, same placement.
    let small = "126,\"q,\"\"\n\",x\n127,y,\n";
    for size in 1..small.len() {
        let sql = "COPY customers FROM STDIN (FORMAT csv)";
        load(&mut c, &mut plain, sql, small.as_bytes(), size, "COPY 2");
        for cl in [&mut c, &mut plain] {
            simple(cl, "DELETE FROM customers WHERE id IN (126, 127)");
        }
    }
    for (what, r) in [
        ("the shards' rows together", together(shards, &f.cluster.primary, "customers")),
        ("placement by id", placement(shards, &f.cluster.primary, "customers", "id")),
    ] {
        if let Err(e) = r {
            problems.push(format!("{what}: {e}"));
        }
    }
    for (i, s) in shards.iter().enumerate() {
        let n = value_on(s, "SELECT count(*) FROM customers");
        if n == "0" {
            problems.push(format!("shard {i} got no rows"));
        }
    }
    // A NULL key: as PostgreSQL (the NOT NULL of the primary key), the COPY loads nothing.
    let null_key = "COPY customers FROM STDIN (FORMAT csv)";
    let got = copy_chunks(&mut c, null_key, b"200,a,b\n,b,c\n", 4);
    let want = copy_chunks(&mut plain, null_key, b"200,a,b\n,b,c\n", 4);
    let code = |o: &Outcome| o.error.as_ref().map(|e| e.0.clone());
    if code(&got) != code(&want) || code(&got).is_none() {
        problems.push(format!("NULL key: {got:?}, plain: {want:?}"));
    }
    if shards.iter().any(|s| value_on(s, "SELECT count(*) FROM customers WHERE id = 200") != "0") {
        problems.push("the failed COPY left row 200".into());
    }
    // Refused with the reason, before any row: binary.
    let o = simple(&mut c, "COPY customers FROM STDIN (FORMAT binary)");
    if o.error.as_ref().map(|e| e.0.as_str()) != Some("0A000") {
        problems.push(format!("binary: {o:?}"));
    }
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}
