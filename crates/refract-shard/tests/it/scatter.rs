//! Scatter-gather against real PostgreSQL: the same rows in one plain database and split by
//! PostgreSQL's hash partitioning (`partition::remainder`) over 2 and over 3 databases of one
//! test server (each database a shard: merging does not care where a shard runs). Every
//! SELECT goes through plan → each shard → Gather and must equal the plain database's answer
//! byte for byte: columns, rows (in order where ORDER BY fixes it, as a multiset otherwise)
//! and the CommandComplete tag; in text and in binary (all result columns binary).
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::BytesMut;
use refract_pg::auth::{ClientAuth, ClientStep};
use refract_pg::frontend::{Bind, Target};
use refract_pg::startup::PROTOCOL_3_0;
use refract_pg::testkit::{PgCluster, PgServer, PASSWORD, USER};
use refract_pg::{BackendMessage, FrontendMessage, Limits, Startup, StartupPacket};
use refract_shard::partition::{remainder, Key};
use refract_shard::scatter::{self, write_tag, Decision, Gather, Options, Placement, Plan, Row, Step};

/// A minimal blocking client built from refract-pg's codec, on one database.
struct Conn {
    stream: TcpStream,
    buf: BytesMut,
}

impl Conn {
    fn connect(server: &PgServer, db: &str) -> Conn {
        let stream = TcpStream::connect(server.addr()).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut c = Conn { stream, buf: BytesMut::new() };
        let params = vec![("user".into(), USER.into()), ("database".into(), db.into())];
        let mut out = BytesMut::new();
        StartupPacket::Startup(Startup { protocol: PROTOCOL_3_0, params }).encode(&mut out);
        c.stream.write_all(&out).unwrap();
        let mut auth = ClientAuth::new(USER, Some(PASSWORD));
        loop {
            match c.recv() {
                BackendMessage::Authentication(a) => match auth.step(&a).unwrap() {
                    ClientStep::Send(bytes) => c.stream.write_all(&bytes).unwrap(),
                    ClientStep::Wait => {}
                    ClientStep::Authenticated => break,
                },
                other => panic!("during auth: {other:?}"),
            }
        }
        c.until_ready();
        c
    }

    fn recv(&mut self) -> BackendMessage {
        loop {
            if let Some((msg, n)) = BackendMessage::parse(&self.buf, &Limits::default()).unwrap() {
                let _ = self.buf.split_to(n);
                return msg;
            }
            let mut chunk = [0u8; 65536];
            let n = self.stream.read(&mut chunk).unwrap();
            assert!(n > 0, "server closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn send(&mut self, msgs: &[FrontendMessage]) {
        let mut out = BytesMut::new();
        msgs.iter().for_each(|m| m.encode(&mut out));
        self.stream.write_all(&out).unwrap();
    }

    fn until_ready(&mut self) -> Vec<BackendMessage> {
        let mut got = vec![];
        loop {
            match self.recv() {
                BackendMessage::ReadyForQuery(_) => return got,
                m => got.push(m),
            }
        }
    }

    /// Runs `sql` (simple query, several statements allowed); panics on an error.
    fn exec(&mut self, sql: &str) -> Vec<BackendMessage> {
        self.send(&[FrontendMessage::Query(sql.into())]);
        let msgs = self.until_ready();
        if let Some(BackendMessage::ErrorResponse(e)) =
            msgs.iter().find(|m| matches!(m, BackendMessage::ErrorResponse(_)))
        {
            panic!("{sql}: {:?}", e.message());
        }
        msgs
    }

    /// Starts `sql` in text (simple query) or binary (extended, all results binary) and
    /// returns its RowDescription; rows follow through [`Conn::row`].
    fn start(&mut self, sql: &str, binary: bool) -> Vec<refract_pg::backend::FieldDescription> {
        if binary {
            let bind = Bind {
                portal: String::new(),
                statement: String::new(),
                param_formats: vec![],
                params: vec![],
                result_formats: vec![1],
            };
            self.send(&[
                FrontendMessage::Parse { name: String::new(), query: sql.into(), param_types: vec![] },
                FrontendMessage::Bind(bind),
                FrontendMessage::Describe(Target::Portal, String::new()),
                FrontendMessage::Execute { portal: String::new(), max_rows: 0 },
                FrontendMessage::Sync,
            ]);
        } else {
            self.send(&[FrontendMessage::Query(sql.into())]);
        }
        loop {
            match self.recv() {
                BackendMessage::RowDescription(f) => return f,
                BackendMessage::ParseComplete | BackendMessage::BindComplete => {}
                other => panic!("{sql}: {other:?}"),
            }
        }
    }

    /// The next row, or `None` (and the tag) at CommandComplete, then reads to ReadyForQuery.
    fn row(&mut self) -> Result<Row, String> {
        match self.recv() {
            BackendMessage::DataRow(r) => Ok(r),
            BackendMessage::CommandComplete(tag) => {
                self.until_ready();
                Err(tag)
            }
            other => panic!("{other:?}"),
        }
    }
}

/// A result as the client sees it (table OIDs and column numbers left out: they differ
/// between databases).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    columns: Vec<(String, u32, i16, i32, i16)>,
    rows: Vec<Row>,
    tag: String,
}

fn columns(fields: &[refract_pg::backend::FieldDescription]) -> Vec<(String, u32, i16, i32, i16)> {
    fields.iter().map(|f| (f.name.clone(), f.type_oid, f.type_size, f.type_modifier, f.format)).collect()
}

fn plain(c: &mut Conn, sql: &str, binary: bool) -> Answer {
    let fields = c.start(sql, binary);
    let mut rows = vec![];
    let tag = loop {
        match c.row() {
            Ok(r) => rows.push(r),
            Err(tag) => break tag,
        }
    };
    Answer { columns: columns(&fields), rows, tag }
}

/// plan → every shard → Gather.
fn scattered(shards: &mut [Conn], plan: &Plan, binary: bool) -> Result<Answer, String> {
    let descs: Vec<_> = shards.iter_mut().map(|s| s.start(&plan.sql, binary)).collect();
    let mut open = vec![true; shards.len()];
    let drain = |shards: &mut [Conn], open: &[bool]| {
        for (s, _) in shards.iter_mut().zip(open).filter(|(_, o)| **o) {
            while s.row().is_ok() {}
        }
    };
    let mut g = match Gather::new(plan, &descs, true) {
        Ok(g) => g,
        Err(e) => {
            drain(shards, &open);
            return Err(e.to_string());
        }
    };
    let mut rows = vec![];
    let tag = loop {
        match g.step().map_err(|e| e.to_string())? {
            Step::Row(r) => rows.push(r),
            Step::Need(s) => {
                let next = shards[s].row().ok();
                open[s] &= next.is_some();
                g.push(s, next).map_err(|e| e.to_string())?;
            }
            Step::Done(tag) => break tag,
        }
        assert!(g.resident() <= shards.len());
    };
    drain(shards, &open);
    Ok(Answer { columns: columns(g.description()), rows, tag })
}

/// A small LCG: deterministic test data.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len() as u64) as usize]
    }

    /// NULL one time in `n`, else `v`.
    fn or_null(&mut self, n: u64, v: impl FnOnce(&mut Lcg) -> String) -> String {
        if self.below(n) == 0 {
            "NULL".into()
        } else {
            v(self)
        }
    }
}

const SCHEMA: &str = "
CREATE TABLE customers (id int8 PRIMARY KEY, name text, city text, score int4, small int2,
  balance numeric(12,2), ratio numeric, rating float8, r4 float4, active bool, born date,
  seen timestamptz, at timestamp, ref uuid, blob bytea, code char(4), tag varchar(10));
CREATE TABLE few (id int8, v int4);
CREATE TABLE empty_t (id int8, v int4, n numeric);
CREATE TABLE nums (id int8, n numeric);
CREATE TABLE cities (name text, region text);
INSERT INTO cities VALUES ('Bern', 'west'), ('Chur', 'east'), ('Zug', 'center'), ('aarau', 'north');
";

/// One customer row's values, as SQL literals.
fn customer(id: i64, r: &mut Lcg) -> String {
    let name =
        r.or_null(12, |r| format!("'{}'", r.pick(&["Anna", "anna", "Bo", "Ärni", "", "zed", "Zed", "bo b", "x''y"])));
    let city = r.or_null(8, |r| format!("'{}'", r.pick(&["Bern", "Chur", "Zug", "aarau", "Basel"])));
    let score = r.or_null(9, |r| (r.below(101) as i64 - 50).to_string());
    let small = r.or_null(9, |r| (r.below(2001) as i64 - 1000).to_string());
    let balance = r.or_null(10, |r| format!("{}.{:02}", r.below(20_000) as i64 - 10_000, r.below(100)));
    let ratio = r.or_null(10, |r| r.pick(&["1.5", "0.333", "-12", "7.25000", "0", "1e3", "-0.001"]).to_string());
    let rating =
        r.or_null(10, |r| format!("'{}'", r.pick(&["1.5", "-0", "0", "NaN", "Infinity", "-2.25e10", "3.14159"])));
    let r4 = r.or_null(10, |r| format!("'{}'", r.pick(&["1.5", "-7", "NaN", "0.1", "-Infinity"])));
    let active = r.or_null(7, |r| r.pick(&["true", "false"]).into());
    let born = r.or_null(9, |r| {
        format!("'{}'", r.pick(&["2001-02-03", "0044-03-15 BC", "10000-01-01", "infinity", "1999-12-31"]))
    });
    let seen = r.or_null(9, |r| {
        format!("'2020-0{}-1{} 1{}:30:00.{}+0{}'", 1 + r.below(9), r.below(10), r.below(10), r.below(1000), r.below(9))
    });
    let at = r.or_null(9, |r| format!("'1999-12-31 2{}:59:5{}.5'", r.below(4), r.below(10)));
    let uuid = r.or_null(9, |r| format!("'{:08x}-0000-4000-8000-{:012x}'", r.below(1 << 31), r.below(1 << 40)));
    let blob = r.or_null(9, |r| format!("'\\x{}'", r.pick(&["", "00", "00ff", "01", "ff", "0a0b"])));
    let code = r.or_null(9, |r| format!("'{}'", r.pick(&["ab", "ab  ", "b", "a", "abcd"])));
    let tag = r.or_null(9, |r| format!("'{}'", r.pick(&["t1", "T1", "t10", "t2"])));
    format!("({id}, {name}, {city}, {score}, {small}, {balance}, {ratio}, {rating}, {r4}, {active}, {born}, {seen}, {at}, {uuid}, {blob}, {code}, {tag})")
}

/// Loads the plain database and each layout's shards; returns the plain connection and the
/// shards of each layout.
fn load(server: &PgServer, layouts: &[u64]) -> (Conn, Vec<Vec<Conn>>) {
    let mut admin = Conn::connect(server, "postgres");
    let mut r = Lcg(24);
    // 400 distinct ids, scattered over -300..708 (7919 and the prime 1009 are coprime).
    let rows: Vec<(i64, String)> = (1..=400i64)
        .map(|i| {
            let id = i * 7919 % 1009 - 300;
            (id, customer(id, &mut r))
        })
        .collect();
    // Three `few` rows all on shard 0 of both layouts: the other shards hold none.
    let on_zero = |id: &i64| remainder(&[Key::Int8(*id)], 2) == 0 && remainder(&[Key::Int8(*id)], 3) == 0;
    let few: Vec<(i64, i64)> = (1i64..).filter(on_zero).take(3).zip([10, 20, 5]).collect();
    // Numerics of many scales and magnitudes; the special values only in groups 1 and 2 of
    // `id % 5` (NaN in 1, both infinities in 2).
    let values = [
        "0",
        "-0.00",
        "1",
        "10000",
        "12345.6789",
        "0.0001",
        "-999999999999.99999",
        "1.10",
        "100000000.000000",
        "-0.000000000012340",
        "123456789012345678901234567890.5",
        "7.25000",
        "-3",
        "0.5",
    ];
    let nums: Vec<(i64, String)> = (1..=60i64)
        .map(|id| {
            let n = match id % 5 {
                1 if id % 3 == 0 => "'NaN'".into(),
                2 if id % 3 == 0 => "'Infinity'".into(),
                2 if id % 3 == 1 => "'-Infinity'".into(),
                _ if id % 11 == 0 => "NULL".into(),
                _ => values[(id as usize * 7) % values.len()].to_string(),
            };
            (id, n)
        })
        .collect();
    let fill = |c: &mut Conn, keep: &dyn Fn(i64) -> bool| {
        c.exec(SCHEMA);
        let mine: Vec<&str> = rows.iter().filter(|(id, _)| keep(*id)).map(|(_, v)| v.as_str()).collect();
        if !mine.is_empty() {
            c.exec(&format!("INSERT INTO customers VALUES {}", mine.join(", ")));
        }
        for (id, v) in few.iter().filter(|(id, _)| keep(*id)) {
            c.exec(&format!("INSERT INTO few VALUES ({id}, {v})"));
        }
        let mine: Vec<String> = nums.iter().filter(|(id, _)| keep(*id)).map(|(id, n)| format!("({id}, {n})")).collect();
        if !mine.is_empty() {
            c.exec(&format!("INSERT INTO nums VALUES {}", mine.join(", ")));
        }
    };
    admin.exec("CREATE DATABASE plain");
    let mut plain = Conn::connect(server, "plain");
    fill(&mut plain, &|_| true);
    let mut all = vec![];
    for &k in layouts {
        let mut shards = vec![];
        for i in 0..k {
            let db = format!("s{k}_{i}");
            admin.exec(&format!("CREATE DATABASE {db}"));
            let mut c = Conn::connect(server, &db);
            fill(&mut c, &|id| remainder(&[Key::Int8(id)], k) == i);
            shards.push(c);
        }
        all.push(shards);
    }
    (plain, all)
}

/// How to compare the scattered answer with the plain one.
#[derive(Debug, Clone, Copy)]
enum Cmp {
    /// The ORDER BY fixes every row's place.
    Exact,
    /// No ORDER BY: the same rows in any order.
    Set,
    /// ORDER BY these output columns with ties: their values in order, the rows as a multiset.
    Keys(&'static [usize]),
    /// LIMIT without ORDER BY: any rows; the same number of them.
    Count,
}

/// (SQL, comparison, also in binary).
const QUERIES: &[(&str, Cmp, bool)] = &[
    ("SELECT id, name FROM customers ORDER BY id", Cmp::Exact, true),
    ("SELECT id, name, city FROM customers ORDER BY city, id", Cmp::Exact, true),
    ("SELECT id, city FROM customers ORDER BY city DESC, id", Cmp::Exact, true),
    ("SELECT id, city FROM customers ORDER BY city NULLS FIRST, id DESC", Cmp::Exact, true),
    ("SELECT id, city FROM customers ORDER BY city DESC NULLS LAST, id", Cmp::Exact, true),
    ("SELECT id, score FROM customers ORDER BY score DESC NULLS LAST, id LIMIT 10", Cmp::Exact, true),
    ("SELECT id, name FROM customers ORDER BY name, id LIMIT 7 OFFSET 13", Cmp::Exact, true),
    ("SELECT name FROM customers ORDER BY id LIMIT 5", Cmp::Exact, true),
    ("SELECT name FROM customers ORDER BY id DESC OFFSET 390", Cmp::Exact, true),
    ("SELECT * FROM customers ORDER BY id OFFSET 395", Cmp::Exact, true),
    ("SELECT id, small FROM customers ORDER BY small, id", Cmp::Exact, true),
    ("SELECT id, balance FROM customers ORDER BY balance DESC, id", Cmp::Exact, true),
    ("SELECT id, ratio FROM customers ORDER BY ratio, id", Cmp::Exact, true),
    ("SELECT id, rating FROM customers ORDER BY rating, id", Cmp::Exact, true),
    ("SELECT id, r4 FROM customers ORDER BY r4 DESC, id", Cmp::Exact, true),
    ("SELECT id, active FROM customers ORDER BY active, id DESC", Cmp::Exact, true),
    ("SELECT id, born FROM customers ORDER BY born, id", Cmp::Exact, true),
    ("SELECT id, seen FROM customers ORDER BY seen DESC, id", Cmp::Exact, true),
    ("SELECT id, at FROM customers ORDER BY at, id", Cmp::Exact, true),
    ("SELECT id, ref FROM customers ORDER BY ref, id", Cmp::Exact, true),
    ("SELECT id, blob FROM customers ORDER BY blob, id", Cmp::Exact, true),
    ("SELECT id, code FROM customers ORDER BY code, id", Cmp::Exact, true),
    ("SELECT id, tag FROM customers ORDER BY tag DESC, id LIMIT 50", Cmp::Exact, true),
    ("SELECT id, name FROM customers ORDER BY lower(name), id", Cmp::Exact, true),
    ("SELECT id AS k, name FROM customers ORDER BY active, 2, k", Cmp::Exact, true),
    ("SELECT c.id, t.region FROM customers c JOIN cities t ON t.name = c.city ORDER BY t.region, c.id", Cmp::Exact, true),
    ("SELECT city, score FROM customers ORDER BY city", Cmp::Keys(&[0]), true),
    ("SELECT score, name FROM customers ORDER BY score DESC", Cmp::Keys(&[0]), true),
    ("SELECT born FROM customers ORDER BY born", Cmp::Exact, true),
    ("SELECT id, name FROM customers WHERE score > 10", Cmp::Set, true),
    ("SELECT * FROM customers", Cmp::Set, true),
    ("SELECT id FROM customers LIMIT 17", Cmp::Count, true),
    ("SELECT id FROM customers LIMIT 0", Cmp::Exact, true),
    ("SELECT count(*) FROM customers", Cmp::Exact, true),
    ("SELECT count(city), count(score), sum(score), sum(small), sum(id), min(id), max(id) FROM customers", Cmp::Exact, true),
    ("SELECT count(*), count(city), sum(score), sum(small), min(id), max(id) FROM customers", Cmp::Exact, true),
    ("SELECT sum(balance), sum(ratio), min(ratio), max(balance) FROM customers", Cmp::Exact, true),
    ("SELECT avg(score), avg(small), avg(id), avg(balance), avg(ratio) FROM customers", Cmp::Exact, true),
    ("SELECT min(name), max(name), min(city), max(code), min(tag) FROM customers", Cmp::Exact, true),
    ("SELECT min(rating), max(rating), min(r4), max(r4) FROM customers", Cmp::Exact, true),
    ("SELECT min(born), max(born), min(seen), max(at), max(small) FROM customers", Cmp::Exact, true),
    ("SELECT count(*), sum(score), avg(score), min(name) FROM customers WHERE id < -1000", Cmp::Exact, true),
    ("SELECT count(*), sum(v), avg(v), min(v), max(n), avg(n) FROM empty_t", Cmp::Exact, true),
    ("SELECT count(*), max(v), sum(v), avg(v) FROM few", Cmp::Exact, true),
    ("SELECT id, v FROM few ORDER BY v DESC", Cmp::Exact, true),
    ("SELECT count(*) AS n, sum(v) AS total FROM few LIMIT 1", Cmp::Exact, true),
    ("SELECT count(*) FROM customers OFFSET 1", Cmp::Exact, true),
    ("SELECT city, count(*), sum(score), avg(score), min(name), max(born) FROM customers GROUP BY city", Cmp::Set, true),
    ("SELECT city, count(*), sum(score), avg(score), min(name), max(born) FROM customers GROUP BY city ORDER BY city", Cmp::Exact, true),
    ("SELECT city, count(*) FROM customers GROUP BY city ORDER BY city DESC", Cmp::Exact, true),
    ("SELECT active, city, count(*), max(id) FROM customers GROUP BY active, city ORDER BY active DESC, city NULLS FIRST", Cmp::Exact, true),
    ("SELECT count(*), avg(balance), sum(ratio) FROM customers GROUP BY city", Cmp::Set, true),
    ("SELECT count(*), min(id) FROM customers GROUP BY city, active ORDER BY active", Cmp::Keys(&[]), true),
    ("SELECT score % 3, count(*), avg(small) FROM customers GROUP BY score % 3 ORDER BY 1", Cmp::Exact, true),
    ("SELECT tag, count(*), sum(small) FROM customers GROUP BY 1 ORDER BY 1 DESC", Cmp::Exact, true),
    ("SELECT city, count(*) FROM customers GROUP BY city ORDER BY city LIMIT 2 OFFSET 1", Cmp::Exact, true),
    ("SELECT code, count(*) FROM customers GROUP BY code ORDER BY code", Cmp::Exact, true),
    ("SELECT r4, count(*) FROM customers GROUP BY r4 ORDER BY r4", Cmp::Exact, true),
    ("SELECT born, avg(score) FROM customers GROUP BY born ORDER BY born DESC", Cmp::Exact, true),
    ("SELECT t.region, count(*), sum(c.score) FROM customers c JOIN cities t ON t.name = c.city GROUP BY t.region ORDER BY t.region", Cmp::Exact, true),
    ("SELECT DISTINCT city FROM customers", Cmp::Set, true),
    ("SELECT DISTINCT city FROM customers ORDER BY city", Cmp::Exact, true),
    ("SELECT DISTINCT city, active FROM customers ORDER BY active DESC, city LIMIT 4", Cmp::Exact, true),
    ("SELECT DISTINCT code FROM customers ORDER BY code", Cmp::Exact, true),
    ("SELECT DISTINCT score FROM customers ORDER BY score OFFSET 5 LIMIT 10", Cmp::Exact, true),
    ("SELECT DISTINCT ratio FROM customers ORDER BY ratio", Cmp::Exact, true),
    ("SELECT id % 5, count(n), sum(n), avg(n), min(n), max(n) FROM nums GROUP BY id % 5 ORDER BY 1", Cmp::Exact, true),
    ("SELECT sum(n), avg(n), min(n), max(n), count(*) FROM nums WHERE id % 5 IN (0, 3, 4)", Cmp::Exact, true),
    ("SELECT sum(id * 1000000000000), avg(id * 1000000000000), avg(id), sum(id) FROM nums", Cmp::Exact, true),
    ("SELECT id, n FROM nums ORDER BY n DESC NULLS LAST, id", Cmp::Exact, true),
    ("SELECT DISTINCT n FROM nums ORDER BY n", Cmp::Exact, true),
];

fn sorted(rows: &[Row]) -> Vec<Row> {
    let mut v = rows.to_vec();
    v.sort();
    v
}

fn same(cmp: Cmp, want: &Answer, got: &Answer, what: &str) {
    assert_eq!(got.columns, want.columns, "{what}: columns");
    let project = |rows: &[Row], cols: &[usize]| -> Vec<Row> {
        rows.iter().map(|r| cols.iter().map(|&c| r[c].clone()).collect()).collect()
    };
    match cmp {
        Cmp::Exact => assert_eq!(got.rows, want.rows, "{what}"),
        Cmp::Set => assert_eq!(sorted(&got.rows), sorted(&want.rows), "{what}"),
        Cmp::Keys(cols) => {
            assert_eq!(project(&got.rows, cols), project(&want.rows, cols), "{what}: order");
            assert_eq!(sorted(&got.rows), sorted(&want.rows), "{what}");
        }
        Cmp::Count => assert_eq!(got.rows.len(), want.rows.len(), "{what}"),
    }
    assert_eq!(got.tag, want.tag, "{what}: tag");
}

fn schema(t: &str) -> Option<&'static str> {
    match t {
        "customers" | "few" | "empty_t" | "nums" => Some("id"),
        _ => None,
    }
}

#[test]
fn selects_over_two_and_three_shards_answer_as_one_server() {
    let cluster = PgCluster::start_with_replicas(0).unwrap();
    let (mut one, mut layouts) = load(&cluster.primary, &[2, 3]);
    // The shards really split the rows, every one non-empty.
    for shards in &mut layouts {
        let counts: Vec<String> = shards
            .iter_mut()
            .map(|s| {
                plain(s, "SELECT count(*) FROM customers", false).rows[0][0]
                    .clone()
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default()
            })
            .collect();
        assert!(counts.iter().all(|c| c != "0" && c != "400"), "{counts:?}");
    }
    // `few` leaves shards empty: count(*) there is 0, sum and avg NULL.
    let few: Vec<usize> = layouts[1].iter_mut().map(|s| plain(s, "SELECT id FROM few", false).rows.len()).collect();
    assert_eq!(few, [3, 0, 0]);
    let opts = Options { schema: &schema, aggregates: &[], colocated: false };
    let mut compared = 0;
    for &(sql, cmp, binary) in QUERIES {
        let Decision::Exact(plan) = scatter::plan(sql, &opts) else { panic!("{sql}: not planned") };
        for fmt in [false, true].into_iter().filter(|&b| !b || binary) {
            let want = plain(&mut one, sql, fmt);
            for shards in &mut layouts {
                let what = format!("{sql} over {} shards{}", shards.len(), if fmt { " (binary)" } else { "" });
                let got = scattered(shards, &plan, fmt).unwrap_or_else(|e| panic!("{what}: {e}"));
                same(cmp, &want, &got, &what);
                compared += 1;
            }
        }
    }
    assert!(compared >= 150, "{compared}");
    refused_at_the_row_description(&mut layouts[0], &opts);
    write_counts(&mut one, &mut layouts[1]);
    catalog_facts(&mut one);
}

/// What only the shards' column types show is refused before any row is sent.
fn refused_at_the_row_description(shards: &mut [Conn], opts: &Options<'_>) {
    let cases = [
        ("SELECT avg(rating) FROM customers", false, true, "floating-point sums"),
        ("SELECT sum(r4) FROM customers", false, true, "floating-point sums"),
        ("SELECT id, name FROM customers ORDER BY name", false, false, "C collation"),
        ("SELECT min(name) FROM customers", false, false, "C collation"),
        ("SELECT id, ARRAY[id] AS a FROM customers ORDER BY a", false, true, "not compared across shards"),
    ];
    for (sql, binary, c_collation, why) in cases {
        let Decision::Exact(plan) = scatter::plan(sql, opts) else { panic!("{sql}") };
        let descs: Vec<_> = shards.iter_mut().map(|s| s.start(&plan.sql, binary)).collect();
        for s in shards.iter_mut() {
            while s.row().is_ok() {}
        }
        let err = Gather::new(&plan, &descs, c_collation).err().unwrap_or_else(|| panic!("{sql}: gathered"));
        assert_eq!(err.sqlstate(), scatter::REFUSED, "{sql}");
        assert!(err.to_string().contains(why), "{sql}: {err}");
    }
}

/// Writes: a sharded table's counts add up, a replicated table reports one copy's.
fn write_counts(one: &mut Conn, shards: &mut [Conn]) {
    let tag = |msgs: Vec<BackendMessage>| {
        msgs.into_iter()
            .find_map(|m| match m {
                BackendMessage::CommandComplete(t) => Some(t),
                _ => None,
            })
            .unwrap()
    };
    for (sql, placement) in [
        ("UPDATE customers SET score = score WHERE score > 0", Placement::Sharded),
        ("DELETE FROM customers WHERE id < -1000", Placement::Sharded),
        ("UPDATE cities SET region = region WHERE name <> 'Zug'", Placement::Replicated),
    ] {
        let want = tag(one.exec(sql));
        let tags: Vec<String> = shards.iter_mut().map(|s| tag(s.exec(sql))).collect();
        let tags: Vec<&str> = tags.iter().map(String::as_str).collect();
        assert_eq!(write_tag(&tags, placement).unwrap(), want, "{sql}: {tags:?}");
    }
}

/// The test servers compare text under C (what exact text merging needs), and every built-in
/// aggregate is one the planner knows.
fn catalog_facts(one: &mut Conn) {
    let text = |a: Answer| -> Vec<String> {
        a.rows.into_iter().map(|r| String::from_utf8_lossy(r[0].as_deref().unwrap_or_default()).into_owned()).collect()
    };
    let coll = text(plain(one, "SELECT datcollate FROM pg_database WHERE datname = current_database()", false));
    assert_eq!(coll, ["C"]);
    let aggs = text(plain(one, "SELECT DISTINCT proname::text FROM pg_proc WHERE prokind = 'a'", false));
    let unknown: Vec<&String> = aggs.iter().filter(|a| !scatter::BUILTIN_AGGREGATES.contains(&a.as_str())).collect();
    assert!(unknown.is_empty(), "aggregates the planner does not know: {unknown:?}");
    assert!(aggs.len() > 40, "{aggs:?}");
}
