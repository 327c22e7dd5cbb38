//! The in-band signals of the PostgreSQL result hand-over (docs/handover.md, "PostgreSQL").
//!
//! refract reaches a server that has an agent through the agent, which proxies the connection
//! and watches the results. The two ends agree on it before the startup message, with a
//! startup-phase packet of a code PostgreSQL itself refuses ([`HybridRequest`]); the agent
//! answers `H` and the connection's id, which names it in the hand-over messages. From then
//! on, besides PostgreSQL's own messages:
//! - agent → refract, [`WANT`]: the next row would bring a result to the threshold; the agent
//!   stopped forwarding at a message boundary before it and waits for the hand-off (on the hand-over link) or a [`RELAY`];
//! - refract → agent, [`RELAY`]: no hand-over for this result; forward the rest;
//! - agent → refract, [`DELIVERED`]: after a hand-over, the messages the agent wrote to the
//!   client itself other than rows and copy data (the rows are the bulk and change no
//!   session state), so refract's session follows the statements, errors and status.
//!
//! The tags are bytes PostgreSQL never uses (it uses ASCII letters and digits), so a marker
//! cannot be mistaken for a message of the protocol.

use bytes::{BufMut, BytesMut};

use crate::Error;

/// The startup-phase code of [`HybridRequest`] (1234.5710; SSLRequest is 1234.5679).
pub const HYBRID_REQUEST_CODE: i32 = (1234 << 16) | 5710;
/// Length of a [`HybridRequest`] packet.
pub const HYBRID_REQUEST_LEN: usize = 16;
/// The agent's answer to a [`HybridRequest`]: this byte, then the connection id (u64).
pub const HYBRID_ACCEPTED: u8 = b'H';
/// Agent → refract: a large result; waiting for the hand-off or [`RELAY`].
pub const WANT: u8 = 0xFE;
/// refract → agent: forward the rest of the result (no hand-over).
pub const RELAY: u8 = 0xFE;
/// Agent → refract: the non-row messages the agent delivered while it had the client.
pub const DELIVERED: u8 = 0xFD;

/// refract asks the agent to watch this connection's results: those of at least `threshold`
/// bytes are offered for hand-over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HybridRequest {
    /// Smallest result (bytes of rows or copy data) the agent asks about.
    pub threshold: u64,
}

impl HybridRequest {
    /// The packet: length 16, the code, the threshold.
    pub fn encode(&self, out: &mut BytesMut) {
        out.put_i32(HYBRID_REQUEST_LEN as i32);
        out.put_i32(HYBRID_REQUEST_CODE);
        out.put_u64(self.threshold);
    }

    /// Reads the packet from the first [`HYBRID_REQUEST_LEN`] bytes of a connection; `None`
    /// when they are something else (a plain startup packet).
    pub fn parse(first: &[u8]) -> Option<HybridRequest> {
        let b: &[u8; HYBRID_REQUEST_LEN] = first.get(..HYBRID_REQUEST_LEN)?.try_into().ok()?;
        let len = i32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let code = i32::from_be_bytes([b[4], b[5], b[6], b[7]]);
        if len != HYBRID_REQUEST_LEN as i32 || code != HYBRID_REQUEST_CODE {
            return None;
        }
        let mut t = [0u8; 8];
        t.copy_from_slice(&b[8..16]);
        Some(HybridRequest { threshold: u64::from_be_bytes(t) })
    }
}

/// The agent's acceptance: `H` and the connection id.
pub fn encode_accepted(id: u64, out: &mut BytesMut) {
    out.put_u8(HYBRID_ACCEPTED);
    out.put_u64(id);
}

/// The connection id from the agent's 9-byte answer.
pub fn parse_accepted(b: &[u8; 9]) -> Result<u64, Error> {
    if b[0] != HYBRID_ACCEPTED {
        return Err(Error::Malformed {
            from: crate::Side::Backend,
            reason: format!("the agent answered {:#04x} to the hybrid request: is it a refract agent?", b[0]),
        });
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&b[1..]);
    Ok(u64::from_be_bytes(id))
}

/// A marker message with a body: tag, length, body (as PostgreSQL frames its messages, so
/// either side's framing reads it).
pub fn encode_marker(tag: u8, body: &[u8], out: &mut BytesMut) {
    out.put_u8(tag);
    out.put_i32((body.len() + 4) as i32);
    out.put_slice(body);
}

/// The [`WANT`] marker: the bytes of the result forwarded so far.
pub fn encode_want(so_far: u64, out: &mut BytesMut) {
    encode_marker(WANT, &so_far.to_be_bytes(), out);
}

/// Whether a backend message of this tag is part of a result's bulk (rows or copy data), which
/// the [`DELIVERED`] digest leaves out. Notices and notifications are left out too: they go to
/// the client and change no session state.
pub fn is_bulk(tag: u8) -> bool {
    matches!(tag, b'D' | b'd' | b'N' | b'A')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_round_trips_and_nothing_else_reads_as_one() {
        let mut out = BytesMut::new();
        HybridRequest { threshold: 65536 }.encode(&mut out);
        assert_eq!(out.len(), HYBRID_REQUEST_LEN);
        assert_eq!(HybridRequest::parse(&out), Some(HybridRequest { threshold: 65536 }));
        let mut ssl = BytesMut::new();
        ssl.put_i32(8);
        ssl.put_i32(crate::startup::SSL_REQUEST_CODE);
        ssl.put_u64(0);
        assert_eq!(HybridRequest::parse(&ssl), None, "an SSLRequest is not a hybrid request");
        assert_eq!(HybridRequest::parse(&out[..15]), None, "short");
    }

    #[test]
    fn the_acceptance_carries_the_id() {
        let mut out = BytesMut::new();
        encode_accepted(42, &mut out);
        let b: [u8; 9] = out[..].try_into().unwrap();
        assert_eq!(parse_accepted(&b).unwrap(), 42);
        let mut e = b;
        e[0] = b'E';
        assert!(parse_accepted(&e).is_err(), "a PostgreSQL error is no acceptance");
    }

    #[test]
    fn markers_are_framed_like_messages() {
        let mut out = BytesMut::new();
        encode_want(7, &mut out);
        let h = crate::frame::peek(&out, crate::Side::Backend, &crate::Limits::default()).unwrap().unwrap();
        assert_eq!((h.tag, h.total), (WANT, 13));
    }
}
