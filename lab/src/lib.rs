//! refract's lab: a network-namespace fabric that reproduces the paper's topology on one
//! machine, the cluster that runs in it (blob servers with their agents, the refract
//! dispatchers — relay-only, hybrid, hand-over — and HAProxy as the peer) or the PostgreSQL
//! cluster (primary, streaming replica, refract, PgBouncer as the peer), the wrk-driven
//! payload sweep with its report (markdown, CSV, PNG), the paper's reproduction, and the demo.
//!
//! This crate is the bench harness: it uses `anyhow` and shells out to `ip`, `tc`, `wrk`,
//! `curl`, `haproxy`, PostgreSQL's tools and `pgbouncer`; it never ships in the data path.
//!
//! # Layout
//! - [`cli`]: the `lab`, `bench` and `demo` subcommands (`LabCmd`, `BenchCmd`, `DemoArgs`).
//! - [`fabric`]: namespaces, veths, the bridge, tbf (`lab up` / `lab down` / `lab exec`);
//!   [`fabric::topology`]: the hosts, namespaces and addresses (198.18.0.0/24 only);
//!   [`fabric::shaping`]: tbf parameters for a rate, and why; [`fabric::congestion`]: TCP
//!   congestion control in the namespaces.
//! - [`cluster`]: starting, probing and stopping a cluster's processes; [`cluster::layout`]:
//!   where they live; [`cluster::dispatch_config`], [`cluster::haproxy`]: reading the
//!   dispatcher config, HAProxy's mirrored config; [`cluster::http_client`]: a tiny HTTP client.
//! - [`lab`]: `lab up/down/status` and `LabGuard`, which undoes what it brought up.
//! - [`pglab`]: the PostgreSQL cluster of `lab up --cluster --db postgres` (primary, streaming
//!   replica, refract hybrid and relay-only, PgBouncer); [`pglab::layout`]: its addresses and
//!   where the PostgreSQL agent slots in, [`pglab::server`]: PostgreSQL, [`pglab::pgbouncer`].
//! - [`bench`](mod@bench): the benchmarks, one folder each, each with its own results, report and plot:
//!   [`bench::sweep`] (`bench sweep`: wrk, the sweep with progress and ETA, the steering
//!   dispatcher switch, the hand-over figures from `/metrics`, the section, CSV and figure);
//!   [`bench::pairs`] (`bench pairs`: two targets in alternating runs, a confidence interval on
//!   their ratio, CPU per request); [`bench::paper`] (`bench paper`: the whole reproduction with
//!   its acceptance figures); [`bench::overload`] (`bench overload`) and [`bench::loadgen`]
//!   (its open-loop load generator and statistics); [`bench::pgbench`] (`bench pgbench`:
//!   pgbench through refract, PgBouncer and pgpool-II on a PostgreSQL primary and replica).
//! - [`report`]: what every benchmark page shares (page header, marked sections, ratios, the
//!   environment, the figures' font and colours).
//! - [`demo`]: the demo; [`demo::pg`]: its PostgreSQL line (lab only).
//! - [`support`]: helpers (commands, state directory, units, Ctrl-C).

pub mod bench;
pub mod cli;
pub mod cluster;
pub mod demo;
pub mod fabric;
pub mod lab;
pub mod multi;
pub mod pglab;
pub mod report;
pub mod support;

pub use cli::{BenchCmd, DemoArgs, LabCmd};
