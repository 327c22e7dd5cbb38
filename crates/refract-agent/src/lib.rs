//! `refract agent`: the backend-side agent of refract's connection hand-over.
//!
//! It runs on a backend host beside the database (or the blob server) it fronts. At start it
//! checks the host for direct server return — the VIP on `lo`, ARP suppressed, the guard
//! attached to the NIC that faces the dispatcher — and refuses to start, naming each problem
//! and its fix, when something is wrong. Then it listens for dispatcher control connections,
//! authenticates them with the shared key and answers them (heartbeats; hand-offs are refused
//! for now: see `docs/handover.md`).
//!
//! # Layout
//! - [`AgentArgs`], [`run`] (this file): the command line and the start-up sequence.
//! - [`AgentConfig`] (`config.rs`): the TOML configuration.
//! - [`check_host`] (`checks.rs`): the host checks; returns the attached guard.
//! - [`serve`] (`server.rs`): the control listener.
//! - [`Error`] (`error.rs`): what stops the agent, whose fault, whether to retry.

mod checks;
mod config;
mod error;
mod server;

use std::path::PathBuf;

pub use checks::{check_host, HostSpec};
pub use config::AgentConfig;
pub use error::{Error, Problem, Result, Side};
pub use server::{serve, NOT_YET};

/// `refract agent --config FILE`.
#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// The agent's TOML configuration (see examples/lab/agent-b1.toml and docs/handover.md).
    #[arg(long)]
    pub config: PathBuf,
}

/// Runs the agent: config, host checks, then the control listener (until it fails or Ctrl-C).
pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    let cfg = AgentConfig::from_file(&args.config)?;
    let key = cfg.control_key()?;
    let spec = HostSpec { vip: cfg.vip, interface: cfg.interface.clone(), map_capacity: cfg.map_capacity };
    let guard = check_host(&spec)?;
    tracing::info!(vip = %cfg.vip, interface = %cfg.interface, backend = %cfg.backend, "host ready, guard attached");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let listener =
            tokio::net::TcpListener::bind(cfg.control).await.map_err(|e| Error::Io(bind_err(cfg.control, e)))?;
        tracing::info!(control = %cfg.control, "control listener up");
        tokio::select! {
            r = serve(listener, key, cfg.channel_options()) => r.map_err(Error::Io)?,
            r = tokio::signal::ctrl_c() => r.map_err(Error::Io)?,
        }
        Ok::<_, Error>(())
    })?;
    drop(guard); // detaches the guard from the interface
    Ok(())
}

fn bind_err(addr: std::net::SocketAddr, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("cannot listen for control connections on {addr}: {e}"))
}
