//! refract's fuzz targets: one function per decoder family, taking arbitrary bytes and
//! panicking only when a decoder breaks an invariant (a panic inside a decoder is a bug too).
//! The AFL++ harnesses in `src/bin/` call them under coverage-guided fuzzing (`make fuzz`);
//! `tests/replay.rs` calls them on every seed and every saved crash, so a fixed crash stays
//! fixed in `make test` without cargo-afl. See docs/fuzzing.md.
//!
//! # Layout
//! - [`targets`]: the target functions (`http_head`, `http_chunked`, `pg_frontend`,
//!   `pg_backend`, `pg_startup`, `handover_msg`, `pg_keyparam`, `pg_copyrows`, `pg_numeric`,
//!   `pg_scram`, `pg_hybrid`, `peer_cancel`) and [`targets::ALL`], their names.

#![forbid(unsafe_code)]

pub mod targets;
