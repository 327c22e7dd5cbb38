//! The gather's merge without servers: for random rows split over random shards, the merged
//! (and grouped) answer equals a plain sort (and grouping) of all rows, under random ORDER BY
//! directions, NULL placements, formats, OFFSET and LIMIT; and merging 2 × 1 M rows holds at
//! most one row per shard at any time.
#![allow(clippy::unwrap_used)]

use std::cmp::Ordering;
use std::collections::BTreeMap;

use bytes::Bytes;
use proptest::prelude::*;
use refract_pg::backend::FieldDescription;
use refract_shard::scatter::value::{oid, ColType};
use refract_shard::scatter::{Col, Gather, Plan, Role, Row, Shape, SortKey, Step};

fn field(name: &str, type_oid: u32, format: i16) -> FieldDescription {
    FieldDescription { name: name.into(), table_oid: 0, column: 0, type_oid, type_size: -1, type_modifier: -1, format }
}

/// Runs the gather over `shards` (each already in the plan's order).
fn gather(plan: &Plan, fields: &[FieldDescription], shards: Vec<Vec<Row>>) -> (Vec<Row>, String, usize) {
    let descs = vec![fields.to_vec(); shards.len()];
    let mut g = Gather::new(plan, &descs, true).unwrap();
    let mut streams: Vec<_> = shards.into_iter().map(Vec::into_iter).collect();
    let mut out = vec![];
    loop {
        match g.step().unwrap() {
            Step::Row(r) => out.push(r),
            Step::Need(s) => g.push(s, streams[s].next()).unwrap(),
            Step::Done(tag) => return (out, tag, g.peak()),
        }
    }
}

/// One test row: a nullable int key, a nullable text key, a unique id.
#[derive(Debug, Clone)]
struct Rec {
    n: Option<i32>,
    t: Option<Vec<u8>>,
    id: u32,
}

fn encode(r: &Rec, binary: bool) -> Row {
    let int =
        |v: i64| if binary { Bytes::copy_from_slice(&(v as i32).to_be_bytes()) } else { Bytes::from(v.to_string()) };
    vec![r.n.map(|v| int(v.into())), r.t.clone().map(Bytes::from), Some(int(r.id.into()))]
}

/// The reference order: one key's values, NULLs placed, direction applied to values only.
fn cmp_key<T: Ord>(a: &Option<T>, b: &Option<T>, desc: bool, nulls_first: bool) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => {
            if nulls_first {
                Ordering::Less
            } else {
                Ordering::Greater
            }
        }
        (Some(_), None) => {
            if nulls_first {
                Ordering::Greater
            } else {
                Ordering::Less
            }
        }
        (Some(x), Some(y)) => {
            if desc {
                y.cmp(x)
            } else {
                x.cmp(y)
            }
        }
    }
}

fn reference(keys: &[SortKey], a: &Rec, b: &Rec) -> Ordering {
    for k in keys {
        let (d, nf) = (k.desc, k.nulls_first);
        let o = match k.col {
            Col::Out(0) => cmp_key(&a.n, &b.n, d, nf),
            Col::Out(1) => cmp_key(&a.t, &b.t, d, nf),
            _ => cmp_key(&Some(a.id), &Some(b.id), d, nf),
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    Ordering::Equal
}

fn rec() -> impl Strategy<Value = (Option<i32>, Option<Vec<u8>>)> {
    let n = prop_oneof![1 => Just(None), 4 => (-5i32..5).prop_map(Some), 1 => any::<i32>().prop_map(Some)];
    let t = prop_oneof![1 => Just(None), 4 => proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'B'), Just(0xc3u8), Just(b' ')], 0..4).prop_map(Some)];
    (n, t)
}

fn key() -> impl Strategy<Value = SortKey> {
    (0usize..3, any::<bool>(), any::<bool>()).prop_map(|(c, desc, nulls_first)| SortKey {
        col: Col::Out(c),
        desc,
        nulls_first,
    })
}

proptest! {
    #[test]
    fn merging_sorted_shards_is_sorting_everything(
        vals in proptest::collection::vec((rec(), 0usize..4), 0..120),
        keys in proptest::collection::vec(key(), 0..3),
        binary in any::<bool>(),
        shards in 1usize..5,
        offset in 0u64..10,
        limit in proptest::option::of(0u64..50),
    ) {
        let recs: Vec<(Rec, usize)> =
            vals.into_iter().enumerate().map(|(i, ((n, t), s))| (Rec { n, t, id: i as u32 }, s % shards)).collect();
        // The id last makes the order total, so the answer is one exact sequence.
        let mut order = keys;
        order.push(SortKey { col: Col::Out(2), desc: false, nulls_first: false });
        let by = |a: &Rec, b: &Rec| reference(&order, a, b);
        let mut parts: Vec<Vec<Rec>> = vec![vec![]; shards];
        for (r, s) in &recs {
            parts[*s].push(r.clone());
        }
        parts.iter_mut().for_each(|p| p.sort_by(by));
        let mut all: Vec<Rec> = recs.into_iter().map(|(r, _)| r).collect();
        all.sort_by(by);
        let want: Vec<Row> = all.iter().skip(offset as usize).take(limit.unwrap_or(u64::MAX) as usize).map(|r| encode(r, binary)).collect();
        let fmt = i16::from(binary);
        let fields = [field("n", oid::INT4, fmt), field("t", oid::TEXT, fmt), field("id", oid::INT4, fmt)];
        let plan = Plan { sql: String::new(), hidden: 0, order, shape: Shape::Rows, offset, limit };
        let input = parts.iter().map(|p| p.iter().map(|r| encode(r, binary)).collect()).collect();
        let (got, tag, peak) = gather(&plan, &fields, input);
        prop_assert_eq!(&got, &want);
        prop_assert_eq!(tag, format!("SELECT {}", want.len()));
        prop_assert!(peak <= shards);
    }

    #[test]
    fn grouping_merged_partial_counts_and_sums_is_grouping_everything(
        vals in proptest::collection::vec((prop_oneof![1 => Just(None), 5 => (0i64..6).prop_map(Some)], -1000i64..1000, 0usize..3), 0..100),
        desc in any::<bool>(),
    ) {
        // Each shard answers `SELECT g, count(*), sum(v) ... GROUP BY g ORDER BY g`.
        let mut per_shard: Vec<BTreeMap<Option<i64>, (i64, i64)>> = vec![BTreeMap::new(); 3];
        let mut whole: BTreeMap<Option<i64>, (i64, i64)> = BTreeMap::new();
        for (g, v, s) in vals {
            for m in [&mut per_shard[s], &mut whole] {
                let e = m.entry(g).or_default();
                *e = (e.0 + 1, e.1 + v);
            }
        }
        let key = SortKey { col: Col::Out(0), desc, nulls_first: desc };
        let rows = |m: &BTreeMap<Option<i64>, (i64, i64)>| -> Vec<Row> {
            let mut v: Vec<(&Option<i64>, &(i64, i64))> = m.iter().collect();
            v.sort_by(|a, b| cmp_key(a.0, b.0, desc, desc));
            v.into_iter().map(|(g, (c, s))| vec![g.map(|g| Bytes::from(g.to_string())), Some(Bytes::from(c.to_string())), Some(Bytes::from(s.to_string()))]).collect()
        };
        let plan = Plan { sql: String::new(), hidden: 0, order: vec![key], shape: Shape::Groups(vec![Role::Key, Role::Count, Role::Sum]), offset: 0, limit: None };
        let fields = [field("g", oid::INT8, 0), field("count", oid::INT8, 0), field("sum", oid::INT8, 0)];
        let (got, _, _) = gather(&plan, &fields, per_shard.iter().map(rows).collect());
        prop_assert_eq!(got, rows(&whole));
    }
}

proptest! {
    /// Whatever bytes a shard sends, reading them is an answer or an error, never a panic.
    #[test]
    fn any_bytes_read_without_panicking(
        bytes in proptest::collection::vec(any::<u8>(), 0..40),
        text in "[-+0-9.:eE ,BCinfyt]{0,40}",
        ty in 0usize..16,
        binary in any::<bool>(),
    ) {
        let oids = [oid::BOOL, oid::BYTEA, oid::NAME, oid::INT8, oid::INT2, oid::INT4, oid::TEXT, oid::FLOAT4,
            oid::FLOAT8, oid::BPCHAR, oid::VARCHAR, oid::DATE, oid::TIMESTAMP, oid::TIMESTAMPTZ, oid::NUMERIC, oid::UUID];
        if let Ok(t) = ColType::of(oids[ty], i16::from(binary), true) {
            let _ = t.read(&Bytes::from(bytes));
            let _ = t.read(&Bytes::from(text.into_bytes()));
        }
    }
}

/// 2 × 1 M rows, generated as they are asked for: the merge holds at most one per shard.
#[test]
fn a_million_rows_per_shard_merge_one_row_per_shard_at_a_time() {
    const N: i64 = 1_000_000;
    let plan = Plan {
        sql: String::new(),
        hidden: 0,
        order: vec![SortKey { col: Col::Out(0), desc: false, nulls_first: false }],
        shape: Shape::Rows,
        offset: 0,
        limit: None,
    };
    let fields = vec![field("k", oid::INT8, 1), field("pad", oid::TEXT, 0)];
    let mut g = Gather::new(&plan, &[fields.clone(), fields], true).unwrap();
    let mut next = [0i64; 2];
    let (mut seen, mut prev) = (0i64, i64::MIN);
    loop {
        match g.step().unwrap() {
            Step::Row(r) => {
                let k = i64::from_be_bytes(r[0].as_deref().unwrap().try_into().unwrap());
                assert!(k > prev, "{k} after {prev}");
                (prev, seen) = (k, seen + 1);
            }
            Step::Need(s) => {
                let i = next[s];
                next[s] += 1;
                let row = (i < N).then(|| {
                    vec![
                        Some(Bytes::copy_from_slice(&(2 * i + s as i64).to_be_bytes())),
                        Some(Bytes::from_static(b"some padding")),
                    ]
                });
                g.push(s, row).unwrap();
                assert!(g.resident() <= 2);
            }
            Step::Done(tag) => {
                assert_eq!(tag, format!("SELECT {}", 2 * N));
                break;
            }
        }
    }
    assert_eq!(seen, 2 * N);
    assert_eq!(g.peak(), 2);
}

/// A shard answer that breaks the plan is an error with its SQLSTATE, never a wrong answer.
#[test]
fn broken_shard_answers_are_errors_not_answers() {
    let ordered = Plan {
        sql: String::new(),
        hidden: 0,
        order: vec![SortKey { col: Col::Out(0), desc: false, nulls_first: false }],
        shape: Shape::Rows,
        offset: 0,
        limit: None,
    };
    let int = |v: i64| Some(Bytes::from(v.to_string()));
    let f = vec![field("k", oid::INT8, 0)];
    let mut g = Gather::new(&ordered, &[f.clone(), f.clone()], true).unwrap();
    assert_eq!(g.step(), Ok(Step::Need(0)));
    g.push(0, Some(vec![int(5)])).unwrap();
    assert_eq!(g.step(), Ok(Step::Need(1)));
    g.push(1, Some(vec![int(7)])).unwrap();
    assert_eq!(g.step(), Ok(Step::Row(vec![int(5)])));
    assert_eq!(g.step(), Ok(Step::Need(0)));
    let err = g.push(1, Some(vec![int(8)])).unwrap_err();
    assert!(err.to_string().contains("not asked for"), "{err}");
    // Shard 0 goes back to 3 after 5: its order is not the plan's (e.g. another collation).
    let err = g.push(0, Some(vec![int(3)])).unwrap_err();
    assert!(err.to_string().contains("out of the pushed-down ORDER BY"), "{err}");
    assert_eq!(err.sqlstate(), "XX000");

    let mut g = Gather::new(&ordered, std::slice::from_ref(&f), true).unwrap();
    g.step().unwrap();
    assert!(g.push(0, Some(vec![int(1), int(2)])).unwrap_err().to_string().contains("a row of 2 columns"));
    let mut g = Gather::new(&ordered, std::slice::from_ref(&f), true).unwrap();
    g.step().unwrap();
    assert!(g.push(0, Some(vec![Some(Bytes::from_static(b"x"))])).unwrap_err().to_string().contains("cannot read"));

    let other = vec![field("k", oid::INT4, 0)];
    let err = Gather::new(&ordered, &[f.clone(), other], true).err().unwrap();
    assert!(err.to_string().contains("shard 1: columns unlike shard 0's"), "{err}");

    // A combined int8 sum that overflows is PostgreSQL's "bigint out of range".
    let sum = Plan { order: vec![], shape: Shape::Groups(vec![Role::Sum]), ..ordered };
    let mut g = Gather::new(&sum, &[f.clone(), f], true).unwrap();
    let mut err = None;
    for _ in 0..6 {
        match g.step() {
            Ok(Step::Need(s)) => g.push(s, Some(vec![int(i64::MAX - 1)])).unwrap(),
            Ok(other) => panic!("{other:?}"),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    let err = err.unwrap();
    assert_eq!((err.to_string().as_str(), err.sqlstate()), ("bigint out of range", "22003"));
}
