//! refract-dispatch's integration tests, one test binary: the dispatcher as a library in this
//! process in front of real PostgreSQL (the `pg_*` modules: wire, sessions, statements,
//! results, replicas, members, admission, caches, TLS, sharding, hand-over, drivers) and the example
//! configs. `pg_common` is the PostgreSQL fixture they share, `pg_sharded_cases` the sharded
//! suite. Run: `cargo test --profile ci -p refract-dispatch --test it`.
#![allow(clippy::unwrap_used)]

mod cluster;
mod examples;
mod pg_admission;
mod pg_affinity;
mod pg_cache;
mod pg_cluster;
mod pg_common;
mod pg_drivers;
mod pg_encoding;
mod pg_frontend;
mod pg_handover;
mod pg_large_bind;
mod pg_limit;
mod pg_members;
mod pg_partial;
mod pg_replicas;
mod pg_results;
mod pg_session_state;
mod pg_sharded;
mod pg_sharded_batches;
mod pg_sharded_cases;
mod pg_sharded_drivers;
mod pg_statements;
mod pg_tls;
mod pg_wire;
