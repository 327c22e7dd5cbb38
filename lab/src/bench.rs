//! The benchmarks (`refract bench …`), one folder each: [`sweep`] (the payload sweep, its
//! report, CSV and figure), [`pairs`] (two targets in alternating runs), [`paper`] (the
//! paper's reproduction), [`overload`] (past saturation), [`loadgen`] (its open-loop load
//! generator), [`pgbench`] (pgbench through refract and the poolers), [`pgoverload`]
//! (PostgreSQL past saturation, refract beside PgBouncer), [`pglarge`] (large PostgreSQL
//! results in the lab: direct, relay, hybrid, PgBouncer), [`pgshard`] (what sharding's routing
//! costs on keyed reads: refract sharded vs unsharded over one server), [`pgcache`] (cache-affinity
//! routing against peak-EWMA over replicas of bounded memory).

pub mod cluster;
pub mod loadgen;
pub mod overload;
pub mod pairs;
pub mod paper;
pub mod pgbench;
pub mod pgcache;
pub mod pglarge;
pub mod pgoverload;
pub mod pgshard;
pub mod streams;
pub mod sweep;
