//! refract-agent's integration tests, one test binary: adoption of handed-over connections,
//! the control listener, forwarding, TCP hand-off, host checks, peers and stalls.
//! `common` is the kit they share. Run: `cargo test --profile ci -p refract-agent --test it`.
#![allow(clippy::unwrap_used)]

mod adopt;
mod common;
mod control;
mod forward;
mod handoff_tcp;
mod host_checks;
mod peer;
mod stall;
