// pgx v5 through refract (run by crates/refract-dispatch/tests/it/pg_drivers.rs; built by
// tests/drivers/setup-all.sh). Usage: pgx-suite PORT. Prints `ok NAME` or `FAIL NAME: reason`
// per check, then `done`; exits 1 when a check failed. Every check asserts what a direct
// connection to PostgreSQL gives, and runs under a time limit.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	clients = 20
	big     = 200 * 1024 * 1024
	name    = "pgx"
)

var dsn string

func connect(ctx context.Context, mode pgx.QueryExecMode) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.DefaultQueryExecMode = mode
	return pgx.ConnectConfig(ctx, cfg)
}

func conn(ctx context.Context) (*pgx.Conn, error) {
	return connect(ctx, pgx.QueryExecModeCacheStatement)
}

func eq[T comparable](got, want T, what string) error {
	if got != want {
		return fmt.Errorf("%s: got %v, want %v", what, got, want)
	}
	return nil
}

func sqlstate(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// parallel runs fn(i) for 0 <= i < n at once; the first error, naming its client.
func parallel(ctx context.Context, n int, fn func(context.Context, int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = fn(ctx, i)
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("client %d: %w", i, err)
		}
	}
	return nil
}

func scalar[T any](ctx context.Context, c *pgx.Conn, sql string, args ...any) (T, error) {
	var v T
	err := c.QueryRow(ctx, sql, args...).Scan(&v)
	return v, err
}

// prepared: explicit Prepare under a name every client uses with a text of its own, the
// statement cache (named by a hash of the text) and a batch.
func prepared(ctx context.Context, i int) error {
	c, err := conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	for j := 0; j < 3; j++ {
		if _, err := c.Prepare(ctx, fmt.Sprintf("drv_q%d", j), fmt.Sprintf("SELECT $1::int + %d", i*100+j)); err != nil {
			return err
		}
	}
	for r := 0; r < 8; r++ {
		for j := 0; j < 3; j++ {
			v, err := scalar[int32](ctx, c, fmt.Sprintf("drv_q%d", j), r)
			if err != nil {
				return err
			}
			if err := eq(v, int32(r+i*100+j), fmt.Sprintf("prepared %d, round %d", j, r)); err != nil {
				return err
			}
		}
		v, err := scalar[int32](ctx, c, fmt.Sprintf("SELECT $1::int - %d", i*100), r)
		if err != nil {
			return err
		}
		if err := eq(v, int32(r-i*100), fmt.Sprintf("cached, round %d", r)); err != nil {
			return err
		}
		time.Sleep(2 * time.Millisecond)
	}
	// A batch: the statements' messages go out with one Sync.
	for r := 0; r < 3; r++ {
		b := &pgx.Batch{}
		for j := 0; j < 3; j++ {
			b.Queue(fmt.Sprintf("SELECT $1::int * 2 + %d", i*100+j), r)
		}
		br := c.SendBatch(ctx, b)
		for j := 0; j < 3; j++ {
			var v int32
			if err := br.QueryRow().Scan(&v); err != nil {
				br.Close()
				return fmt.Errorf("batch %d, round %d: %w", j, r, err)
			}
			if err := eq(v, int32(r*2+i*100+j), fmt.Sprintf("batch %d, round %d", j, r)); err != nil {
				br.Close()
				return err
			}
		}
		if err := br.Close(); err != nil {
			return err
		}
	}
	return nil
}

// unnamed: QueryExecModeDescribeExec (Parse("")+Describe+Sync, then Bind("")+Execute+Sync),
// QueryExecModeCacheDescribe and QueryExecModeExec (unnamed, one round trip).
func unnamed(ctx context.Context, i int) error {
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeDescribeExec, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeExec} {
		c, err := connect(ctx, mode)
		if err != nil {
			return err
		}
		for r := 0; r < 6; r++ {
			var a, b int32
			if err := c.QueryRow(ctx, fmt.Sprintf("SELECT $1::int + %d, %d", i*100, r), r).Scan(&a, &b); err != nil {
				c.Close(context.Background())
				return fmt.Errorf("%v, round %d: %w", mode, r, err)
			}
			if a != int32(r+i*100) || b != int32(r) {
				c.Close(context.Background())
				return fmt.Errorf("%v, round %d: got (%d, %d), want (%d, %d)", mode, r, a, b, r+i*100, r)
			}
			time.Sleep(2 * time.Millisecond)
		}
		c.Close(context.Background())
	}
	return nil
}

func sqlPrepare(ctx context.Context, i int) error {
	c, err := conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, fmt.Sprintf("PREPARE drv_q (int) AS SELECT $1 + %d", i*100)); err != nil {
		return err
	}
	for r := 0; r < 4; r++ {
		v, err := scalar[int32](ctx, c, fmt.Sprintf("EXECUTE drv_q (%d)", r), pgx.QueryExecModeSimpleProtocol)
		if err != nil {
			return err
		}
		if err := eq(v, int32(r+i*100), fmt.Sprintf("EXECUTE round %d", r)); err != nil {
			return err
		}
		time.Sleep(3 * time.Millisecond)
	}
	if _, err := c.Exec(ctx, "DEALLOCATE drv_q"); err != nil {
		return err
	}
	_, err = c.Exec(ctx, "EXECUTE drv_q (1)")
	return eq(sqlstate(err), "26000", "EXECUTE after DEALLOCATE")
}

func setSimple(ctx context.Context, i int) error {
	c, err := conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	before, err := scalar[string](ctx, c, "SHOW application_name")
	if err != nil {
		return err
	}
	if _, err := c.Exec(ctx, fmt.Sprintf("SET application_name = 'drv-%d'", i)); err != nil { // no arguments: simple Query
		return err
	}
	for r := 0; r < 5; r++ {
		v, err := scalar[string](ctx, c, "SELECT current_setting($1)", "application_name")
		if err != nil {
			return err
		}
		if err := eq(v, fmt.Sprintf("drv-%d", i), fmt.Sprintf("current_setting, round %d", r)); err != nil {
			return err
		}
		time.Sleep(3 * time.Millisecond)
	}
	if _, err := c.Exec(ctx, "RESET application_name"); err != nil {
		return err
	}
	v, err := scalar[string](ctx, c, "SHOW application_name")
	if err != nil {
		return err
	}
	return eq(v, before, "after RESET")
}

func setExtended(ctx context.Context, i int) error {
	c, err := conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	want := fmt.Sprintf("%dkB", 1025+i)
	// Parse("")/Bind/Describe/Execute/Sync.
	if _, err := c.PgConn().ExecParams(ctx, fmt.Sprintf("SET work_mem = '%s'", want), nil, nil, nil, nil).Close(); err != nil {
		return err
	}
	for r := 0; r < 5; r++ {
		v, err := scalar[string](ctx, c, "SELECT current_setting($1)", "work_mem")
		if err != nil {
			return err
		}
		if err := eq(v, want, fmt.Sprintf("current_setting, round %d", r)); err != nil {
			return err
		}
		time.Sleep(3 * time.Millisecond)
	}
	return nil
}

// churnSQL: short statements on the primary (the hint is a comment to PostgreSQL) and on a
// replica, so that a client's statements land on whichever server connection is free.
var churnSQL = []string{"/* refract: route=primary */ SELECT pg_sleep(0.002)", "SELECT pg_sleep(0.002)"}

// churn runs 3 clients running churnSQL until the returned function is called: session state
// a client's statements rely on must stay with that client meanwhile.
func churn(ctx context.Context) func() {
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for k := 0; k < 3; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := conn(cctx)
			if err != nil {
				return
			}
			defer c.Close(context.Background())
			for cctx.Err() == nil {
				for _, sql := range churnSQL {
					_, _ = c.Exec(cctx, sql)
				}
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	return func() {
		cancel()
		wg.Wait()
	}
}

// startupOptions: `options` (-c name=value) and application_name in the startup message,
// each client its own.
func startupOptions(ctx context.Context, i int) error {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.RuntimeParams["options"] = fmt.Sprintf("-c work_mem=%dkB", 2049+i)
	cfg.RuntimeParams["application_name"] = fmt.Sprintf("drv-start-%d", i)
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	for r := 0; r < 5; r++ {
		v, err := scalar[string](ctx, c, "SHOW work_mem")
		if err != nil {
			return err
		}
		if err := eq(v, fmt.Sprintf("%dkB", 2049+i), fmt.Sprintf("work_mem, round %d", r)); err != nil {
			return err
		}
		v, err = scalar[string](ctx, c, "SELECT current_setting($1)", "application_name")
		if err != nil {
			return err
		}
		if err := eq(v, fmt.Sprintf("drv-start-%d", i), "application_name"); err != nil {
			return err
		}
		time.Sleep(3 * time.Millisecond)
	}
	return nil
}

func two(ctx context.Context, fn func(a, b *pgx.Conn) error) error {
	a, err := conn(ctx)
	if err != nil {
		return err
	}
	defer a.Close(context.Background())
	b, err := conn(ctx)
	if err != nil {
		return err
	}
	defer b.Close(context.Background())
	defer churn(ctx)()
	return fn(a, b)
}

func setConfig(ctx context.Context) error {
	return two(ctx, func(a, b *pgx.Conn) error {
		def, err := scalar[string](ctx, b, "SHOW work_mem")
		if err != nil {
			return err
		}
		if _, err := a.Exec(ctx, "SELECT set_config('work_mem', $1, false)", "3333kB"); err != nil {
			return err
		}
		for r := 0; r < 8; r++ {
			v, err := scalar[string](ctx, b, "SHOW work_mem")
			if err != nil {
				return err
			}
			if err := eq(v, def, "another client's work_mem"); err != nil {
				return err
			}
			v, err = scalar[string](ctx, a, "SHOW work_mem")
			if err != nil {
				return err
			}
			if err := eq(v, "3333kB", fmt.Sprintf("work_mem after set_config, round %d", r)); err != nil {
				return err
			}
		}
		return nil
	})
}

func tempTable(ctx context.Context) error {
	return two(ctx, func(a, b *pgx.Conn) error {
		if _, err := a.Exec(ctx, "CREATE TEMP TABLE drv_tmp (k int, v text)"); err != nil {
			return err
		}
		if _, err := a.Exec(ctx, "INSERT INTO drv_tmp VALUES ($1, $2)", 1, name); err != nil {
			return err
		}
		for r := 0; r < 8; r++ {
			if _, err := b.Exec(ctx, "SELECT 1"); err != nil {
				return err
			}
			v, err := scalar[string](ctx, a, "SELECT v FROM drv_tmp WHERE k = $1", 1)
			if err != nil {
				return fmt.Errorf("read back, round %d: %w", r, err)
			}
			if err := eq(v, name, "read back"); err != nil {
				return err
			}
		}
		_, err := b.Exec(ctx, "SELECT * FROM drv_tmp")
		if err := eq(sqlstate(err), "42P01", "another client's SELECT of the temp table"); err != nil {
			return err
		}
		if _, err := b.Exec(ctx, "CREATE TEMP TABLE drv_tmp (k int, v text)"); err != nil {
			return err
		}
		n, err := scalar[int64](ctx, b, "SELECT count(*) FROM drv_tmp")
		if err != nil {
			return err
		}
		if err := eq(n, int64(0), "the other client's own temp table"); err != nil {
			return err
		}
		n, err = scalar[int64](ctx, a, "SELECT count(*) FROM drv_tmp")
		if err != nil {
			return err
		}
		return eq(n, int64(1), "the first client's temp table")
	})
}

func advisoryLock(ctx context.Context) error {
	const key = 4_200_005
	return two(ctx, func(a, b *pgx.Conn) error {
		step := func(c *pgx.Conn, sql string, want bool, what string) error {
			v, err := scalar[bool](ctx, c, sql, key)
			if err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			return eq(v, want, what)
		}
		// try-lock, so that a lock some earlier client left on a pooled connection fails the
		// check instead of blocking it.
		if err := step(a, "SELECT pg_try_advisory_lock($1)", true, "the holder takes the lock"); err != nil {
			return err
		}
		for r := 0; r < 8; r++ {
			if _, err := a.Exec(ctx, "SELECT 1"); err != nil {
				return err
			}
			if err := step(b, "SELECT pg_try_advisory_lock($1)", false, fmt.Sprintf("another client takes the lock, round %d", r)); err != nil {
				return err
			}
		}
		if err := step(a, "SELECT pg_advisory_unlock($1)", true, "the holder unlocks"); err != nil {
			return err
		}
		if _, err := b.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
			return err
		}
		return step(b, "SELECT pg_advisory_unlock($1)", true, "and unlocks it")
	})
}

func listenNotify(ctx context.Context) error {
	chan_ := "drv_" + name
	listener, err := conn(ctx)
	if err != nil {
		return err
	}
	defer listener.Close(context.Background())
	return two(ctx, func(other, sender *pgx.Conn) error {
		if _, err := listener.Exec(ctx, "LISTEN "+chan_); err != nil {
			return err
		}
		if _, err := other.Exec(ctx, "SELECT 1"); err != nil {
			return err
		}
		if _, err := sender.Exec(ctx, "NOTIFY "+chan_+", 'hello'"); err != nil {
			return err
		}
		if _, err := sender.Exec(ctx, "SELECT pg_notify($1, $2)", chan_, "second"); err != nil {
			return err
		}
		var got []string
		for len(got) < 2 {
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			n, err := listener.WaitForNotification(wctx)
			cancel()
			if err != nil {
				return fmt.Errorf("notifications of an idle listener: got %v, then %w", got, err)
			}
			got = append(got, n.Channel+":"+n.Payload)
		}
		if err := eq(strings.Join(got, ","), chan_+":hello,"+chan_+":second", "notifications"); err != nil {
			return err
		}
		// A client that did not LISTEN gets none, even after statements.
		for r := 0; r < 3; r++ {
			if _, err := other.Exec(ctx, "SELECT 1"); err != nil {
				return err
			}
		}
		wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		n, err := other.WaitForNotification(wctx)
		cancel()
		if err == nil {
			return fmt.Errorf("a client that did not LISTEN got %s:%s", n.Channel, n.Payload)
		}
		return nil
	})
}

func copyIn(ctx context.Context) error {
	c, err := conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	table := "drv_copy_" + name
	if _, err := c.Exec(ctx, "DROP TABLE IF EXISTS "+table); err != nil {
		return err
	}
	if _, err := c.Exec(ctx, "CREATE TABLE "+table+" (k int, v text)"); err != nil {
		return err
	}
	rows := make([][]any, 20000)
	for k := range rows {
		rows[k] = []any{int32(k), fmt.Sprintf("row %d", k)}
	}
	n, err := c.CopyFrom(ctx, pgx.Identifier{table}, []string{"k", "v"}, pgx.CopyFromRows(rows))
	if err != nil {
		return err
	}
	if err := eq(n, int64(20000), "rows copied"); err != nil {
		return err
	}
	var count, sum int64
	if err := c.QueryRow(ctx, "SELECT count(*), sum(k) FROM "+table).Scan(&count, &sum); err != nil {
		return err
	}
	return eq(fmt.Sprint(count, sum), "20000 199990000", "rows copied in")
}

func copyOut(ctx context.Context) error {
	c, err := conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	var out bytes.Buffer
	tag, err := c.PgConn().CopyTo(ctx, &out, "COPY (SELECT g, 'row ' || g FROM generate_series(0, 19999) g) TO STDOUT")
	if err != nil {
		return err
	}
	if err := eq(tag.RowsAffected(), int64(20000), "command tag"); err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if err := eq(len(lines), 20000, "rows copied out"); err != nil {
		return err
	}
	return eq(lines[12345], "12345\trow 12345", "row 12345")
}

func cancelSleep(ctx context.Context) error {
	c, err := conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	// A bystander's statement running meanwhile is not cancelled.
	bystander, err := conn(ctx)
	if err != nil {
		return err
	}
	defer bystander.Close(context.Background())
	byDone := make(chan error, 1)
	go func() {
		v, err := scalar[string](ctx, bystander, "SELECT pg_sleep(1.5)::text || 'slept'")
		if err == nil {
			err = eq(v, "slept", "the bystander's statement")
		}
		byDone <- err
	}()
	start := time.Now()
	timer := time.AfterFunc(500*time.Millisecond, func() {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_ = c.PgConn().CancelRequest(cctx)
	})
	defer timer.Stop()
	_, err = c.Exec(ctx, "SELECT pg_sleep(30)")
	if err := eq(sqlstate(err), "57014", fmt.Sprintf("SQLSTATE of the cancelled statement (error %v)", err)); err != nil {
		return err
	}
	if took := time.Since(start); took > 5*time.Second {
		return fmt.Errorf("cancelled after %v", took)
	}
	v, err := scalar[int32](ctx, c, "SELECT 1")
	if err != nil {
		return fmt.Errorf("the connection after the cancel: %w", err)
	}
	if err := eq(v, int32(1), "the connection after the cancel"); err != nil {
		return err
	}
	if err := <-byDone; err != nil {
		return fmt.Errorf("the bystander's statement: %w", err)
	}
	return nil
}

func result200MB(ctx context.Context) error {
	c, err := conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	v, err := scalar[string](ctx, c, fmt.Sprintf("SELECT repeat('x', %d)", big))
	if err != nil {
		return err
	}
	if err := eq(len(v), big, "length"); err != nil {
		return err
	}
	w, err := scalar[int32](ctx, c, "SELECT 2")
	if err != nil {
		return err
	}
	return eq(w, int32(2), "the connection after")
}

func errorCodes(ctx context.Context) error {
	c, err := conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	for _, tc := range []struct {
		sql  string
		args []any
		code string
	}{
		{"SELECT 1/0", nil, "22012"},
		{"SELECT $1::int / 0", []any{1}, "22012"},
		{"SELEC 1", nil, "42601"},
		{"SELECT * FROM drv_no_such_table", nil, "42P01"},
	} {
		_, err := c.Exec(ctx, tc.sql, tc.args...)
		if err := eq(sqlstate(err), tc.code, tc.sql); err != nil {
			return err
		}
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		return err
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	_, err = sp.Exec(ctx, "SELECT 1/0")
	if err := eq(sqlstate(err), "22012", "in a savepoint"); err != nil {
		return err
	}
	if err := sp.Rollback(ctx); err != nil {
		return err
	}
	v, err := scalar[int32](ctx, c, "SELECT 3")
	if err != nil {
		return fmt.Errorf("after a failed savepoint: %w", err)
	}
	if err := eq(v, int32(3), "after a failed savepoint"); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

var failed []string

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

func concurrent(fn func(context.Context, int) error) func(context.Context) error {
	return func(ctx context.Context) error { return parallel(ctx, clients, fn) }
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: pgx-suite PORT")
		os.Exit(2)
	}
	dsn = fmt.Sprintf("host=127.0.0.1 port=%s user=refract password=refract dbname=postgres sslmode=disable connect_timeout=10", os.Args[1])
	limit := 30 * time.Second
	check("connect", limit, func(ctx context.Context) error {
		c, err := conn(ctx)
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		v, err := scalar[int32](ctx, c, "SELECT $1::int * 2", 21)
		if err != nil {
			return err
		}
		return eq(v, int32(42), "a parameter")
	})
	check("prepared_concurrent", limit, concurrent(prepared))
	check("unnamed_statement_concurrent", limit, concurrent(unnamed))
	check("sql_prepare_concurrent", limit, concurrent(sqlPrepare))
	check("set_simple_concurrent", limit, concurrent(setSimple))
	check("set_extended_concurrent", limit, concurrent(setExtended))
	check("startup_options_concurrent", limit, concurrent(startupOptions))
	check("set_config", limit, setConfig)
	check("temp_table", limit, tempTable)
	check("advisory_lock", limit, advisoryLock)
	check("listen_notify", limit, listenNotify)
	check("copy_in", limit, copyIn)
	check("copy_out", limit, copyOut)
	check("cancel", limit, cancelSleep)
	check("result_200mb", limit, result200MB)
	check("errors", limit, errorCodes)
	if len(failed) > 0 {
		fmt.Printf("failed: %s\n", strings.Join(failed, ", "))
	}
	fmt.Println("done")
	if len(failed) > 0 {
		os.Exit(1)
	}
}
