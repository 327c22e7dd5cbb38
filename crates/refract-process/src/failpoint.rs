//! Test failpoints: `REFRACT_FAILPOINT=<name>` makes the process misbehave at one named place,
//! so that a test can check what it does then. The names and what they do are listed in
//! docs/operations.md ("Failpoints"); none is set in production.

use std::sync::OnceLock;

/// Whether the failpoint `name` is the one set (`REFRACT_FAILPOINT`, read once).
pub fn is(name: &str) -> bool {
    static SET: OnceLock<Option<String>> = OnceLock::new();
    SET.get_or_init(|| std::env::var("REFRACT_FAILPOINT").ok()).as_deref() == Some(name)
}
