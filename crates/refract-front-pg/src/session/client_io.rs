//! The client side of a session ([`ClientIo`]): the client's connection, the bytes gathered
//! for it and not yet written, and, after a hand-over, what the agent delivered to the client
//! itself, read again (muted) before the server's next messages. A field of the session; what
//! touches only it is here, what also needs the session's other parts (a listening client's
//! notifications, the phase) is the session's (`relay`, `listen`).

use crate::client::wire::{Frame, Wire, KEEP_CAPACITY};
use crate::error::PgError;
use bytes::{Bytes, BytesMut};
use refract_pg::frame::{self, Limits};
use refract_pg::Side;

/// A session's client side.
pub(crate) struct ClientIo {
    pub wire: Wire,
    /// Bytes to the client not yet written.
    pub out: BytesMut,
    /// After a hand-over: the messages the agent delivered to the client itself (rows left
    /// out), read before the server's next ones; while it is set, nothing goes to the client
    /// (`handover.rs`).
    replay: Option<BytesMut>,
}

/// Whether a flush wrote, or the client already has what was gathered (a replay runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replay {
    /// No replay runs: the gathered bytes go to the client.
    Off,
    /// A replay runs: the gathered bytes were dropped, the client has them from the agent.
    Muted,
}

impl ClientIo {
    /// The client side of `wire`, nothing gathered yet.
    pub(crate) fn new(wire: Wire) -> ClientIo {
        ClientIo { wire, out: BytesMut::new(), replay: None }
    }

    /// After a hand-over: what the agent delivered is read next, muted.
    pub(crate) fn replay_delivered(&mut self, delivered: Bytes) {
        self.replay = Some(BytesMut::from(&delivered[..]));
    }

    /// The next message of a replay, while it lasts. At its end, what was gathered for the
    /// client meanwhile is dropped: the client has it from the agent.
    pub(crate) fn next_replayed(&mut self) -> Result<Option<Frame>, PgError> {
        let Some(r) = self.replay.as_mut() else { return Ok(None) };
        if let Some(h) = frame::peek(r, Side::Backend, &Limits::default())? {
            return Ok(Some((h.tag, r.split_to(h.total).freeze())));
        }
        self.replay = None;
        self.out.clear();
        Ok(None)
    }

    /// Before a flush: while a replay runs, what is gathered is dropped (the client has it),
    /// and the replay ends once all of it has been read.
    pub(crate) fn mute_replayed(&mut self) -> Replay {
        let Some(r) = &self.replay else { return Replay::Off };
        if r.is_empty() {
            self.replay = None;
        }
        self.out.clear();
        Replay::Muted
    }

    /// Writes the gathered bytes to the client.
    pub(crate) async fn write_out(&mut self) -> Result<(), PgError> {
        if !self.out.is_empty() {
            self.wire.send(&self.out).await?;
            self.out.clear();
            if self.out.capacity() > KEEP_CAPACITY {
                self.out = BytesMut::new(); // grown for one large message: give it back
            }
        }
        Ok(())
    }

    /// The client wire's byte count.
    pub(crate) fn sent(&self) -> u64 {
        self.wire.sent()
    }
}
