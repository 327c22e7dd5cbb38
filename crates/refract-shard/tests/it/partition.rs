//! refract's hash placement against PostgreSQL's own: rows inserted into a real
//! `PARTITION BY HASH` table land in the partition whose remainder `partition::remainder`
//! computes, for every supported key type, several moduli, and a two-column key; array
//! parameters (`= ANY($n)`) read alike in PostgreSQL's text and binary forms.
#![allow(clippy::unwrap_used)]

use refract_pg::testkit::PgCluster;
use refract_shard::keyparam::Params;
use refract_shard::partition::{remainder, Key, KeyType};

/// Deterministic test values: a small LCG.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 11
    }
}

/// SQL literals and the same values as refract reads them (from the literal's text).
fn values(ty: KeyType, n: usize) -> Vec<String> {
    let mut r = Lcg(n as u64 * 7 + ty as u64);
    let mut out: Vec<String> = match ty {
        KeyType::Int2 => vec!["0".into(), "-1".into(), "32767".into(), "-32768".into()],
        KeyType::Int4 => vec!["0".into(), "-1".into(), "2147483647".into(), "-2147483648".into()],
        KeyType::Int8 => vec!["0".into(), "-1".into(), "9223372036854775807".into(), "-9223372036854775808".into()],
        KeyType::Text => vec![String::new(), "a".into(), "héllo wörld".into(), "x".repeat(100)],
        KeyType::Uuid => vec!["00000000-0000-0000-0000-000000000000".into()],
    };
    while out.len() < n {
        let v = r.next();
        out.push(match ty {
            KeyType::Int2 => (v as i16).to_string(),
            KeyType::Int4 => (v as i32).to_string(),
            KeyType::Int8 => ((v << 11) as i64 ^ (v as i64)).to_string(),
            // Every length from 0 to ~40 bytes, so each tail length of the 12-byte blocks occurs.
            KeyType::Text => (0..(v % 41)).map(|i| char::from(b'a' + ((v >> (i % 20)) % 26) as u8)).collect(),
            KeyType::Uuid => format!("{:016x}{:016x}", r.next() ^ (v << 11), v.rotate_left(17)),
        });
    }
    out
}

fn sql_type(ty: KeyType) -> &'static str {
    match ty {
        KeyType::Int2 => "int2",
        KeyType::Int4 => "int4",
        KeyType::Int8 => "int8",
        KeyType::Text => "text",
        KeyType::Uuid => "uuid",
    }
}

/// Creates `name` partitioned by hash over `cols` with `modulus` partitions, inserts `rows`
/// (each a list of SQL literals, numbered from 0 by `id`) and returns each id's remainder.
fn placed(cluster: &PgCluster, name: &str, cols: &[&str], modulus: u64, rows: &[Vec<String>]) -> Vec<u64> {
    let defs: Vec<String> = cols.iter().enumerate().map(|(i, t)| format!("k{i} {t}")).collect();
    let keys: Vec<String> = (0..cols.len()).map(|i| format!("k{i}")).collect();
    let mut sql = format!("CREATE TABLE {name} (id int, {}) PARTITION BY HASH ({});", defs.join(", "), keys.join(", "));
    for r in 0..modulus {
        sql += &format!(
            "CREATE TABLE {name}_r{r} PARTITION OF {name} FOR VALUES WITH (MODULUS {modulus}, REMAINDER {r});"
        );
    }
    let tuples: Vec<String> = rows
        .iter()
        .enumerate()
        .map(|(id, lits)| {
            let lits: Vec<String> =
                lits.iter().zip(cols).map(|(l, t)| format!("'{}'::{t}", l.replace('\'', "''"))).collect();
            format!("({id}, {})", lits.join(", "))
        })
        .collect();
    sql += &format!("INSERT INTO {name} VALUES {};", tuples.join(", "));
    cluster.psql(&cluster.primary, &sql).unwrap();
    let out = cluster
        .psql(
            &cluster.primary,
            &format!("SELECT id, substring(tableoid::regclass::text from '_r([0-9]+)$') FROM {name} ORDER BY id"),
        )
        .unwrap();
    out.lines().map(|l| l.split_once('|').unwrap().1.parse().unwrap()).collect()
}

#[test]
fn every_key_type_lands_where_postgresql_puts_it() {
    let cluster = PgCluster::start_with_replicas(0).unwrap();
    for ty in [KeyType::Int2, KeyType::Int4, KeyType::Int8, KeyType::Text, KeyType::Uuid] {
        for modulus in [2u64, 3, 7] {
            let vals = values(ty, 200);
            let rows: Vec<Vec<String>> = vals.iter().map(|v| vec![v.clone()]).collect();
            let name = format!("p_{}_{modulus}", sql_type(ty));
            let theirs = placed(&cluster, &name, &[sql_type(ty)], modulus, &rows);
            let ours: Vec<u64> =
                vals.iter().map(|v| remainder(&[ty.parse_text(v.as_bytes()).unwrap()], modulus)).collect();
            assert_eq!(ours, theirs, "{name}: values {vals:?}");
        }
    }
}

#[test]
fn varchar_keys_and_two_column_keys_match_too() {
    let cluster = PgCluster::start_with_replicas(0).unwrap();
    let (a, b) = (values(KeyType::Int8, 150), values(KeyType::Text, 150));
    let rows: Vec<Vec<String>> = a.iter().zip(&b).map(|(x, y)| vec![x.clone(), y.clone()]).collect();
    let theirs = placed(&cluster, "p_two", &["int8", "varchar"], 5, &rows);
    let ours: Vec<u64> = rows
        .iter()
        .map(|r| {
            let keys = [
                KeyType::Int8.parse_text(r[0].as_bytes()).unwrap(),
                KeyType::Text.parse_text(r[1].as_bytes()).unwrap(),
            ];
            remainder(&keys, 5)
        })
        .collect();
    assert_eq!(ours, theirs);
    // A NULL key column is skipped, in PostgreSQL as here.
    cluster.psql(&cluster.primary, "INSERT INTO p_two VALUES (1000, NULL, 'abc'), (1001, NULL, NULL)").unwrap();
    let got = cluster
        .psql(
            &cluster.primary,
            "SELECT substring(tableoid::regclass::text from '_r([0-9]+)$') FROM p_two WHERE id >= 1000 ORDER BY id",
        )
        .unwrap();
    let want = [remainder(&[Key::Null, Key::Text(b"abc".to_vec())], 5), remainder(&[Key::Null, Key::Null], 5)];
    assert_eq!(got, format!("{}\n{}", want[0], want[1]));
}

fn unhex(h: &str) -> Vec<u8> {
    (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn array_parameters_read_alike_in_postgresqls_text_and_binary_forms() {
    let cluster = PgCluster::start_with_replicas(0).unwrap();
    let cases = [
        (KeyType::Int8, "ARRAY[1, -2, NULL, 9223372036854775807]::int8[]"),
        (KeyType::Int4, "ARRAY[[1, 2], [3, 4]]::int4[]"),
        (KeyType::Text, r#"ARRAY['a b', 'c"d', 'e,f', 'g\h', '{x}', 'NULL', NULL, '', ' pad ']::text[]"#),
        (KeyType::Uuid, "ARRAY['a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', NULL]::uuid[]"),
        (KeyType::Int8, "'{}'::int8[]"),
    ];
    for (ty, expr) in cases {
        let out = cluster
            .psql(&cluster.primary, &format!("SELECT ({expr})::text, encode(array_send({expr}), 'hex')"))
            .unwrap();
        let (text, hex) = out.split_once('|').unwrap();
        let bin = unhex(hex);
        let from_text = Params { formats: &[], values: &[Some(text.as_bytes())] }.array(1, ty).unwrap();
        let from_bin = Params { formats: &[1], values: &[Some(&bin)] }.array(1, ty).unwrap();
        assert_eq!(from_text, from_bin, "{expr}: text form {text}");
        assert!(!from_text.is_empty() || expr.starts_with("'{}'"), "{expr}");
        if ty == KeyType::Text {
            let t = |s: &str| Key::Text(s.as_bytes().to_vec());
            let want = [t("a b"), t("c\"d"), t("e,f"), t(r"g\h"), t("{x}"), t("NULL"), Key::Null, t(""), t(" pad ")];
            assert_eq!(from_text, want, "{text}");
        }
    }
}
