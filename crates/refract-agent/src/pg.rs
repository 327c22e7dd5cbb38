//! The agent in front of a PostgreSQL server (docs/handover.md, "PostgreSQL"): refract's
//! server connections reach the server through here, and a result that reaches the threshold
//! is written straight to the client.
//!
//! - this file: the listener for refract's server connections (the connections that stopped
//!   at a large result wait in `crate::waiting::Waiting` for the client's socket).
//! - `pump.rs`: one proxied connection: refract ↔ server, watching the results (the
//!   in-band signals are `refract_pg::hybrid`'s).
//! - `adopt.rs`: a `HandOff` for a waiting connection, over either carrier: take the client's
//!   socket, let the pump write the rest of the result to it, hand it back at ReadyForQuery.

mod adopt;
mod pump;

use tokio::net::TcpListener;

use crate::options::LocalOptions;

pub(crate) use crate::waiting::{Served, Verdict};
pub(crate) use adopt::adopt;

/// Serves refract's server connections on `listener` until it fails, one task each.
pub async fn serve_postgres(listener: TcpListener, opts: LocalOptions) -> std::io::Result<()> {
    loop {
        let (stream, peer) = listener.accept().await?;
        let opts = opts.clone();
        tokio::spawn(refract_process::contain("server connection", async move {
            if let Err(e) = pump::run(stream, &opts).await {
                tracing::debug!(%peer, "server connection ended: {e}");
            }
        }));
    }
}
