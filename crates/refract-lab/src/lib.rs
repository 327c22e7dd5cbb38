//! refract's lab: a network-namespace fabric that reproduces the paper's topology on one
//! machine, the cluster that runs in it (blob servers with their agents, the refract
//! dispatchers — relay-only, hybrid, hand-over — and HAProxy as the peer), the wrk-driven
//! payload sweep with its report (markdown, CSV, PNG), the paper's reproduction, and the demo.
//!
//! This crate is the bench harness: it uses `anyhow` and shells out to `ip`, `tc`, `wrk`,
//! `curl` and `haproxy`; it never ships in the data path.
//!
//! # Layout
//! - [`cli`]: the `lab`, `bench` and `demo` subcommands (`LabCmd`, `BenchCmd`, `DemoArgs`).
//! - [`topology`]: the hosts, namespaces and addresses (198.18.0.0/24 only).
//! - [`fabric`]: namespaces, veths, the bridge, tbf (`lab up` / `lab down` / `lab exec`).
//! - [`shaping`]: tbf parameters for a rate, and why.
//! - [`lab`]: `lab up/down/status` and `LabGuard`, which undoes what it brought up.
//! - [`layout`], [`cluster`]: where a cluster's processes live; starting, probing, stopping them.
//! - [`dispatch_config`], [`haproxy`]: reading the dispatcher config; HAProxy's mirrored config.
//! - [`wrk`], [`sweep`]: running wrk and parsing it; the sweep with progress and ETA;
//!   [`switch`]: which steering dispatcher runs for a target; [`handover_stats`]: the
//!   dispatchers' hand-over figures from `/metrics`; [`paper`] (`bench paper`): the whole
//!   reproduction, both link settings, with its acceptance figures; [`paired`]: two targets
//!   in alternating runs, with a confidence interval on their ratio.
//! - [`report`], [`csv`], [`plot`], [`environment`]: the outputs.
//! - [`demo`], [`http_client`]: the demo and its tiny HTTP client.
//! - [`overload`] (`bench overload`), [`overload_args`]: the overload benchmark; [`rig`]: its
//!   processes; [`loadgen`], [`pool`], [`schedule`], [`summary`]: the open-loop load generator
//!   and its statistics; [`overload_results`], [`overload_report`], [`overload_plot`]: the outputs.
//! - [`pgbench`] (`bench pgbench`): pgbench through refract, PgBouncer and pgpool-II on a
//!   PostgreSQL primary and replica; [`pgbench_targets`]: the poolers' processes and configs;
//!   [`pgbench_run`]: running pgbench and reading it; [`pgbench_report`]: the outputs.
//! - [`sh`], [`state`], [`units`], [`interrupt`]: helpers.

pub mod bench;
pub mod cli;
pub mod cluster;
pub mod congestion;
pub mod cpu;
pub mod csv;
pub mod demo;
pub mod dispatch_config;
pub mod environment;
pub mod fabric;
pub mod handover_stats;
pub mod haproxy;
pub mod http_client;
pub mod interrupt;
pub mod lab;
pub mod layout;
pub mod loadgen;
pub mod overload;
pub mod overload_args;
pub mod overload_plot;
pub mod overload_report;
pub mod overload_results;
pub mod paired;
pub mod paper;
pub mod pgbench;
pub mod pgbench_report;
pub mod pgbench_run;
pub mod pgbench_targets;
pub mod plot;
pub mod pool;
pub mod report;
pub mod rig;
pub mod schedule;
pub mod sh;
pub mod shaping;
pub mod state;
pub mod summary;
pub mod sweep;
pub mod switch;
pub mod topology;
pub mod units;
pub mod wrk;

pub use cli::{BenchCmd, DemoArgs, LabCmd};
