//! The benchmarks (`refract bench …`), one folder each: [`sweep`] (the payload sweep, its
//! report, CSV and figure), [`pairs`] (two targets in alternating runs), [`paper`] (the
//! paper's reproduction), [`overload`] (past saturation), [`loadgen`] (its open-loop load
//! generator), [`pgbench`] (pgbench through refract and the poolers).

pub mod loadgen;
pub mod overload;
pub mod pairs;
pub mod paper;
pub mod pgbench;
pub mod sweep;
