//! The planner's decisions: rewrites as SQL text, and every refusal with its reason.

use super::*;

fn schema(t: &str) -> Option<&'static str> {
    match t {
        "customers" => Some("id"),
        "orders" => Some("customer_id"),
        _ => None,
    }
}

fn decide(sql: &str) -> Decision {
    plan(sql, &Options { schema: &schema, aggregates: &[], colocated: false })
}

fn exact(sql: &str) -> Plan {
    match decide(sql) {
        Decision::Exact(p) => p,
        other => panic!("{sql}: {other:?}"),
    }
}

fn key(col: Col, desc: bool, nulls_first: bool) -> SortKey {
    SortKey { col, desc, nulls_first }
}

#[test]
fn limit_offset_is_pushed_as_their_sum_and_applied_after_the_merge() {
    let p = exact("SELECT id, name FROM customers ORDER BY name DESC NULLS LAST, id LIMIT 5 OFFSET 10");
    assert_eq!(p.sql, "SELECT id, name FROM customers ORDER BY name DESC NULLS LAST, id LIMIT 15");
    assert_eq!(p.order, [key(Col::Out(1), true, false), key(Col::Out(0), false, false)]);
    assert_eq!((p.shape, p.offset, p.limit, p.hidden), (Shape::Rows, 10, Some(5), 0));
    let p = exact("SELECT id FROM customers ORDER BY id DESC OFFSET 3");
    assert_eq!(p.sql, "SELECT id FROM customers ORDER BY id DESC");
    assert_eq!((p.order, p.offset, p.limit), (vec![key(Col::Out(0), true, true)], 3, None));
    let p = exact("SELECT id FROM customers FETCH FIRST 2 ROWS ONLY");
    assert_eq!((p.sql.as_str(), p.limit), ("SELECT id FROM customers LIMIT 2", Some(2)));
    // A whole-table aggregate is one row per shard: its LIMIT stays with refract.
    let p = exact("SELECT count(*) FROM customers LIMIT 1");
    assert_eq!((p.sql.as_str(), p.limit), ("SELECT count(*) FROM customers", Some(1)));
}

#[test]
fn order_keys_outside_the_select_list_become_hidden_columns() {
    let p = exact("SELECT name FROM customers ORDER BY id");
    assert_eq!((p.sql.as_str(), p.hidden), ("SELECT name, id FROM customers ORDER BY id", 1));
    assert_eq!(p.order, [key(Col::Hidden(0), false, false)]);
    let p = exact("SELECT * FROM customers ORDER BY lower(name)");
    assert_eq!(p.sql, "SELECT *, lower(name) FROM customers ORDER BY lower(name)");
    let p = exact("SELECT id AS k, name FROM customers ORDER BY k, 2 NULLS FIRST");
    assert_eq!((p.hidden, p.order), (0, vec![key(Col::Out(0), false, false), key(Col::Out(1), false, true)]));
}

#[test]
fn averages_become_sums_and_hidden_counts_and_groups_arrive_sorted() {
    let p =
        exact("SELECT city, count(*), avg(score) AS a, avg(balance) FROM customers GROUP BY city ORDER BY city DESC");
    assert_eq!(
        p.sql,
        "SELECT city, count(*), sum(score) AS a, sum(balance) AS avg, count(score), count(balance) FROM customers \
         GROUP BY city ORDER BY city DESC"
    );
    let roles = vec![Role::Key, Role::Count, Role::Avg { count: 4 }, Role::Avg { count: 5 }, Role::Count, Role::Count];
    assert_eq!((p.shape, p.hidden, p.order), (Shape::Groups(roles), 2, vec![key(Col::Out(0), true, true)]));
    let p = exact("SELECT count(*), max(name) FROM customers GROUP BY city, active ORDER BY active LIMIT 2");
    assert_eq!(
        p.sql,
        "SELECT count(*), max(name), city, active FROM customers GROUP BY city, active ORDER BY active, 3 LIMIT 2"
    );
    assert_eq!(p.order, [key(Col::Hidden(1), false, false), key(Col::Hidden(0), false, false)]);
    let p = exact("SELECT DISTINCT city, active FROM customers ORDER BY active LIMIT 3");
    assert_eq!(p.sql, "SELECT DISTINCT city, active FROM customers ORDER BY active, 1 LIMIT 3");
    assert_eq!(p.shape, Shape::Distinct);
}

#[test]
fn replicated_only_statements_go_to_one_shard() {
    assert_eq!(decide("SELECT * FROM cities ORDER BY name"), Decision::One);
    assert_eq!(decide("SELECT 1 UNION SELECT 2"), Decision::One);
    assert_eq!(decide("SELEKT nonsense"), Decision::One);
    assert!(matches!(decide("SELECT c.name FROM customers c JOIN cities t ON t.name = c.city"), Decision::Exact(_)));
    assert!(matches!(decide("SELECT * FROM customers c LEFT JOIN cities t ON t.name = c.city"), Decision::Exact(_)));
}

#[test]
fn what_is_not_answered_exactly_is_refused_with_its_reason() {
    let cases = [
        ("SELECT id, row_number() OVER () FROM customers", "window functions"),
        ("SELECT id FROM customers WINDOW w AS (ORDER BY id)", "window functions"),
        ("SELECT string_agg(name, ',') FROM customers", "aggregate string_agg() is not combined"),
        ("SELECT stddev(score) FROM customers", "aggregate stddev()"),
        ("SELECT count(DISTINCT city) FROM customers", "count(DISTINCT ...)"),
        ("SELECT count(*) FILTER (WHERE active) FROM customers", "FILTER"),
        ("SELECT max(name ORDER BY id) FROM customers", "FILTER, ORDER BY"),
        ("SELECT sum(score) + 1 FROM customers", "aggregate inside an expression"),
        ("SELECT city, count(*) FROM customers GROUP BY city HAVING count(*) > 1", "HAVING"),
        ("SELECT city, count(*) FROM customers GROUP BY city ORDER BY count(*) DESC", "ORDER BY an aggregate"),
        ("SELECT city, count(*) FROM customers GROUP BY city ORDER BY 2", "ORDER BY an aggregate"),
        ("SELECT city, name, count(*) FROM customers GROUP BY city", "neither an aggregate nor a GROUP BY key"),
        ("SELECT city, count(*) FROM customers GROUP BY ROLLUP (city)", "ROLLUP"),
        ("SELECT name FROM customers ORDER BY name COLLATE \"en_US\"", "COLLATE \"en_US\""),
        ("SELECT id FROM customers ORDER BY id USING <", "USING"),
        ("SELECT * FROM customers WHERE id IN (SELECT customer_id FROM orders)", "subquery"),
        ("SELECT * FROM (SELECT * FROM customers) c", "subquery"),
        ("WITH c AS (SELECT * FROM customers) SELECT * FROM c", "WITH"),
        ("SELECT id FROM customers UNION SELECT customer_id FROM orders", "set operations"),
        ("SELECT * FROM customers FOR UPDATE", "FOR UPDATE"),
        ("SELECT * FROM customers c JOIN orders o ON o.customer_id = c.id", "join of two sharded tables"),
        ("SELECT * FROM cities t LEFT JOIN customers c ON t.name = c.city", "outer join"),
        ("SELECT * FROM customers c FULL JOIN cities t ON t.name = c.city", "outer join"),
        ("SELECT DISTINCT ON (city) city, name FROM customers", "DISTINCT ON"),
        ("SELECT DISTINCT city FROM customers ORDER BY id", "DISTINCT, ORDER BY must name output columns"),
        ("SELECT DISTINCT * FROM customers", "DISTINCT *"),
        ("SELECT id FROM customers LIMIT $1", "LIMIT across shards must be an integer constant"),
        ("SELECT id FROM customers ORDER BY id FETCH FIRST 3 ROWS WITH TIES", "WITH TIES"),
        ("SELECT * FROM customers ORDER BY 2", "column position with SELECT *"),
        ("SELECT city AS name, count(*) FROM customers GROUP BY name", "may name an output column or a table column"),
        ("SELECT id INTO copy FROM customers", "SELECT INTO"),
        ("UPDATE customers SET name = 'x'", "only SELECT"),
        ("SELECT 1 FROM customers; SELECT 2 FROM customers", "one statement at a time"),
    ];
    for (sql, why) in cases {
        match decide(sql) {
            Decision::Refuse(reason) => assert!(reason.contains(why), "{sql}: {reason:?} lacks {why:?}"),
            other => panic!("{sql}: {other:?}, not refused"),
        }
    }
}

/// Binary numeric aggregates over two shards: the bytes one server's `numeric_send` gives for
/// the whole table, derived by hand (ndigits, weight, sign, dscale, base-10000 digits).
#[test]
fn binary_numeric_aggregates_combine_to_the_single_servers_bytes() {
    use bytes::Bytes;

    use crate::scatter::value::oid;
    use refract_pg::backend::FieldDescription;
    let p = exact("SELECT city, avg(score), sum(balance), min(balance), max(balance), sum(id) FROM customers GROUP BY city ORDER BY city");
    let field = |name: &str, type_oid: u32| FieldDescription {
        name: name.into(),
        table_oid: 0,
        column: 0,
        type_oid,
        type_size: -1,
        type_modifier: -1,
        format: 1,
    };
    let desc = vec![
        field("city", oid::TEXT),
        field("avg", oid::INT8),
        field("sum", oid::NUMERIC),
        field("min", oid::NUMERIC),
        field("max", oid::NUMERIC),
        field("sum", oid::NUMERIC),
        field("count", oid::INT8),
    ];
    let words = |w: &[u16]| Some(Bytes::from(w.iter().flat_map(|x| x.to_be_bytes()).collect::<Vec<u8>>()));
    let int8 = |v: i64| Some(Bytes::copy_from_slice(&v.to_be_bytes()));
    let text = |s: &str| Some(Bytes::copy_from_slice(s.as_bytes()));
    // Shard 0: Bern, score sum 10 over 3, balances 12.50 and -0.75 (sum 11.75), ids summing to
    // 20000. Shard 1: Bern, score sum 5 over 2, balances 0.25 and 100.00 (sum 100.25), ids 1.
    let shard0 = vec![
        text("Bern"),
        int8(10),
        words(&[2, 0, 0, 2, 11, 7500]),
        words(&[1, 0xFFFF, 0x4000, 2, 7500]),
        words(&[2, 0, 0, 2, 12, 5000]),
        words(&[1, 1, 0, 0, 2]),
        int8(3),
    ];
    let shard1 = vec![
        text("Bern"),
        int8(5),
        words(&[2, 0, 0, 2, 100, 2500]),
        words(&[1, 0xFFFF, 0, 2, 2500]),
        words(&[1, 0, 0, 2, 100]),
        words(&[1, 0, 0, 0, 1]),
        int8(2),
    ];
    let mut g = Gather::new(&p, &[desc.clone(), desc], true).unwrap();
    let mut shards = [Some(shard0), Some(shard1)];
    let row = loop {
        match g.step().unwrap() {
            Step::Need(s) => g.push(s, shards[s].take()).unwrap(),
            Step::Row(r) => break r,
            Step::Done(t) => panic!("{t}"),
        }
    };
    assert_eq!(g.description()[1].type_oid, oid::NUMERIC);
    let want = vec![
        text("Bern"),
        // avg = 15 / 5 = 3.0000000000000000 (scale 16).
        words(&[1, 0, 0, 16, 3]),
        // 11.75 + 100.25 = 112.00: one digit, the trailing zero word stripped.
        words(&[1, 0, 0, 2, 112]),
        words(&[1, 0xFFFF, 0x4000, 2, 7500]),
        words(&[1, 0, 0, 2, 100]),
        // 20000 + 1 = 20001: 2 0001 (weight 1).
        words(&[2, 1, 0, 0, 2, 1]),
    ];
    assert_eq!(row, want);
}
