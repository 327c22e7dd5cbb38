//! Moving a live client TCP connection between hosts or processes.
//!
//! This is the foundation of refract's hand-over (`docs/handover.md`: the protocol, "The
//! protocol", and what is built on it): it knows sockets, eBPF maps and control messages,
//! never an application protocol. It is the only crate of the workspace with `unsafe` code; every
//! block says why it is sound.
//!
//! # Layout
//! - [`TcpState`] (`tcp_state.rs`): the plain, serializable state of one connection.
//! - [`snapshot`] / [`Repair`] (`snapshot.rs`): source side, TCP_REPAIR in the protocol's order.
//! - [`restore`] (`restore.rs`): target side, rebuilds the socket from a [`TcpState`].
//! - [`quiesce`] (`quiesce.rs`): waits until the peer acknowledged everything (I3), asking for
//!   an ACK it holds back instead of waiting for its delayed-ACK timer.
//! - [`Rules`]: the ★ rules, each switchable only so tests can show why it exists.
//! - [`Steering`] (`steering.rs`): the dispatcher's ingress program, FREEZE / STEER per flow.
//! - [`Guard`] (`guard.rs`): the agent host's no-RST guard and its tombstones.
//! - [`send_fd`] / [`recv_fd`] (`fd_pass.rs`): same-host hand-over by SCM_RIGHTS.
//! - [`Msg`], [`msg::parse`], [`msg::encode`] (`msg.rs`): every message dispatcher ↔ agent and
//!   their one pure codec; [`Transfer`], [`Socket`], [`Serving`] (`transfer.rs`): a moving
//!   connection; `wire.rs`: field encoding.
//! - [`EpochTracker`] (`epoch.rs`): per-connection transfer epochs; stale messages refused.
//! - [`Carrier`] (`carrier.rs`): a link that carries the messages, and what each may carry.
//! - [`local`]: the same-host carrier, [`local::LocalLink`] (Unix stream, SCM_RIGHTS).
//! - [`control`]: the cross-host carrier, [`control::ControlChannel`] (TCP, HMAC-SHA256
//!   authentication, heartbeats).
//! - [`seam`]: the dispatcher's hand-over client, protocol-neutral ([`seam::hand_off`],
//!   [`seam::take_back`]); a front end implements [`seam::Seam`] for what only it knows.
//! - [`across`]: the dispatcher's cross-host move for any protocol (quiesce, FREEZE, snapshot,
//!   STEER, `HandOff`, restore at the hand-back; [`across::steer`]: its ingress map), and why a
//!   hand-over did not happen ([`across::Declined`]).
//! - [`config`]: the dispatcher's `[handover]` section (mode, threshold, agents), shared by
//!   the front ends.
//! - [`metrics`]: the hand-over's metric families, shared by the front ends.
//! - [`FlowKey`] and the embedded objects (`bpf.rs`; C sources in `bpf/`, built by build.rs).
//! - `sys.rs`: the raw socket options and ioctls, descriptors received by SCM_RIGHTS, the
//!   `Pod` promises of the map types (every `unsafe` of the crate lives here);
//!   [`queued_bytes`].
//! - [`Error`] (`error.rs`): what failed, whose fault, whether to retry.

// `unsafe` only in `sys.rs` (the `allow` on `mod sys` below); everywhere else it is an error.
#![deny(unsafe_code)]

pub mod across;
mod bpf;
mod carrier;
pub mod config;
pub mod control;
mod epoch;
mod error;
mod fd_pass;
mod guard;
pub mod local;
pub mod metrics;
pub mod msg;
mod quiesce;
mod restore;
pub mod seam;
mod snapshot;
mod steering;
#[allow(unsafe_code)]
mod sys;
mod tcp_state;
mod transfer;
mod wire;

pub use bpf::FlowKey;
pub use carrier::Carrier;
pub use epoch::EpochTracker;
pub use error::{Error, Result, Side};
pub use fd_pass::{recv_fd, recv_with_fd, send_fd, send_with_fd};
pub use guard::{Guard, GuardStats};
pub use msg::{Msg, MAX_FRAME, NONCE_LEN, VERSION};
pub use quiesce::quiesce;
pub use restore::restore;
#[doc(hidden)]
pub use restore::restore_with;
pub use snapshot::{conn_info, discard, discard_in_place, resume, snapshot, unacked, unsent, ConnInfo, Repair};
pub use steering::{FlowAction, FlowEntry, SteerTarget, Steering, SteeringStats};
pub use sys::queued_bytes;
pub use tcp_state::{RepairWindow, SockOpts, TcpOptions, TcpState};
pub use transfer::{Serving, Socket, Transfer};

/// The ★ rules of the protocol (docs/handover.md) that snapshot and restore follow. Production code
/// always uses [`Rules::ALL`]; the switches exist so the negative-control tests can show each
/// failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// Snapshot 4: select the SEND repair queue right after repair on.
    pub select_send_queue_first: bool,
    /// Snapshot 8: re-check `SIOCOUTQNSD` and the receive sequence after reading the queues.
    pub recheck_queues: bool,
    /// Restore 2: `TCP_MAXSEG` before `connect`.
    pub maxseg_before_connect: bool,
    /// Restore 9: `SO_REUSEADDR` again after repair off.
    pub reuseaddr_after_repair: bool,
}

impl Rules {
    /// Every rule on.
    pub const ALL: Rules = Rules {
        select_send_queue_first: true,
        recheck_queues: true,
        maxseg_before_connect: true,
        reuseaddr_after_repair: true,
    };
}

impl Default for Rules {
    fn default() -> Self {
        Rules::ALL
    }
}
