//! Extended-protocol batches over several shards (docs/sharding.md "Extended protocol",
//! `sharding/several.rs`), against real PostgreSQL: refract over two shards (customers hash
//! sharded by `id`, products replicated, two-phase commit configured) beside one plain
//! PostgreSQL loaded alike. Each batch goes to both; the answers must be the same message by
//! message (binary results byte for byte), and rows written must sit on the shard
//! PostgreSQL's hash partitioning names. A batch is PostgreSQL's implicit transaction: when
//! one of its statements fails, none of its writes stays, on any shard.
#![allow(clippy::unwrap_used)]

use crate::pg_common;
use crate::pg_sharded_cases;

use bytes::Bytes;
use pg_common::{shard_config, until, Client, Fixture};
use pg_sharded_cases::shard_of;
use refract_pg::frontend::{Bind, Target};
use refract_pg::{BackendMessage, FrontendMessage, TxStatus};
use refract_testkit::{PgCluster, PgServer, PASSWORD, USER};

/// SQLSTATE `feature_not_supported`: what refract answers for what it does not run.
const REFUSED: &str = "0A000";

/// int4's type OID.
const INT4: u32 = 23;

/// One message of an answer, comparable across servers (a RowDescription without the table
/// OIDs, which differ from server to server).
fn shown(m: &BackendMessage) -> String {
    match m {
        BackendMessage::RowDescription(fields) => {
            let f: Vec<_> =
                fields.iter().map(|f| (f.name.clone(), f.type_oid, f.type_size, f.type_modifier, f.format)).collect();
            format!("RowDescription{f:?}")
        }
        BackendMessage::ErrorResponse(e) => format!("Error({})", e.code().unwrap_or_default()),
        other => format!("{other:?}"),
    }
}

/// Sends `msgs` and reads the answer to ReadyForQuery, each message shown. Rows of a result
/// without ORDER BY come in any order: `sort` sorts each run of DataRows.
fn batch_sorted(c: &mut Client, msgs: &[FrontendMessage], sort: bool) -> Vec<String> {
    c.send(msgs);
    let mut out: Vec<String> = vec![];
    let mut run_start = None;
    while let Some(m) = c.recv() {
        let ready = matches!(m, BackendMessage::ReadyForQuery(_));
        let row = matches!(m, BackendMessage::DataRow(_));
        match (row, run_start) {
            (true, None) => run_start = Some(out.len()),
            (false, Some(at)) if sort => {
                out[at..].sort();
                run_start = None;
            }
            _ => {}
        }
        out.push(shown(&m));
        if ready {
            break;
        }
    }
    out
}

fn batch(c: &mut Client, msgs: &[FrontendMessage]) -> Vec<String> {
    batch_sorted(c, msgs, false)
}

fn parse(name: &str, sql: &str, types: &[u32]) -> FrontendMessage {
    FrontendMessage::Parse { name: name.into(), query: sql.into(), param_types: types.to_vec() }
}

fn bind(statement: &str, params: &[&str], result_formats: &[i16]) -> FrontendMessage {
    FrontendMessage::Bind(Bind {
        portal: String::new(),
        statement: statement.into(),
        param_formats: vec![],
        params: params.iter().map(|p| Some(Bytes::from(p.to_string()))).collect(),
        result_formats: result_formats.to_vec(),
    })
}

fn execute() -> FrontendMessage {
    FrontendMessage::Execute { portal: String::new(), max_rows: 0 }
}

fn describe_portal() -> FrontendMessage {
    FrontendMessage::Describe(Target::Portal, String::new())
}

/// refract over two standalone shards of a fresh cluster (its primary is the plain server),
/// with a two-phase commit log in `dir`.
fn sharded(dir: &std::path::Path) -> Fixture {
    let mut cluster = PgCluster::start_with_replicas(0).expect("PostgreSQL test cluster");
    for _ in 0..2 {
        cluster.add_standalone().unwrap();
    }
    let shards: Vec<&PgServer> = cluster.standalone.iter().collect();
    let servers = shard_config(&["s0", "s1"], &shards, &[("customers", "id")]);
    let extra = format!("twophase_log = \"{}\"", dir.join("twophase.log").display());
    let f = Fixture::start_servers(cluster, &extra, &servers);
    until("refract answers through its shards", || {
        Client::connect(f.addr(), USER, PASSWORD).is_ok_and(|mut c| c.query("SELECT 1").error.is_none())
    });
    f
}

/// Rows of `sql` on `server` directly.
fn on(server: &PgServer, sql: &str) -> Vec<Vec<Option<String>>> {
    let mut c = Client::connect(server.addr(), USER, PASSWORD).unwrap();
    let a = c.query(sql);
    assert!(a.error.is_none(), "{sql}: {:?}", a.error);
    a.rows
}

/// The shard servers holding customer `id` (must be exactly the one hash partitioning names).
fn holders(f: &Fixture, id: i64) -> Vec<usize> {
    (0..2)
        .filter(|&i| on(&f.cluster.standalone[i], &format!("SELECT 1 FROM customers WHERE id = {id}")).len() == 1)
        .collect()
}

/// Sends `msgs` to refract (`r`) and to the plain server (`p`): a problem when the answers
/// differ. Returns refract's.
fn same(
    problems: &mut Vec<String>,
    what: &str,
    msgs: &[FrontendMessage],
    r: &mut Client,
    p: &mut Client,
) -> Vec<String> {
    let sort = what.contains("returning");
    let (got, want) = (batch_sorted(r, msgs, sort), batch_sorted(p, msgs, sort));
    if got != want {
        problems.push(format!("{what}:\n    refract: {got:?}\n    plain:   {want:?}"));
    }
    got
}

#[test]
fn extended_batches_over_several_shards_answer_as_one_postgres() {
    let dir = std::env::temp_dir().join(format!("refract-batches-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = sharded(&dir);
    let mut r = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    let mut p = Client::connect(f.cluster.primary.addr(), USER, PASSWORD).unwrap();
    let rows: Vec<String> = (1..=40).map(|i| format!("({i}, 'c{i}', {})", i % 7)).collect();
    for sql in [
        "CREATE TABLE customers (id int8 PRIMARY KEY, name text, score int4)".to_owned(),
        "CREATE TABLE products (id int4 PRIMARY KEY, name text)".to_owned(),
        format!("INSERT INTO customers VALUES {}", rows.join(", ")),
        "INSERT INTO products VALUES (1, 'p1'), (2, 'p2')".to_owned(),
    ] {
        for c in [&mut r, &mut p] {
            let a = c.query(&sql);
            assert!(a.error.is_none(), "{sql}: {:?}", a.error);
        }
    }
    let mut problems: Vec<String> = vec![];
    // executemany: one statement, six rows on both shards, one Sync.
    let mut msgs = vec![parse("ins", "INSERT INTO customers VALUES ($1, $2, $3)", &[])];
    for id in 101..=106 {
        msgs.extend([bind("ins", &[&id.to_string(), "new", "1"], &[]), execute()]);
    }
    msgs.push(FrontendMessage::Sync);
    same(&mut problems, "executemany over both shards", &msgs, &mut r, &mut p);
    let spread: Vec<u64> = (101..=106).map(|id| shard_of(id, 2)).collect();
    assert!(spread.contains(&0) && spread.contains(&1), "the rows span both shards: {spread:?}");

    // The batch's implicit transaction: a duplicate key after rows on both shards undoes them all.
    let mut msgs = vec![];
    for id in ["201", "202", "203", "101"] {
        msgs.extend([bind("ins", &[id, "dup", "1"], &[]), execute()]);
    }
    msgs.push(FrontendMessage::Sync);
    let got = same(&mut problems, "a failing batch", &msgs, &mut r, &mut p);
    if !got.iter().any(|m| m == "Error(23505)") {
        problems.push(format!("the failing batch failed otherwise: {got:?}"));
    }

    // Reads over both shards: binary and text results, described, aggregated, ordered.
    for (what, sql, params, formats) in [
        (
            "scatter order by, binary",
            "SELECT id, score FROM customers WHERE score > $1 ORDER BY score DESC, id",
            vec!["3"],
            vec![1],
        ),
        (
            "scatter order by, text",
            "SELECT id, name FROM customers WHERE score = $1 ORDER BY id LIMIT 4 OFFSET 1",
            vec!["2"],
            vec![],
        ),
        ("aggregates, binary", "SELECT count(*), sum(score), min(id), max(name) FROM customers", vec![], vec![1]),
        (
            "group by, binary",
            "SELECT score, count(*), max(id) FROM customers GROUP BY score ORDER BY score",
            vec![],
            vec![1, 1, 1],
        ),
        (
            "any array",
            "SELECT id, name FROM customers WHERE id = ANY($1::int8[]) ORDER BY id",
            vec!["{1,2,3,101,102}"],
            vec![],
        ),
    ] {
        let msgs =
            [parse("", sql, &[]), bind("", &params, &formats), describe_portal(), execute(), FrontendMessage::Sync];
        same(&mut problems, what, &msgs, &mut r, &mut p);
    }

    // A statement prepared in a batch of its own, then bound over both shards.
    let types = [INT4];
    let prepare = [
        parse("q", "SELECT count(*) FROM customers WHERE score >= $1", &types),
        FrontendMessage::Describe(Target::Statement, "q".into()),
        FrontendMessage::Sync,
    ];
    same(&mut problems, "prepare and describe", &prepare, &mut r, &mut p);
    same(
        &mut problems,
        "execute the prepared statement over both shards",
        &[bind("q", &["3"], &[]), execute(), FrontendMessage::Sync],
        &mut r,
        &mut p,
    );
    // Describe of a statement and a portal inside a batch refract runs itself.
    let msgs = [
        parse("q2", "SELECT id FROM customers WHERE id = ANY($1::int8[]) ORDER BY id", &[]),
        FrontendMessage::Describe(Target::Statement, "q2".into()),
        bind("q2", &["{4,5,6,7}"], &[]),
        describe_portal(),
        execute(),
        FrontendMessage::Close(Target::Statement, "q2".into()),
        FrontendMessage::Sync,
    ];
    same(&mut problems, "describe statement and portal, close", &msgs, &mut r, &mut p);
    same(
        &mut problems,
        "the closed statement is gone",
        &[bind("q2", &["{1}"], &[]), execute(), FrontendMessage::Sync],
        &mut r,
        &mut p,
    );

    // Writes on several shards and on every copy of a replicated table, one answer each.
    for (what, sql, params) in [
        ("update over both shards", "UPDATE customers SET score = score + 1 WHERE score = $1", vec!["6"]),
        (
            "delete returning over both shards",
            "DELETE FROM customers WHERE id > $1 AND id < 105 RETURNING id",
            vec!["102"],
        ),
        ("insert into a replicated table", "INSERT INTO products VALUES ($1, $2)", vec!["3", "p3"]),
    ] {
        let msgs = [parse("", sql, &[]), bind("", &params, &[]), execute(), FrontendMessage::Sync];
        same(&mut problems, what, &msgs, &mut r, &mut p);
    }
    same(
        &mut problems,
        "the writes' result",
        &[parse("", "SELECT * FROM customers ORDER BY id", &[]), bind("", &[], &[]), execute(), FrontendMessage::Sync],
        &mut r,
        &mut p,
    );

    // Rows sit where PostgreSQL's hash partitioning puts them; the failed batch left none.
    for id in [101i64, 102, 105, 106] {
        let want = vec![shard_of(id, 2) as usize];
        if holders(&f, id) != want {
            problems.push(format!("customer {id} on shards {:?}, want {want:?}", holders(&f, id)));
        }
    }
    for id in [201i64, 202, 203] {
        if !holders(&f, id).is_empty() {
            problems.push(format!("customer {id} of the failed batch stayed on {:?}", holders(&f, id)));
        }
    }
    for (i, s) in f.cluster.standalone.iter().enumerate() {
        if on(s, "SELECT id FROM products ORDER BY id").len() != 3 {
            problems.push(format!("shard {i} does not hold the three products"));
        }
    }

    // A transaction on both shards, its statements and its COMMIT sent as extended batches:
    // two-phase commit, nothing left prepared.
    let (a, b) = ((1..).find(|i| shard_of(*i, 2) == 0).unwrap(), (1..).find(|i| shard_of(*i, 2) == 1).unwrap());
    assert!(r.query("BEGIN").error.is_none());
    for id in [a, b] {
        let msgs = [
            parse("", "UPDATE customers SET name = 'tx' WHERE id = $1", &[]),
            bind("", &[&id.to_string()], &[]),
            execute(),
            FrontendMessage::Sync,
        ];
        let got = batch(&mut r, &msgs);
        if got.last().map(String::as_str) != Some("ReadyForQuery(InTransaction)")
            || got.iter().any(|m| m.starts_with("Error"))
        {
            problems.push(format!("update of {id} in the transaction: {got:?}"));
        }
    }
    let got = batch(&mut r, &[parse("", "COMMIT", &[]), bind("", &[], &[]), execute(), FrontendMessage::Sync]);
    let want = ["ParseComplete", "BindComplete", "CommandComplete(\"COMMIT\")", "ReadyForQuery(Idle)"];
    if got != want {
        problems.push(format!("extended COMMIT over two shards: {got:?}"));
    }
    for (i, s) in f.cluster.standalone.iter().enumerate() {
        let id = if i == 0 { a } else { b };
        if on(s, &format!("SELECT name FROM customers WHERE id = {id}")) != vec![vec![Some("tx".to_owned())]] {
            problems.push(format!("the transaction's update of {id} is not on shard {i}"));
        }
        if on(s, "SELECT count(*) FROM pg_prepared_xacts") != vec![vec![Some("0".to_owned())]] {
            problems.push(format!("a prepared transaction stayed on shard {i}"));
        }
    }

    // A savepoint in a transaction on both shards is refused (it would roll back one shard's
    // part only): the transaction fails and its ROLLBACK ends it.
    assert!(r.query("BEGIN").error.is_none());
    for id in [a, b] {
        assert!(r.query(&format!("UPDATE customers SET name = 'sp' WHERE id = {id}")).error.is_none());
    }
    for (how, answer) in [
        ("simple", r.query("SAVEPOINT s1")),
        ("extended", {
            assert!(r.query("ROLLBACK").error.is_none());
            assert!(r.query("BEGIN").error.is_none());
            for id in [a, b] {
                assert!(r.query(&format!("UPDATE customers SET name = 'sp' WHERE id = {id}")).error.is_none());
            }
            r.extended("SAVEPOINT s2")
        }),
    ] {
        let refused = answer.error.as_ref().is_some_and(|e| e.code() == Some(REFUSED));
        if !refused || answer.status != Some(TxStatus::Failed) {
            problems.push(format!("{how} savepoint over two shards: {:?} {:?}", answer.error, answer.status));
        }
    }
    let end = r.query("ROLLBACK");
    if end.error.is_some() || end.status != Some(TxStatus::Idle) {
        problems.push(format!("ROLLBACK after the refused savepoint: {:?} {:?}", end.error, end.status));
    }
    for (i, s) in f.cluster.standalone.iter().enumerate() {
        if on(s, "SELECT count(*) FROM customers WHERE name = 'sp'") != vec![vec![Some("0".to_owned())]] {
            problems.push(format!("the rolled back updates stayed on shard {i}"));
        }
    }

    // What refract does not run across shards is refused with the reason, and the session goes on.
    let refusals: [(&str, Vec<FrontendMessage>); 3] = [
        (
            "a window function over a sharded table",
            vec![
                parse("", "SELECT id, row_number() OVER (ORDER BY id) FROM customers", &[]),
                bind("", &[], &[]),
                execute(),
                FrontendMessage::Sync,
            ],
        ),
        (
            "part of a portal",
            vec![
                parse("", "SELECT id FROM customers", &[]),
                bind("", &[], &[]),
                FrontendMessage::Execute { portal: String::new(), max_rows: 2 },
                FrontendMessage::Sync,
            ],
        ),
        (
            "a SET beside a read over several shards",
            vec![
                parse("s", "SET application_name = 'x'", &[]),
                bind("s", &[], &[]),
                execute(),
                parse("", "SELECT count(*) FROM customers", &[]),
                bind("", &[], &[]),
                execute(),
                FrontendMessage::Sync,
            ],
        ),
    ];
    for (what, msgs) in refusals {
        r.send(&msgs);
        let a = r.until_ready();
        let refused = a
            .error
            .as_ref()
            .is_some_and(|e| e.code() == Some(REFUSED) && e.message().is_some_and(|m| m.starts_with("refract: ")));
        if !refused || a.status != Some(TxStatus::Idle) {
            problems.push(format!("{what}: want 0A000 with a reason, got {:?} {:?}", a.error, a.status));
        }
        if r.query("SELECT 1").error.is_some() {
            problems.push(format!("{what}: the session did not go on"));
        }
    }
    drop(f);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}
