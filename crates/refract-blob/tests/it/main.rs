//! refract-blob's integration tests, one test binary: deferred results.
//! Run: `cargo test --profile ci -p refract-blob --test it`.
#![allow(clippy::unwrap_used)]

mod defer;
