//! [`Transfer`]: one client connection moving between dispatcher and agent, and its fields'
//! encoding inside a `HandOff` or `HandBack` frame.
//!
//! Layout: `conn u64`, `epoch u64`, the socket (a tag byte: 0 passed beside the frame, 1
//! TCP_REPAIR state with the flow), the pending bytes (`u32` length + bytes), the serving
//! options (`idle_ms u32`, then the backend: 0 for none, else an address), `sent u64`.

use std::net::SocketAddr;

use bytes::{BufMut, BytesMut};

use crate::bpf::FlowKey;
use crate::error::{Error, Result};
use crate::tcp_state::TcpState;
use crate::wire::{self, Reader};

/// One connection moving between dispatcher and agent: sent with [`crate::Msg::HandOff`] and
/// [`crate::Msg::HandBack`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    /// The dispatcher's id of the client connection.
    pub conn: u64,
    /// The epoch of this transfer (each transfer of a flow increments it).
    pub epoch: u64,
    /// How the socket itself travels.
    pub socket: Socket,
    /// Bytes read from the client and not consumed: in a hand-off, the request to serve and
    /// anything pipelined behind it; in a hand-back, what follows the last response served.
    pub pending: Vec<u8>,
    /// In a hand-off, how the agent serves the connection; the default in a hand-back.
    pub serving: Serving,
    /// In a hand-back (or `Closed`): bytes the agent wrote to the client while it owned the
    /// connection (for metrics). 0 in a hand-off.
    pub sent: u64,
}

/// How a moved socket travels: the carrier decides which one it can take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Socket {
    /// Same host: the descriptor rides beside the frame (SCM_RIGHTS on its first byte).
    Passed,
    /// Across hosts: the TCP_REPAIR state to restore, and the flow the steering map keys.
    Repair {
        /// The client's flow (client → VIP).
        flow: FlowKey,
        /// The TCP state to restore.
        tcp_state: TcpState,
    },
}

/// What a hand-off tells the agent about serving the connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Serving {
    /// How long the agent waits for the client's next request (at a request boundary with
    /// nothing buffered) before it hands the connection back; 0 = hand back at once.
    pub idle_ms: u32,
    /// The backend the requests are for: an agent refuses one it does not front. `None`: the
    /// one it fronts (the cross-host dispatcher knows the agent, not its backend).
    pub backend: Option<SocketAddr>,
}

mod tag {
    pub const PASSED: u8 = 0;
    pub const REPAIR: u8 = 1;
    pub const NO_BACKEND: u8 = 0;
}

pub(crate) fn put_transfer(out: &mut BytesMut, t: &Transfer) {
    out.put_u64(t.conn);
    out.put_u64(t.epoch);
    match &t.socket {
        Socket::Passed => out.put_u8(tag::PASSED),
        Socket::Repair { flow, tcp_state } => {
            out.put_u8(tag::REPAIR);
            wire::put_flow(out, flow);
            wire::put_tcp_state(out, tcp_state);
        }
    }
    wire::put_blob(out, &t.pending);
    out.put_u32(t.serving.idle_ms);
    match &t.serving.backend {
        None => out.put_u8(tag::NO_BACKEND),
        Some(a) => wire::put_addr(out, a),
    }
    out.put_u64(t.sent);
}

pub(crate) fn transfer(r: &mut Reader<'_>) -> Result<Transfer> {
    let (conn, epoch) = (r.u64()?, r.u64()?);
    let socket = match r.u8()? {
        tag::PASSED => Socket::Passed,
        tag::REPAIR => Socket::Repair { flow: r.flow()?, tcp_state: r.tcp_state()? },
        _ => return Err(Error::Codec("unknown socket tag")),
    };
    let pending = r.blob()?;
    let idle_ms = r.u32()?;
    let backend = match r.u8()? {
        tag::NO_BACKEND => None,
        family => Some(r.addr_of(family)?),
    };
    Ok(Transfer { conn, epoch, socket, pending, serving: Serving { idle_ms, backend }, sent: r.u64()? })
}
