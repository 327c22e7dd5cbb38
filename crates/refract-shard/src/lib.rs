//! refract's sharding arithmetic: where a row lives and how the shards' answers combine. It
//! computes PostgreSQL's hash partitioning, reads the key values a statement touches from its
//! parse tree and its Bind parameters, splits COPY data into rows, and plans and merges a
//! SELECT over every shard. It is pure: nothing here awaits or opens a socket; the sharded
//! session in `refract-front-pg` owns the I/O. The codec types come from `refract-pg`.
//!
//! # Layout
//! - [`partition`]: PostgreSQL's hash partitioning (which remainder a key gets).
//! - [`shardkey`]: which key values a statement touches in each sharded table (from its parse tree).
//! - [`keyparam`]: key values from Bind parameters (text, binary, arrays for `= ANY($n)`).
//! - [`copyrows`]: the rows of COPY FROM data (text, csv) and their fields, found incrementally.
//! - [`scatter`]: a SELECT over every shard answered exactly (plan, streaming merge) or refused.

pub mod copyrows;
pub mod keyparam;
pub mod partition;
pub mod scatter;
pub mod shardkey;
