//! [`GatherError`]: why the shards' answers to a plan cannot be combined, with its SQLSTATE.

/// Why the shards' answers cannot be combined.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum GatherError {
    /// A column refract cannot compare or combine exactly (known at RowDescription).
    #[error("{0}")]
    Refused(String),
    /// The shards' answers disagree with each other or with the plan.
    #[error("shard {shard}: {reason}")]
    Shard { shard: usize, reason: String },
    /// A value that does not read as its column's type.
    #[error("{0}")]
    Value(String),
    /// A combined int8 sum or count overflows, as `bigint out of range` on one server.
    #[error("bigint out of range")]
    OutOfRange,
}

impl GatherError {
    /// The SQLSTATE to send the client.
    pub fn sqlstate(&self) -> &'static str {
        match self {
            GatherError::Refused(_) => super::REFUSED,
            GatherError::OutOfRange => "22003",
            GatherError::Shard { .. } | GatherError::Value(_) => "XX000",
        }
    }
}
