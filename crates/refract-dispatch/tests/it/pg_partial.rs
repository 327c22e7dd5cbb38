//! Partial replicas (issue 24 item 5, docs/postgres.md "Partial replicas"): a primary and two
//! logical replicas, r1 subscribing to tables a and b, r2 to b and c (real PostgreSQL logical
//! replication). refract reads what each holds from its subscriptions and sends a read only to a
//! server holding every table it names: a to the primary or r1, c to the primary or r2, a join
//! of a and c to the primary; reads of b follow the configured share; a session reads its own
//! writes on any of them.
#![allow(clippy::unwrap_used)]

use crate::pg_common;

use pg_common::{until, Client, Fixture};
use refract_testkit::{PgCluster, PASSWORD, USER};
use std::collections::HashMap;
use std::time::Duration;

const SCHEMA: [(&str, &str); 3] = [
    ("a", "create table a (id int primary key, v text)"),
    ("b", "create table b (id int primary key, v text)"),
    ("c", "create table c (id int primary key, a_id int, v text)"),
];

/// The cluster: primary with a, b, c and two publications; r1 and r2 subscribed and synced.
fn cluster() -> PgCluster {
    let mut cluster = PgCluster::start_with_replicas(0).expect("PostgreSQL test cluster");
    let (r1, r2) = (cluster.add_standalone().unwrap(), cluster.add_standalone().unwrap());
    let p = &cluster.primary;
    for (_, ddl) in SCHEMA {
        cluster.psql(p, ddl).unwrap();
    }
    let rows = "insert into a select n, 'a' || n from generate_series(1, 10) n; \
                insert into b select n, 'b' || n from generate_series(1, 10) n; \
                insert into c select n, n, 'c' || n from generate_series(1, 10) n";
    cluster.psql(p, rows).unwrap();
    cluster.psql(p, "create publication pab for table a, b; create publication pbc for table b, c").unwrap();
    let conninfo = format!("host=127.0.0.1 port={} user={USER} password={PASSWORD} dbname=postgres", p.port);
    for (i, tables, publication) in [(r1, ["a", "b"], "pab"), (r2, ["b", "c"], "pbc")] {
        let r = &cluster.standalone[i];
        for (name, ddl) in SCHEMA.iter().filter(|(n, _)| tables.contains(n)) {
            cluster.psql(r, ddl).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        // CREATE SUBSCRIPTION cannot run in a transaction block: its own psql call.
        let sub = format!("create subscription s{i} connection '{conninfo}' publication {publication}");
        cluster.psql(r, &sub).unwrap();
        let synced = "select count(*) filter (where srsubstate = 'r') from pg_subscription_rel";
        cluster.wait_for(r, synced, "2", Duration::from_secs(60)).unwrap();
    }
    cluster
}

fn refract(cluster: PgCluster, share: &str) -> Fixture {
    let servers = format!(
        r#"
[[postgres.server]]
name = "primary"
addr = "{}"
role = "primary"

[[postgres.server]]
name = "r1"
addr = "{}"
role = "replica"

[[postgres.server]]
name = "r2"
addr = "{}"
role = "replica"

{share}
"#,
        cluster.primary.addr(),
        cluster.standalone[0].addr(),
        cluster.standalone[1].addr()
    );
    let f = Fixture::start_servers(cluster, "", &servers);
    // The health loop reads what each replica holds from its subscriptions.
    until("the replicas' tables are known", || {
        let v = f.admin_json("/pg/servers");
        let tables = |name: &str| {
            v.as_array().unwrap().iter().find(|s| s["name"] == name).map(|s| s["tables"].to_string()).unwrap()
        };
        tables("r1") == r#"["a","b"]"# && tables("r2") == r#"["b","c"]"# && tables("primary") == "null"
    });
    f
}

/// Which server answered each of `n` runs of `sql` (whose first column is the server's port).
fn served(f: &Fixture, c: &mut Client, sql: &str, n: usize) -> HashMap<&'static str, usize> {
    let names: HashMap<String, &'static str> = [
        (f.cluster.primary.port, "primary"),
        (f.cluster.standalone[0].port, "r1"),
        (f.cluster.standalone[1].port, "r2"),
    ]
    .into_iter()
    .map(|(p, n)| (p.to_string(), n))
    .collect();
    let mut count = HashMap::new();
    for _ in 0..n {
        let a = c.query(sql);
        assert!(a.error.is_none(), "{sql}: {:?}", a.error);
        *count.entry(names[a.value()]).or_insert(0) += 1;
    }
    count
}

fn only(count: &HashMap<&str, usize>, allowed: &[&str]) -> bool {
    count.keys().all(|k| allowed.contains(k))
}

#[test]
fn reads_go_only_to_servers_that_hold_every_table_they_name() {
    let f = refract(cluster(), "");
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    let port = "current_setting('port')";
    let of_a = served(&f, &mut c, &format!("select {port}, count(*) from a"), 40);
    assert!(only(&of_a, &["primary", "r1"]) && of_a.contains_key("r1"), "reads of a: {of_a:?}");
    let of_c = served(&f, &mut c, &format!("select {port}, count(*) from public.c"), 40);
    assert!(only(&of_c, &["primary", "r2"]) && of_c.contains_key("r2"), "reads of c: {of_c:?}");
    let join = served(&f, &mut c, &format!("select {port}, count(*) from a join c on c.a_id = a.id"), 20);
    assert!(only(&join, &["primary"]), "a join of a and c: {join:?}");
    let of_b = served(&f, &mut c, &format!("select {port}, count(*) from b"), 40);
    assert!(only(&of_b, &["r1", "r2"]), "reads of b go to either replica: {of_b:?}");
    let none = served(&f, &mut c, &format!("select {port}"), 20);
    assert!(only(&none, &["primary"]), "a read naming no table may read any through a function: {none:?}");

    // Extended protocol: the tables of the statements the batch parses.
    let r2 = f.cluster.standalone[1].port.to_string();
    let primary = f.cluster.primary.port.to_string();
    let ports: Vec<String> =
        (0..20).map(|_| c.extended(&format!("select {port} from c limit 1")).value().to_owned()).collect();
    assert!(ports.iter().all(|p| *p == r2 || *p == primary) && ports.contains(&r2), "extended reads of c: {ports:?}");

    // A session reads its own writes, whichever server serves the read.
    for id in 100..120 {
        let w = c.query(&format!("insert into a values ({id}, 'new{id}')"));
        assert!(w.error.is_none(), "{:?}", w.error);
        assert_eq!(c.query(&format!("select v from a where id = {id}")).value(), format!("new{id}"));
    }
}

#[test]
fn configured_shares_hold_over_a_thousand_reads() {
    let share = r#"
[[postgres.share]]
tables = ["b"]
servers = { primary = 1.0, r1 = 1.0, r2 = 2.0 }
"#;
    let f = refract(cluster(), share);
    let mut c = Client::connect(f.addr(), USER, PASSWORD).unwrap();
    let count = served(&f, &mut c, "select current_setting('port'), count(*) from b", 1000);
    for (name, want) in [("primary", 250.0), ("r1", 250.0), ("r2", 500.0)] {
        let got = *count.get(name).unwrap_or(&0) as f64;
        assert!((got - want).abs() <= want * 0.1, "{name}: {got} reads of 1000, want {want} ± 10 %: {count:?}");
    }
    // Reads of another class are not shared with the primary.
    let of_a = served(&f, &mut c, "select current_setting('port'), count(*) from a", 20);
    assert!(only(&of_a, &["r1"]), "{of_a:?}");
}
