//! `Msg`: everything dispatcher and agent say to each other, over either carrier, and its pure
//! length-prefixed codec.
//!
//! A frame is `len: u32` (big-endian, the bytes that follow, at most [`MAX_FRAME`]), a kind
//! byte, then the kind's fields: integers big-endian, byte strings as `u32` length + bytes,
//! reasons as `u16` length + UTF-8. A frame must be consumed exactly: trailing bytes are an error.
//! Which kinds a carrier takes is the carrier's rule (`carrier.rs`), not the codec's: the
//! handshake and heartbeats travel only over TCP, a passed socket only over a Unix link.

use bytes::{BufMut, BytesMut};

use crate::error::{Error, Result};
use crate::transfer::{put_transfer, transfer, Socket, Transfer};
use crate::wire::{self, Reader};

/// The largest frame (after the length prefix) either side accepts: room for a full send and
/// receive queue plus buffered requests. A longer length prefix is refused before buffering.
pub const MAX_FRAME: usize = 32 << 20;

/// Length of a handshake nonce and of an HMAC-SHA256 proof.
pub const NONCE_LEN: usize = 32;

/// The protocol version carried in [`Msg::Hello`]. 2: `Next`, `Serve`, `Return`, serving
/// options in a `HandOff`. 3: one vocabulary for both carriers (a [`Transfer`] says how its
/// socket travels and carries typed [`crate::Serving`] options; `Closed` has a reason; `Idle`).
pub const VERSION: u16 = 3;

/// A hand-over message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// Handshake 1 (TCP), connector → acceptor: protocol version and the connector's nonce.
    Hello {
        /// [`VERSION`].
        version: u16,
        /// Fresh random bytes.
        nonce: [u8; NONCE_LEN],
    },
    /// Handshake 2 (TCP), acceptor → connector: its nonce and its proof over both nonces.
    Challenge {
        /// Fresh random bytes.
        nonce: [u8; NONCE_LEN],
        /// HMAC-SHA256 proving the acceptor holds the key.
        proof: [u8; NONCE_LEN],
    },
    /// Handshake 3 (TCP), connector → acceptor: the connector's proof over both nonces.
    Proof {
        /// HMAC-SHA256 proving the connector holds the key.
        proof: [u8; NONCE_LEN],
    },
    /// Keeps an idle TCP channel alive; never returned by [`crate::control::ControlChannel::recv`].
    Heartbeat,
    /// Agent → dispatcher (hybrid): the result of `request` on `conn` is large; hand the client
    /// over, or say [`Msg::RelayInstead`]. The agent holds the result meanwhile.
    WantConnection {
        /// The client connection.
        conn: u64,
        /// The request whose result is large.
        request: u64,
    },
    /// Dispatcher → agent: adopt this connection and serve the requests in its pending bytes.
    HandOff(Box<Transfer>),
    /// Agent → dispatcher: adopted; the agent owns the connection at `epoch`.
    HandOffOk {
        /// The client connection.
        conn: u64,
        /// The epoch of the hand-off.
        epoch: u64,
    },
    /// Agent → dispatcher: not adopted, nothing was written to the client; the dispatcher
    /// keeps (or restores) the connection and relays.
    HandOffErr {
        /// The client connection.
        conn: u64,
        /// The epoch of the hand-off.
        epoch: u64,
        /// Why (for logs and metrics).
        reason: String,
    },
    /// Agent → dispatcher: take the connection back at this request boundary.
    HandBack(Box<Transfer>),
    /// Dispatcher → agent: restored; the agent may drop its tombstone after the grace period
    /// (the same-host dispatcher need not send it).
    HandBackOk {
        /// The client connection.
        conn: u64,
        /// The epoch of the hand-back.
        epoch: u64,
    },
    /// Agent → dispatcher: the connection must end (the client closed, a response was cut
    /// short, or no hand-back was possible); the dispatcher closes its copy.
    Closed {
        /// The client connection.
        conn: u64,
        /// The epoch the agent owned it at.
        epoch: u64,
        /// Bytes the agent wrote to the client while it owned the connection (for metrics).
        sent: u64,
        /// Why (for logs and metrics).
        reason: String,
    },
    /// Dispatcher → agent: no hand-over for this request; send the result as [`Msg::Response`]s.
    RelayInstead {
        /// The client connection.
        conn: u64,
        /// The request.
        request: u64,
        /// Why (for logs).
        reason: String,
    },
    /// Dispatcher → agent (hybrid): send this request to the backend; relay a result below
    /// `threshold` bytes in [`Msg::Response`] frames, else ask with [`Msg::WantConnection`].
    Forward {
        /// The client connection.
        conn: u64,
        /// The request's number on this connection.
        request: u64,
        /// Results of at least this many bytes are handed over.
        threshold: u64,
        /// The whole request (head and body).
        bytes: Vec<u8>,
    },
    /// Agent → dispatcher (hybrid): a piece of a small result, for the dispatcher to relay.
    Response {
        /// The client connection.
        conn: u64,
        /// The request this answers.
        request: u64,
        /// The result's last frame.
        last: bool,
        /// With `last`: whether the connection may carry another request.
        keep: bool,
        /// The response bytes (head and body, in order).
        bytes: Vec<u8>,
    },
    /// Agent → dispatcher, while the agent owns `conn`: the client sent another whole request;
    /// may the agent serve it? Answered by [`Msg::Serve`] or [`Msg::Return`].
    Next {
        /// The client connection.
        conn: u64,
        /// The agent's number of this request within its ownership of `conn` (1, 2, …).
        request: u64,
        /// The whole request (head and body).
        bytes: Vec<u8>,
    },
    /// Dispatcher → agent: serve request `request` of [`Msg::Next`] from your backend.
    Serve {
        /// The client connection.
        conn: u64,
        /// The request.
        request: u64,
    },
    /// Dispatcher → agent: do not serve it; hand the connection back with the request pending.
    Return {
        /// The client connection.
        conn: u64,
        /// The request.
        request: u64,
    },
    /// Agent → dispatcher, same host, while the agent owns `conn`: the response to `request`
    /// (0: the one the connection was handed over for) is written whole and the agent waits for
    /// the client's next request. Should the link end now, the dispatcher takes the connection
    /// back (it kept its own descriptor).
    Idle {
        /// The client connection.
        conn: u64,
        /// The agent's number of the request answered last.
        request: u64,
    },
}

mod kind {
    pub const HELLO: u8 = 1;
    pub const CHALLENGE: u8 = 2;
    pub const PROOF: u8 = 3;
    pub const HEARTBEAT: u8 = 10;
    pub const WANT_CONNECTION: u8 = 11;
    pub const HAND_OFF: u8 = 12;
    pub const HAND_OFF_OK: u8 = 13;
    pub const HAND_OFF_ERR: u8 = 14;
    pub const HAND_BACK: u8 = 15;
    pub const HAND_BACK_OK: u8 = 16;
    pub const CLOSED: u8 = 17;
    pub const RELAY_INSTEAD: u8 = 18;
    pub const FORWARD: u8 = 19;
    pub const RESPONSE: u8 = 20;
    pub const NEXT: u8 = 21;
    pub const SERVE: u8 = 22;
    pub const RETURN: u8 = 23;
    pub const IDLE: u8 = 24;
}

impl Msg {
    /// Whether this message belongs to the authentication handshake.
    pub fn is_handshake(&self) -> bool {
        matches!(self, Msg::Hello { .. } | Msg::Challenge { .. } | Msg::Proof { .. })
    }

    /// Whether this message travels with the client socket beside it (a transfer whose socket
    /// is [`Socket::Passed`]).
    pub fn carries_fd(&self) -> bool {
        matches!(self, Msg::HandOff(t) | Msg::HandBack(t) if t.socket == Socket::Passed)
    }

    /// Whether this message moves a socket by its TCP_REPAIR state.
    pub fn repairs(&self) -> bool {
        matches!(self, Msg::HandOff(t) | Msg::HandBack(t) if matches!(t.socket, Socket::Repair { .. }))
    }

    /// A short name for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Msg::Hello { .. } => "Hello",
            Msg::Challenge { .. } => "Challenge",
            Msg::Proof { .. } => "Proof",
            Msg::Heartbeat => "Heartbeat",
            Msg::WantConnection { .. } => "WantConnection",
            Msg::HandOff(_) => "HandOff",
            Msg::HandOffOk { .. } => "HandOffOk",
            Msg::HandOffErr { .. } => "HandOffErr",
            Msg::HandBack(_) => "HandBack",
            Msg::HandBackOk { .. } => "HandBackOk",
            Msg::Closed { .. } => "Closed",
            Msg::RelayInstead { .. } => "RelayInstead",
            Msg::Forward { .. } => "Forward",
            Msg::Response { .. } => "Response",
            Msg::Next { .. } => "Next",
            Msg::Serve { .. } => "Serve",
            Msg::Return { .. } => "Return",
            Msg::Idle { .. } => "Idle",
        }
    }
}

/// Appends `msg` as one frame. A message longer than [`MAX_FRAME`] is encoded anyway; the peer
/// refuses it, so callers keep transfers under the limit (relay instead).
pub fn encode(msg: &Msg, out: &mut BytesMut) {
    let start = out.len();
    out.put_u32(0); // patched below
    encode_body(msg, out);
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_be_bytes());
}

fn encode_body(msg: &Msg, out: &mut BytesMut) {
    match msg {
        Msg::Hello { version, nonce } => {
            out.put_u8(kind::HELLO);
            out.put_u16(*version);
            out.put_slice(nonce);
        }
        Msg::Challenge { nonce, proof } => {
            out.put_u8(kind::CHALLENGE);
            out.put_slice(nonce);
            out.put_slice(proof);
        }
        Msg::Proof { proof } => {
            out.put_u8(kind::PROOF);
            out.put_slice(proof);
        }
        Msg::Heartbeat => out.put_u8(kind::HEARTBEAT),
        Msg::WantConnection { conn, request } => put_ids(out, kind::WANT_CONNECTION, *conn, *request),
        Msg::HandOff(t) => {
            out.put_u8(kind::HAND_OFF);
            put_transfer(out, t);
        }
        Msg::HandOffOk { conn, epoch } => put_ids(out, kind::HAND_OFF_OK, *conn, *epoch),
        Msg::HandOffErr { conn, epoch, reason } => {
            put_ids(out, kind::HAND_OFF_ERR, *conn, *epoch);
            wire::put_string(out, reason);
        }
        Msg::HandBack(t) => {
            out.put_u8(kind::HAND_BACK);
            put_transfer(out, t);
        }
        Msg::HandBackOk { conn, epoch } => put_ids(out, kind::HAND_BACK_OK, *conn, *epoch),
        Msg::Closed { conn, epoch, sent, reason } => {
            put_ids(out, kind::CLOSED, *conn, *epoch);
            out.put_u64(*sent);
            wire::put_string(out, reason);
        }
        Msg::RelayInstead { conn, request, reason } => {
            put_ids(out, kind::RELAY_INSTEAD, *conn, *request);
            wire::put_string(out, reason);
        }
        Msg::Forward { conn, request, threshold, bytes } => {
            put_ids(out, kind::FORWARD, *conn, *request);
            out.put_u64(*threshold);
            wire::put_blob(out, bytes);
        }
        Msg::Response { conn, request, last, keep, bytes } => {
            put_ids(out, kind::RESPONSE, *conn, *request);
            out.put_u8(u8::from(*last) | u8::from(*keep) << 1);
            wire::put_blob(out, bytes);
        }
        Msg::Next { conn, request, bytes } => {
            put_ids(out, kind::NEXT, *conn, *request);
            wire::put_blob(out, bytes);
        }
        Msg::Serve { conn, request } => put_ids(out, kind::SERVE, *conn, *request),
        Msg::Return { conn, request } => put_ids(out, kind::RETURN, *conn, *request),
        Msg::Idle { conn, request } => put_ids(out, kind::IDLE, *conn, *request),
    }
}

fn put_ids(out: &mut BytesMut, kind: u8, a: u64, b: u64) {
    out.put_u8(kind);
    out.put_u64(a);
    out.put_u64(b);
}

/// Parses one frame from the start of `buf`: `Ok(None)` when more bytes are needed, else the
/// message and how many bytes it used. Never panics; a length prefix above [`MAX_FRAME`] is an
/// error as soon as the prefix is complete.
pub fn parse(buf: &[u8]) -> Result<Option<(Msg, usize)>> {
    let Some(prefix) = buf.get(..4) else { return Ok(None) };
    let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
    if len == 0 {
        return Err(Error::Codec("empty frame"));
    }
    if len > MAX_FRAME {
        return Err(Error::Codec("frame longer than MAX_FRAME"));
    }
    let Some(body) = buf.get(4..4 + len) else { return Ok(None) };
    let mut r = Reader::new(body);
    let msg = parse_body(&mut r)?;
    if !r.is_empty() {
        return Err(Error::Codec("trailing bytes in frame"));
    }
    Ok(Some((msg, 4 + len)))
}

fn parse_body(r: &mut Reader<'_>) -> Result<Msg> {
    Ok(match r.u8()? {
        kind::HELLO => Msg::Hello { version: r.u16()?, nonce: r.array()? },
        kind::CHALLENGE => Msg::Challenge { nonce: r.array()?, proof: r.array()? },
        kind::PROOF => Msg::Proof { proof: r.array()? },
        kind::HEARTBEAT => Msg::Heartbeat,
        kind::WANT_CONNECTION => Msg::WantConnection { conn: r.u64()?, request: r.u64()? },
        kind::HAND_OFF => Msg::HandOff(Box::new(transfer(r)?)),
        kind::HAND_OFF_OK => Msg::HandOffOk { conn: r.u64()?, epoch: r.u64()? },
        kind::HAND_OFF_ERR => Msg::HandOffErr { conn: r.u64()?, epoch: r.u64()?, reason: r.string()? },
        kind::HAND_BACK => Msg::HandBack(Box::new(transfer(r)?)),
        kind::HAND_BACK_OK => Msg::HandBackOk { conn: r.u64()?, epoch: r.u64()? },
        kind::CLOSED => Msg::Closed { conn: r.u64()?, epoch: r.u64()?, sent: r.u64()?, reason: r.string()? },
        kind::RELAY_INSTEAD => Msg::RelayInstead { conn: r.u64()?, request: r.u64()?, reason: r.string()? },
        kind::FORWARD => Msg::Forward { conn: r.u64()?, request: r.u64()?, threshold: r.u64()?, bytes: r.blob()? },
        kind::RESPONSE => {
            let (conn, request) = (r.u64()?, r.u64()?);
            let (last, keep) = flags(r)?;
            Msg::Response { conn, request, last, keep, bytes: r.blob()? }
        }
        kind::NEXT => Msg::Next { conn: r.u64()?, request: r.u64()?, bytes: r.blob()? },
        kind::SERVE => Msg::Serve { conn: r.u64()?, request: r.u64()? },
        kind::RETURN => Msg::Return { conn: r.u64()?, request: r.u64()? },
        kind::IDLE => Msg::Idle { conn: r.u64()?, request: r.u64()? },
        _ => return Err(Error::Codec("unknown message kind")),
    })
}

/// The `Response` flags byte: bit 0 `last`, bit 1 `keep`; other bits are refused.
fn flags(r: &mut Reader<'_>) -> Result<(bool, bool)> {
    match r.u8()? {
        f @ 0..=3 => Ok((f & 1 != 0, f & 2 != 0)),
        _ => Err(Error::Codec("unknown response flags")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::transfer::Serving;

    fn frame(msg: &Msg) -> Vec<u8> {
        let mut b = BytesMut::new();
        encode(msg, &mut b);
        b.to_vec()
    }

    #[test]
    fn byte_literals() {
        assert_eq!(frame(&Msg::Heartbeat), [0, 0, 0, 1, 10]);
        assert_eq!(
            frame(&Msg::WantConnection { conn: 1, request: 0x0203 }),
            [0, 0, 0, 17, 11, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 2, 3]
        );
        assert_eq!(
            frame(&Msg::HandOffErr { conn: 0, epoch: 7, reason: "no".into() }),
            [0, 0, 0, 21, 14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 2, b'n', b'o']
        );
        // Version 3: `Closed` gained its reason (the last two bytes: an empty string).
        assert_eq!(
            frame(&Msg::Closed { conn: 1, epoch: 2, sent: 0x0304, reason: String::new() }),
            [0, 0, 0, 27, 17, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 3, 4, 0, 0]
        );
    }

    #[test]
    fn hybrid_byte_literals() {
        assert_eq!(
            frame(&Msg::Forward { conn: 1, request: 2, threshold: 0x0300, bytes: b"GE".to_vec() }),
            [
                &[0, 0, 0, 31, 19][..],
                &[0, 0, 0, 0, 0, 0, 0, 1],
                &[0, 0, 0, 0, 0, 0, 0, 2],
                &[0, 0, 0, 0, 0, 0, 3, 0],
                &[0, 0, 0, 2, b'G', b'E'],
            ]
            .concat()
        );
        assert_eq!(
            frame(&Msg::Response { conn: 1, request: 2, last: true, keep: true, bytes: b"H".to_vec() }),
            [&[0, 0, 0, 23, 20][..], &[0, 0, 0, 0, 0, 0, 0, 1], &[0, 0, 0, 0, 0, 0, 0, 2], &[3, 0, 0, 0, 1, b'H']]
                .concat()
        );
        let last_only = frame(&Msg::Response { conn: 0, request: 0, last: true, keep: false, bytes: vec![] });
        assert_eq!(last_only[21], 1, "flags: bit 0 last, bit 1 keep");
    }

    #[test]
    fn hybrid_round_trips_and_strictness() {
        let msgs = [
            Msg::Forward { conn: 7, request: 3, threshold: 64 << 10, bytes: b"GET / HTTP/1.1\r\n\r\n".to_vec() },
            Msg::Forward { conn: 7, request: 4, threshold: u64::MAX, bytes: vec![] },
            Msg::Response { conn: 7, request: 3, last: false, keep: false, bytes: vec![9; 1000] },
            Msg::Response { conn: 7, request: 3, last: true, keep: true, bytes: vec![] },
        ];
        for m in msgs {
            let f = frame(&m);
            for cut in 0..f.len() {
                assert!(parse(&f[..cut]).unwrap().is_none(), "{} cut at {cut}", m.name());
            }
            assert_eq!(parse(&f).unwrap(), Some((m.clone(), f.len())));
        }
        let mut bad = frame(&Msg::Response { conn: 1, request: 1, last: true, keep: false, bytes: vec![] });
        bad[21] = 4;
        assert!(matches!(parse(&bad), Err(Error::Codec("unknown response flags"))));
        let mut long = frame(&Msg::Forward { conn: 1, request: 1, threshold: 1, bytes: b"ab".to_vec() });
        long[32] = 3; // the blob claims more bytes than the frame holds
        assert!(parse(&long).is_err(), "blob longer than the frame");
        let mut short = frame(&Msg::Forward { conn: 1, request: 1, threshold: 1, bytes: b"ab".to_vec() });
        short[32] = 1; // one byte of the frame left over
        assert!(matches!(parse(&short), Err(Error::Codec("trailing bytes in frame"))));
    }

    #[test]
    fn keep_serving_byte_literals_round_trips_and_strictness() {
        assert_eq!(
            frame(&Msg::Next { conn: 1, request: 2, bytes: b"GE".to_vec() }),
            [&[0, 0, 0, 23, 21][..], &[0, 0, 0, 0, 0, 0, 0, 1], &[0, 0, 0, 0, 0, 0, 0, 2], &[0, 0, 0, 2, b'G', b'E']]
                .concat()
        );
        assert_eq!(
            frame(&Msg::Serve { conn: 1, request: 2 }),
            [0, 0, 0, 17, 22, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]
        );
        assert_eq!(
            frame(&Msg::Return { conn: 1, request: 2 }),
            [0, 0, 0, 17, 23, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]
        );
        let msgs = [
            Msg::Next { conn: 7, request: 1, bytes: b"GET / HTTP/1.1\r\n\r\n".to_vec() },
            Msg::Next { conn: u64::MAX, request: u64::MAX, bytes: vec![] },
            Msg::Serve { conn: 7, request: 1 },
            Msg::Return { conn: 7, request: 9 },
        ];
        for m in msgs {
            let f = frame(&m);
            for cut in 0..f.len() {
                assert!(parse(&f[..cut]).unwrap().is_none(), "{} cut at {cut}", m.name());
            }
            assert_eq!(parse(&f).unwrap(), Some((m.clone(), f.len())));
        }
        // Malformed: a truncated id, a trailing byte, a blob longer than the frame.
        assert!(parse(&[0, 0, 0, 9, 22, 0, 0, 0, 0, 0, 0, 0, 1]).is_err(), "Serve without its request");
        let mut long = frame(&Msg::Return { conn: 1, request: 2 });
        long[3] += 1;
        long.push(0);
        assert!(matches!(parse(&long), Err(Error::Codec("trailing bytes in frame"))));
        let mut next = frame(&Msg::Next { conn: 1, request: 2, bytes: b"ab".to_vec() });
        next[24] = 3;
        assert!(parse(&next).is_err(), "blob longer than the frame");
    }

    fn passed(conn: u64, epoch: u64, pending: &[u8], serving: Serving, sent: u64) -> Box<Transfer> {
        Box::new(Transfer { conn, epoch, socket: Socket::Passed, pending: pending.to_vec(), serving, sent })
    }

    #[test]
    fn transfer_byte_literals() {
        let serving = Serving { idle_ms: 0x0102, backend: Some("127.0.0.1:1".parse().unwrap()) };
        assert_eq!(
            frame(&Msg::HandOff(passed(1, 3, b"GE", serving, 0))),
            [
                &[0, 0, 0, 43, 12][..],
                &[0, 0, 0, 0, 0, 0, 0, 1], // conn
                &[0, 0, 0, 0, 0, 0, 0, 3], // epoch
                &[0],                      // socket: passed beside the frame
                &[0, 0, 0, 2, b'G', b'E'], // pending
                &[0, 0, 1, 2],             // idle_ms
                &[4, 127, 0, 0, 1, 0, 1],  // backend
                &[0, 0, 0, 0, 0, 0, 0, 0], // sent
            ]
            .concat()
        );
        let back = frame(&Msg::HandBack(passed(1, 4, b"", Serving::default(), 0x0102)));
        assert_eq!(back[4], 15);
        assert_eq!(&back[4 + 17..], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2], "no backend: tag 0");
        assert_eq!(
            frame(&Msg::Idle { conn: 1, request: 2 }),
            [0, 0, 0, 17, 24, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]
        );
    }

    #[test]
    fn transfers_round_trip_and_are_strict() {
        let serving = Serving { idle_ms: 20, backend: Some("[::1]:9000".parse().unwrap()) };
        let msgs = [
            Msg::HandOff(passed(7, 1, b"GET / HTTP/1.1\r\n\r\n", serving, 0)),
            Msg::HandBack(passed(7, 2, b"", Serving::default(), u64::MAX)),
            Msg::Closed { conn: 7, epoch: 2, sent: 3 << 20, reason: "client closed".into() },
            Msg::Idle { conn: 7, request: 0 },
        ];
        for m in msgs {
            let f = frame(&m);
            for cut in 0..f.len() {
                assert!(parse(&f[..cut]).unwrap().is_none(), "{} cut at {cut}", m.name());
            }
            assert_eq!(parse(&f).unwrap(), Some((m.clone(), f.len())));
            assert_eq!(m.carries_fd(), matches!(m, Msg::HandOff(_) | Msg::HandBack(_)), "{}", m.name());
            assert!(!m.repairs());
        }
        let flow = crate::FlowKey::new("198.18.1.1:40000".parse().unwrap(), "198.18.1.100:8080".parse().unwrap());
        let socket = Socket::Repair { flow, tcp_state: crate::tcp_state::tests::sample() };
        let t = Transfer { conn: 3, epoch: 5, socket, pending: b"GET".to_vec(), serving: Serving::default(), sent: 9 };
        let repair = Msg::HandOff(Box::new(t));
        let f = frame(&repair);
        assert_eq!(f[4 + 17], 1, "socket: TCP_REPAIR state follows");
        assert_eq!(parse(&f).unwrap(), Some((repair.clone(), f.len())));
        assert!(repair.repairs() && !repair.carries_fd());
        let good = frame(&Msg::HandOff(passed(1, 1, b"", Serving::default(), 0)));
        let mut bad_tag = good.clone();
        bad_tag[4 + 17] = 2;
        assert!(matches!(parse(&bad_tag), Err(Error::Codec("unknown socket tag"))));
        let mut bad_backend = good.clone();
        bad_backend[4 + 17 + 1 + 4 + 4] = 5;
        assert!(matches!(parse(&bad_backend), Err(Error::Codec("unknown address family"))));
        let mut short = good.clone();
        short.truncate(good.len() - 1);
        short[3] -= 1;
        assert!(parse(&short).is_err(), "a transfer without all of sent");
    }

    #[test]
    fn partial_frames_need_more_bytes() {
        let closed = Msg::Closed { conn: 9, epoch: 3, sent: 5, reason: "done".into() };
        let f = frame(&closed);
        for cut in 0..f.len() {
            assert!(parse(&f[..cut]).unwrap().is_none(), "cut at {cut}");
        }
        let (m, n) = parse(&f).unwrap().unwrap();
        assert_eq!((m, n), (closed, f.len()));
    }

    #[test]
    fn bad_frames_are_errors() {
        assert!(parse(&[0, 0, 0, 0]).is_err(), "empty");
        assert!(parse(&[0xff, 0xff, 0xff, 0xff]).is_err(), "too long, refused from the prefix alone");
        assert!(parse(&[0, 0, 0, 1, 99]).is_err(), "unknown kind");
        assert!(parse(&[0, 0, 0, 2, 10, 0]).is_err(), "trailing byte");
        assert!(parse(&[0, 0, 0, 2, 11, 0]).is_err(), "truncated field");
    }

    #[test]
    fn long_reasons_are_cut_at_a_char_boundary() {
        let reason = "é".repeat(MAX_REASON_CHARS);
        let (m, _) = parse(&frame(&Msg::HandOffErr { conn: 1, epoch: 1, reason })).unwrap().unwrap();
        let Msg::HandOffErr { reason, .. } = m else { panic!() };
        assert_eq!(reason.len(), crate::wire::MAX_REASON);
    }

    const MAX_REASON_CHARS: usize = 2000;
}
