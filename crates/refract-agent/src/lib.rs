//! `refract agent`: the backend-side agent of refract's connection hand-over.
//!
//! It runs on a backend host beside the database (or the blob server) it fronts. At start it
//! checks the host for direct server return — the VIP on `lo`, ARP suppressed, the guard
//! attached to the NIC that faces the dispatcher — and refuses to start, naming each problem
//! and its fix, when something is wrong. Then it listens for dispatcher control connections,
//! authenticates them with the shared key and answers them: heartbeats; `HandOff` (restore the
//! client's TCP socket, serve it, hand it back); `Forward` (hybrid: relay a small result over the
//! channel, ask for the connection for a large one); see `docs/handover.md`. With `local` set it
//! also (or only) adopts client connections from a dispatcher on the same host (SCM_RIGHTS),
//! serves their requests from its backend and hands them back at the next request boundary.
//!
//! # Layout
//! - [`AgentArgs`], [`run`] (this file): the command line and the start-up sequence.
//! - [`AgentConfig`] (`config.rs`): the TOML configuration.
//! - [`check_host`] (`checks.rs`): the host checks; returns the attached guard.
//! - [`serve`], [`serve_local`] (`server.rs`): the control listener and the same-host listener.
//! - `adopt.rs`: the one adoption over either carrier (check, take the socket, serve, hand back);
//!   `Move`, the one step that differs by carrier: how the client socket arrives and leaves.
//! - `local.rs`: same host, the socket beside the `HandOff` / `HandBack` (SCM_RIGHTS).
//! - [`LocalOptions`] (`options.rs`): how adopted connections reach the backend, their bounds.
//! - [`PeerPolicy`], [`bind_local`] (`peer.rs`): who may use the same-host link (file mode, uid).
//! - `remote.rs`: across hosts, restore from the `HandOff`'s TCP_REPAIR state; quiesce,
//!   tombstone and snapshot for the `HandBack`.
//! - `ask.rs`: the dispatcher asked about each further request, over either carrier.
//! - `exchange.rs`: serving adopted requests from the backend straight to the client.
//! - `backend.rs`: the connection to the backend (TCP, or its Unix socket) and connecting it.
//! - `pipe.rs`: splicing large bodies backend → pipe → client (zero-copy).
//! - `hybrid.rs`: forwarded requests over either carrier; a large result asks for the client's
//!   connection and adopts it (`adopt.rs`).
//! - `pg/`: in front of a PostgreSQL server (`postgres_listen`): refract's server connections
//!   pass through; a large result is written straight to the client (`pg/pump.rs`) once the
//!   link hands its socket over (`pg/adopt.rs`); `waiting.rs`: the connections waiting for it.
//! - [`Error`] (`error.rs`): what stops the agent, whose fault, whether to retry; the I/O errors
//!   that end serving an adopted connection.

mod adopt;
mod ask;
mod backend;
mod checks;
mod config;
mod error;
mod exchange;
mod hybrid;
mod local;
mod options;
mod peer;
mod pg;
mod pipe;
mod remote;
mod server;
mod waiting;

use std::path::PathBuf;

pub use checks::{check_host, HostSpec};
pub use config::AgentConfig;
pub use error::{Error, Problem, Result, Side};
pub use options::LocalOptions;
pub use peer::{bind_local, PeerPolicy};
pub use pg::serve_postgres;
pub use server::{serve, serve_local, serve_local_for, serve_with, NOT_YET};
pub use waiting::Waiting;

/// `refract agent --config FILE`.
#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// The agent's TOML configuration (see examples/lab/agent-b1.toml and docs/agent.md).
    #[arg(long)]
    pub config: PathBuf,
}

/// How long the agent may take to stop after SIGTERM or SIGINT before its watchdog ends it
/// (it drains nothing: its listeners and connections close at once).
pub const STOP_BOUND: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a stopping runtime waits for its blocking work.
const RUNTIME_GRACE: std::time::Duration = std::time::Duration::from_millis(200);

/// Runs the agent: config, host checks (cross host only), then the listeners, until one fails
/// or SIGTERM / SIGINT; then closes every connection and detaches the guard.
pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    refract_process::watchdog::start(|| STOP_BOUND)?;
    let cfg = AgentConfig::from_file(&args.config)?;
    let key = cfg.control_key()?;
    let guard = match (cfg.vip, &cfg.interface) {
        (Some(vip), Some(interface)) => {
            let spec = HostSpec { vip, interface: interface.clone(), map_capacity: cfg.map_capacity };
            let guard = check_host(&spec)?;
            tracing::info!(%vip, %interface, backend = %cfg.backend, "host ready, guard attached");
            Some(std::sync::Arc::new(std::sync::Mutex::new(guard)))
        }
        _ => None,
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let served = rt.block_on(async {
        // Before any listener opens: a stop signal is never missed.
        let mut stop = refract_process::StopSignals::install().map_err(Error::Io)?;
        tokio::select! {
            r = remote(&cfg, key, guard.clone()) => r?,
            r = same_host(&cfg) => r?,
            r = postgres(&cfg, guard.clone()) => r?,
            signal = stop.recv() => tracing::info!(signal, "signal received: stopping"),
        }
        Ok::<_, Error>(())
    });
    // Connections still open are closed here; then the last hold on the guard goes, which
    // detaches it from the interface.
    rt.shutdown_timeout(RUNTIME_GRACE);
    drop(guard);
    Ok(served?)
}

/// The control listener for dispatchers on other hosts (pending forever when not configured).
async fn remote(
    cfg: &AgentConfig,
    key: refract_handover::control::ControlKey,
    guard: Option<SharedGuard>,
) -> Result<()> {
    let Some(addr) = cfg.control else { return std::future::pending().await };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| Error::Io(bind_err(addr, e)))?;
    tracing::info!(control = %addr, "control listener up");
    serve_with(listener, key, cfg.channel_options(), Some(local_options(cfg, guard))).await.map_err(Error::Io)
}

/// The same-host listener (pending forever when not configured). A stale socket file left by
/// an earlier run is replaced; the new one is 0600 (0660 with `local_gid`).
async fn same_host(cfg: &AgentConfig) -> Result<()> {
    let Some(path) = &cfg.local else { return std::future::pending().await };
    let listener = bind_local(path, cfg.local_gid)
        .map_err(|e| Error::Io(std::io::Error::new(e.kind(), format!("cannot listen on {}: {e}", path.display()))))?;
    tracing::info!(local = %path.display(), backend = %cfg.backend, "same-host listener up");
    let peers = PeerPolicy { uids: cfg.allowed_uids.clone() };
    serve_local_for(listener, local_options(cfg, None), peers).await.map_err(Error::Io)
}

/// The listener for refract's PostgreSQL server connections (pending forever when not
/// configured). Its waiting connections are the links' too: one [`LocalOptions::pg`] for all.
async fn postgres(cfg: &AgentConfig, guard: Option<SharedGuard>) -> Result<()> {
    let Some(addr) = cfg.postgres_listen else { return std::future::pending().await };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| Error::Io(bind_err(addr, e)))?;
    tracing::info!(postgres = %addr, backend = %cfg.backend, "PostgreSQL listener up");
    pg::serve_postgres(listener, local_options(cfg, guard)).await.map_err(Error::Io)
}

/// How adopted connections reach the backend, from the config.
fn local_options(cfg: &AgentConfig, guard: Option<SharedGuard>) -> LocalOptions {
    LocalOptions {
        backend: cfg.backend,
        backend_socket: cfg.backend_socket.clone(),
        pass_socket: cfg.pass_socket,
        backend_timeout: cfg.backend_timeout(),
        write_stall: cfg.write_stall(),
        guard,
        pg: WAITING.clone(),
    }
}

/// The PostgreSQL connections waiting for a client's socket: one registry for the process, so
/// that the links (which take the `HandOff`) and the PostgreSQL listener share it.
static WAITING: std::sync::LazyLock<Waiting> = std::sync::LazyLock::new(Waiting::default);

/// The guard, shared by the tasks that tombstone flows they hand back.
type SharedGuard = std::sync::Arc<std::sync::Mutex<refract_handover::Guard>>;

fn bind_err(addr: std::net::SocketAddr, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("cannot listen for control connections on {addr}: {e}"))
}
