// pgx v5 through SHARDED refract, compared with one plain PostgreSQL (run by
// crates/refract-dispatch/tests/it/pg_sharded_drivers.rs; built by tests/drivers/setup-all.sh).
//
// Usage: pgx-sharded-suite REFRACT_PORT ORACLE_PORT SHARD_PORT... pgx with its defaults
// (QueryExecModeCacheStatement): a statement with arguments is prepared under a name of its
// own and run with Bind/Execute, results in binary format where pgx knows the type; one
// without arguments is a simple Query (the schema, and BEGIN/COMMIT of conn.Begin); a Batch
// sends its statements' messages under one Sync. Each check runs the same calls against
// refract and against the oracle and compares the answers step by step (the rows, in order
// where the ORDER BY fixes it; status tags; SQLSTATE of errors), as the Python suites do
// (tests/drivers/python/sharded_harness.py). Prints `ok NAME` or `FAIL NAME: reason` per
// check, then `done`; exits 1 when a check failed.
package main

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var (
	refract, oracle string
	shards          []string
	shardOf         = map[int64]int{}
	failed          []string
)

const loaded = 80

func dsn(port string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%s user=refract password=refract dbname=postgres sslmode=disable connect_timeout=10", port)
}

func connect(ctx context.Context, port string) (*pgx.Conn, error) {
	return pgx.Connect(ctx, dsn(port))
}

// query: rows of sql on port as text, through the simple protocol (for the probe and the
// direct reads of the shards).
func query(ctx context.Context, port, sql string) ([][]string, error) {
	c, err := connect(ctx, port)
	if err != nil {
		return nil, err
	}
	defer c.Close(context.Background())
	rows, err := c.Query(ctx, sql, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out [][]string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return nil, err
		}
		out = append(out, texts(vals))
	}
	return out, rows.Err()
}

// show: a value as text (numerics by their decimal string, not pgx's struct).
func show(v any) string {
	if v == nil {
		return "NULL"
	}
	if val, ok := v.(driver.Valuer); ok {
		if x, err := val.Value(); err == nil {
			return fmt.Sprint(x)
		}
	}
	return fmt.Sprint(v)
}

func texts(vals []any) []string {
	out := make([]string, len(vals))
	for i, v := range vals {
		out[i] = show(v)
	}
	return out
}

func cents(v int) string {
	sign := ""
	if v < 0 {
		sign, v = "-", -v
	}
	return fmt.Sprintf("%s%d.%02d", sign, v/100, v%100)
}

var cities = []string{"'Bern'", "'Chur'", "'Zug'", "'aarau'", "'Basel'", "NULL"}

func load() []string {
	var cs, os_, ps []string
	for i := 1; i <= loaded; i++ {
		score := "NULL"
		if i%11 != 0 {
			score = strconv.Itoa((i*37)%101 - 50)
		}
		balance := "NULL"
		if i%13 != 0 {
			balance = cents((i*7919)%200001 - 100000)
		}
		cs = append(cs, fmt.Sprintf("(%d, 'c%03d', %s, %s, %s)", i, i, cities[i%len(cities)], score, balance))
	}
	for i := 1; i <= 200; i++ {
		os_ = append(os_, fmt.Sprintf("(%d, %d, %d, %s)", i, (i*13)%loaded+1, i%7+1, cents(i*250%9999)))
	}
	for i := 1; i <= 10; i++ {
		ps = append(ps, fmt.Sprintf("(%d, 'p%d', %s)", i, i, cents(i*325)))
	}
	return []string{
		"INSERT INTO customers VALUES " + strings.Join(cs, ", "),
		"INSERT INTO orders VALUES " + strings.Join(os_, ", "),
		"INSERT INTO products VALUES " + strings.Join(ps, ", "),
	}
}

var schema = []string{
	"DROP TABLE IF EXISTS orders",
	"DROP TABLE IF EXISTS customers",
	"DROP TABLE IF EXISTS products",
	"CREATE TABLE customers (id int8 PRIMARY KEY, name text NOT NULL, city text, score int4, balance numeric(10,2))",
	"CREATE TABLE orders (id int8 NOT NULL, customer_id int8 NOT NULL, qty int4 NOT NULL, amount numeric(10,2), PRIMARY KEY (customer_id, id))",
	"CREATE TABLE products (id int4 PRIMARY KEY, name text NOT NULL, price numeric(8,2))",
}

// probe: which partition PostgreSQL's PARTITION BY HASH (int8) gives each key, on the oracle.
func probe(ctx context.Context) error {
	n := len(shards)
	stmts := []string{"DROP TABLE IF EXISTS refract_probe", "CREATE TABLE refract_probe (k int8) PARTITION BY HASH (k)"}
	for i := 0; i < n; i++ {
		stmts = append(stmts, fmt.Sprintf("CREATE TABLE refract_probe_%d PARTITION OF refract_probe FOR VALUES WITH (MODULUS %d, REMAINDER %d)", i, n, i))
	}
	stmts = append(stmts, "INSERT INTO refract_probe SELECT generate_series(-100, 20000)")
	for _, s := range stmts {
		if _, err := query(ctx, oracle, s); err != nil {
			return err
		}
	}
	rows, err := query(ctx, oracle, "SELECT k, tableoid::regclass::text FROM refract_probe")
	if err != nil {
		return err
	}
	for _, r := range rows {
		k, _ := strconv.ParseInt(r[0], 10, 64)
		p := r[1][strings.LastIndex(r[1], "_")+1:]
		i, _ := strconv.Atoi(p)
		shardOf[k] = i
	}
	return nil
}

func keyOn(shard int, start int64) int64 {
	for k := start; ; k++ {
		if s, ok := shardOf[k]; ok && s == shard {
			return k
		}
	}
}

// keysOnBoth: n keys from start on, alternating shard 0 and shard 1.
func keysOnBoth(start int64, n int) []int64 {
	var out []int64
	k := start
	for len(out) < n {
		k = keyOn(len(out)%2, k)
		out = append(out, k)
		k++
	}
	return out
}

type step struct{ label, value, detail string }

// S: one connection's steps; a PostgreSQL error is recorded, not returned.
type S struct {
	c     *pgx.Conn
	steps []step
}

func (s *S) add(label, value, detail string) { s.steps = append(s.steps, step{label, value, detail}) }

func (s *S) fail(label string, err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		s.add(label, "error "+pe.Code, pe.Message)
		return true
	}
	s.add(label, "driver error", err.Error())
	return true
}

func (s *S) rows(ctx context.Context, label string, ordered bool, sql string, args ...any) {
	rows, err := s.c.Query(ctx, sql, args...)
	if err != nil {
		s.fail(label, err)
		return
	}
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			rows.Close()
			s.fail(label, err)
			return
		}
		out = append(out, "("+strings.Join(texts(vals), ", ")+")")
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		s.fail(label, err)
		return
	}
	if !ordered {
		sort.Strings(out)
	}
	s.add(label, fmt.Sprintf("%d rows: %s", len(out), strings.Join(out, " ")), "")
}

func (s *S) run(ctx context.Context, label, sql string, args ...any) {
	tag, err := s.c.Exec(ctx, sql, args...)
	if err != nil {
		s.fail(label, err)
		return
	}
	s.add(label, tag.String(), "")
}

// batch: every statement of `args` rows as one pgx.Batch (one Sync); the tags.
func (s *S) batch(ctx context.Context, label, sql string, args [][]any) {
	b := &pgx.Batch{}
	for _, a := range args {
		b.Queue(sql, a...)
	}
	br := s.c.SendBatch(ctx, b)
	var tags []string
	for range args {
		tag, err := br.Exec()
		if err != nil {
			br.Close()
			s.fail(label, err)
			return
		}
		tags = append(tags, tag.String())
	}
	if err := br.Close(); err != nil {
		s.fail(label, err)
		return
	}
	s.add(label, fmt.Sprintf("%d tags, first %s", len(tags), tags[0]), "")
}

func cut(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

// both: body against refract, then against the oracle; the first step that differs.
func both(body func(context.Context, *S) error) func(context.Context) error {
	return func(ctx context.Context) error {
		on := func(port string) (*S, error) {
			c, err := connect(ctx, port)
			if err != nil {
				return nil, err
			}
			defer c.Close(context.Background())
			s := &S{c: c}
			return s, body(ctx, s)
		}
		got, err := on(refract)
		if err != nil {
			return fmt.Errorf("refract: %w", err)
		}
		want, err := on(oracle)
		if err != nil {
			return fmt.Errorf("PostgreSQL: %w", err)
		}
		// Only `duplicate ...` steps may fail on the oracle: another failure is the suite's mistake.
		for _, w := range want.steps {
			if strings.HasPrefix(w.value, "error") || strings.HasPrefix(w.value, "driver error") {
				if !strings.HasPrefix(w.label, "duplicate") {
					return fmt.Errorf("the suite's own step %q failed on PostgreSQL: %s %s", w.label, w.value, w.detail)
				}
			}
		}
		for i := 0; i < len(got.steps) && i < len(want.steps); i++ {
			g, w := got.steps[i], want.steps[i]
			if g.value != w.value {
				return fmt.Errorf("%s: refract %s [%s]; PostgreSQL %s [%s]", g.label, cut(g.value), g.detail, cut(w.value), w.detail)
			}
		}
		if len(got.steps) != len(want.steps) {
			return fmt.Errorf("refract ran %d steps, PostgreSQL %d", len(got.steps), len(want.steps))
		}
		return nil
	}
}

const selectCustomer = "SELECT id, name, city, score, balance FROM customers WHERE id = $1"
const insertCustomer = "INSERT INTO customers (id, name, city, score, balance) VALUES ($1, $2, $3, $4, $5)"

func rowsOf(sql string, ordered bool, args ...any) func(context.Context, *S) error {
	return func(ctx context.Context, s *S) error { s.rows(ctx, "rows", ordered, sql, args...); return nil }
}

func setup(ctx context.Context) error {
	for _, port := range []string{oracle, refract} {
		c, err := connect(ctx, port)
		if err != nil {
			return err
		}
		for _, sql := range append(append([]string{}, schema...), load()...) {
			if _, err := c.Exec(ctx, sql); err != nil {
				c.Close(context.Background())
				return fmt.Errorf("port %s: %s: %w", port, cut(sql), err)
			}
		}
		var n [3]int64
		for i, t := range []string{"customers", "orders", "products"} {
			if err := c.QueryRow(ctx, "SELECT count(*) FROM "+t, pgx.QueryExecModeSimpleProtocol).Scan(&n[i]); err != nil {
				c.Close(context.Background())
				return err
			}
		}
		c.Close(context.Background())
		if n != [3]int64{loaded, 200, 10} {
			return fmt.Errorf("port %s: counts %v", port, n)
		}
	}
	return nil
}

func noPreparedLeft(ctx context.Context) error {
	for i, port := range shards {
		rows, err := query(ctx, port, "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'refract:%'")
		if err != nil {
			return err
		}
		if len(rows) > 0 {
			return fmt.Errorf("shard %d: prepared transactions left: %v", i, rows)
		}
	}
	return nil
}

func placement(ctx context.Context) error {
	var problems []string
	for _, t := range [][2]string{{"customers", "id"}, {"orders", "customer_id"}} {
		for i, port := range shards {
			rows, err := query(ctx, port, fmt.Sprintf("SELECT %s FROM %s", t[1], t[0]))
			if err != nil {
				return err
			}
			var wrong []string
			for _, r := range rows {
				k, _ := strconv.ParseInt(r[0], 10, 64)
				if shardOf[k] != i {
					wrong = append(wrong, r[0])
				}
			}
			if len(wrong) > 0 {
				problems = append(problems, fmt.Sprintf("%s: %d keys on shard %d that PostgreSQL puts elsewhere: %v", t[0], len(wrong), i, wrong[:min(5, len(wrong))]))
			}
			if len(rows) == 0 {
				problems = append(problems, fmt.Sprintf("%s: shard %d holds no row", t[0], i))
			}
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, " | "))
	}
	return nil
}

func sortedRows(rows [][]string) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = strings.Join(r, "|")
	}
	sort.Strings(out)
	return out
}

func tablesEqual(ctx context.Context) error {
	var problems []string
	for _, t := range []string{"customers", "orders", "products"} {
		want, err := query(ctx, oracle, "SELECT * FROM "+t)
		if err != nil {
			return err
		}
		w := strings.Join(sortedRows(want), "\n")
		if t == "products" {
			for i, port := range shards {
				got, err := query(ctx, port, "SELECT * FROM "+t)
				if err != nil {
					return err
				}
				if g := strings.Join(sortedRows(got), "\n"); g != w {
					problems = append(problems, fmt.Sprintf("products on shard %d: %d rows, PostgreSQL %d", i, len(got), len(want)))
				}
			}
			continue
		}
		var all [][]string
		for _, port := range shards {
			got, err := query(ctx, port, "SELECT * FROM "+t)
			if err != nil {
				return err
			}
			all = append(all, got...)
		}
		if g := strings.Join(sortedRows(all), "\n"); g != w {
			problems = append(problems, fmt.Sprintf("%s: shards hold %d rows, PostgreSQL %d", t, len(all), len(want)))
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, " | "))
	}
	return nil
}

func check(name string, limit time.Duration, fn func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(limit + 5*time.Second):
		err = fmt.Errorf("timed out after %v", limit)
	}
	if err != nil {
		failed = append(failed, name)
		fmt.Printf("FAIL %s: %s\n", name, strings.ReplaceAll(err.Error(), "\n", " | "))
		return
	}
	fmt.Printf("ok %s (%.1f s)\n", name, time.Since(start).Seconds())
}

func main() {
	if len(os.Args) < 5 {
		fmt.Fprintln(os.Stderr, "usage: pgx-sharded-suite REFRACT_PORT ORACLE_PORT SHARD_PORT...")
		os.Exit(2)
	}
	refract, oracle, shards = os.Args[1], os.Args[2], os.Args[3:]
	// Per check: 26 checks stay within the Rust test's limit for a suite even if every one hangs.
	limit := 15 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	if err := probe(ctx); err != nil {
		fmt.Printf("FAIL setup: probe: %v\ndone\n", err)
		os.Exit(1)
	}
	cancel()
	k0, k1 := keyOn(0, 1), keyOn(1, 1)
	check("setup", 40*time.Second, setup)
	check("keyed_read", limit, both(func(ctx context.Context, s *S) error {
		s.rows(ctx, "shard 0", true, selectCustomer, k0)
		s.rows(ctx, "shard 1", true, selectCustomer, k1)
		s.rows(ctx, "absent", true, selectCustomer, int64(100000))
		return nil
	}))
	four := keysOnBoth(1, 4)
	check("in_list", limit, both(rowsOf("SELECT id, name FROM customers WHERE id IN ($1, $2, $3, $4) ORDER BY id", true, four[0], four[1], four[2], four[3])))
	six := append(keysOnBoth(3, 6), 100000)
	check("any_array", limit, both(func(ctx context.Context, s *S) error {
		s.rows(ctx, "= ANY", true, "SELECT id, name, score FROM customers WHERE id = ANY($1) ORDER BY id", six)
		s.rows(ctx, "orders = ANY", true, "SELECT id, customer_id, qty FROM orders WHERE customer_id = ANY($1) ORDER BY id", six)
		return nil
	}))
	check("scatter_count", limit, both(func(ctx context.Context, s *S) error {
		s.rows(ctx, "count(*)", true, "SELECT count(*) FROM customers")
		s.rows(ctx, "count with an argument", true, "SELECT count(*) FROM orders WHERE qty >= $1", 3)
		return nil
	}))
	check("scatter_where", limit, both(func(ctx context.Context, s *S) error {
		s.rows(ctx, "balance > $1", false, "SELECT id, name, balance FROM customers WHERE balance > $1", 0)
		s.rows(ctx, "count balance > $1", true, "SELECT count(*) FROM customers WHERE balance > $1", 0)
		return nil
	}))
	check("scatter_order_limit", limit, both(func(ctx context.Context, s *S) error {
		s.rows(ctx, "ORDER BY LIMIT OFFSET", true, "SELECT id, name, score FROM customers WHERE score > $1 ORDER BY score DESC, id LIMIT 7 OFFSET 2", -20)
		s.rows(ctx, "ORDER BY name LIMIT", true, "SELECT name, id FROM customers WHERE id > $1 ORDER BY name DESC LIMIT 5", 10)
		return nil
	}))
	check("group_by_aggregates", limit, both(func(ctx context.Context, s *S) error {
		s.rows(ctx, "GROUP BY city", true, "SELECT city, count(*), sum(score), min(score), max(score) FROM customers WHERE id > $1 GROUP BY city ORDER BY city", 5)
		s.rows(ctx, "whole-table aggregates", true, "SELECT count(*), sum(qty), min(customer_id), max(customer_id) FROM orders WHERE qty > $1", 2)
		return nil
	}))
	check("group_by_avg", limit, both(rowsOf("SELECT city, avg(score), avg(balance), sum(balance) FROM customers WHERE id > $1 GROUP BY city ORDER BY city", true, 5)))
	check("distinct", limit, both(func(ctx context.Context, s *S) error {
		s.rows(ctx, "DISTINCT", true, "SELECT DISTINCT city FROM customers WHERE score > $1 ORDER BY city", 0)
		s.rows(ctx, "DISTINCT 2", false, "SELECT DISTINCT qty, customer_id % 3 AS m FROM orders WHERE qty < $1", 5)
		return nil
	}))
	check("colocated_join", limit, both(func(ctx context.Context, s *S) error {
		s.rows(ctx, "join on the key", true, "SELECT c.id AS cid, c.name, o.id AS oid, o.qty FROM customers c JOIN orders o ON o.customer_id = c.id WHERE o.qty > $1 ORDER BY oid", 4)
		s.rows(ctx, "keyed join", true, "SELECT c.name, o.id, o.qty FROM customers c JOIN orders o ON o.customer_id = c.id WHERE c.id = $1 ORDER BY o.id", k1)
		return nil
	}))
	check("replicated_read", limit, both(func(ctx context.Context, s *S) error {
		s.rows(ctx, "products", true, "SELECT id, name, price FROM products WHERE price > $1 ORDER BY id", 10)
		s.rows(ctx, "product by id", true, "SELECT name FROM products WHERE id = $1", 3)
		return nil
	}))
	check("insert_one", limit, both(func(ctx context.Context, s *S) error {
		keys := keysOnBoth(1000, 2)
		for _, k := range keys {
			s.run(ctx, fmt.Sprintf("insert %d", k), insertCustomer, k, fmt.Sprintf("n%d", k), "Zug", k%50, nil)
		}
		for _, k := range keys {
			s.rows(ctx, fmt.Sprintf("read %d", k), true, selectCustomer, k)
		}
		return nil
	}))
	check("insert_many", limit, both(func(ctx context.Context, s *S) error {
		var args [][]any
		for k := int64(2000); k < 2200; k++ {
			args = append(args, []any{k, fmt.Sprintf("m%d", k), "Chur", k % 100, nil})
		}
		s.batch(ctx, "batch of 200", insertCustomer, args)
		s.rows(ctx, "count", true, "SELECT count(*), sum(score) FROM customers WHERE id BETWEEN $1 AND $2", 2000, 2199)
		s.rows(ctx, "keyed", true, selectCustomer, int64(2001))
		return nil
	}))
	check("keyed_update", limit, both(func(ctx context.Context, s *S) error {
		for _, k := range keysOnBoth(10, 2) {
			s.run(ctx, fmt.Sprintf("update %d", k), "UPDATE customers SET score = score + $1, name = $2 WHERE id = $3", 5, fmt.Sprintf("u%d", k), k)
			s.rows(ctx, fmt.Sprintf("read %d", k), true, selectCustomer, k)
		}
		s.run(ctx, "update absent", "UPDATE customers SET score = 0 WHERE id = $1", 100000)
		return nil
	}))
	check("keyed_delete", limit, both(func(ctx context.Context, s *S) error {
		for _, k := range keysOnBoth(40, 2) {
			s.run(ctx, fmt.Sprintf("delete %d", k), "DELETE FROM customers WHERE id = $1", k)
			s.rows(ctx, fmt.Sprintf("read %d", k), true, selectCustomer, k)
		}
		s.run(ctx, "delete absent", "DELETE FROM customers WHERE id = $1", 100000)
		return nil
	}))
	check("replicated_write", limit, both(func(ctx context.Context, s *S) error {
		s.run(ctx, "insert", "INSERT INTO products (id, name, price) VALUES ($1, $2, $3)", 100, "new", "1.5")
		s.run(ctx, "update", "UPDATE products SET price = price * $1 WHERE id <= $2", 2, 3)
		s.run(ctx, "delete", "DELETE FROM products WHERE id = $1", 4)
		s.rows(ctx, "read", true, "SELECT id, name, price FROM products ORDER BY id")
		return nil
	}))
	// Transactions as pgx runs them: conn.Begin (BEGIN), tx.Commit / tx.Rollback.
	txn := func(s *S, ctx context.Context, commit bool, body func(tx pgx.Tx)) {
		tx, err := s.c.Begin(ctx)
		if err != nil {
			s.fail("begin", err)
			return
		}
		body(tx)
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			s.fail("end", err)
			return
		}
		s.add("end", "ok", "")
	}
	check("tx_one_shard_commit", limit, both(func(ctx context.Context, s *S) error {
		k := keyOn(0, 3000)
		txn(s, ctx, true, func(pgx.Tx) {
			s.run(ctx, "insert", insertCustomer, k, "t1", "Bern", 1, nil)
			s.run(ctx, "update", "UPDATE customers SET score = score + $1 WHERE id = $2", 10, k)
			s.rows(ctx, "read inside", true, selectCustomer, k)
		})
		s.rows(ctx, "after commit", true, selectCustomer, k)
		return nil
	}))
	check("tx_one_shard_rollback", limit, both(func(ctx context.Context, s *S) error {
		k := keyOn(1, 3100)
		txn(s, ctx, false, func(pgx.Tx) {
			s.run(ctx, "insert", insertCustomer, k, "t2", "Bern", 1, nil)
			s.rows(ctx, "read inside", true, selectCustomer, k)
		})
		s.rows(ctx, "after rollback", true, selectCustomer, k)
		return nil
	}))
	check("tx_two_shards_commit", limit, func(ctx context.Context) error {
		err := both(func(ctx context.Context, s *S) error {
			ab := keysOnBoth(3200, 2)
			txn(s, ctx, true, func(pgx.Tx) {
				s.run(ctx, "insert shard 0", insertCustomer, ab[0], "x0", "Zug", 1, nil)
				s.run(ctx, "insert shard 1", insertCustomer, ab[1], "x1", "Zug", 2, nil)
				s.run(ctx, "update shard 0", "UPDATE customers SET score = $1 WHERE id = $2", 7, ab[0])
			})
			for _, k := range ab {
				s.rows(ctx, fmt.Sprintf("read %d", k), true, selectCustomer, k)
			}
			return nil
		})(ctx)
		if err != nil {
			return err
		}
		return noPreparedLeft(ctx)
	})
	check("tx_two_shards_rollback", limit, both(func(ctx context.Context, s *S) error {
		ab := keysOnBoth(3300, 2)
		txn(s, ctx, false, func(pgx.Tx) {
			s.run(ctx, "insert shard 0", insertCustomer, ab[0], "y0", "Zug", 1, nil)
			s.run(ctx, "insert shard 1", insertCustomer, ab[1], "y1", "Zug", 2, nil)
		})
		for _, k := range ab {
			s.rows(ctx, fmt.Sprintf("read %d", k), true, selectCustomer, k)
		}
		return nil
	}))
	check("tx_scatter_read", limit, both(func(ctx context.Context, s *S) error {
		ab := keysOnBoth(3400, 2)
		txn(s, ctx, true, func(pgx.Tx) {
			s.run(ctx, "insert shard 0", insertCustomer, ab[0], "z0", "Zug", 3, nil)
			s.run(ctx, "insert shard 1", insertCustomer, ab[1], "z1", "Zug", 4, nil)
			s.rows(ctx, "scatter inside", true, "SELECT count(*), sum(score) FROM customers WHERE id BETWEEN $1 AND $2", 3400, 3499)
			s.rows(ctx, "scatter rows inside", true, "SELECT id, name FROM customers WHERE id >= $1 ORDER BY id", 3400)
		})
		s.rows(ctx, "after commit", true, "SELECT count(*) FROM customers WHERE id BETWEEN $1 AND $2", 3400, 3499)
		return nil
	}))
	check("unique_violation", limit, both(func(ctx context.Context, s *S) error {
		for _, k := range keysOnBoth(1, 2) {
			s.run(ctx, fmt.Sprintf("duplicate %d", k), insertCustomer, k, "dup", nil, nil, nil)
		}
		s.rows(ctx, "usable after", true, "SELECT 1")
		return nil
	}))
	check("refused_window", limit, func(ctx context.Context) error {
		c, err := connect(ctx, refract)
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		rows, err := c.Query(ctx, "SELECT id, row_number() OVER (ORDER BY id) FROM customers WHERE score > $1", 0)
		if err == nil {
			for rows.Next() {
			}
			rows.Close()
			err = rows.Err()
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "0A000" || !strings.HasPrefix(pe.Message, "refract:") || !strings.Contains(pe.Message, "window functions") {
			return fmt.Errorf("want 0A000 'refract: ...window functions...', got %v", err)
		}
		var n int64
		if err := c.QueryRow(ctx, "SELECT count(*) FROM customers WHERE id = $1", 1).Scan(&n); err != nil || n != 1 {
			return fmt.Errorf("usable after: %d, %v", n, err)
		}
		return nil
	})
	check("placement", limit, placement)
	check("tables_equal", limit, tablesEqual)
	if len(failed) > 0 {
		fmt.Printf("failed: %s\n", strings.Join(failed, ", "))
	}
	fmt.Println("done")
	if len(failed) > 0 {
		os.Exit(1)
	}
}
