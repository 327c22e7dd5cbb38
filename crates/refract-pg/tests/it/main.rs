//! refract-pg's integration tests, one test binary: codec properties, the wire protocol
//! against real PostgreSQL, psql against a server made of the codec, and the test cluster.
//! Run: `cargo test --profile ci -p refract-pg --test it`.
#![allow(clippy::unwrap_used)]

mod cluster;
mod codec_props;
mod serve_psql;
mod wire;
