// One large result fetched by pgjdbc, digested client-side (run by
// crates/refract-dispatch/tests/it/pg_drivers.rs; built into the suite's jar by
// tests/drivers/setup-all.sh). Usage: java -cp target/pgjdbc-suite.jar refract.LargeResult PORT MIB.
// Prints `rows N md5 HEX`, the MD5 of every row as the text `n|md5|xxx...` plus a newline (what
// `psql -XAt -F '|'` prints), so it must equal psql's and the other drivers', through refract
// or directly. The whole result is fetched in one go (pgjdbc's default fetch size, 0).
package refract;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.Statement;
import java.util.Properties;

public final class LargeResult {
    static final int WIDTH = 1000;

    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        long mib = Long.parseLong(args[1]);
        long rows = Math.max(1, mib * 1024 * 1024 / (WIDTH + 45));
        String sql = "select n, md5(n::text), repeat('x', " + WIDTH + ") from generate_series(1, " + rows + ") n";
        Properties p = new Properties();
        p.setProperty("user", System.getenv().getOrDefault("REFRACT_PG_USER", "refract"));
        p.setProperty("password", System.getenv().getOrDefault("REFRACT_PG_PASSWORD", "refract"));
        p.setProperty("connectTimeout", "10");
        String db = System.getenv().getOrDefault("REFRACT_PG_DATABASE", "postgres");
        MessageDigest md5 = MessageDigest.getInstance("MD5");
        long count = 0;
        try (Connection c = DriverManager.getConnection("jdbc:postgresql://127.0.0.1:" + port + "/" + db, p);
                Statement st = c.createStatement();
                ResultSet rs = st.executeQuery(sql)) {
            while (rs.next()) {
                String row = rs.getString(1) + "|" + rs.getString(2) + "|" + rs.getString(3) + "\n";
                md5.update(row.getBytes(StandardCharsets.UTF_8));
                count++;
            }
        }
        StringBuilder hex = new StringBuilder();
        for (byte b : md5.digest()) {
            hex.append(String.format("%02x", b));
        }
        System.out.println("rows " + count + " md5 " + hex);
    }
}
