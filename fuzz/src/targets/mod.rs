//! The fuzz targets, by crate: each takes any bytes, must not panic, and asserts what the
//! decoder promises (consumed ≤ offered, decode-then-encode gives the same bytes, ...).

mod handover;
mod http;
mod hybrid;
mod peers;
mod pg;
mod scram;
mod shard;

pub use handover::handover_msg;
pub use http::{http_chunked, http_head};
pub use hybrid::pg_hybrid;
pub use peers::{peer_cancel, PEER_KEY, PEER_NOW_MS};
pub use pg::{pg_backend, pg_copyrows, pg_frontend, pg_keyparam, pg_startup};
pub use scram::pg_scram;
pub use shard::pg_numeric;

/// A fuzz target: a name (its `src/bin/` harness, its `corpus/` directory) and its function.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, in the order `make fuzz` runs them.
pub const ALL: [Target; 12] = [
    ("http_head", http_head),
    ("http_chunked", http_chunked),
    ("pg_frontend", pg_frontend),
    ("pg_backend", pg_backend),
    ("pg_startup", pg_startup),
    ("handover_msg", handover_msg),
    ("pg_keyparam", pg_keyparam),
    ("pg_copyrows", pg_copyrows),
    ("pg_numeric", pg_numeric),
    ("pg_scram", pg_scram),
    ("pg_hybrid", pg_hybrid),
    ("peer_cancel", peer_cancel),
];
