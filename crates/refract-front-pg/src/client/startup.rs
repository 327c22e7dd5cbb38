//! What a client's startup settings become: the SETs refract replays on every server
//! connection it uses ([`startup_sets`]), and the greeting learnt for each set of them
//! ([`Greetings`], asked by `greeting`). A leaf: data and pure functions only.

use crate::admit::lru::Lru;
use refract_pg::{text, Startup};
use std::hash::BuildHasher;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Startup parameters that become session SETs (replayed on every server connection used).
pub(crate) const TRACKED_PARAMS: &[&str] =
    &["application_name", "client_encoding", "datestyle", "timezone", "intervalstyle", "extra_float_digits"];

/// Why a login is refused: SQLSTATE and message (sent as a FATAL).
pub(crate) type Refusal = (&'static str, String);

/// Sets of startup settings whose greeting is kept.
const CAPACITY: usize = 256;

/// How long a kept greeting is reused before the server is asked again (a reload or a restart
/// may have changed its defaults or its version).
const MAX_AGE: Duration = Duration::from_secs(60);

/// ParameterStatus values as (name, value).
pub(crate) type Params = Vec<(String, String)>;

/// The greetings learnt from the primary, per set of startup settings.
#[derive(Debug)]
pub(crate) struct Greetings {
    kept: Mutex<Lru<Kept>>,
    /// Keys the table by a hash that clients cannot aim collisions at.
    hasher: std::collections::hash_map::RandomState,
}

/// One set of startup settings (as SET statements) and its greeting.
#[derive(Debug)]
struct Kept {
    sets: Vec<String>,
    params: Params,
    at: Instant,
}

impl Default for Greetings {
    fn default() -> Self {
        Greetings { kept: Mutex::new(Lru::new(CAPACITY)), hasher: Default::default() }
    }
}

impl Greetings {
    /// The greeting kept for `sets`, and whether it is younger than `MAX_AGE`.
    pub(crate) fn get(&self, sets: &[String]) -> Option<(Params, bool)> {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        let k = kept.get_mut(self.hasher.hash_one(sets)).filter(|k| k.sets == sets)?;
        Some((k.params.clone(), k.at.elapsed() < MAX_AGE))
    }

    pub(crate) fn keep(&self, sets: Vec<String>, params: Params) {
        let key = self.hasher.hash_one(&sets);
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.insert(key, Kept { sets, params, at: Instant::now() });
    }
}

/// The startup parameters to track as session SETs, as SET statements: the usual ones
/// (`TRACKED_PARAMS`) as `SET`, any other setting (PostgreSQL takes every parameter but
/// `user`, `database`, `options`, `replication` and `_pq_.*` as one, e.g. asyncpg's
/// `server_settings`) and those of the startup `options` as `set_config`, which takes the value
/// as the server's `-c` does (`SET search_path = 'a,b'` would name one schema `a,b`).
pub fn startup_sets(startup: &Startup) -> Vec<(String, String)> {
    let mut sets = vec![];
    for (k, v) in &startup.params {
        let name = k.to_ascii_lowercase();
        if text::is_raw(v) && is_setting(k) {
            sets.push((name.clone(), set_raw(startup, &name, v)));
        } else if TRACKED_PARAMS.contains(&name.as_str()) {
            sets.push((name, format!("SET {k} = {}", literal(v))));
        } else if is_setting(k) {
            sets.push((name.clone(), set_config(&name, v)));
        }
    }
    for (name, value) in options(startup).unwrap_or_default() {
        let text = set_config(&name, &value);
        sets.push((name, text));
    }
    sets
}

/// A startup value that is not UTF-8, as a `set_config` whose value the server reads in the
/// client's `client_encoding` from hex digits: the statement is ASCII, so it means the same
/// whatever encoding the connection replaying it is in (PostgreSQL itself takes such a value
/// unconverted; the text is the same when the encoding is the server's). Without a
/// `client_encoding` the value must be valid in the server's, or the login is refused.
fn set_raw(startup: &Startup, name: &str, value: &str) -> String {
    let hex: String = text::to_bytes(value).iter().map(|b| format!("{b:02x}")).collect();
    let encoding = startup.param("client_encoding").map_or("pg_catalog.getdatabaseencoding()".into(), literal);
    let value = format!("pg_catalog.convert_from(pg_catalog.decode('{hex}', 'hex'), {encoding})");
    format!("SELECT pg_catalog.set_config({}, {value}, false)", literal(name))
}

fn set_config(name: &str, value: &str) -> String {
    format!("SELECT pg_catalog.set_config({}, {}, false)", literal(name), literal(value))
}

/// Whether a startup parameter is a setting (not one of the protocol's own).
fn is_setting(name: &str) -> bool {
    !matches!(name, "user" | "database" | "options" | "replication") && !name.starts_with("_pq_.")
}

/// The startup packet's `options` as settings (refused as PostgreSQL refuses them).
pub(crate) fn options(startup: &Startup) -> Result<Vec<(String, String)>, refract_pg::session::OptionsError> {
    match startup.params.iter().find(|(k, _)| k == "options") {
        Some((_, v)) => refract_pg::session::parse_options(v),
        None => Ok(vec![]),
    }
}

/// `s` as an SQL string literal.
pub(crate) fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greetings_are_kept_per_set_of_settings_and_age() {
        let g = Greetings::default();
        let sets = vec!["SET TimeZone = 'utc'".to_owned()];
        assert_eq!(g.get(&sets), None);
        g.keep(sets.clone(), vec![("TimeZone".into(), "UTC".into())]);
        assert_eq!(g.get(&sets), Some((vec![("TimeZone".into(), "UTC".into())], true)));
        assert_eq!(g.get(&[]), None, "another set of settings");
        if let Some(k) = g.kept.lock().unwrap_or_else(PoisonError::into_inner).get_mut(g.hasher.hash_one(&sets)) {
            k.at = k.at.checked_sub(MAX_AGE).unwrap_or(k.at);
        }
        assert_eq!(g.get(&sets).map(|(_, fresh)| fresh), Some(false), "kept, but to be asked again");
    }
}
