//! `refract bench pgbench --quick` end to end: a real primary and replica, refract, PgBouncer and
//! pgpool-II, pgbench through each; the report section must have a figure for every target in
//! simple mode and show refract (with `read_your_writes = false`) running reads on the replica.
//!
//! It needs PostgreSQL's server and client programs, pgbouncer, pgpool-II and a built refract
//! binary (`$REFRACT_BIN`, else `refract` in this test's target directory, which
//! `cargo test --workspace` builds); without them it says why and passes.

mod common;

use common::{refract_bin, skip};
use refract_lab::bench::pgbench::report::{replica_share, MARKER, SECTION};
use refract_lab::bench::pgbench::targets::{PGBOUNCER, PGPOOL, REFRACT_NO_RYW, TARGETS};
use refract_lab::bench::pgbench::{self, PgbenchOptions};
use refract_lab::support::sh;

fn skip_reason() -> Option<String> {
    for tool in ["initdb", "pgbench", "psql"] {
        match refract_pg::testkit::tool(tool) {
            Ok(p) if p.exists() => {}
            _ => return Some(format!("PostgreSQL's {tool} is not installed")),
        }
    }
    for tool in [PGBOUNCER, PGPOOL, "runuser"] {
        if !sh::have(tool) {
            return Some(format!("{tool} is not installed"));
        }
    }
    if refract_bin().is_none() {
        return Some("no refract binary: build it (cargo build -p refract) or set REFRACT_BIN".into());
    }
    None
}

#[test]
fn quick_run_writes_a_complete_section() {
    if let Some(why) = skip_reason() {
        skip(&why);
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("benchmarks.md");
    std::fs::write(&out, "# Benchmarks\n\nkept as is\n").expect("page");
    let bin = refract_bin().expect("refract binary");
    let started = std::time::Instant::now();
    let results = pgbench::run(&PgbenchOptions::quick(out.clone(), bin)).expect("bench pgbench --quick");
    eprintln!("bench pgbench --quick took {:?}", started.elapsed());

    let page = std::fs::read_to_string(&out).expect("page written");
    assert!(page.starts_with("# Benchmarks\n\nkept as is\n"), "the rest of the page is kept");
    let (start, end) = (format!("<!-- {MARKER}:{SECTION} -->"), format!("<!-- /{MARKER}:{SECTION} -->"));
    let section = &page[page.find(&start).expect("start marker")..page.find(&end).expect("end marker")];
    assert!(section.contains("Table P1") && section.contains("Table P2"), "{section}");

    for t in TARGETS {
        let row = section.lines().find(|l| l.starts_with(&format!("| {t} |"))).unwrap_or_else(|| panic!("{section}"));
        let simple = row.split('|').nth(2).expect("simple column");
        assert!(simple.contains("**") && simple.chars().any(|c| c.is_ascii_digit()), "{t} simple: {row}");
        let ok = results.runs.iter().any(|r| r.target == t && r.mode == "simple" && r.outcome.is_ok());
        assert!(ok, "{t} ran in simple mode: {:?}", results.runs);
    }
    let refract = results.mix.iter().find(|m| m.target == REFRACT_NO_RYW).expect("refract mix row");
    assert!(replica_share(refract) > 0.0, "refract ran reads on the replica: {refract:?}");
    let bouncer = results.mix.iter().find(|m| m.target == "pgbouncer").expect("pgbouncer mix row");
    assert_eq!(bouncer.replica.account_scans, 0, "PgBouncer never reaches the replica: {bouncer:?}");

    let csv = std::fs::read_to_string(dir.path().join("pgbench.csv")).expect("csv");
    assert!(csv.lines().count() > TARGETS.len() * 2, "{csv}");
}
