//! The `refract` binary's integration tests, one test binary: each module starts the real
//! binary (blob servers, dispatchers, agents) on loopback ports or in network namespaces it
//! creates and checks what a client sees: routing (affinity included), admin, overload,
//! timeouts, signals, request smuggling, memory, hand-over (same host, over TCP, in the lab) and
//! PostgreSQL shards.
//! `common` is the kit they share. Run: `cargo test --profile ci -p refract --test it`.
#![allow(clippy::unwrap_used)]

mod admin;
mod affinity;
mod common;
mod config_errors;
mod failures;
mod handover_lab;
mod handover_local;
mod handover_pg;
mod handover_tcp;
mod memory;
mod overload;
mod partial;
mod pg_shards;
mod routing;
mod signals;
mod smuggling;
mod streaming;
mod timeouts;
