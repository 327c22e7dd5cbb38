//! refract's engine. It runs client connections for front ends it does not know by name
//! (HTTP, PostgreSQL: `refract-front-http`, `refract-front-pg`) and keeps what they share:
//! the event loops and listeners, the backends and their health, balancing, admission control
//! and overload, metrics and the drain. It never names a protocol or the hand-over; its
//! `Cargo.toml` holds that rule (`make lint` checks it).
//!
//! # Layout
//! - [`engine`]: the [`engine::Front`] a protocol plugs in; one event loop per worker or one
//!   multi-threaded runtime; binding, accepting, placing, draining.
//! - [`accept`]: the accept loop and the open connections gauge.
//! - [`config`]: the engine's sections of the TOML configuration and their checks; the front
//!   ends' sections ride along in [`config::Sections`].
//! - [`ctx`]: the state every session and service shares ([`ctx::Ctx`]).
//! - [`live`]: the configuration in force, swapped whole by a reload.
//! - [`membership`]: backends at runtime and the choice of one per request.
//! - [`backend`]: one backend, its health, ejection, admission and connection pool.
//! - [`overload`]: admission limits, queues, deadlines, retry budget, a client's fair share,
//!   memory spilled for clients that stopped reading.
//! - [`partial`]: partial replicas: what a member holds, shares per class of reads.
//! - [`metrics`]: Prometheus metrics.
//! - [`worker`]: which per-core event loop the current thread is; [`spin`]: busy polling.
//!
//! The words shared with the front ends (route class, error side) are in `refract-vocab`.

pub mod accept;
pub mod backend;
pub mod config;
pub mod ctx;
pub mod engine;
pub mod live;
pub mod membership;
pub mod metrics;
pub mod overload;
pub mod partial;
pub mod spin;
pub mod worker;

pub use config::Config;
pub use ctx::Ctx;
