//! refract-handover's integration tests, one test binary: TCP_REPAIR snapshot/restore, fd
//! passing, quiescing, eBPF steering, the switchable rules, the seam and the control messages,
//! in network namespaces the tests create. `common` is the kit they share.
//! Run: `cargo test --profile ci -p refract-handover --test it`.
#![allow(clippy::unwrap_used)]

mod common;
mod control;
mod fd_pass;
mod quiesce;
mod repair;
mod rules;
mod seam;
mod steering;
