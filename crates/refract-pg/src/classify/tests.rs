//! Classification of many SQL samples.

use super::*;

fn classify(sql: &str) -> Classification {
    Classifier::default().classify_uncached(sql)
}

fn route(sql: &str) -> Route {
    let c = classify(sql);
    assert!(c.parse_error.is_none(), "{sql}: {:?}", c.parse_error);
    c.route
}

#[test]
fn plain_reads() {
    for sql in [
        "SELECT 1",
        "select * from t where id = $1",
        "SELECT abalance FROM pgbench_accounts WHERE aid = 42;",
        "SELECT a.x, b.y FROM a JOIN b USING (id) ORDER BY 1 LIMIT 10 OFFSET 5",
        "SELECT count(*), max(x) FROM t GROUP BY y HAVING count(*) > 1",
        "WITH r AS (SELECT * FROM t) SELECT * FROM r",
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5) SELECT * FROM n",
        "SELECT * FROM a UNION SELECT * FROM b EXCEPT SELECT * FROM c",
        "VALUES (1, 'a'), (2, 'b')",
        "SELECT now(), pg_is_in_recovery(), inet_server_port()",
        "SELECT * FROM generate_series(1, 10)",
        "SELECT x FROM t WHERE id IN (SELECT id FROM u WHERE z > lower('A'))",
        "SHOW search_path",
        "EXPLAIN SELECT * FROM t",
        "TABLE t",
        "SELECT 'nextval(1)'",
        "SELECT \"nextval\" FROM t",
        "/* refract: route=primary */ SELECT 1",
    ] {
        assert_eq!(route(sql), Route::Read, "{sql}");
    }
}

#[test]
fn writes() {
    for sql in [
        "INSERT INTO t VALUES (1)",
        "UPDATE t SET x = 1 WHERE id = 2",
        "DELETE FROM t",
        "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE",
        "CREATE TABLE t (id int)",
        "DROP TABLE t",
        "TRUNCATE t",
        "VACUUM t",
        "COPY t FROM STDIN",
        "COPY t TO STDOUT",
        "LOCK TABLE t",
        "CALL p()",
        "DO $$ BEGIN END $$",
        "GRANT SELECT ON t TO bob",
        "LISTEN chan",
        "NOTIFY chan",
        "SELECT * FROM t FOR UPDATE",
        "SELECT * FROM t FOR SHARE SKIP LOCKED",
        "SELECT * FROM (SELECT * FROM t FOR NO KEY UPDATE) s",
        "SELECT * INTO newt FROM t",
        "CREATE TABLE t2 AS SELECT * FROM t",
        "WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d",
        "WITH i AS (INSERT INTO t VALUES (1) RETURNING id) SELECT id FROM i",
        "WITH a AS (SELECT 1), u AS (UPDATE t SET x = 1 RETURNING x) SELECT * FROM a, u",
        "SELECT nextval('s')",
        "SELECT pg_catalog.nextval('s')",
        "SELECT NEXTVAL('s')",
        "SELECT setval('s', 1)",
        "SELECT currval('s')",
        "SELECT * FROM nextval('s')",
        "SELECT 1 FROM t LIMIT nextval('s')",
        "VALUES (nextval('s'))",
        "SELECT nextval('s')::int + 1",
        "SELECT CASE WHEN true THEN nextval('s') END",
        "SELECT coalesce(null, nextval('s'))",
        "SELECT x FROM t WHERE id = (SELECT nextval('s'))",
        "SELECT pg_advisory_lock(1)",
        "SELECT pg_try_advisory_xact_lock(1, 2)",
        "SELECT pg_advisory_unlock_all()",
        "SELECT txid_current()",
        "SELECT set_config('a.b', 'c', false)",
        "SELECT pg_notify('c', 'p')",
        "SELECT lo_create(0)",
        "EXPLAIN ANALYZE INSERT INTO t VALUES (1)",
        "EXPLAIN ANALYZE SELECT nextval('s')",
        "DECLARE c CURSOR FOR SELECT 1",
        "FETCH 10 FROM c",
        "PREPARE TRANSACTION 'x'",
        "COMMIT PREPARED 'x'",
    ] {
        assert_eq!(route(sql), Route::Write, "{sql}");
    }
}

#[test]
fn multi_statement_is_write_if_any_is() {
    assert_eq!(route("SELECT 1; SELECT 2"), Route::Read);
    assert_eq!(route("SELECT 1; INSERT INTO t VALUES (1)"), Route::Write);
    assert_eq!(route("SELECT 1; SELECT nextval('s');"), Route::Write);
    assert_eq!(classify("SELECT 1; BEGIN; SELECT 2; COMMIT").statements.len(), 4);
}

#[test]
fn transaction_control() {
    let kinds = |sql: &str| classify(sql).statements;
    assert_eq!(kinds("BEGIN"), vec![Statement::Begin { read_only: false }]);
    assert_eq!(kinds("START TRANSACTION"), vec![Statement::Begin { read_only: false }]);
    assert_eq!(kinds("BEGIN READ ONLY"), vec![Statement::Begin { read_only: true }]);
    assert_eq!(kinds("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"), vec![Statement::Begin { read_only: true }]);
    assert_eq!(kinds("START TRANSACTION READ WRITE"), vec![Statement::Begin { read_only: false }]);
    assert_eq!(kinds("BEGIN READ ONLY, READ WRITE"), vec![Statement::Begin { read_only: false }], "last wins");
    assert_eq!(kinds("COMMIT"), vec![Statement::Commit]);
    assert_eq!(kinds("END"), vec![Statement::Commit]);
    assert_eq!(kinds("ROLLBACK"), vec![Statement::Rollback]);
    assert_eq!(kinds("ABORT"), vec![Statement::Rollback]);
    assert_eq!(kinds("SAVEPOINT a"), vec![Statement::Savepoint]);
    assert_eq!(kinds("RELEASE SAVEPOINT a"), vec![Statement::Savepoint]);
    assert_eq!(kinds("ROLLBACK TO SAVEPOINT a"), vec![Statement::Savepoint]);
    assert_eq!(route("BEGIN READ ONLY"), Route::Read);
    assert_eq!(route("BEGIN"), Route::Write);
}

#[test]
fn session_statements() {
    let one = |sql: &str| classify(sql).statements.into_iter().next().unwrap();
    let set = |name: &str, local: bool, text: &str| Statement::Set { name: name.into(), local, text: text.into() };
    assert_eq!(one("SET search_path = a, b"), set("search_path", false, "SET search_path = a, b"));
    assert_eq!(
        one("set SESSION statement_timeout TO 5000;"),
        set("statement_timeout", false, "set SESSION statement_timeout TO 5000")
    );
    assert_eq!(one("SET LOCAL work_mem = '64MB'"), set("work_mem", true, "SET LOCAL work_mem = '64MB'"));
    assert_eq!(one("SET TIME ZONE 'UTC'"), set("timezone", false, "SET TIME ZONE 'UTC'"));
    assert_eq!(
        one("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"),
        set("transaction", true, "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
    );
    assert_eq!(
        one("SET application_name TO DEFAULT"),
        set("application_name", false, "SET application_name TO DEFAULT")
    );
    assert_eq!(one("RESET work_mem"), Statement::Reset { name: Some("work_mem".into()) });
    assert_eq!(one("RESET ALL"), Statement::Reset { name: None });
    assert_eq!(one("DISCARD ALL"), Statement::Discard { all: true });
    assert_eq!(one("DISCARD PLANS"), Statement::Discard { all: false });
    assert_eq!(
        one("PREPARE q(int) AS SELECT * FROM t WHERE id = $1"),
        Statement::Prepare {
            name: "q".into(),
            text: "PREPARE q(int) AS SELECT * FROM t WHERE id = $1".into(),
            read: true
        }
    );
    assert_eq!(
        one("PREPARE w AS INSERT INTO t VALUES (1)"),
        Statement::Prepare { name: "w".into(), text: "PREPARE w AS INSERT INTO t VALUES (1)".into(), read: false }
    );
    assert_eq!(one("EXECUTE q(1)"), Statement::Execute { name: "q".into() });
    assert_eq!(one("DEALLOCATE q"), Statement::Deallocate { name: Some("q".into()) });
    assert_eq!(one("DEALLOCATE PREPARE q"), Statement::Deallocate { name: Some("q".into()) });
    assert_eq!(one("DEALLOCATE ALL"), Statement::Deallocate { name: None });
    let c = classify("SET a.b = 1; SELECT 1; SET LOCAL c.d = 2");
    assert_eq!(c.statements[0], set("a.b", false, "SET a.b = 1"));
    assert_eq!(c.statements[2], set("c.d", true, "SET LOCAL c.d = 2"));
    assert_eq!(classify("EXECUTE q(1); EXECUTE r").executes().collect::<Vec<_>>(), vec!["q", "r"]);
}

#[test]
fn route_settings_and_hints() {
    let one = |sql: &str| classify(sql).statements.into_iter().next().unwrap();
    assert_eq!(one("SET refract.route = primary"), Statement::RouteSetting(RouteHint::Primary));
    assert_eq!(one("SET refract.route TO 'replica'"), Statement::RouteSetting(RouteHint::Replica));
    assert_eq!(one("set refract.route = auto"), Statement::RouteSetting(RouteHint::Auto));
    assert_eq!(one("RESET refract.route"), Statement::RouteSetting(RouteHint::Auto));
    assert!(matches!(one("SET refract.route = elsewhere"), Statement::Set { .. }));
    // PRIMARY is a reserved word, so PostgreSQL's grammar refuses it unquoted; refract takes it.
    assert_eq!(one("SET refract.route = 'primary'"), Statement::RouteSetting(RouteHint::Primary));
    assert_eq!(one(" set  SESSION refract.route TO Primary ;"), Statement::RouteSetting(RouteHint::Primary));
    assert!(classify("SET refract.route = primary; SELECT 1").parse_error.is_some(), "only alone");
    assert_eq!(route("SET refract.route = replica"), Route::Read, "needs no server");

    let hinted = classify("/* refract: route=primary */ SELECT 1");
    assert_eq!(hinted.hint, Some(RouteHint::Primary));
    assert_eq!(hinted.target(RouteHint::Auto), Route::Write);
    assert_eq!(hinted.target(RouteHint::Replica), Route::Write, "the query's hint wins");
    let plain = classify("SELECT 1");
    assert_eq!(plain.target(RouteHint::Primary), Route::Write);
    assert_eq!(plain.target(RouteHint::Auto), Route::Read);
    assert_eq!(classify("INSERT INTO t VALUES (1) /* refract: route=replica */").target(RouteHint::Auto), Route::Read);
    assert_eq!(classify("/* refract: route=auto */ SELECT 1").target(RouteHint::Primary), Route::Write);
}

#[test]
fn unparsable_goes_to_the_primary() {
    for sql in ["SELEC 1", "SELECT (", "", "   ", "SELECT 1\0"] {
        let c = classify(sql);
        if sql.trim().is_empty() {
            assert_eq!((c.route, c.statements.len()), (Route::Read, 0), "empty query");
        } else {
            assert_eq!(c.route, Route::Write, "{sql}");
            assert!(c.parse_error.is_some(), "{sql}");
        }
    }
}

#[test]
fn write_function_list_is_configurable() {
    let config = ClassifierConfig { write_functions: vec!["audit_*".into(), "MyFn".into()], ..Default::default() };
    let c = Classifier::new(config);
    assert_eq!(c.classify("SELECT audit_log('x')").route, Route::Write);
    assert_eq!(c.classify("SELECT myfn()").route, Route::Write);
    assert_eq!(c.classify("SELECT nextval('s')").route, Route::Read, "replaced the defaults");
    assert!(analyze::glob("pg_create_*_replication_slot", "pg_create_physical_replication_slot"));
    assert!(!analyze::glob("pg_create_*_replication_slot", "pg_create_slot"));
    assert!(analyze::glob("lo_*", "lo_"));
}

#[test]
fn cache_is_bounded() {
    let c = Classifier::new(ClassifierConfig { cache_capacity: 3, max_cached_len: 20, ..Default::default() });
    let first = c.classify("SELECT 1");
    assert!(Arc::ptr_eq(&first, &c.classify("SELECT 1")), "cached");
    for i in 0..10 {
        c.classify(&format!("SELECT {i} AS c{i}"));
    }
    assert_eq!(c.cached(), 3);
    c.classify("SELECT 'this text is longer than twenty bytes'");
    assert_eq!(c.cached(), 3);
    let zero = Classifier::new(ClassifierConfig { cache_capacity: 0, ..Default::default() });
    zero.classify("SELECT 1");
    assert_eq!(zero.cached(), 0);
}

#[test]
fn texts_differing_in_literals_share_a_shape() {
    let c = Classifier::default();
    let a = c.classify("SELECT abalance FROM pgbench_accounts WHERE aid = 42;");
    let b = c.classify("SELECT abalance FROM pgbench_accounts WHERE aid = 77;");
    assert!(Arc::ptr_eq(&a, &b), "one parse for both");
    assert_eq!(b.route, Route::Read);
    assert_eq!(c.cached(), 1);
    let w1 = c.classify("UPDATE pgbench_accounts SET abalance = abalance + 5 WHERE aid = 1");
    let w2 = c.classify("UPDATE pgbench_accounts SET abalance = abalance + 3 WHERE aid = 2");
    assert!(Arc::ptr_eq(&w1, &w2));
    assert_eq!(w2.route, Route::Write);
}

#[test]
fn shapes_keep_writes_writes() {
    let c = Classifier::default();
    // A read shape first, then texts that differ in more than literals.
    assert_eq!(c.classify("SELECT * FROM t WHERE a = 1").route, Route::Read);
    for sql in [
        "SELECT * FROM t WHERE a = 2 FOR UPDATE",
        "SELECT * FROM t WHERE a = 3 FOR SHARE",
        "SELECT nextval('s'), 4",
        "SELECT setval('s', 5)",
        "SELECT pg_advisory_lock(6)",
        "SELECT * INTO u FROM t WHERE a = 7",
        "WITH d AS (DELETE FROM t WHERE a = 8 RETURNING *) SELECT * FROM d",
        "SELECT * FROM t WHERE a = 9; DELETE FROM t WHERE a = 9",
    ] {
        assert_eq!(c.classify(sql).route, Route::Write, "{sql}");
        // The same text with other literals: still a write, now from the shape cache.
        let other = sql.replace(|ch: char| ch.is_ascii_digit(), "1").replace("'s'", "'other'");
        assert_eq!(c.classify(&other).route, Route::Write, "{other}");
    }
    assert_eq!(c.classify("SELECT * FROM t WHERE a = 10").route, Route::Read);
}

#[test]
fn session_statements_are_not_shared_by_shape() {
    let c = Classifier::default();
    let set = |sql: &str| match c.classify(sql).statements.first() {
        Some(Statement::Set { text, .. }) => text.clone(),
        other => panic!("{sql}: {other:?}"),
    };
    assert_eq!(set("SET statement_timeout = 1000"), "SET statement_timeout = 1000");
    assert_eq!(set("SET statement_timeout = 2000"), "SET statement_timeout = 2000");
    assert_eq!(set("SET application_name = 'a'"), "SET application_name = 'a'");
    assert_eq!(set("SET application_name = 'b'"), "SET application_name = 'b'");
    assert_eq!(
        c.classify("SET refract.route = 'primary'").statements,
        vec![Statement::RouteSetting(RouteHint::Primary)]
    );
    assert_eq!(
        c.classify("SET refract.route = 'replica'").statements,
        vec![Statement::RouteSetting(RouteHint::Replica)]
    );
    let p1 = c.classify("PREPARE q AS SELECT * FROM t WHERE a = 1");
    let p2 = c.classify("PREPARE q AS SELECT * FROM t WHERE a = 2");
    assert_ne!(p1.statements, p2.statements, "PREPARE keeps its own text");
    // Hints: a literal that looks like a hint still counts, text by text.
    assert_eq!(c.classify("SELECT '/* refract: route=primary */', 1").target(RouteHint::Auto), Route::Write);
    assert_eq!(c.classify("SELECT 'plain', 1").target(RouteHint::Auto), Route::Read);
}

#[test]
fn shape_cache_agrees_with_the_parser() {
    let samples = [
        "SELECT abalance FROM pgbench_accounts WHERE aid = 17",
        "SELECT x FROM t WHERE id IN (SELECT id FROM u WHERE z > lower('A')) LIMIT 5",
        "VALUES (1, 'a'), (2, 'b')",
        "INSERT INTO t VALUES (1, 'x''y')",
        "SELECT 'nextval(1)', 2",
        "SELECT * FROM t WHERE a = 1.5e3 AND b = 'c' FOR NO KEY UPDATE",
        "EXPLAIN SELECT * FROM t WHERE a = 3",
        "SELECT * FROM t WHERE a = 'unterminated",
        "SELECT 1 +",
        "BEGIN; SELECT 1; COMMIT",
        "SELECT /* 5 */ 5 -- 6\n",
    ];
    let shared = Classifier::default();
    for round in 0..3 {
        for sql in samples {
            let varied = sql.replace('1', &(round + 1).to_string());
            let want = shared.classify_uncached(&varied);
            assert_eq!(*shared.classify(&varied), want, "{varied}");
        }
    }
}

#[test]
fn statements_that_may_leave_session_state() {
    for sql in [
        "CREATE TEMP TABLE t (x int)",
        "CREATE TEMPORARY TABLE t AS SELECT 1",
        "create temporary view v as select 1",
        "CREATE TEMP SEQUENCE s",
        "CREATE TABLE pg_temp.t (x int)",
        "SELECT 1 INTO TEMP t",
        "CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "SELECT pg_advisory_lock(1)",
        "SELECT pg_try_advisory_lock(1, 2)",
        "SELECT pg_advisory_lock_shared(1)",
        "SELECT pg_advisory_unlock(1)",
        "SELECT pg_catalog.pg_advisory_unlock_all()",
        "SELECT set_config('a.b', 'c', false)",
        "SELECT set_config('a.b', 'c', 'true')",
        "SELECT set_config('a.b', 'c', $1)",
        "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
        "DO $$ BEGIN PERFORM 1; END $$",
        "CALL p()",
        "LISTEN x",
        "SELECT 1; CREATE TEMP TABLE t (x int)",
    ] {
        assert!(classify(sql).stateful, "{sql}");
    }
    for sql in [
        "SELECT 1",
        "CREATE TABLE t (x int)",
        "CREATE UNLOGGED TABLE t (x int)",
        "SELECT pg_advisory_xact_lock(1)",
        "SELECT pg_try_advisory_xact_lock(1)",
        "SELECT set_config('a.b', 'c', true)",
        "DECLARE c CURSOR FOR SELECT 1",
        "SET search_path = a",
        "INSERT INTO t VALUES (1)",
    ] {
        assert!(!classify(sql).stateful, "{sql}");
    }
    assert!(classify("SELECT 1, set_config('a.b', 'c', false)").set_config);
    assert!(!classify("SELECT set_config('a.b', 'c', true)").set_config);
    assert!(!classify("CREATE TEMP TABLE t (x int)").set_config);
    assert_eq!(classify("LISTEN Chan").statements, vec![Statement::Listen { channel: "chan".into() }]);
    assert_eq!(classify("UNLISTEN \"C\"").statements, vec![Statement::Unlisten { channel: Some("C".into()) }]);
    assert_eq!(classify("UNLISTEN *").statements, vec![Statement::Unlisten { channel: None }]);
}

#[test]
fn fingerprints_are_one_per_kind_of_statement() {
    let f = super::fingerprint;
    assert_eq!(f("SELECT pg_sleep(0.02)"), f("SELECT pg_sleep(0.5)"), "literals do not make a kind");
    assert_eq!(f("SELECT * FROM t WHERE a = 'x'"), f("SELECT * FROM t WHERE a = 'yy'"));
    assert_ne!(f("SELECT 1"), f("SELECT pg_sleep(0.02)"));
    assert_ne!(f("SELECT a FROM t"), f("SELECT b FROM t"), "a text without literals is its own kind");
    assert_eq!(f("SELECT a FROM t"), f("SELECT a FROM t"));
}

#[test]
fn the_relations_a_text_names() {
    let tables = |sql: &str| classify(sql).tables;
    assert_eq!(tables("select * from b join a using (id) where x in (select y from s.c)"), ["a", "b", "s.c"]);
    assert_eq!(tables("select * from public.a, A, \"A\""), ["A", "a"], "public. dropped; unquoted names fold");
    assert_eq!(tables("with r as (select * from t) select * from r"), ["r", "t"], "a CTE's name counts (conservative)");
    assert_eq!(tables("select 1; select * from x"), ["x"]);
    assert!(tables("select 1").is_empty());
    assert!(tables("select from").is_empty(), "no parse, no tables");
}

#[test]
fn prepared_statements_run_inside_other_statements() {
    let c = classify("CREATE TABLE t2 AS EXECUTE q(1)");
    assert_eq!(c.nested_executes, ["q"]);
    assert_eq!(c.route, Route::Write);
    let c = classify("EXPLAIN (COSTS OFF) EXECUTE q2; EXPLAIN ANALYZE CREATE TABLE t3 AS EXECUTE q3");
    assert_eq!(c.nested_executes, ["q2", "q3"]);
    assert!(classify("EXECUTE q").nested_executes.is_empty(), "EXECUTE itself is a Statement::Execute");
    assert_eq!(classify("EXECUTE q").statements, [Statement::Execute { name: "q".into() }]);
}

#[test]
fn schema_changes() {
    for sql in ["ALTER TABLE t ADD COLUMN c int", "DROP TYPE ty", "CREATE TABLE t (a int)", "DO $$ BEGIN END $$"] {
        assert!(classify(sql).changes_schema, "{sql}");
    }
    for sql in ["SELECT 1", "INSERT INTO t VALUES (1)", "BEGIN", "SET a = 1", "TRUNCATE t", "VACUUM t"] {
        assert!(!classify(sql).changes_schema, "{sql}");
    }
}

#[test]
fn objects_in_the_temp_schema_are_session_state() {
    for sql in [
        "CREATE STATISTICS pg_temp.s ON a, b FROM t",
        "CREATE COLLATION pg_temp.c (locale = 'C')",
        "CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    ] {
        assert!(classify(sql).stateful, "{sql}");
    }
    assert!(!classify("CREATE STATISTICS s ON a, b FROM t").stateful);
}
