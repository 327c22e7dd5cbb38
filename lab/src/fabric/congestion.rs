//! The lab's TCP congestion control: which algorithm every lab namespace uses, and how it is
//! made possible on a host that does not allow it.
//!
//! A new network namespace inherits the host's default algorithm (`bbr` on many cloud images)
//! and may only switch to one in the host's `net.ipv4.tcp_allowed_congestion_control`, which is
//! global. The lab wants `cubic` (Linux's own default) so that its figures do not depend on the
//! host: with `bbr` the unshaped memory-speed paths of this 2-core machine ran at about half the
//! speed (docs/benchmarks.md, "Congestion control"). So, as root in the host namespace:
//!
//! 1. the algorithm asked for (`--cc` of `lab up`, else `$REFRACT_LAB_CC`, else `cubic`) is
//!    pinned in every namespace when the host allows it;
//! 2. otherwise, when the kernel has it, it is added to the allowed list for the lab's lifetime:
//!    the list as found is saved in the lab's state directory and written back by `lab down`;
//! 3. otherwise the namespaces keep the host's default, and the lab says so.
//!
//! Whatever is in force is read back from a namespace for every report header.

use crate::support::sh::{self, cmd};
use crate::support::state;
use anyhow::{Context, Result};
use std::sync::Mutex;

/// The algorithm the lab asks for unless told otherwise.
pub const PREFERRED: &str = "cubic";
/// Environment variable naming the algorithm for commands that build the lab themselves
/// (`bench …`, `demo`).
pub const ENV: &str = "REFRACT_LAB_CC";
/// The host's allowed list (global, written only from the host namespace).
pub const ALLOWED: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
const AVAILABLE: &str = "/proc/sys/net/ipv4/tcp_available_congestion_control";
const DEFAULT: &str = "/proc/sys/net/ipv4/tcp_congestion_control";
/// State file: the allowed list as the lab found it, present while the lab has extended it.
const SAVED_ALLOWED: &str = "cc-allowed";

/// The algorithm asked for: `explicit`, else `$REFRACT_LAB_CC`, else [`PREFERRED`].
pub fn requested(explicit: Option<&str>) -> String {
    explicit
        .map(str::to_string)
        .or_else(|| std::env::var(ENV).ok().filter(|v| !v.trim().is_empty()))
        .unwrap_or_else(|| PREFERRED.to_string())
}

/// What the host's settings let the lab do about the algorithm it wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The host allows it: pin it in every namespace.
    Pin(String),
    /// The kernel has it but the host does not allow it: add it to the allowed list for the
    /// lab's lifetime, then pin it.
    Allow(String),
    /// Neither: keep the host's default (named), for the reason given.
    HostDefault { name: String, why: String },
}

/// Decide from the host's lists (space-separated, as the sysctls print them). Pure.
pub fn decide(wanted: &str, allowed: &str, available: &str, host_default: &str) -> Decision {
    let has = |list: &str| list.split_whitespace().any(|a| a == wanted);
    if wanted == host_default || has(allowed) {
        Decision::Pin(wanted.to_string())
    } else if has(available) || loadable(wanted) {
        Decision::Allow(wanted.to_string())
    } else {
        Decision::HostDefault {
            name: host_default.to_string(),
            why: format!("the kernel has no `{wanted}` (available: {})", available.trim()),
        }
    }
}

/// Whether the algorithm is a module the kernel could load (`tcp_NAME.ko`).
fn loadable(name: &str) -> bool {
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else { return false };
    let dir = format!("/lib/modules/{}/kernel/net/ipv4", release.trim());
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    let stem = format!("tcp_{name}.ko");
    entries.flatten().any(|e| e.file_name().to_string_lossy().starts_with(&stem))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_default()
}

/// The allowed list with `name` appended.
pub fn extended(allowed: &str, name: &str) -> String {
    let mut v: Vec<&str> = allowed.split_whitespace().collect();
    if !v.contains(&name) {
        v.push(name);
    }
    v.join(" ")
}

/// Make `wanted` usable in the lab's namespaces (extending the host's allowed list if needed)
/// and return the algorithm to pin there. Runs in the host namespace before the lab's sockets
/// open.
pub fn prepare(wanted: &str) -> Result<String> {
    let host_default = read(DEFAULT);
    match decide(wanted, &read(ALLOWED), &read(AVAILABLE), &host_default) {
        Decision::Pin(name) => Ok(name),
        Decision::Allow(name) => match allow(&name) {
            Ok(()) => Ok(name),
            Err(e) => Ok(fall_back(host_default, &format!("{e:#}"))),
        },
        Decision::HostDefault { name, why } => Ok(fall_back(name, &why)),
    }
}

fn fall_back(name: String, why: &str) -> String {
    eprintln!("note: the lab keeps the host's TCP congestion control `{name}`: {why}");
    name
}

/// Add `name` to the host's allowed list, saving the list as found (once: a lab that is
/// repaired keeps the original saved).
fn allow(name: &str) -> Result<()> {
    let found = read(ALLOWED);
    if state::read(SAVED_ALLOWED).is_none() {
        state::write(SAVED_ALLOWED, &found)?;
    }
    let list = extended(&found, name);
    std::fs::write(ALLOWED, &list).with_context(|| format!("allowing `{name}` in {ALLOWED} (`{list}`)"))?;
    eprintln!("allowed TCP congestion control `{name}` on the host for the lab's lifetime (was `{found}`; `lab down` restores it)");
    Ok(())
}

/// Put the host's allowed list back as the lab found it, if the lab changed it (`lab down`).
pub fn restore() -> Result<()> {
    let Some(saved) = state::read(SAVED_ALLOWED) else { return Ok(()) };
    let saved = saved.trim().to_string();
    if !saved.is_empty() {
        std::fs::write(ALLOWED, &saved).with_context(|| format!("restoring {ALLOWED} to `{saved}`"))?;
        eprintln!("restored the host's allowed TCP congestion controls: `{saved}`");
    }
    let _ = std::fs::remove_file(state::path(SAVED_ALLOWED));
    Ok(())
}

/// The algorithm this process last pinned in the lab (the report of a run may be written after
/// the lab it ran in is gone).
static PINNED: Mutex<Option<String>> = Mutex::new(None);

/// Set `name` as the default of namespace `ns` (sockets opened afterwards use it).
pub fn pin(ns: &str, name: &str) -> Result<()> {
    let key = format!("net.ipv4.tcp_congestion_control={name}");
    sh::run(cmd(Some(ns), "sysctl", &["-q", "-w", &key]))
        .with_context(|| format!("setting TCP congestion control {name} in {ns}"))?;
    *PINNED.lock().unwrap_or_else(|e| e.into_inner()) = Some(name.to_string());
    Ok(())
}

/// The algorithm in force in namespace `ns`, if it can be read.
pub fn in_namespace(ns: &str) -> Option<String> {
    let out = sh::run(cmd(Some(ns), "cat", &[DEFAULT])).ok()?;
    Some(out.trim().to_string()).filter(|s| !s.is_empty())
}

/// The host namespace's algorithm (loopback runs) for report headers: "`bbr` (the host's)".
pub fn host() -> String {
    format!("`{}` (the host's)", read(DEFAULT))
}

/// The algorithm of the lab for report headers: read from its client namespace, else the one
/// this process pinned, else the host's (loopback runs).
pub fn describe() -> String {
    let pinned = || PINNED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    match in_namespace("rf-c1").or_else(pinned) {
        Some(name) => format!("`{name}` in every lab namespace"),
        None => format!("`{}` (the host's; no lab namespace)", read(DEFAULT)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_is_pinned() {
        assert_eq!(decide("cubic", "reno cubic", "reno cubic bbr", "bbr"), Decision::Pin("cubic".into()));
    }

    #[test]
    fn host_default_is_always_usable() {
        assert_eq!(decide("bbr", "reno", "reno bbr", "bbr"), Decision::Pin("bbr".into()));
    }

    #[test]
    fn available_but_not_allowed_is_allowed_for_the_lab() {
        assert_eq!(decide("cubic", "reno bbr", "reno bbr cubic", "bbr"), Decision::Allow("cubic".into()));
    }

    #[test]
    fn missing_algorithm_falls_back_to_the_host_default() {
        match decide("no-such-cc", "reno bbr", "reno bbr", "bbr") {
            Decision::HostDefault { name, why } => {
                assert_eq!(name, "bbr");
                assert!(why.contains("no-such-cc"), "{why}");
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn extending_the_list_keeps_it_and_adds_once() {
        assert_eq!(extended("reno bbr", "cubic"), "reno bbr cubic");
        assert_eq!(extended("reno cubic", "cubic"), "reno cubic");
    }

    #[test]
    fn requested_prefers_the_explicit_choice() {
        assert_eq!(requested(Some("reno")), "reno");
    }
}
