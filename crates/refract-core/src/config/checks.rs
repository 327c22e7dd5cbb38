//! Checks across keys that serde cannot express: listeners that clash, backends that repeat
//! an address or are missing, and values too large to be meant (each would otherwise fail
//! late, at bind time or as a panic deep in a runtime). Every error names the key and line.

use super::{find_key_line, line_of, Config};
use std::net::SocketAddr;

/// Most event loops `[listen] workers` accepts: far above any core count refract runs on,
/// far below what makes thread creation fail.
pub const MAX_WORKERS: usize = 1024;

/// Longest time any `*_ms` key accepts (one day): longer is a typo, and deadlines built from
/// it would overflow the clock.
pub const MAX_MS: u64 = 86_400_000;

/// Largest count any size or count limit accepts (2^30).
pub const MAX_COUNT: usize = 1 << 30;

/// A front end's listener, for the clash check: (section, key, address).
pub type Listener = (&'static str, &'static str, SocketAddr);

/// Runs every check in this module; `others` are the front ends' client listeners.
pub(super) fn all(cfg: &Config, text: &str, others: &[Listener]) -> Result<(), String> {
    listeners(cfg, text, others)?;
    backends(cfg, text)?;
    bounds(cfg, text)
}

/// The configured listeners: [`Listener`]s, the front ends' client listeners first.
fn listener_keys(cfg: &Config, others: &[Listener]) -> Vec<Listener> {
    let mut v = others.to_vec();
    v.extend(cfg.listen.admin.map(|a| ("listen", "admin", a)));
    v
}

/// The line of `key` inside `[section]` (0 when absent).
fn key_line(text: &str, section: &str, key: &str) -> usize {
    let mut current = "";
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_start();
        if let Some(header) = line.strip_prefix('[') {
            current = header.trim_start_matches('[').split(']').next().unwrap_or("").trim();
        } else if current == section && line.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with('=')) {
            return i + 1;
        }
    }
    0
}

/// Two listeners on one address (port 0 picks a free port each, so never clashes).
fn listeners(cfg: &Config, text: &str, others: &[Listener]) -> Result<(), String> {
    let keys = listener_keys(cfg, others);
    for (i, &(section, key, addr)) in keys.iter().enumerate() {
        let clash = keys[..i].iter().find(|(_, _, a)| a.port() != 0 && a.port() == addr.port() && overlaps(*a, addr));
        if let Some((s, k, _)) = clash {
            let at = key_line(text, section, key);
            return Err(format!("line {at}: [{section}] {key} {addr} clashes with [{s}] {k} on the same address"));
        }
    }
    Ok(())
}

/// Whether two addresses with one port would compete for it (equal, or one is a wildcard).
fn overlaps(a: SocketAddr, b: SocketAddr) -> bool {
    a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified()
}

/// Backends: no address twice (whether there must be one is the front ends' business).
fn backends(cfg: &Config, text: &str) -> Result<(), String> {
    for (i, b) in cfg.backends.iter().enumerate() {
        let (name, addr) = (&b.get_ref().name, b.get_ref().addr);
        if let Some(o) = cfg.backends[..i].iter().find(|o| o.get_ref().addr == addr) {
            let at = line_of(text, b.span().start);
            return Err(format!(
                "line {at}: backend {name:?} has the address {addr} of backend {:?}",
                o.get_ref().name
            ));
        }
    }
    Ok(())
}

/// Values past any sane bound.
fn bounds(cfg: &Config, text: &str) -> Result<(), String> {
    let l = &cfg.listen;
    if l.workers > MAX_WORKERS {
        let at = find_key_line(text, "workers");
        return Err(format!("line {at}: [listen] workers = {} is more than {MAX_WORKERS}", l.workers));
    }
    if cfg.timeouts.drain_ms == 0 {
        let at = find_key_line(text, "drain_ms");
        return Err(format!("line {at}: [timeouts] drain_ms must be > 0 (a drain needs time to finish responses)"));
    }
    let (t, h, o) = (&cfg.timeouts, &cfg.health, &cfg.overload);
    let times = [
        ("[timeouts] connect_ms", "connect_ms", t.connect_ms),
        ("[timeouts] request_ms", "request_ms", t.request_ms),
        ("[timeouts] client_idle_ms", "client_idle_ms", t.client_idle_ms),
        ("[timeouts] drain_ms", "drain_ms", t.drain_ms),
        ("[timeouts] contended_stall_ms", "contended_stall_ms", t.contended_stall_ms),
        ("[health] interval_ms", "interval_ms", h.interval_ms),
        ("[health] timeout_ms", "timeout_ms", h.timeout_ms),
        ("[overload] queue_target_ms", "queue_target_ms", o.queue_target_ms),
        ("[overload] queue_interval_ms", "queue_interval_ms", o.queue_interval_ms),
        ("[overload] max_queue_wait_ms", "max_queue_wait_ms", o.max_queue_wait_ms),
        ("[overload] default_timeout_ms", "default_timeout_ms", o.default_timeout_ms),
        ("[overload] eject_ms", "eject_ms", o.eject_ms),
        ("[overload] eject_slow_min_ms", "eject_slow_min_ms", o.eject_slow_min_ms),
    ];
    if let Some((key, name, v)) = times.into_iter().find(|(_, _, v)| *v > MAX_MS) {
        return Err(format!("line {}: {key} = {v} is more than a day ({MAX_MS})", find_key_line(text, name)));
    }
    let lim = &cfg.limits;
    let counts = [
        ("[limits] max_head_bytes", "max_head_bytes", lim.max_head_bytes),
        ("[limits] max_buffered_body", "max_buffered_body", lim.max_buffered_body),
        ("[limits] max_idle_per_backend", "max_idle_per_backend", lim.max_idle_per_backend),
        ("[limits] spill_bytes", "spill_bytes", lim.spill_bytes),
        ("[limits] spill_total_bytes", "spill_total_bytes", lim.spill_total_bytes),
        ("[overload] max_concurrency", "max_concurrency", o.max_concurrency),
        ("[overload] initial_concurrency", "initial_concurrency", o.initial_concurrency),
        ("[overload] max_queue", "max_queue", o.max_queue),
    ];
    let per_backend = cfg.backends.iter().filter_map(|b| b.get_ref().max_concurrency).max().unwrap_or(0);
    let counts = counts.into_iter().chain([("[[backend]] max_concurrency", "max_concurrency", per_backend)]);
    if let Some((key, name, v)) = counts.into_iter().find(|(_, _, v)| *v > MAX_COUNT) {
        return Err(format!("line {}: {key} = {v} is more than {MAX_COUNT}", find_key_line(text, name)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::Config;

    const B: &str = "[[backend]]\nname = \"a\"\naddr = \"127.0.0.1:1\"\nrole = \"primary\"\n";

    fn err(text: &str) -> String {
        Config::parse(text).expect_err(text)
    }

    #[test]
    fn absurd_values_refused_with_their_line() {
        let head = "[listen]\nhttp = \"127.0.0.1:8080\"\n";
        let e = err(&format!("{head}workers = 100000\n{B}"));
        assert_eq!(e, "line 3: [listen] workers = 100000 is more than 1024");
        let e = err(&format!("{head}{B}[timeouts]\ndrain_ms = 0\n"));
        assert!(e.starts_with("line 8: [timeouts] drain_ms must be > 0"), "{e}");
        let e = err(&format!("{head}{B}[timeouts]\nrequest_ms = 99999999999\n"));
        assert!(e.starts_with("line 8: [timeouts] request_ms = 99999999999 is more than a day"), "{e}");
        let e = err(&format!("{head}{B}[overload]\nmax_queue = 99999999999\n"));
        assert!(e.starts_with("line 8: [overload] max_queue"), "{e}");
    }
}
