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
}
