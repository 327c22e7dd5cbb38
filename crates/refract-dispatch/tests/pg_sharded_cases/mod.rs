//! The data and the statements of the sharding acceptance suite (tests/pg_sharded.rs): a
//! deterministic data set (NULLs, duplicates, negative keys, varied text) and the statements
//! run through sharded refract and on one plain PostgreSQL, plus those refract must refuse.
#![allow(dead_code)]

use refract_shard::partition::{remainder, Key};

/// How two answers' rows are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// The ORDER BY fixes every row's place (or there is at most one row).
    Ordered,
    /// The same rows in any order (a multiset).
    Unordered,
}

/// One statement of the differential suite.
#[derive(Debug, Clone)]
pub struct Case {
    pub sql: String,
    pub cmp: Cmp,
    /// Run through the extended protocol (Parse/Bind/Describe/Execute/Sync) with these text
    /// parameters; `None`: one simple Query.
    pub params: Option<Vec<String>>,
    /// refract may refuse it (0A000 with a reason) instead of answering: the spec does not
    /// say, and refusing is never a wrong answer. When refract answers, the answer must match.
    pub may_refuse: bool,
    /// `COPY ... FROM STDIN`: the data sent after CopyInResponse.
    pub copy: Option<String>,
}

impl Case {
    /// Transaction control: not counted among the suite's statements.
    pub fn is_control(&self) -> bool {
        let s = self.sql.to_ascii_uppercase();
        ["BEGIN", "START", "COMMIT", "ROLLBACK", "SAVEPOINT"].iter().any(|k| s.starts_with(k))
    }
}

/// A statement refract must refuse with 0A000 and a reason, after `before` (which must
/// succeed); `in_tx`: inside a transaction, which the refusal fails and a ROLLBACK ends.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub before: Vec<String>,
    pub sql: String,
    pub extended: bool,
    pub in_tx: bool,
}

/// The shard (0-based) PostgreSQL's `PARTITION BY HASH` over `n` partitions gives an int8 key.
pub fn shard_of(id: i64, n: u64) -> u64 {
    remainder(&[Key::Int8(id)], n)
}

/// A small LCG: deterministic data.
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

    fn quoted(&mut self, n: u64, from: &[&str]) -> String {
        self.or_null(n, |r| format!("'{}'", r.pick(from)))
    }
}

pub const SCHEMA: [&str; 4] = [
    "CREATE TABLE customers (id int8 PRIMARY KEY, name text, city text, score int4, \
     balance numeric(10,2), active bool, tier int2)",
    "CREATE TABLE orders (id int8 NOT NULL, customer_id int8, product_id int4, \
     amount numeric(10,2), qty int4, status text, placed date)",
    "CREATE TABLE products (id int4 PRIMARY KEY, name text NOT NULL, category text, price numeric(8,2))",
    "CREATE INDEX orders_customer ON orders (customer_id)",
];

/// 240 distinct customer ids over -300..708 (7919 and the prime 1009 are coprime).
pub fn customer_ids() -> Vec<i64> {
    (1..=240i64).map(|i| i * 7919 % 1009 - 300).collect()
}

/// The customers, as SQL row literals.
pub fn customers() -> Vec<String> {
    let mut r = Lcg(2024);
    let names = ["Anna", "anna", "Bo", "Ärni", "", "zed", "Zed", "x''y", "O''Brien", "Li Wei", "Zoë"];
    let cities = ["Bern", "Chur", "Zug", "aarau", "Basel", "Genève"];
    customer_ids()
        .into_iter()
        .map(|id| {
            let name = r.quoted(10, &names);
            let city = r.quoted(8, &cities);
            let score = r.or_null(9, |r| (r.below(201) as i64 - 100).to_string());
            let balance = r.or_null(10, |r| format!("{}.{:02}", r.below(20_000) as i64 - 10_000, r.below(100)));
            let active = r.or_null(7, |r| r.pick(&["true", "false"]).into());
            let tier = r.or_null(6, |r| r.below(5).to_string());
            format!("({id}, {name}, {city}, {score}, {balance}, {active}, {tier})")
        })
        .collect()
}

/// 400 orders (ids 1..=400) of customers (skewed towards the first 60, one in 20 of a
/// customer that does not exist), then 20 exact duplicates of the first 20.
pub fn orders() -> Vec<String> {
    let mut r = Lcg(7);
    let ids = customer_ids();
    let mut rows: Vec<String> = (1..=400i64)
        .map(|id| {
            let customer = match r.below(20) {
                0 => 9000 + r.below(5) as i64,
                1..=10 => ids[r.below(60) as usize],
                _ => ids[r.below(240) as usize],
            };
            let product = r.or_null(10, |r| (1 + r.below(22)).to_string());
            let amount = r.or_null(10, |r| format!("{}.{:02}", r.below(500), r.below(100)));
            let qty = r.or_null(8, |r| (r.below(24) as i64 - 3).to_string());
            let status = r.quoted(7, &["new", "paid", "shipped", "void", "Paid"]);
            let placed = r.or_null(9, |r| format!("'2024-{:02}-{:02}'", 1 + r.below(12), 1 + r.below(28)));
            format!("({id}, {customer}, {product}, {amount}, {qty}, {status}, {placed})")
        })
        .collect();
    let dups: Vec<String> = rows[..20].to_vec();
    rows.extend(dups);
    rows
}

/// 20 products (replicated on every shard).
pub fn products() -> Vec<String> {
    let mut r = Lcg(99);
    (1..=20)
        .map(|id| {
            let category = r.quoted(5, &["tools", "toys", "food"]);
            let price = format!("{}.{:02}", r.below(100), r.below(100));
            format!("({id}, 'p{id}', {category}, {price})")
        })
        .collect()
}

/// The customer ids the statements name, chosen by the shard that holds them.
#[derive(Debug, Clone)]
pub struct Keys {
    /// Existing customers (the first five ids), a negative one and one that does not exist.
    pub keyed: Vec<i64>,
    /// Two customers on shard 0.
    pub a: i64,
    pub a2: i64,
    /// A customer on shard 1.
    pub b: i64,
    /// A customer on the last shard (another one on shard 1 with two shards).
    pub c: i64,
    /// Customers to delete (not used elsewhere).
    pub gone: [i64; 2],
    /// An id no customer has, on shard 0 (inserted inside a transaction).
    pub new_a: i64,
    /// An id no customer has, on shard 1.
    pub new_b: i64,
    /// Ids no customer has, on shard 0 (never inserted).
    pub spare: [i64; 2],
}

impl Keys {
    pub fn new(n: u64) -> Keys {
        let ids = customer_ids();
        let on = |shard: u64, skip: usize| {
            ids[10..].iter().copied().filter(|&id| shard_of(id, n) == shard).nth(skip).unwrap_or_default()
        };
        let negative = ids.iter().copied().find(|&id| id < 0).unwrap_or_default();
        let fresh =
            |shard: u64, skip: usize| (5000..).filter(|&id| shard_of(id, n) == shard).nth(skip).unwrap_or_default();
        let (c, gone) = if n > 2 { (on(2, 0), [on(2, 5), on(0, 5)]) } else { (on(1, 1), [on(1, 5), on(0, 5)]) };
        Keys {
            keyed: vec![ids[0], ids[1], ids[2], ids[3], ids[4], negative, 123_456],
            a: on(0, 0),
            a2: on(0, 1),
            b: on(1, 0),
            c,
            gone,
            new_a: fresh(0, 0),
            new_b: fresh(1, 0),
            spare: [fresh(0, 1), fresh(0, 2)],
        }
    }
}

/// A builder for the statement list.
#[derive(Default)]
struct Suite(Vec<Case>);

impl Suite {
    fn push(&mut self, sql: String, cmp: Cmp, params: Option<Vec<String>>, may_refuse: bool) {
        self.0.push(Case { sql, cmp, params, may_refuse, copy: None });
    }
    fn ord(&mut self, sql: impl Into<String>) {
        self.push(sql.into(), Cmp::Ordered, None, false);
    }
    fn any(&mut self, sql: impl Into<String>) {
        self.push(sql.into(), Cmp::Unordered, None, false);
    }
    fn ext(&mut self, sql: impl Into<String>, params: &[String]) {
        self.push(sql.into(), Cmp::Ordered, Some(params.to_vec()), false);
    }
    fn either(&mut self, sql: impl Into<String>, cmp: Cmp) {
        self.push(sql.into(), cmp, None, true);
    }
    /// COPY is in the acceptance list but not in the spec of this version: refract
    /// may refuse it; rows it takes must land where PostgreSQL's partitioning puts them.
    fn copy(&mut self, sql: impl Into<String>, data: String) {
        self.0.push(Case { sql: sql.into(), cmp: Cmp::Ordered, params: None, may_refuse: true, copy: Some(data) });
    }
}

/// The differential suite, in the order it runs (reads, writes, transactions, reads again).
pub fn suite(k: &Keys) -> Vec<Case> {
    let mut s = Suite::default();
    keyed_reads(&mut s, k);
    in_lists(&mut s, k);
    unkeyed_customers(&mut s);
    unkeyed_orders(&mut s);
    joins_and_replicated(&mut s, k);
    extended_reads(&mut s, k);
    errors(&mut s, k);
    writes(&mut s, k);
    extended_writes(&mut s, k);
    transactions(&mut s, k);
    after_writes(&mut s, k);
    s.0
}

fn keyed_reads(s: &mut Suite, k: &Keys) {
    for id in &k.keyed {
        s.ord(format!("SELECT * FROM customers WHERE id = {id}"));
        s.ord(format!("SELECT id, name, score FROM customers WHERE id = {id} AND (score > 0 OR score IS NULL)"));
        s.ord(format!("SELECT * FROM orders WHERE customer_id = {id} ORDER BY id"));
        s.ord(format!(
            "SELECT count(*), sum(amount), min(placed), max(qty), avg(qty) FROM orders WHERE customer_id = {id}"
        ));
        s.ord(format!(
            "SELECT c.name, o.id, o.amount FROM customers c JOIN orders o ON o.customer_id = c.id \
             WHERE c.id = {id} ORDER BY o.id"
        ));
        s.any(format!("SELECT status, count(*) FROM orders WHERE customer_id = {id} GROUP BY status"));
    }
    let (a, b) = (k.a, k.b);
    s.ord(format!("SELECT name FROM customers WHERE {a} = id"));
    s.ord(format!("SELECT name FROM customers WHERE id = '{b}'"));
    s.ord(format!("SELECT name, city FROM customers WHERE id = {a}::int8 AND city IS NOT NULL"));
    s.ord(format!(
        "SELECT o.id FROM orders o JOIN customers c ON c.id = o.customer_id WHERE o.customer_id = {b} ORDER BY o.id"
    ));
    for id in [k.a, k.b, k.keyed[5]] {
        s.ext(format!("SELECT * FROM customers WHERE id = {id}"), &[]);
        s.ext("SELECT count(*), sum(qty) FROM orders WHERE customer_id = $1", &[id.to_string()]);
    }
    s.ext("SELECT id, name FROM customers WHERE id = $1 AND score > $2", &[k.c.to_string(), "-1000".into()]);
}

fn in_lists(s: &mut Suite, k: &Keys) {
    let (a, a2, b, c) = (k.a, k.a2, k.b, k.c);
    s.ord(format!("SELECT id, name FROM customers WHERE id IN ({a}, {b}, {c}) ORDER BY id"));
    s.ord(format!("SELECT id FROM customers WHERE id IN ({a}, {a2}) ORDER BY id DESC"));
    s.ord(format!("SELECT id, name FROM customers WHERE id = ANY(ARRAY[{a}, {b}, 123456]) ORDER BY id"));
    s.ord(format!("SELECT * FROM orders WHERE customer_id = ANY('{{{a},{c}}}') ORDER BY id"));
    s.ord(format!("SELECT count(*), sum(qty), min(amount) FROM orders WHERE customer_id IN ({a}, {b}, {c})"));
    s.ord(format!(
        "SELECT customer_id, count(*) FROM orders WHERE customer_id IN ({a}, {b}) GROUP BY customer_id ORDER BY customer_id"
    ));
    s.any("SELECT * FROM customers WHERE id IN (123456, 654321)");
    s.ord(format!("SELECT id FROM customers WHERE id IN ({a}, NULL) ORDER BY id"));
    s.ord(format!(
        "SELECT c.id, count(o.id) FROM customers c JOIN orders o ON o.customer_id = c.id \
         WHERE c.id IN ({a}, {b}, {c}) GROUP BY c.id ORDER BY c.id"
    ));
    s.ord(format!("SELECT DISTINCT status FROM orders WHERE customer_id IN ({a}, {b}) ORDER BY status"));
    s.ord(format!("SELECT id, name FROM customers WHERE id IN ({a}, {b}) ORDER BY name NULLS FIRST, id LIMIT 1"));
    s.ord(format!("SELECT id FROM customers WHERE id NOT IN ({a}, {b}) ORDER BY id"));
    s.ext("SELECT id, name FROM customers WHERE id = ANY($1::int8[]) ORDER BY id", &[format!("{{{a},{a2}}}")]);
}

fn unkeyed_customers(s: &mut Suite) {
    s.any("SELECT * FROM customers");
    s.ord("SELECT id, name FROM customers ORDER BY id");
    s.ord("SELECT id, name FROM customers ORDER BY id DESC LIMIT 10");
    s.ord("SELECT id, name FROM customers ORDER BY id LIMIT 5 OFFSET 20");
    s.ord("SELECT id FROM customers ORDER BY id OFFSET 230");
    s.ord("SELECT id, name FROM customers ORDER BY name, id");
    s.ord("SELECT id, name FROM customers ORDER BY name DESC NULLS LAST, id LIMIT 15");
    s.ord("SELECT id, city, score FROM customers ORDER BY city NULLS FIRST, score DESC, id");
    s.ord("SELECT id, score FROM customers WHERE score > 50 ORDER BY score, id");
    s.ord("SELECT id, balance FROM customers WHERE balance < 0 ORDER BY balance DESC, id LIMIT 7");
    s.ord("SELECT id, name FROM customers ORDER BY 2, 1 LIMIT 9");
    s.any("SELECT id FROM customers WHERE name IS NULL");
    s.any("SELECT id, name FROM customers WHERE name LIKE 'A%' OR name = ''");
    s.ord("SELECT id, active FROM customers WHERE active ORDER BY id");
    s.ord("SELECT id, tier FROM customers ORDER BY tier DESC NULLS LAST, id LIMIT 12 OFFSET 3");
    s.ord("SELECT name FROM customers ORDER BY id LIMIT 0");
    s.ord("SELECT id, lower(name) AS ln FROM customers ORDER BY ln, id LIMIT 20");
    s.ord("SELECT id, score * 2 AS s2 FROM customers ORDER BY s2 DESC NULLS LAST, id LIMIT 10");
    s.ord("SELECT id FROM customers WHERE id < 0 ORDER BY id");
    s.ord("SELECT id FROM customers WHERE id BETWEEN -50 AND 50 ORDER BY id");
    s.ord("SELECT count(*) FROM customers");
    s.ord("SELECT count(*), count(name), count(city), count(score) FROM customers");
    s.ord("SELECT sum(score), min(score), max(score), avg(score) FROM customers");
    s.ord("SELECT sum(balance), min(balance), max(balance), avg(balance) FROM customers");
    s.ord("SELECT min(name), max(name), min(city), max(city) FROM customers");
    s.ord("SELECT min(id), max(id), sum(id), avg(id) FROM customers");
    s.ord("SELECT avg(tier), sum(tier), count(tier) FROM customers");
    s.ord("SELECT count(*), sum(score), avg(score) FROM customers WHERE id > 100000");
    s.ord("SELECT min(name), max(balance) FROM customers WHERE false");
    s.ord("SELECT count(*) AS n FROM customers WHERE active");
    s.any("SELECT city, count(*) FROM customers GROUP BY city");
    s.ord("SELECT city, count(*), sum(score), avg(score), min(name), max(balance) FROM customers GROUP BY city ORDER BY city");
    s.ord("SELECT city, count(*) FROM customers GROUP BY city ORDER BY city DESC NULLS LAST LIMIT 3");
    s.ord("SELECT active, tier, count(*), avg(balance) FROM customers GROUP BY active, tier ORDER BY active, tier");
    s.ord("SELECT tier, max(score), min(score) FROM customers GROUP BY tier ORDER BY tier DESC");
    s.any("SELECT count(*) FROM customers GROUP BY city");
    s.ord("SELECT city, count(*) FROM customers WHERE score > 0 GROUP BY city ORDER BY city OFFSET 1");
    s.ord("SELECT score % 3, count(*), sum(score) FROM customers GROUP BY score % 3 ORDER BY 1");
    s.any("SELECT DISTINCT city FROM customers");
    s.ord("SELECT DISTINCT city FROM customers ORDER BY city");
    s.ord("SELECT DISTINCT tier, active FROM customers ORDER BY tier, active");
    s.ord("SELECT DISTINCT name FROM customers ORDER BY name DESC LIMIT 5");
    s.ord("SELECT DISTINCT score FROM customers ORDER BY score OFFSET 10 LIMIT 10");
}

fn unkeyed_orders(s: &mut Suite) {
    s.any("SELECT * FROM orders");
    s.ord("SELECT id, customer_id, amount FROM orders ORDER BY id");
    s.ord("SELECT id, amount FROM orders ORDER BY amount DESC NULLS LAST, id LIMIT 10");
    s.ord("SELECT id FROM orders WHERE qty < 0 ORDER BY id");
    s.ord("SELECT count(*), sum(amount), sum(qty), avg(amount), avg(qty), min(placed), max(placed) FROM orders");
    s.ord("SELECT status, count(*), sum(amount) FROM orders GROUP BY status ORDER BY status NULLS FIRST");
    s.any("SELECT status, avg(amount) FROM orders GROUP BY status");
    s.ord("SELECT placed, count(*) FROM orders GROUP BY placed ORDER BY placed DESC LIMIT 5");
    s.ord("SELECT customer_id, count(*), sum(qty) FROM orders GROUP BY customer_id ORDER BY customer_id LIMIT 20");
    s.any("SELECT customer_id, max(amount) FROM orders GROUP BY customer_id");
    s.ord("SELECT DISTINCT customer_id FROM orders ORDER BY customer_id");
    s.ord("SELECT DISTINCT status, qty FROM orders ORDER BY status, qty");
    s.ord("SELECT DISTINCT id, customer_id, amount FROM orders ORDER BY id");
    s.ord("SELECT id, placed FROM orders WHERE placed >= '2024-06-01' ORDER BY placed, id");
    s.ord("SELECT min(status), max(status) FROM orders");
    s.ord("SELECT count(*) FROM orders WHERE customer_id IS NULL");
    s.ord("SELECT count(*) FROM orders WHERE customer_id >= 9000");
}

fn joins_and_replicated(s: &mut Suite, k: &Keys) {
    s.ord("SELECT c.id, c.name, o.id, o.amount FROM customers c JOIN orders o ON o.customer_id = c.id ORDER BY o.id, c.id");
    s.ord(
        "SELECT c.city, count(*), sum(o.amount) FROM customers c JOIN orders o ON o.customer_id = c.id \
         GROUP BY c.city ORDER BY c.city",
    );
    s.ord(
        "SELECT c.id, count(*) FROM customers c JOIN orders o ON c.id = o.customer_id \
         WHERE o.status = 'paid' GROUP BY c.id ORDER BY c.id",
    );
    s.ord("SELECT count(*) FROM customers c JOIN orders o ON o.customer_id = c.id");
    s.any("SELECT c.id, o.id FROM customers c LEFT JOIN orders o ON o.customer_id = c.id WHERE c.score > 80");
    s.ord("SELECT DISTINCT c.city FROM customers c JOIN orders o ON o.customer_id = c.id ORDER BY c.city");
    s.ord("SELECT o.id, p.name FROM orders o JOIN products p ON p.id = o.product_id ORDER BY o.id");
    s.ord(
        "SELECT p.category, count(*), sum(o.qty) FROM orders o JOIN products p ON p.id = o.product_id \
         GROUP BY p.category ORDER BY p.category",
    );
    s.ord(format!(
        "SELECT o.id, p.name, p.price FROM orders o JOIN products p ON p.id = o.product_id \
         WHERE o.customer_id = {} ORDER BY o.id",
        k.keyed[0]
    ));
    s.ord("SELECT * FROM products ORDER BY id");
    s.any("SELECT * FROM products WHERE category = 'tools'");
    s.ord("SELECT category, count(*), avg(price) FROM products GROUP BY category ORDER BY category");
    s.ord("SELECT count(*), sum(price), min(name), max(price) FROM products");
    s.any("SELECT DISTINCT category FROM products");
    s.ord("SELECT name FROM products ORDER BY price DESC, id LIMIT 3");
    s.ord("SELECT name, price FROM products WHERE id IN (1, 2, 3) ORDER BY id");
    s.ord("SELECT string_agg(name, ',' ORDER BY id) FROM products");
    s.ord("SELECT id, row_number() OVER (ORDER BY price DESC, id) FROM products ORDER BY id");
    s.ord("SELECT 1 + 1 AS two, 'x'::text AS x");
    s.ord("SELECT current_setting('DateStyle'), current_setting('server_version_num')");
}

/// Statements on which the reference fails (refract must fail with the same SQLSTATE), and
/// key values refract cannot read as an int8.
fn errors(s: &mut Suite, k: &Keys) {
    let (a, b) = (k.a, k.b);
    s.ord(format!("INSERT INTO customers (id, name) VALUES ({a}, 'dup')"));
    s.ord(format!("INSERT INTO customers (id, name) VALUES ({}, 'ok'), ({b}, 'dup')", k.spare[0]));
    s.ord(format!("SELECT 1 / 0 FROM customers WHERE id = {a}"));
    s.ord("SELECT nope FROM customers WHERE id = 1");
    s.ord("SELECT * FROM nosuch_table");
    s.ord("SELEC 1");
    s.ord("SELECT * FROM customers WHERE id = 'abc'");
    s.ord("INSERT INTO customers (id, name) VALUES (NULL, 'no key')");
    s.ord(format!("UPDATE customers SET score = 'x' WHERE id = {b}"));
    s.ord("SELECT count(*) FROM customers WHERE score / 0 > 1");
    // Fails on a's shard only: PostgreSQL changes no row, so no shard may keep its changes.
    s.ord(format!("UPDATE customers SET score = coalesce(score, 0) + 1 + 1 / (id - {a})"));
    s.ord("INSERT INTO products VALUES (1, 'again', NULL, 1.00)");
    s.ord("SELECT count(*) FROM customers WHERE id = 99999999999999999999");
}

fn writes(s: &mut Suite, k: &Keys) {
    let (a, b, c) = (k.a, k.b, k.c);
    s.ord("INSERT INTO customers VALUES (2001, 'New', 'Bern', 10, 1.50, true, 1)");
    s.ord("INSERT INTO customers (id, name) VALUES (-2001, 'Neg')");
    s.ord(
        "INSERT INTO customers (id, name, city, score) VALUES (2002, 'm2', 'Zug', 2), (2003, 'm3', NULL, 3), \
         (2004, 'm4', 'Chur', NULL), (2005, 'm5', 'Bern', -5), (2006, '', 'Zug', 6), (2007, 'm7', 'aarau', 7)",
    );
    s.ord("INSERT INTO customers VALUES (2010, 'Ret', NULL, NULL, NULL, NULL, NULL) RETURNING id, name");
    s.ord(format!(
        "INSERT INTO orders VALUES (1001, {a}, 3, 9.99, 2, 'new', '2024-12-01'), \
         (1002, {b}, 4, 19.99, 1, 'new', '2024-12-02'), (1003, {c}, NULL, NULL, NULL, NULL, NULL)"
    ));
    s.ord("INSERT INTO orders (id, customer_id, qty) VALUES (1004, NULL, 5)");
    s.ord(format!("INSERT INTO orders (id, customer_id, qty) VALUES (1005, NULL, 6), (1006, {b}, 7)"));
    s.ord(format!("INSERT INTO orders (customer_id, id) VALUES ({a}, 1007)"));
    s.ord("INSERT INTO orders VALUES (1008, 2001, 1, 1.00, 1, 'paid', '2024-12-03')");
    s.ord(format!("UPDATE customers SET score = score + 1 WHERE id = {}", k.keyed[0]));
    s.ord(format!("UPDATE customers SET name = 'Upd' WHERE id IN ({a}, {b})"));
    s.ord("UPDATE customers SET city = 'Bern' WHERE city IS NULL");
    s.ord("UPDATE customers SET score = -score WHERE score < -90");
    s.ord("UPDATE customers SET balance = 0 WHERE id = 999999");
    s.ord(format!("UPDATE customers SET tier = 4 WHERE id = {} RETURNING id, tier", k.keyed[1]));
    s.ord(format!("UPDATE orders SET status = 'void' WHERE customer_id = {} AND qty > 5", k.keyed[2]));
    s.ord("UPDATE orders SET qty = qty + 1 WHERE status = 'new'");
    s.ord("UPDATE orders SET amount = NULL WHERE id = 5");
    s.ord(format!("DELETE FROM orders WHERE customer_id = {}", k.keyed[3]));
    s.ord("DELETE FROM orders WHERE qty < 0");
    s.ord(format!("DELETE FROM orders WHERE customer_id IN ({a}, {b}) AND status = 'void'"));
    s.ord(format!("DELETE FROM customers WHERE id = {}", k.gone[0]));
    s.ord("DELETE FROM customers WHERE id = 999999");
    s.ord("DELETE FROM customers WHERE name = ''");
    s.ord(format!("DELETE FROM customers WHERE id = {} RETURNING name", k.gone[1]));
    s.ext("UPDATE customers SET score = $2 WHERE id = $1", &[c.to_string(), "42".into()]);
    s.ext("INSERT INTO orders (id, customer_id, qty) VALUES ($1, $2, $3)", &["1009".into(), c.to_string(), "3".into()]);
    s.ord("INSERT INTO products VALUES (21, 'p21', 'tools', 5.00)");
    s.ord("INSERT INTO products VALUES (22, 'p22', NULL, 1.00), (23, 'p23', 'food', 2.50)");
    s.ord("UPDATE products SET price = price + 1 WHERE category = 'tools'");
    s.ord("DELETE FROM products WHERE id = 23");
    s.ord("UPDATE products SET name = upper(name) WHERE id < 5 RETURNING id, name");
    s.ord("ALTER TABLE customers ADD COLUMN note text");
    s.ord(format!("UPDATE customers SET note = 'n' || id WHERE id IN ({a}, {b}, {c}, 2001)"));
    s.ord("SELECT id, note FROM customers WHERE note IS NOT NULL ORDER BY id");
    s.ord("CREATE INDEX customers_city ON customers (city)");
    s.ord("CREATE TABLE scratch (x int4, y text)");
    s.ord("INSERT INTO scratch VALUES (1, 'a'), (2, 'b'), (3, NULL)");
    s.ord("SELECT sum(x), count(y) FROM scratch");
    s.ord("DROP TABLE scratch");
    s.copy(
        "COPY orders FROM STDIN",
        format!(
            "1301\t{a}\t2\t5.50\t1\tnew\t2024-12-10\n1302\t{b}\t\\N\t\\N\t2\tpaid\t\\N\n\
             1303\t{c}\t3\t0.01\t-1\t\\N\t2024-12-11\n1304\t\\N\t4\t1.00\t1\tnew\t2024-12-12\n"
        ),
    );
    s.copy(
        "COPY customers (name, id, city) FROM STDIN (FORMAT csv)",
        "\"Smith, J\",6001,Bern\n,6002,\"\"\n\"q\"\"x\",-7777,\n".into(),
    );
    s.either("COPY orders TO STDOUT", Cmp::Unordered);
    s.either("COPY products TO STDOUT (FORMAT csv)", Cmp::Unordered);
    s.either("COPY (SELECT id, name FROM customers ORDER BY id) TO STDOUT", Cmp::Ordered);
    // Not in the spec either way; refusing is not wrong, a wrong answer or misplaced rows are.
    s.either("INSERT INTO customers (id, name) SELECT id + 5000, name FROM customers WHERE id < -280", Cmp::Ordered);
    s.either("DELETE FROM orders WHERE qty = 0 RETURNING id, customer_id", Cmp::Unordered);
    s.either("UPDATE orders SET status = 'x' WHERE status = 'void' RETURNING id", Cmp::Unordered);
    s.either(
        format!("INSERT INTO orders (id, customer_id) VALUES (1201, {a}), (1202, {b}) RETURNING id"),
        Cmp::Unordered,
    );
}

/// Reads over several shards through the extended protocol (Parse/Bind/Describe/Execute with
/// the values bound): refract runs the batch across the shards (`sharding/across.rs`).
fn extended_reads(s: &mut Suite, k: &Keys) {
    let (a, b) = (k.a, k.b);
    s.ext("SELECT count(*) FROM customers", &[]);
    s.ext("SELECT id, name FROM customers WHERE score > $1 ORDER BY id", &["60".into()]);
    s.ext(
        "SELECT id, score FROM customers WHERE city = $1 ORDER BY score DESC NULLS LAST, id LIMIT 7",
        &["Bern".into()],
    );
    s.ext("SELECT city, count(*), sum(score), min(name), max(balance) FROM customers GROUP BY city ORDER BY city", &[]);
    s.ext("SELECT avg(score), count(balance) FROM customers WHERE score > $1", &["-50".into()]);
    s.ext("SELECT DISTINCT tier FROM customers ORDER BY tier", &[]);
    s.ext("SELECT id FROM customers ORDER BY id DESC LIMIT 5 OFFSET 2", &[]);
    s.ext("SELECT id, name FROM customers WHERE id = ANY($1::int8[]) ORDER BY id", &[format!("{{{a},{b},-1}}")]);
    s.ext(format!("SELECT id, city FROM customers WHERE id IN ({a}, $1) ORDER BY id"), &[b.to_string()]);
    s.ext(
        "SELECT c.id, o.id FROM customers c JOIN orders o ON c.id = o.customer_id WHERE o.qty > $1 ORDER BY 1, 2",
        &["15".into()],
    );
    s.push("SELECT id, status FROM orders WHERE qty = $1".into(), Cmp::Unordered, Some(vec!["4".into()]), false);
}

/// Writes on several shards (or every copy) through the extended protocol: one transaction
/// per shard, committed together.
fn extended_writes(s: &mut Suite, k: &Keys) {
    s.ext("UPDATE customers SET score = score + $1 WHERE score > 90", &["1".into()]);
    s.ext("UPDATE orders SET qty = qty WHERE customer_id = ANY($1::int8[])", &[format!("{{{},{}}}", k.a, k.b)]);
    s.ext("INSERT INTO products VALUES ($1, $2, NULL, $3)", &["24".into(), "p24".into(), "3.25".into()]);
    s.ext("UPDATE products SET price = price * 2 WHERE id > $1", &["20".into()]);
    s.push("DELETE FROM orders WHERE qty = $1 RETURNING id".into(), Cmp::Unordered, Some(vec!["2".into()]), false);
    s.ext("SELECT * FROM products ORDER BY id", &[]);
    // Several statements of one simple Query on different shards (psycopg2's execute_batch):
    // each where it runs, one transaction per shard committed together; one failing undoes all.
    s.ord(
        "INSERT INTO customers (id, name) VALUES (7001, 'b1'); INSERT INTO customers (id, name) VALUES (7002, 'b2'); \
         INSERT INTO customers (id, name) VALUES (7003, 'b3'); INSERT INTO customers (id, name) VALUES (7004, 'b4')",
    );
    s.ord(format!(
        "UPDATE customers SET score = 1 WHERE id = 7001; SELECT id, name FROM customers WHERE id IN (7001, 7002, 7003, 7004) ORDER BY id; \
         UPDATE customers SET score = 2 WHERE id = {}",
        k.b
    ));
    s.ord(format!(
        "INSERT INTO customers (id, name) VALUES (7011, 'f1'); INSERT INTO customers (id, name) VALUES (7012, 'f2'); \
         INSERT INTO customers (id, name) VALUES ({}, 'dup')",
        k.a
    ));
    s.ord("SELECT id, name, score FROM customers WHERE id > 7000 AND id < 7100 ORDER BY id");
}

fn transactions(s: &mut Suite, k: &Keys) {
    let (a, a2, b) = (k.a, k.a2, k.b);
    s.ord("BEGIN");
    s.ord(format!("UPDATE customers SET score = 77 WHERE id = {a}"));
    s.ord(format!("SELECT id, score FROM customers WHERE id = {a}"));
    s.ord(format!("INSERT INTO orders VALUES (1101, {a}, 1, 1.00, 1, 'new', '2024-12-05')"));
    s.ord(format!("SELECT count(*) FROM orders WHERE customer_id = {a}"));
    s.ord("COMMIT");
    s.ord(format!("SELECT score FROM customers WHERE id = {a}"));

    s.ord("BEGIN");
    s.ord(format!("DELETE FROM orders WHERE customer_id = {b}"));
    s.ord(format!("SELECT count(*) FROM orders WHERE customer_id = {b}"));
    s.ord("ROLLBACK");
    s.ord(format!("SELECT count(*) FROM orders WHERE customer_id = {b}"));

    s.ord("BEGIN");
    s.ord(format!("SELECT * FROM customers WHERE id = {a2}"));
    s.ord("SELECT name FROM products WHERE id = 2");
    s.ord(format!("UPDATE customers SET tier = 2 WHERE id IN ({a}, {a2})"));
    s.ord("COMMIT");

    s.ord("BEGIN");
    s.ord(format!("UPDATE customers SET score = 1 WHERE id = {b}"));
    s.ord(format!("SELECT 1 / 0 FROM customers WHERE id = {b}"));
    s.ord("SELECT 1");
    s.ord("ROLLBACK");
    s.ord(format!("SELECT score FROM customers WHERE id = {b}"));

    s.ord("START TRANSACTION ISOLATION LEVEL REPEATABLE READ");
    s.ord(format!("SELECT name FROM customers WHERE id = {b}"));
    s.ord("SELECT current_setting('transaction_isolation')");
    s.ord("COMMIT");

    s.ord("BEGIN");
    s.ord("COMMIT");

    let new = k.new_a;
    s.ord("BEGIN");
    s.ord(format!("INSERT INTO customers (id, name, city) VALUES ({new}, 'tx', 'Zug')"));
    s.ord(format!("INSERT INTO orders (id, customer_id, amount) VALUES (1102, {new}, 3.50)"));
    s.ord(format!("SELECT c.name, o.amount FROM customers c JOIN orders o ON o.customer_id = c.id WHERE c.id = {new}"));
    s.ord("COMMIT");

    s.ord("BEGIN");
    s.ord(format!("UPDATE customers SET balance = balance + 1 WHERE id = {a}"));
    s.ord("ROLLBACK");

    s.ord("BEGIN");
    s.ord(format!("SELECT count(*) FROM customers WHERE id = {a}"));
    s.ord("SAVEPOINT s1");
    s.ord(format!("UPDATE customers SET name = 'sp' WHERE id = {a}"));
    s.ord("ROLLBACK TO SAVEPOINT s1");
    s.ord(format!("SELECT name FROM customers WHERE id = {a}"));
    s.ord("COMMIT");
}

fn after_writes(s: &mut Suite, k: &Keys) {
    s.ord("SELECT * FROM customers WHERE id IN (2001, 2002, 2003, 2004, 2005, 2006, 2007, -2001) ORDER BY id");
    s.ord("SELECT count(*) FROM orders WHERE customer_id IS NULL");
    s.ord("SELECT * FROM orders WHERE id >= 1000 ORDER BY id");
    s.ord("SELECT * FROM customers WHERE id IN (6001, 6002, -7777) ORDER BY id");
    s.ord("SELECT city, count(*), sum(score), avg(balance) FROM customers GROUP BY city ORDER BY city");
    s.ord("SELECT status, count(*), avg(qty) FROM orders GROUP BY status ORDER BY status");
    s.ord(format!("SELECT * FROM customers WHERE id IN ({}, {}) ORDER BY id", k.gone[0], k.gone[1]));
    s.ord("SELECT * FROM products ORDER BY id");
}

/// Statements refract must refuse (docs/sharding.md "What is refused", the spec's
/// transactions and extended protocol), each with the statements that lead up to it.
pub fn refusals(k: &Keys) -> Vec<Refusal> {
    let plain = |sql: &str| Refusal { before: vec![], sql: sql.into(), extended: false, in_tx: false };
    let mut r: Vec<Refusal> = [
        "SELECT id, row_number() OVER (ORDER BY id) FROM customers",
        "SELECT city, count(*) FROM customers GROUP BY city HAVING count(*) > 1",
        "SELECT c.id, o.id FROM customers c JOIN orders o ON o.status = c.city",
        "SELECT c.id, o.id FROM customers c JOIN orders o ON o.id = c.id",
        "SELECT string_agg(name, ',') FROM customers",
        "SELECT count(DISTINCT city) FROM customers",
        "SELECT count(*) FILTER (WHERE active) FROM customers",
        "SELECT sum(score) + 1 FROM customers",
        "SELECT sum(score::float8) FROM customers",
        "SELECT city, count(*) FROM customers GROUP BY city ORDER BY count(*)",
        "SELECT DISTINCT ON (city) city, id FROM customers ORDER BY city, id",
        "SELECT city, count(*) FROM customers GROUP BY ROLLUP (city)",
        "SELECT * FROM customers WHERE score > (SELECT avg(qty) FROM orders)",
        "WITH x AS (SELECT * FROM customers) SELECT count(*) FROM x",
        "SELECT name FROM customers UNION SELECT status FROM orders",
        "SELECT * FROM customers FOR UPDATE",
        "SELECT id FROM customers ORDER BY tier FETCH FIRST 3 ROWS WITH TIES",
        "SELECT id FROM customers ORDER BY id LIMIT (SELECT 2)",
        "SELECT p.id, c.id FROM products p LEFT JOIN customers c ON c.id = p.id",
    ]
    .into_iter()
    .map(plain)
    .collect();
    let (a, b) = (k.a, k.b);
    r.push(plain(&format!("SELECT c.id, o.id FROM customers c JOIN orders o ON o.id = c.id WHERE c.id = {a}")));
    r.push(plain(&format!("UPDATE customers SET id = id + 100000 WHERE id = {a}")));
    r.push(Refusal {
        before: vec![],
        sql: "SELECT id, row_number() OVER (ORDER BY id) FROM customers".into(),
        extended: true,
        in_tx: false,
    });
    // A transaction on a second shard: refused, as the servers have max_prepared_transactions
    // = 0 and no [postgres] twophase_log is configured (two-phase commit is pg_twophase's).
    let tx =
        |first: String, sql: String| Refusal { before: vec!["BEGIN".into(), first], sql, extended: false, in_tx: true };
    r.push(tx(
        format!("UPDATE customers SET score = 5 WHERE id = {a}"),
        format!("UPDATE customers SET score = 5 WHERE id = {b}"),
    ));
    r.push(tx(format!("SELECT * FROM customers WHERE id = {a}"), "SELECT count(*) FROM customers".into()));
    r.push(tx(
        format!("UPDATE orders SET qty = 1 WHERE customer_id = {a}"),
        "INSERT INTO products VALUES (50, 'px', NULL, 1.00)".into(),
    ));
    r.push(Refusal {
        before: vec!["BEGIN".into()],
        sql: format!("INSERT INTO customers (id) VALUES ({}), ({})", k.new_b, k.spare[1]),
        extended: false,
        in_tx: true,
    });
    r
}
