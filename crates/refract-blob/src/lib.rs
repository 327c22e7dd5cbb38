//! refract's test backend, standing in for the paper's stored procedure that returns a result of
//! a requested size. `GET /blob?bytes=N&seed=S` streams N bytes where byte i is `(i + S) % 251`;
//! `POST /blob` is a write; `POST /query` takes a Hyrise-R plan; `GET /stats` counts what it
//! served. `--delay-ms` and `--concurrency` give it a real capacity.
//!
//! # Layout
//! - [`pattern`]: the blob byte pattern, shared with tests that check bodies byte-exact.
//! - `server`: the HTTP server (one task per connection, requests served in order).

pub mod pattern;
mod server;

pub use server::{serve, BlobServer, Stats};

use std::net::SocketAddr;

/// `refract blob-server` options.
#[derive(clap::Args, Debug, Clone)]
pub struct BlobArgs {
    /// Address to listen on.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Name reported in `x-served-by` and `/stats`.
    #[arg(long)]
    pub name: String,
    /// Simulated processing time per query, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub delay_ms: u64,
    /// Queries processed at once (others wait); 0 = unbounded.
    #[arg(long, default_value_t = 0)]
    pub concurrency: usize,
}

/// Runs a blob server until SIGINT/SIGTERM.
pub fn run(args: BlobArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen).await?;
        tracing::info!(addr = %args.listen, name = %args.name, "blob server listening");
        let server = BlobServer::new(args.name, args.delay_ms, args.concurrency);
        tokio::select! {
            r = serve(listener, server) => r,
            _ = shutdown_signal() => Ok(()),
        }
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {},
                _ = tokio::signal::ctrl_c() => {},
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
