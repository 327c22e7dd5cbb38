//! The hand-over error type: each error says whose fault it was and whether a retry may help.

use std::io;

/// Whose fault an error is: `Client` when the client's connection is not in a state that can
/// move (closed, half-closed, reset); `Backend` when the peer of the control channel (an agent
/// or a dispatcher) failed or misbehaved; `Internal` for this host (a system call, a map, a
/// missing capability).
pub use refract_vocab::Side;

/// What can go wrong while moving a connection.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call failed; `op` names the step (e.g. `"setsockopt(TCP_REPAIR)"`).
    #[error("{op}: {source}")]
    Sys {
        /// The step that failed.
        op: &'static str,
        /// The cause.
        source: io::Error,
    },
    /// The socket is not ESTABLISHED (the `tcpi_state` it has instead); it cannot move.
    #[error("connection not established (tcp state {0})")]
    NotEstablished(u8),
    /// Unacknowledged bytes remain (docs/handover.md, I3); relay instead or try again later.
    #[error("connection not quiescent: {0} bytes unacknowledged")]
    NotQuiescent(u32),
    /// A queue changed while the snapshot was taken (★ step 8); the socket was resumed locally.
    #[error("{0} queue moved during the snapshot")]
    QueueMoved(&'static str),
    /// Peeking a queue returned another length than the kernel reported.
    #[error("{queue} queue: expected {expected} bytes, read {got}")]
    QueueLength {
        /// Which queue.
        queue: &'static str,
        /// The length SIOCINQ/SIOCOUTQ reported.
        expected: u32,
        /// What `recv(MSG_PEEK)` returned.
        got: usize,
    },
    /// A snapshot that cannot be restored (e.g. addresses of different families).
    #[error("invalid tcp state: {0}")]
    InvalidState(&'static str),
    /// Loading, attaching or using an eBPF program or map failed.
    #[error("bpf: {0}")]
    Bpf(String),
    /// The redirect map has no room for another flow; relay instead.
    #[error("redirect map full ({0} entries)")]
    MapFull(u32),
    /// A control message is malformed.
    #[error("bad control message: {0}")]
    Codec(&'static str),
    /// The control peer failed authentication (wrong key or wrong proof).
    #[error("control peer not authenticated")]
    Auth,
    /// A control message carried an epoch other than the one expected.
    #[error("stale epoch {got} (expected {expected})")]
    StaleEpoch {
        /// The epoch expected.
        expected: u64,
        /// The epoch received.
        got: u64,
    },
    /// The control peer sent nothing (not even a heartbeat) for this long; it is declared dead.
    #[error("control peer silent for {0:?}: declared dead")]
    PeerDead(std::time::Duration),
    /// The control peer closed the channel.
    #[error("control peer closed the channel")]
    Closed,
    /// I/O on the control channel or the fd-passing socket failed.
    #[error("control channel: {0}")]
    Io(#[from] io::Error),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps the current `errno` of a failed system call.
    pub(crate) fn last_os(op: &'static str) -> Self {
        Error::Sys { op, source: io::Error::last_os_error() }
    }

    /// Wraps a `nix` error of a failed system call.
    pub(crate) fn nix(op: &'static str, e: nix::Error) -> Self {
        Error::Sys { op, source: io::Error::from(e) }
    }

    /// Whose fault it is.
    pub fn side(&self) -> Side {
        match self {
            Error::NotEstablished(_) => Side::Client,
            Error::Codec(_)
            | Error::Auth
            | Error::StaleEpoch { .. }
            | Error::PeerDead(_)
            | Error::Closed
            | Error::Io(_) => Side::Backend,
            Error::Sys { .. }
            | Error::NotQuiescent(_)
            | Error::QueueMoved(_)
            | Error::QueueLength { .. }
            | Error::InvalidState(_)
            | Error::Bpf(_)
            | Error::MapFull(_) => Side::Internal,
        }
    }

    /// Whether trying the same hand-over again later may succeed. Callers relay the current
    /// request either way; this only says whether the next one is worth a hand-over attempt.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::NotQuiescent(_) | Error::QueueMoved(_) | Error::MapFull(_) => true,
            Error::Sys { source, .. } => {
                matches!(source.raw_os_error(), Some(libc::EAGAIN | libc::ENOMEM | libc::ENOBUFS | libc::EINTR))
            }
            _ => false,
        }
    }
}
