// pgjdbc through refract (run by crates/refract-dispatch/tests/it/pg_drivers.rs; built by
// tests/drivers/setup-all.sh). Usage: java -jar target/pgjdbc-suite.jar PORT. Prints `ok NAME`
// or `FAIL NAME: reason` per check, then `done`; exits 1 when a check failed. Every check
// asserts what a direct connection to PostgreSQL gives, and runs under a time limit.
//
// pgjdbc sends every statement, SET included, through the extended protocol (unless
// preferQueryMode=simple); a PreparedStatement runs as the unnamed statement until
// prepareThreshold executions, then as a named server statement S_1, S_2, ... per connection.
package refract;

import java.io.ByteArrayOutputStream;
import java.io.StringReader;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.Properties;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.postgresql.PGConnection;
import org.postgresql.PGNotification;
import org.postgresql.copy.CopyManager;

public final class Suite {
    static final int CLIENTS = 20;
    static final int BIG = 200 * 1024 * 1024;
    static final String NAME = "pgjdbc";
    static String url;

    interface Body {
        void run() throws Exception;
    }

    interface ClientBody {
        void run(int i) throws Exception;
    }

    static Connection connect(String... extra) throws SQLException {
        Properties p = new Properties();
        p.setProperty("user", "refract");
        p.setProperty("password", "refract");
        p.setProperty("connectTimeout", "10");
        p.setProperty("socketTimeout", "60");
        for (int k = 0; k + 1 < extra.length; k += 2) {
            p.setProperty(extra[k], extra[k + 1]);
        }
        return DriverManager.getConnection(url, p);
    }

    static void eq(Object got, Object want, String what) {
        if (!Objects.equals(got, want)) {
            throw new AssertionError(what + ": got " + got + ", want " + want);
        }
    }

    static Object one(Connection c, String sql, Object... args) throws SQLException {
        try (PreparedStatement ps = c.prepareStatement(sql)) {
            for (int k = 0; k < args.length; k++) {
                ps.setObject(k + 1, args[k]);
            }
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                return rs.getObject(1);
            }
        }
    }

    static void exec(Connection c, String sql) throws SQLException {
        try (Statement s = c.createStatement()) {
            s.execute(sql);
        }
    }

    static String sqlstate(Body body) throws Exception {
        try {
            body.run();
            return null;
        } catch (SQLException e) {
            return e.getSQLState();
        }
    }

    static void parallel(ClientBody body) throws Exception {
        ExecutorService pool = Executors.newFixedThreadPool(CLIENTS);
        try {
            List<Future<?>> fs = new ArrayList<>();
            for (int i = 0; i < CLIENTS; i++) {
                final int n = i;
                fs.add(pool.submit(() -> {
                    body.run(n);
                    return null;
                }));
            }
            for (int i = 0; i < CLIENTS; i++) {
                try {
                    fs.get(i).get(25, TimeUnit.SECONDS);
                } catch (java.util.concurrent.ExecutionException e) {
                    throw new AssertionError("client " + i + ": " + e.getCause(), e.getCause());
                }
            }
        } finally {
            pool.shutdownNow();
        }
    }

    // Named server statements: prepareThreshold=1 names each statement S_n from its first
    // execution, numbered per connection, so every client's S_1 has a text of its own.
    static void preparedConcurrent() throws Exception {
        parallel(i -> {
            try (Connection c = connect("prepareThreshold", "1")) {
                List<PreparedStatement> ps = new ArrayList<>();
                for (int j = 0; j < 3; j++) {
                    ps.add(c.prepareStatement("SELECT ?::int + " + (i * 100 + j)));
                }
                for (int r = 0; r < 8; r++) {
                    for (int j = 0; j < 3; j++) {
                        ps.get(j).setInt(1, r);
                        try (ResultSet rs = ps.get(j).executeQuery()) {
                            rs.next();
                            eq(rs.getInt(1), r + i * 100 + j, "statement " + j + ", round " + r);
                        }
                    }
                    Thread.sleep(2);
                }
                for (PreparedStatement p : ps) {
                    p.close();
                }
            }
        });
    }

    // The unnamed statement: getMetaData() is Parse("")+Describe+Sync; the execution later is
    // Bind("")+Execute+Sync (prepareThreshold=0: never a named statement).
    static void unnamedConcurrent() throws Exception {
        parallel(i -> {
            try (Connection c = connect("prepareThreshold", "0")) {
                for (int r = 0; r < 6; r++) {
                    try (PreparedStatement ps = c.prepareStatement("SELECT ?::int + " + i * 100 + ", " + r)) {
                        eq(ps.getMetaData().getColumnCount(), 2, "described columns");
                        Thread.sleep(5);
                        ps.setInt(1, r);
                        try (ResultSet rs = ps.executeQuery()) {
                            rs.next();
                            eq(rs.getInt(1) + "," + rs.getInt(2), (r + i * 100) + "," + r, "round " + r);
                        }
                    }
                }
            }
        });
    }

    static void sqlPrepareConcurrent() throws Exception {
        parallel(i -> {
            try (Connection c = connect()) {
                exec(c, "PREPARE drv_q (int) AS SELECT $1 + " + i * 100);
                for (int r = 0; r < 4; r++) {
                    eq(one(c, "EXECUTE drv_q (" + r + ")"), r + i * 100, "EXECUTE round " + r);
                    Thread.sleep(3);
                }
                exec(c, "DEALLOCATE drv_q");
                eq(sqlstate(() -> one(c, "EXECUTE drv_q (1)")), "26000", "EXECUTE after DEALLOCATE");
            }
        });
    }

    static void setConcurrent(String mode) throws Exception {
        parallel(i -> {
            try (Connection c = connect("preferQueryMode", mode)) {
                String before = (String) one(c, "SHOW application_name");
                exec(c, "SET application_name = 'drv-" + i + "'");
                for (int r = 0; r < 5; r++) {
                    eq(one(c, "SHOW application_name"), "drv-" + i, "SHOW, round " + r);
                    eq(one(c, "SELECT current_setting(?)", "application_name"), "drv-" + i, "current_setting");
                    Thread.sleep(3);
                }
                exec(c, "RESET application_name");
                eq(one(c, "SHOW application_name"), before, "after RESET");
            }
        });
    }

    // Short statements on the primary (the hint is a comment to PostgreSQL) and on a replica, so
    // that a client's statements land on whichever server connection is free.
    static final String[] CHURN = {"/* refract: route=primary */ SELECT pg_sleep(0.002)", "SELECT pg_sleep(0.002)"};

    /** 3 clients running CHURN until closed: session state must stay with its client meanwhile. */
    static final class Churn implements AutoCloseable {
        final java.util.concurrent.atomic.AtomicBoolean stop = new java.util.concurrent.atomic.AtomicBoolean();
        final List<Thread> threads = new ArrayList<>();

        Churn() throws InterruptedException {
            for (int k = 0; k < 3; k++) {
                Thread t = new Thread(() -> {
                    try (Connection c = connect()) {
                        while (!stop.get()) {
                            for (String sql : CHURN) {
                                exec(c, sql);
                            }
                        }
                    } catch (SQLException e) {
                        // a churn client that fails only churns less
                    }
                });
                t.setDaemon(true);
                t.start();
                threads.add(t);
            }
            Thread.sleep(50);
        }

        @Override
        public void close() throws InterruptedException {
            stop.set(true);
            for (Thread t : threads) {
                t.join(5000);
            }
        }
    }

    // Startup parameters: `options` (-c name=value) and ApplicationName, each client its own.
    static void startupOptionsConcurrent() throws Exception {
        parallel(i -> {
            try (Connection c = connect("options", "-c work_mem=" + (2049 + i) + "kB", "ApplicationName", "drv-start-" + i)) {
                for (int r = 0; r < 5; r++) {
                    eq(one(c, "SHOW work_mem"), (2049 + i) + "kB", "work_mem, round " + r);
                    eq(one(c, "SELECT current_setting(?)", "application_name"), "drv-start-" + i, "application_name");
                    Thread.sleep(3);
                }
            }
        });
    }

    static void setConfig() throws Exception {
        try (Connection a = connect(); Connection b = connect(); Churn churn = new Churn()) {
            Object def = one(b, "SHOW work_mem");
            eq(one(a, "SELECT set_config('work_mem', ?, false)", "3333kB"), "3333kB", "set_config");
            for (int r = 0; r < 8; r++) {
                eq(one(b, "SHOW work_mem"), def, "another client's work_mem");
                eq(one(a, "SHOW work_mem"), "3333kB", "work_mem after set_config, round " + r);
            }
        }
    }

    static void tempTable() throws Exception {
        try (Connection a = connect(); Connection b = connect(); Churn churn = new Churn()) {
            exec(a, "CREATE TEMP TABLE drv_tmp (k int, v text)");
            try (PreparedStatement ps = a.prepareStatement("INSERT INTO drv_tmp VALUES (?, ?)")) {
                ps.setInt(1, 1);
                ps.setString(2, NAME);
                ps.executeUpdate();
            }
            for (int r = 0; r < 8; r++) {
                one(b, "SELECT 1");
                eq(one(a, "SELECT v FROM drv_tmp WHERE k = ?", 1), NAME, "read back, round " + r);
            }
            eq(sqlstate(() -> one(b, "SELECT * FROM drv_tmp")), "42P01", "another client's SELECT of the temp table");
            exec(b, "CREATE TEMP TABLE drv_tmp (k int, v text)");
            eq(one(b, "SELECT count(*)::int FROM drv_tmp"), 0, "the other client's own temp table");
            eq(one(a, "SELECT count(*)::int FROM drv_tmp"), 1, "the first client's temp table");
        }
    }

    static void advisoryLock() throws Exception {
        long key = 4_200_007L;
        try (Connection a = connect(); Connection b = connect(); Churn churn = new Churn()) {
            // try-lock, so that a lock some earlier client left on a pooled connection fails the
            // check instead of blocking it.
            eq(one(a, "SELECT pg_try_advisory_lock(?)", key), true, "the holder takes the lock");
            for (int r = 0; r < 8; r++) {
                one(a, "SELECT 1");
                eq(one(b, "SELECT pg_try_advisory_lock(?)", key), false, "another client takes the lock, round " + r);
            }
            eq(one(a, "SELECT pg_advisory_unlock(?)", key), true, "the holder unlocks");
            one(b, "SELECT pg_advisory_lock(?)", key);
            eq(one(b, "SELECT pg_advisory_unlock(?)", key), true, "and unlocks it");
        }
    }

    static List<String> notifications(Connection c, int want, int timeoutMs) throws SQLException {
        List<String> got = new ArrayList<>();
        long deadline = System.currentTimeMillis() + timeoutMs;
        while (got.size() < want) {
            long left = deadline - System.currentTimeMillis();
            if (left <= 0) {
                break;
            }
            PGNotification[] ns = c.unwrap(PGConnection.class).getNotifications((int) left);
            if (ns != null) {
                for (PGNotification n : ns) {
                    got.add(n.getName() + ":" + n.getParameter());
                }
            }
        }
        return got;
    }

    static void listenNotify() throws Exception {
        String chan = "drv_" + NAME;
        try (Connection listener = connect(); Connection other = connect(); Connection sender = connect();
                Churn churn = new Churn()) {
            exec(listener, "LISTEN " + chan);
            one(other, "SELECT 1");
            exec(sender, "NOTIFY " + chan + ", 'hello'");
            one(sender, "SELECT pg_notify(?, ?)", chan, "second");
            eq(notifications(listener, 2, 5000), List.of(chan + ":hello", chan + ":second"), "notifications of an idle listener");
            for (int r = 0; r < 3; r++) {
                one(other, "SELECT 1");
            }
            eq(notifications(other, 1, 300), List.of(), "notifications seen by a client that did not LISTEN");
            exec(listener, "UNLISTEN " + chan);
            exec(sender, "NOTIFY " + chan + ", 'after unlisten'");
            eq(notifications(listener, 1, 1000), List.of(), "notifications after UNLISTEN");
        }
    }

    static void copyIn() throws Exception {
        String table = "drv_copy_" + NAME;
        try (Connection c = connect()) {
            exec(c, "DROP TABLE IF EXISTS " + table);
            exec(c, "CREATE TABLE " + table + " (k int, v text)");
            StringBuilder data = new StringBuilder();
            for (int k = 0; k < 20000; k++) {
                data.append(k).append("\trow ").append(k).append('\n');
            }
            long n = new CopyManager(c.unwrap(org.postgresql.core.BaseConnection.class))
                    .copyIn("COPY " + table + " (k, v) FROM STDIN", new StringReader(data.toString()));
            eq(n, 20000L, "rows copied");
            eq(one(c, "SELECT count(*)::text || ' ' || sum(k)::text FROM " + table), "20000 199990000", "rows copied in");
        }
    }

    static void copyOut() throws Exception {
        try (Connection c = connect()) {
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            long n = new CopyManager(c.unwrap(org.postgresql.core.BaseConnection.class))
                    .copyOut("COPY (SELECT g, 'row ' || g FROM generate_series(0, 19999) g) TO STDOUT", out);
            eq(n, 20000L, "rows copied out");
            String[] lines = out.toString(StandardCharsets.UTF_8).split("\n");
            eq(lines.length, 20000, "lines");
            eq(lines[12345], "12345\trow 12345", "row 12345");
        }
    }

    static void cancel() throws Exception {
        try (Connection c = connect(); Statement s = c.createStatement()) {
            long start = System.nanoTime();
            CompletableFuture.delayedExecutor(500, TimeUnit.MILLISECONDS).execute(() -> {
                try {
                    s.cancel();
                } catch (SQLException e) {
                    // the check below fails then
                }
            });
            eq(sqlstate(() -> s.execute("SELECT pg_sleep(30)")), "57014", "SQLSTATE of the cancelled statement");
            double took = (System.nanoTime() - start) / 1e9;
            if (took > 5) {
                throw new AssertionError("cancelled after " + took + " s");
            }
            eq(one(c, "SELECT 1"), 1, "the connection after the cancel");
        }
    }

    static void result200MB() throws Exception {
        try (Connection c = connect()) {
            String v = (String) one(c, "SELECT repeat('x', " + BIG + ")");
            eq(v.length(), BIG, "length");
            eq(one(c, "SELECT 2"), 2, "the connection after");
        }
    }

    static void errors() throws Exception {
        try (Connection c = connect()) {
            eq(sqlstate(() -> one(c, "SELECT 1/0")), "22012", "SELECT 1/0");
            eq(sqlstate(() -> one(c, "SELECT ?::int / 0", 1)), "22012", "SELECT $1 / 0");
            eq(sqlstate(() -> one(c, "SELEC 1")), "42601", "SELEC 1");
            eq(sqlstate(() -> one(c, "SELECT * FROM drv_no_such_table")), "42P01", "no such table");
            c.setAutoCommit(false);
            java.sql.Savepoint sp = c.setSavepoint();
            eq(sqlstate(() -> one(c, "SELECT 1/0")), "22012", "in a savepoint");
            c.rollback(sp);
            eq(one(c, "SELECT 3"), 3, "after a failed savepoint");
            c.commit();
        }
    }

    static final List<String> FAILED = new ArrayList<>();

    static void check(String name, Body body) {
        long start = System.nanoTime();
        ExecutorService ex = Executors.newSingleThreadExecutor(r -> {
            Thread t = new Thread(r, name);
            t.setDaemon(true);
            return t;
        });
        Future<?> f = ex.submit(() -> {
            body.run();
            return null;
        });
        try {
            f.get(30, TimeUnit.SECONDS);
            System.out.printf("ok %s (%.1f s)%n", name, (System.nanoTime() - start) / 1e9);
        } catch (TimeoutException e) {
            FAILED.add(name);
            System.out.println("FAIL " + name + ": timed out after 30 s");
        } catch (Exception e) {
            Throwable cause = e.getCause() != null ? e.getCause() : e;
            FAILED.add(name);
            System.out.println("FAIL " + name + ": " + String.valueOf(cause).replace("\n", " | "));
        } finally {
            ex.shutdownNow();
        }
        System.out.flush();
    }

    public static void main(String[] args) {
        if (args.length != 1) {
            System.err.println("usage: java -jar pgjdbc-suite.jar PORT");
            System.exit(2);
        }
        url = "jdbc:postgresql://127.0.0.1:" + args[0] + "/postgres?sslmode=disable";
        check("connect", () -> {
            try (Connection c = connect()) {
                eq(one(c, "SELECT ?::int * 2", 21), 42, "a parameter");
            }
        });
        check("prepared_concurrent", Suite::preparedConcurrent);
        check("unnamed_statement_concurrent", Suite::unnamedConcurrent);
        check("sql_prepare_concurrent", Suite::sqlPrepareConcurrent);
        check("set_simple_concurrent", () -> setConcurrent("simple"));
        check("set_extended_concurrent", () -> setConcurrent("extended"));
        check("startup_options_concurrent", Suite::startupOptionsConcurrent);
        check("set_config", Suite::setConfig);
        check("temp_table", Suite::tempTable);
        check("advisory_lock", Suite::advisoryLock);
        check("listen_notify", Suite::listenNotify);
        check("copy_in", Suite::copyIn);
        check("copy_out", Suite::copyOut);
        check("cancel", Suite::cancel);
        check("result_200mb", Suite::result200MB);
        check("errors", Suite::errors);
        if (!FAILED.isEmpty()) {
            System.out.println("failed: " + String.join(", ", FAILED));
        }
        System.out.println("done");
        System.out.flush();
        System.exit(FAILED.isEmpty() ? 0 : 1);
    }
}
