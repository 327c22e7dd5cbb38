//! [`Carrier`]: what a link between dispatcher and agent does, whichever transport carries it,
//! so that each side writes its exchanges once.
//!
//! Two carriers: [`crate::local::LocalLink`] (same host, a Unix stream; a [`crate::Socket::Passed`]
//! transfer brings the descriptor beside its frame) and [`crate::control::ControlChannel`]
//! (across hosts, authenticated TCP with heartbeats; a transfer brings its TCP_REPAIR state).
//! Each refuses what it cannot carry, sending or receiving, as a codec error.

use std::convert::Infallible;
use std::future::Future;
use std::os::fd::{BorrowedFd, OwnedFd};

use crate::error::{Error, Result};
use crate::msg::Msg;

/// A link that carries [`Msg`]s between dispatcher and agent.
pub trait Carrier {
    /// Whether the dispatcher keeps its own descriptor of a socket it hands over (same host):
    /// then an agent's [`Msg::Idle`] means the dispatcher can take the connection back.
    const SAME_HOST: bool;

    /// Sends `msg`, with `fd` exactly when the message carries the client socket.
    fn send(&mut self, msg: &Msg, fd: Option<BorrowedFd<'_>>) -> impl Future<Output = Result<()>> + Send;

    /// The peer's next message, with the socket it brought (only a [`Msg::carries_fd`] one).
    fn recv(&mut self) -> impl Future<Output = Result<(Msg, Option<OwnedFd>)>> + Send;

    /// Keeps the link alive while this side is busy elsewhere; returns only on failure.
    fn beat(&mut self) -> impl Future<Output = Result<Infallible>> + Send;
}

/// Whether a Unix link may carry `msg`: no handshake, no heartbeat (the peer is checked by its
/// credentials, and a dead peer closes the stream), no TCP_REPAIR state.
pub(crate) fn local_may_carry(msg: &Msg) -> Result<()> {
    if msg.is_handshake() || *msg == Msg::Heartbeat {
        return Err(Error::Codec("a TCP-only message on a same-host link"));
    }
    if msg.repairs() {
        return Err(Error::Codec("a TCP_REPAIR transfer on a same-host link"));
    }
    Ok(())
}

/// Whether the TCP channel may carry `msg`: no descriptor crosses hosts.
pub(crate) fn tcp_may_carry(msg: &Msg) -> Result<()> {
    if msg.carries_fd() {
        return Err(Error::Codec("a passed socket on a TCP channel"));
    }
    Ok(())
}

/// Whether `socket` is the kind the side-by-side descriptor `fd` says it is.
pub(crate) fn fd_matches(msg: &Msg, fd: bool) -> Result<()> {
    if msg.carries_fd() != fd {
        return Err(Error::Codec("descriptor does not match the message kind"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::transfer::{Serving, Socket, Transfer};
    use crate::FlowKey;

    fn hand_off(socket: Socket) -> Msg {
        Msg::HandOff(Box::new(Transfer {
            conn: 1,
            epoch: 1,
            socket,
            pending: vec![],
            serving: Serving::default(),
            sent: 0,
        }))
    }

    #[test]
    fn each_carrier_refuses_what_it_cannot_carry() {
        let flow = FlowKey::new("198.18.0.1:1".parse().unwrap(), "198.18.0.2:2".parse().unwrap());
        let repair = hand_off(Socket::Repair { flow, tcp_state: crate::tcp_state::tests::sample() });
        let passed = hand_off(Socket::Passed);
        assert!(local_may_carry(&passed).is_ok());
        assert!(local_may_carry(&repair).is_err());
        assert!(local_may_carry(&Msg::Heartbeat).is_err());
        assert!(local_may_carry(&Msg::Proof { proof: [0; 32] }).is_err());
        assert!(tcp_may_carry(&repair).is_ok());
        assert!(tcp_may_carry(&passed).is_err());
        assert!(fd_matches(&passed, true).is_ok() && fd_matches(&passed, false).is_err());
        assert!(fd_matches(&repair, false).is_ok() && fd_matches(&repair, true).is_err());
    }
}
