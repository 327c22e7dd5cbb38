//! refract's HTTP front end, on the engine (`refract-core`): the client session (one request
//! at a time, in order), classification, forwarding with admission, retry and learning, relay
//! with bounded buffers, fan-out, HTTP errors, active health probes of the backends, and the
//! hand-over client (handing a client connection to a backend's agent and taking it back).
//!
//! # Layout
//! - [`HttpFront`]: the [`Front`](refract_core::engine::Front) the engine runs.
//! - [`config`]: `[[route]]` and `[handover]` ([`config::HttpConfig`]).
//! - `session`: the client session loop.
//! - `request`: a request's body, the request ready to forward, a failed exchange.
//! - `forward`: one request to one backend: admission, exchange, retry, learning.
//! - `relay`: moving bodies between client and backend with bounded buffers; letting a
//!   backend go when its client stops reading while others wait for it.
//! - `fanout`: class `all`, sent to every backend.
//! - `health`: active health checks (a connect, or an HTTP GET).
//! - `handover`: handing a client connection to a backend's agent and taking it back.
//! - [`conn`]: a client connection and its buffer (the admin API reads through it too).
//! - [`error`]: the error type, with the HTTP status each error gets.

pub mod config;
pub mod conn;
pub mod error;
mod fanout;
mod forward;
mod handover;
mod health;
mod relay;
mod request;
mod session;

pub use error::Error;

use refract_core::engine::{Front, Serving};
use refract_core::{Config, Ctx};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpStream;

/// The HTTP front end: clients on `[http] listen`, backends from `[[backend]]`.
pub struct HttpFront;

impl Front for HttpFront {
    fn name(&self) -> &'static str {
        "http"
    }

    fn listener(&self, cfg: &Config) -> Option<(&'static str, SocketAddr)> {
        config::HttpConfig::of(cfg).listening.listen
    }

    fn start(&self, ctx: &Arc<Ctx>) -> std::io::Result<()> {
        for (old, new) in &config::HttpConfig::of(&ctx.cfg).listening.renamed {
            tracing::warn!("{old} is deprecated: write {new} instead (both in one file is an error)");
        }
        tokio::spawn(health::run(ctx.clone()));
        handover::families(ctx);
        handover::prepare(ctx);
        Ok(())
    }

    fn serve(&self, ctx: Arc<Ctx>, stream: TcpStream, peer: SocketAddr) -> Serving {
        Box::pin(session::run(ctx, stream, peer.ip()))
    }
}

/// Brings the hand-over gauges up to date (before `/metrics` is written).
pub fn publish_metrics(ctx: &Ctx) {
    handover::publish_metrics(ctx);
}

/// Whether backend `name` has a hand-over agent in the configuration in force.
pub fn has_agent(ctx: &Ctx, name: &str) -> bool {
    config::HttpConfig::of(&ctx.cfg).handover.as_ref().is_some_and(|h| h.agents.contains_key(name))
}
