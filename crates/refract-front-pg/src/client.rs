//! The client side: login (startup, TLS, authentication), cancel keys, the client's framed
//! socket, the connected clients, and what the client's startup settings become.
//!
//! # Layout
//! - `login`: startup, SSLRequest (TLS with rustls), CancelRequest and client authentication.
//! - `greeting`: the ParameterStatus set at login, the primary's for the client's settings.
//! - `startup`: what the client's startup settings become (SETs replayed, greetings kept).
//! - `cancel`: cancel keys.
//! - `wire`: framed sockets (plain or TLS).
//! - `clients`: the connected clients, their admin view (`/pg/clients`) and gauges.

pub(crate) mod cancel;
pub(crate) mod clients;
pub(crate) mod greeting;
pub(crate) mod login;
pub(crate) mod startup;
pub(crate) mod wire;
