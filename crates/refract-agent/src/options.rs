//! [`LocalOptions`]: how adopted and forwarded connections reach the backend and how long they
//! may wait, shared by the same-host and the cross-host paths.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the same-host listener needs.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    /// The backend this agent fronts.
    pub backend: SocketAddr,
    /// Connect to the backend over this Unix socket instead (`backend_socket`).
    pub backend_socket: Option<std::path::PathBuf>,
    /// Pass the client's socket to the backend for large results (`pass_socket`).
    pub pass_socket: bool,
    /// Bound on connecting to the backend and on each of its reads.
    pub backend_timeout: Duration,
    /// Bound on a write to an adopted client making no progress (`write_stall_ms`).
    pub write_stall: Duration,
    /// The guard on this host's NIC (cross host): a flow being handed back is tombstoned in it.
    pub guard: Option<Arc<Mutex<refract_handover::Guard>>>,
    /// PostgreSQL server connections waiting for the client's socket (`postgres_listen`).
    pub pg: crate::waiting::Waiting,
}

impl LocalOptions {
    /// Refuses a hand-off meant for another backend than the one this agent fronts (`None`:
    /// the dispatcher did not say, as across hosts); `Err` is the refusal reason.
    pub(crate) fn fronts(&self, backend: Option<SocketAddr>) -> Result<(), String> {
        match backend {
            Some(b) if b != self.backend => Err(format!("this agent fronts {}, not {b}", self.backend)),
            _ => Ok(()),
        }
    }
}
