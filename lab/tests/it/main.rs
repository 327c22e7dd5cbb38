//! refract-lab's integration tests, one test binary: the namespace lab, the demo, pgbench and
//! the PostgreSQL lab, reports and wrk's output parser. `common` is the kit they share.
//! Run: `cargo test --profile ci -p refract-lab --test it`.
#![allow(clippy::unwrap_used)]

mod cluster;
mod common;
mod demo;
mod lab;
mod pgbench;
mod pglab;
mod report;
mod wrk_parse;
