//! The demo's PostgreSQL section in the lab (root only): in the fabric `make demo` builds, the
//! section brings the PostgreSQL cluster up, two clients fetch a 64 MiB result through the
//! relay and through hybrid, and the printed section gives both rates and the hand-overs the
//! hybrid dispatcher counted; the cluster is gone afterwards.
//!
//! It needs what the PostgreSQL lab needs (the section's own check says what is missing) and a
//! built refract binary (`$REFRACT_BIN`, else `refract` in this test's target directory);
//! without them, or not as root, it says why and passes.

use crate::common;

use common::{lab_in_use, refract_bin, skip, Down};
use refract_lab::demo::{self, pg};
use refract_lab::fabric::{self, congestion};
use refract_lab::lab;
use refract_lab::pglab::{self, layout};
use refract_lab::support::sh;
use refract_lab::support::units::Rate;
use std::time::Instant;

/// Why the test cannot run here, if it cannot.
fn skip_reason() -> Option<String> {
    if !sh::is_root() {
        return Some("not root (network namespaces need CAP_NET_ADMIN)".into());
    }
    if !sh::have("ip") || !sh::have("tc") {
        return Some("iproute2 (ip, tc) is not installed".into());
    }
    if let Some(why) = pg::unavailable() {
        return Some(why);
    }
    if refract_bin().is_none() {
        return Some("no refract binary: build it (cargo build -p refract) or set REFRACT_BIN".into());
    }
    lab_in_use()
}

/// The figure before `unit` in `text` after `after` (`relay (…) 110 MiB/s` → 110).
fn figure(text: &str, after: &str, unit: &str) -> f64 {
    let rest = &text[text.find(after).unwrap_or_else(|| panic!("no {after:?} in {text}")) + after.len()..];
    let value = rest.split(unit).next().and_then(|v| v.split_whitespace().last());
    value.and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no figure before {unit:?} after {after:?}: {text}"))
}

#[test]
fn the_postgres_section_shows_relay_and_hybrid_and_the_hand_overs() {
    let _lab = crate::common::lab_lock();
    if let Some(why) = skip_reason() {
        skip(&why);
        return;
    }
    let bin = refract_bin().expect("refract binary");
    let started = Instant::now();
    let down = Down;
    let gbit = Rate::parse("1gbit").expect("rate");
    lab::up_with(gbit, None, &congestion::requested(None), &bin).expect("the lab's fabric");

    let section = demo::postgres_section(&bin).expect("the PostgreSQL section");
    eprintln!("{section}");
    assert!(section.starts_with("== PostgreSQL: a 64 MiB result"), "{section}");
    let relay = figure(&section, &format!("relay ({})", layout::vip(6433)), "MiB/s");
    let hybrid = figure(&section, &format!("hybrid ({})", layout::vip(6432)), "MiB/s");
    assert!(relay > 0.0 && hybrid > 0.0, "{section}");
    assert!(section.contains("hybrid / relay "), "{section}");
    assert!(figure(&section, "; hand-overs", ",") > 0.0, "the hybrid dispatcher handed results over: {section}");
    assert!(!pglab::any_running() && pglab::lab_pids().is_empty(), "the section stopped its cluster");
    assert!(!layout::pg_dir().exists(), "and deleted its data");

    drop(down);
    assert_eq!(fabric::lab_namespaces().expect("list"), Vec::<String>::new(), "no rf-* namespace left");
    eprintln!("whole test {:?}", started.elapsed());
}
