//! refract-shard's integration tests, one binary: placement and parameters against a real
//! server (`partition`), scatter-gather against real shards (`scatter`), and the merge's
//! properties without servers (`scatter_merge`).
#![allow(clippy::unwrap_used)]

mod partition;
mod scatter;
mod scatter_merge;
