//! Scatter-gather across shards, exactly: a SELECT over sharded tables is planned for every
//! shard ([`plan`]) and the shards' answers are combined into the one answer a single
//! PostgreSQL holding all the data would give ([`Gather`]), streaming in memory bounded by the
//! number of shards; what cannot be answered exactly is refused with a reason (SQLSTATE
//! [`REFUSED`]). Writes' row counts combine by [`write_tag`]. Pure: the front end sends the SQL
//! and feeds the rows. docs/sharding.md describes the rules.
//!
//! # Layout
//! - [`planner`]: [`plan`], the decision and the rewrite; [`plan`](mod@plan): the [`Plan`] it returns.
//! - `tree`: questions asked of the parse tree (same expression, aggregates, FROM).
//! - [`gather`]: [`Gather`], the k-way merge, grouping, DISTINCT, OFFSET/LIMIT.
//! - `error`: [`GatherError`]. `fold`: combining aggregates.
//! - `decimal`: [`Numeric`], PostgreSQL `numeric` read from text and binary, exact sums and averages.
//! - [`value`]: reading and ordering column values as PostgreSQL does; `datetime`: ISO dates.
//! - [`tag`]: CommandComplete of writes over several shards.

mod datetime;
mod decimal;
mod error;
mod fold;
pub mod gather;
pub mod plan;
pub mod planner;
pub mod tag;
mod tree;
pub mod value;

pub use decimal::Numeric;
pub use gather::{Gather, GatherError, Row, Step};
pub use plan::{Col, Decision, Plan, Role, Shape, SortKey};
pub use planner::{plan, Options};
pub use tag::{write_tag, Placement, TagError};
pub use tree::BUILTIN_AGGREGATES;

/// SQLSTATE `feature_not_supported`, sent with a refusal's reason.
pub const REFUSED: &str = "0A000";

#[cfg(test)]
mod tests;
