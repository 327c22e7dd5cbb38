//! What the lab's PostgreSQL tests share: saying why a test is skipped, finding the refract
//! binary the lab runs as agents and dispatchers, leaving a lab that is up alone, and taking
//! the lab down however a test ends.

#![allow(dead_code)] // Each test file uses its own part of this module.

use refract_lab::fabric;
use refract_lab::lab;
use std::path::PathBuf;

/// Say why the test is skipped, past the harness's output capture (a skip must be seen).
pub fn skip(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "skipped: {why}");
}

/// The refract binary: `$REFRACT_BIN`, or `refract` next to this test's `deps` directory.
pub fn refract_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("REFRACT_BIN") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join("refract");
    bin.exists().then_some(bin)
}

/// Why the test must not build the lab, if it must not: one is up (someone else's).
pub fn lab_in_use() -> Option<String> {
    match fabric::lab_namespaces() {
        Ok(ns) if !ns.is_empty() => Some(format!("a lab is up ({}); not touching it", ns.join(" "))),
        Ok(_) => None,
        Err(e) => Some(format!("`ip netns list` failed: {e:#}")),
    }
}

/// Takes the lab down however the test ends.
pub struct Down;

impl Drop for Down {
    fn drop(&mut self) {
        if let Err(e) = lab::down() {
            eprintln!("cleanup failed: {e:#}");
        }
    }
}

/// Held by every test that builds the lab: they run one at a time in this binary (the lab's
/// namespaces have fixed names), instead of the later ones finding a lab up and skipping.
pub fn lab_lock() -> std::sync::MutexGuard<'static, ()> {
    static LAB: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LAB.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
