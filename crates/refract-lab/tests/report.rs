//! Report outputs: section replacement on the markdown page, the tables, the CSV merge, the plot.

use refract_lab::bench::sweep::report::{self, Section};
use refract_lab::bench::sweep::run::{LatencyRow, Measurement, Results};
use refract_lab::bench::sweep::wrk::WrkReport;
use refract_lab::bench::sweep::{csv, plot};
use refract_lab::report::environment::Environment;
use refract_lab::report::PAGE_HEADER;
use refract_lab::support::units::ByteSize;

fn wrk(rps: f64, requests: u64, lat_us: f64) -> WrkReport {
    WrkReport {
        requests_per_sec: rps,
        requests,
        seconds: 5.0,
        bytes_read: 0.0,
        latency_avg_us: lat_us,
        latency_p50_us: Some(lat_us),
        latency_p99_us: Some(lat_us * 2.0),
        non_2xx: 0,
        socket_errors: 0,
    }
}

fn results() -> Results {
    let mut r = Results::default();
    for (size, rps) in [(ByteSize(1), 10_000.0), (ByteSize(1 << 20), 100.0)] {
        for (target, f) in [("direct", 1.0), ("refract", 0.5), ("haproxy", 0.45)] {
            let reports = vec![wrk(rps * f / 2.0, 1000, 100.0); 2];
            r.throughput.push(Measurement { target: target.into(), size, reports });
        }
    }
    let mut bad = wrk(10.0, 50, 100.0);
    bad.non_2xx = 3;
    r.throughput[2].reports[1] = bad;
    for (target, lat) in [("direct", 50.0), ("refract", 80.0), ("haproxy", 100.0)] {
        r.latency.push(LatencyRow { target: target.into(), report: wrk(1e6 / lat, 1000, lat) });
    }
    r
}

const CFGS: &[(String, String)] = &[];

fn section<'a>(
    env: &'a Environment,
    results: &'a Results,
    sizes: &'a [ByteSize],
    targets: &'a [String],
) -> Section<'a> {
    Section {
        name: "1gbit",
        shaping: "tbf rate 1gbit",
        duration_s: 5.0,
        repeat: 1,
        command: "sudo refract bench sweep --rate 1gbit",
        env,
        sizes,
        targets,
        results,
        plot: Some("benchmarks.png"),
        haproxy_cfg: Some("global\n    nbthread 2\n"),
        refract_cfgs: CFGS,
        targets_note: "Targets: `direct` = c1 → b1 and c2 → b2.",
    }
}

#[test]
fn section_is_added_then_replaced_alone() {
    let page = report::replace_section("", "1gbit", "first");
    assert!(page.starts_with(PAGE_HEADER.trim_end()));
    assert!(page.contains("<!-- sweep:1gbit -->\nfirst\n<!-- /sweep:1gbit -->"));
    let page = report::replace_section(&page, "none", "unshaped");
    let page = report::replace_section(&page, "1gbit", "second");
    assert!(!page.contains("first"));
    assert!(page.contains("<!-- sweep:1gbit -->\nsecond\n<!-- /sweep:1gbit -->"));
    assert!(page.contains("<!-- sweep:none -->\nunshaped\n<!-- /sweep:none -->"));
    assert!(page.find("<!-- sweep:1gbit") < page.find("<!-- sweep:none"), "order kept");
    assert_eq!(page.matches("# Benchmarks").count(), 1);
    let hand_written = "# Benchmarks\n\nIntro kept.\n";
    let page = report::replace_section(hand_written, "none", "x");
    assert!(page.starts_with("# Benchmarks\n\nIntro kept.\n\n<!-- sweep:none -->"));
}

#[test]
fn tables_have_the_paper_shape() {
    let (env, r) = (Environment::default(), results());
    let sizes = [ByteSize(1), ByteSize(1 << 20)];
    let targets: Vec<String> = ["direct", "refract", "haproxy"].iter().map(|s| s.to_string()).collect();
    let md = report::render(&section(&env, &r, &sizes, &targets));
    assert!(md.contains("| payload | direct | refract | haproxy | refract/direct | refract/haproxy |"), "{md}");
    assert!(md.contains("| 1 MiB | 839 Mbit/s (100 req/s) | 419 Mbit/s (50.0 req/s) |"), "{md}");
    assert!(md.contains("| 0.500× | 1.11× |"), "{md}");
    assert!(md.contains("⚠ haproxy at 1 B had errors: 3 non-2xx/3xx responses"), "{md}");
    assert!(md.contains("| refract | 80.0 µs | 80.0 µs | 160 µs | 12.5k | 1.60× |"), "{md}");
    assert!(md.contains("<details><summary>HAProxy configuration (generated)</summary>"));
    assert!(md.contains("![Throughput vs payload size, log-log](benchmarks.png)"));
    assert!(md.contains("`sudo refract bench sweep --rate 1gbit`"));
}

#[test]
fn csv_keeps_other_sections() {
    let r = results();
    let rows = csv::rows("1gbit", &r);
    assert_eq!(rows.len(), 6 * 2 + 3);
    let first = csv::merge("", "none", &["none,throughput,direct,1,1,1,5.00,1.00,1,0,1.0,,,0,0".to_string()]);
    let both = csv::merge(&first, "1gbit", &rows);
    let again = csv::merge(&both, "1gbit", &rows);
    assert_eq!(both, again, "rewriting a section is idempotent");
    assert!(again.starts_with(csv::HEADER));
    assert_eq!(again.lines().filter(|l| l.starts_with("none,")).count(), 1);
    let cols = csv::HEADER.split(',').count();
    assert!(again.lines().all(|l| l.split(',').count() == cols), "{again}");
}

#[test]
fn plot_is_a_png() {
    if !std::path::Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").exists() {
        use std::io::Write;
        // Straight to stderr: the test harness captures eprintln!, and a skip must be seen.
        let _ = writeln!(std::io::stderr(), "skipped: fonts-dejavu-core is not installed");
        return;
    }
    let r = results();
    let path = std::env::temp_dir().join(format!("rf-plot-test-{}.png", std::process::id()));
    let targets: Vec<String> = ["direct", "refract", "haproxy"].iter().map(|s| s.to_string()).collect();
    plot::draw(&path, "test", &r, &targets, &[ByteSize(1), ByteSize(1 << 20)]).expect("draw");
    let bytes = std::fs::read(&path).expect("read");
    // RF_KEEP_PLOT=1 keeps the file, to look at it.
    if std::env::var_os("RF_KEEP_PLOT").is_none() {
        let _ = std::fs::remove_file(&path);
    } else {
        eprintln!("plot kept at {}", path.display());
    }
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
}
