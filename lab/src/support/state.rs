//! The state directory (`/tmp/refract-lab`): logs, pid files, generated configs.

use anyhow::{Context, Result};
use std::path::PathBuf;

/// Where logs, pid files and generated configs go: `/tmp/refract-lab` for root (the lab),
/// `/tmp/refract-lab-UID` for anyone else (loopback demo). `REFRACT_LAB_DIR` overrides it.
pub fn dir() -> PathBuf {
    if let Some(d) = std::env::var_os("REFRACT_LAB_DIR") {
        return PathBuf::from(d);
    }
    match crate::support::sh::euid() {
        Some(0) | None => PathBuf::from("/tmp/refract-lab"),
        Some(uid) => PathBuf::from(format!("/tmp/refract-lab-{uid}")),
    }
}

/// Create the state directory.
pub fn ensure() -> Result<PathBuf> {
    let d = dir();
    std::fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
    Ok(d)
}

/// A file in the state directory.
pub fn path(name: &str) -> PathBuf {
    dir().join(name)
}

/// Write a file in the state directory, returning its path.
pub fn write(name: &str, contents: &str) -> Result<PathBuf> {
    let p = ensure()?.join(name);
    std::fs::write(&p, contents).with_context(|| format!("cannot write {}", p.display()))?;
    Ok(p)
}

/// Read a file of the state directory, if it exists.
pub fn read(name: &str) -> Option<String> {
    std::fs::read_to_string(path(name)).ok()
}

/// The last `n` lines of a log in the state directory (for error messages).
pub fn log_tail(name: &str, n: usize) -> String {
    let text = read(name).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
