//! `LocalMsg`: what dispatcher and agent say on a same-host link, and its pure codec.
//!
//! A frame is `len: u32` big-endian (the bytes after it), a kind byte, then the fields, encoded
//! like the control messages (integers big-endian, byte strings `u32` length + bytes, reasons
//! `u16` length + UTF-8). [`LocalMsg::Adopt`] and [`LocalMsg::HandBack`] travel with the client
//! socket (SCM_RIGHTS on the frame's first byte); the others never carry a descriptor.

use std::net::SocketAddr;

use bytes::{BufMut, BytesMut};

use crate::control::wire::{put_addr, put_blob, put_string, Reader};
use crate::error::{Error, Result};

/// Largest frame either side accepts (the pending bytes are bounded by the dispatcher's
/// head and body limits, far below this).
pub const MAX_LOCAL_FRAME: usize = 32 << 20;

/// A message on a same-host link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalMsg {
    /// Dispatcher → agent, with the client socket: serve the requests in `pending` (the one the
    /// dispatcher decided to hand over first, then any pipelined bytes) from `backend`.
    Adopt {
        /// The dispatcher's id of the client connection.
        conn: u64,
        /// The epoch of this transfer.
        epoch: u64,
        /// The backend the requests are for (the agent refuses one it does not front).
        backend: SocketAddr,
        /// How long the agent waits for the client's next request before it hands the
        /// connection back (0: at once when nothing is buffered).
        idle_ms: u32,
        /// Bytes read from the client and not consumed: the request to serve, then anything
        /// pipelined behind it (the agent asks with [`LocalMsg::Next`] before serving those).
        pending: Vec<u8>,
    },
    /// Agent → dispatcher: adopted; the agent owns the connection at `epoch`.
    AdoptOk {
        /// The client connection.
        conn: u64,
        /// The epoch of the hand-off.
        epoch: u64,
    },
    /// Agent → dispatcher: not adopted, nothing was written to the client; relay instead.
    AdoptErr {
        /// The client connection.
        conn: u64,
        /// The epoch of the hand-off.
        epoch: u64,
        /// Why (for logs and metrics).
        reason: String,
    },
    /// Agent → dispatcher, with the client socket: take it back at this request boundary.
    HandBack {
        /// The client connection.
        conn: u64,
        /// The epoch of the hand-back (one above the hand-off's).
        epoch: u64,
        /// Bytes the agent wrote to the client while it owned the connection (for metrics).
        sent: u64,
        /// Bytes the agent read from the client beyond the last response it served.
        pending: Vec<u8>,
    },
    /// Agent → dispatcher: the connection must end (the client closed, a response was cut
    /// short, or the exchange asked for `close`); the dispatcher closes its copy.
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
    /// Dispatcher → agent (hybrid): one whole request for the agent's backend on client
    /// connection `conn`; the agent may ask for the connection if the result has at least
    /// `threshold` bytes.
    Forward {
        /// The client connection.
        conn: u64,
        /// The request's number on that connection.
        request: u64,
        /// Smallest result the agent asks the connection for.
        threshold: u64,
        /// The request as the client sent it (head and body).
        bytes: Vec<u8>,
    },
    /// Agent → dispatcher (hybrid): the result of `request` is large; hand the connection over
    /// (an [`LocalMsg::Adopt`] whose pending bytes are what follows the request) or say
    /// [`LocalMsg::RelayInstead`]. The agent holds the result meanwhile.
    Want {
        /// The client connection.
        conn: u64,
        /// The request whose result is large.
        request: u64,
    },
    /// Agent → dispatcher (hybrid): response bytes to relay, in order; `last` ends the response,
    /// and then `keep` says whether the client connection may carry another request.
    Response {
        /// The client connection.
        conn: u64,
        /// The request answered.
        request: u64,
        /// Whether this is the response's last part.
        last: bool,
        /// Whether the connection stays open after this response (meaningful with `last`).
        keep: bool,
        /// The bytes, as the backend sent them.
        bytes: Vec<u8>,
    },
    /// Dispatcher → agent (hybrid): no hand-over for `request`; send its result as responses.
    RelayInstead {
        /// The client connection.
        conn: u64,
        /// The request.
        request: u64,
    },
    /// Agent → dispatcher, while the agent owns `conn`: the client sent another whole request;
    /// may the agent serve it? Answered by [`LocalMsg::Serve`] or [`LocalMsg::Return`].
    Next {
        /// The client connection.
        conn: u64,
        /// The agent's number of this request within its ownership of `conn` (1, 2, …).
        request: u64,
        /// The whole request (head and body).
        bytes: Vec<u8>,
    },
    /// Dispatcher → agent: serve request `request` of [`LocalMsg::Next`] from your backend.
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
    /// Agent → dispatcher, while the agent owns `conn`: the response to `request` (0: the one
    /// the connection was handed over for) is written whole and the agent waits for the
    /// client's next request. Should the link end now, the dispatcher takes the connection back.
    Idle {
        /// The client connection.
        conn: u64,
        /// The agent's number of the request answered last.
        request: u64,
    },
}

mod kind {
    pub const ADOPT: u8 = 1;
    pub const ADOPT_OK: u8 = 2;
    pub const ADOPT_ERR: u8 = 3;
    pub const HAND_BACK: u8 = 4;
    pub const CLOSED: u8 = 5;
    pub const FORWARD: u8 = 6;
    pub const WANT: u8 = 7;
    pub const RESPONSE: u8 = 8;
    pub const RELAY_INSTEAD: u8 = 9;
    pub const NEXT: u8 = 10;
    pub const SERVE: u8 = 11;
    pub const RETURN: u8 = 12;
    pub const IDLE: u8 = 13;
}

impl LocalMsg {
    /// Whether this message travels with the client socket.
    pub fn carries_fd(&self) -> bool {
        matches!(self, LocalMsg::Adopt { .. } | LocalMsg::HandBack { .. })
    }

    /// The message's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            LocalMsg::Adopt { .. } => "Adopt",
            LocalMsg::AdoptOk { .. } => "AdoptOk",
            LocalMsg::AdoptErr { .. } => "AdoptErr",
            LocalMsg::HandBack { .. } => "HandBack",
            LocalMsg::Closed { .. } => "Closed",
            LocalMsg::Forward { .. } => "Forward",
            LocalMsg::Want { .. } => "Want",
            LocalMsg::Response { .. } => "Response",
            LocalMsg::RelayInstead { .. } => "RelayInstead",
            LocalMsg::Next { .. } => "Next",
            LocalMsg::Serve { .. } => "Serve",
            LocalMsg::Return { .. } => "Return",
            LocalMsg::Idle { .. } => "Idle",
        }
    }
}

/// Appends one frame for `msg` to `out` (for messages about a request, the second id is the
/// request number instead of an epoch).
pub fn encode(msg: &LocalMsg, out: &mut BytesMut) {
    let start = out.len();
    out.put_u32(0);
    match msg {
        LocalMsg::Adopt { conn, epoch, backend, idle_ms, pending } => {
            put_ids(out, kind::ADOPT, *conn, *epoch);
            put_addr(out, backend);
            out.put_u32(*idle_ms);
            put_blob(out, pending);
        }
        LocalMsg::AdoptOk { conn, epoch } => put_ids(out, kind::ADOPT_OK, *conn, *epoch),
        LocalMsg::AdoptErr { conn, epoch, reason } => {
            put_ids(out, kind::ADOPT_ERR, *conn, *epoch);
            put_string(out, reason);
        }
        LocalMsg::HandBack { conn, epoch, sent, pending } => {
            put_ids(out, kind::HAND_BACK, *conn, *epoch);
            out.put_u64(*sent);
            put_blob(out, pending);
        }
        LocalMsg::Closed { conn, epoch, sent, reason } => {
            put_ids(out, kind::CLOSED, *conn, *epoch);
            out.put_u64(*sent);
            put_string(out, reason);
        }
        LocalMsg::Forward { conn, request, threshold, bytes } => {
            put_ids(out, kind::FORWARD, *conn, *request);
            out.put_u64(*threshold);
            put_blob(out, bytes);
        }
        LocalMsg::Want { conn, request } => put_ids(out, kind::WANT, *conn, *request),
        LocalMsg::Response { conn, request, last, keep, bytes } => {
            put_ids(out, kind::RESPONSE, *conn, *request);
            out.put_u8(u8::from(*last) | u8::from(*keep) << 1);
            put_blob(out, bytes);
        }
        LocalMsg::RelayInstead { conn, request } => put_ids(out, kind::RELAY_INSTEAD, *conn, *request),
        LocalMsg::Next { conn, request, bytes } => {
            put_ids(out, kind::NEXT, *conn, *request);
            put_blob(out, bytes);
        }
        LocalMsg::Serve { conn, request } => put_ids(out, kind::SERVE, *conn, *request),
        LocalMsg::Return { conn, request } => put_ids(out, kind::RETURN, *conn, *request),
        LocalMsg::Idle { conn, request } => put_ids(out, kind::IDLE, *conn, *request),
    }
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_be_bytes());
}

fn put_ids(out: &mut BytesMut, kind: u8, conn: u64, epoch: u64) {
    out.put_u8(kind);
    out.put_u64(conn);
    out.put_u64(epoch);
}

/// The `Response` flags byte: bit 0 `last`, bit 1 `keep`.
fn flags(r: &mut Reader<'_>) -> Result<(bool, bool)> {
    match r.u8()? {
        f @ 0..=3 => Ok((f & 1 != 0, f & 2 != 0)),
        _ => Err(Error::Codec("unknown response flags")),
    }
}

/// Parses one frame from the start of `buf`: `Ok(None)` until it is all there, else the
/// message and the bytes it used. A length above [`MAX_LOCAL_FRAME`] is refused at once.
pub fn parse(buf: &[u8]) -> Result<Option<(LocalMsg, usize)>> {
    let Some(prefix) = buf.get(..4) else { return Ok(None) };
    let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
    if len == 0 || len > MAX_LOCAL_FRAME {
        return Err(Error::Codec("local frame length out of range"));
    }
    let Some(body) = buf.get(4..4 + len) else { return Ok(None) };
    let mut r = Reader::new(body);
    let (k, conn, epoch) = (r.u8()?, r.u64()?, r.u64()?);
    let msg = match k {
        kind::ADOPT => LocalMsg::Adopt { conn, epoch, backend: r.addr()?, idle_ms: r.u32()?, pending: r.blob()? },
        kind::ADOPT_OK => LocalMsg::AdoptOk { conn, epoch },
        kind::ADOPT_ERR => LocalMsg::AdoptErr { conn, epoch, reason: r.string()? },
        kind::HAND_BACK => LocalMsg::HandBack { conn, epoch, sent: r.u64()?, pending: r.blob()? },
        kind::CLOSED => LocalMsg::Closed { conn, epoch, sent: r.u64()?, reason: r.string()? },
        kind::FORWARD => LocalMsg::Forward { conn, request: epoch, threshold: r.u64()?, bytes: r.blob()? },
        kind::WANT => LocalMsg::Want { conn, request: epoch },
        kind::RESPONSE => {
            let (last, keep) = flags(&mut r)?;
            LocalMsg::Response { conn, request: epoch, last, keep, bytes: r.blob()? }
        }
        kind::RELAY_INSTEAD => LocalMsg::RelayInstead { conn, request: epoch },
        kind::NEXT => LocalMsg::Next { conn, request: epoch, bytes: r.blob()? },
        kind::SERVE => LocalMsg::Serve { conn, request: epoch },
        kind::RETURN => LocalMsg::Return { conn, request: epoch },
        kind::IDLE => LocalMsg::Idle { conn, request: epoch },
        _ => return Err(Error::Codec("unknown local message kind")),
    };
    if !r.is_empty() {
        return Err(Error::Codec("trailing bytes in a local frame"));
    }
    Ok(Some((msg, 4 + len)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn byte_literals() {
        let mut out = BytesMut::new();
        encode(&LocalMsg::AdoptOk { conn: 1, epoch: 2 }, &mut out);
        assert_eq!(&out[..], &[0, 0, 0, 17, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]);
        out.clear();
        encode(&LocalMsg::HandBack { conn: 1, epoch: 3, sent: 0x0102, pending: b"GE".to_vec() }, &mut out);
        let want = [
            &[0, 0, 0, 31, 4][..],
            &[0, 0, 0, 0, 0, 0, 0, 1],
            &[0, 0, 0, 0, 0, 0, 0, 3],
            &[0, 0, 0, 0, 0, 0, 1, 2],
            &[0, 0, 0, 2],
            b"GE",
        ];
        assert_eq!(&out[..], &want.concat()[..]);
    }

    #[test]
    fn round_trips_and_partial_frames() {
        let msgs = [
            LocalMsg::Adopt {
                conn: 7,
                epoch: 1,
                backend: "127.0.0.1:9000".parse().unwrap(),
                idle_ms: 20,
                pending: b"GET / HTTP/1.1\r\n\r\n".to_vec(),
            },
            LocalMsg::AdoptOk { conn: 7, epoch: 1 },
            LocalMsg::AdoptErr { conn: 7, epoch: 1, reason: "no".into() },
            LocalMsg::HandBack { conn: 7, epoch: 2, sent: 0, pending: vec![] },
            LocalMsg::HandBack { conn: 7, epoch: 4, sent: u64::MAX, pending: b"GET /".to_vec() },
            LocalMsg::Closed { conn: 7, epoch: 2, sent: 3 << 20, reason: "client closed".into() },
            LocalMsg::Forward { conn: 7, request: 3, threshold: 1 << 20, bytes: b"GET /".to_vec() },
            LocalMsg::Want { conn: 7, request: 3 },
            LocalMsg::Response { conn: 7, request: 3, last: true, keep: false, bytes: b"HTTP".to_vec() },
            LocalMsg::Response { conn: 7, request: 3, last: false, keep: true, bytes: vec![] },
            LocalMsg::RelayInstead { conn: 7, request: 3 },
            LocalMsg::Next { conn: 7, request: 1, bytes: b"POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n".to_vec() },
            LocalMsg::Next { conn: 7, request: 2, bytes: vec![] },
            LocalMsg::Serve { conn: 7, request: 1 },
            LocalMsg::Return { conn: 7, request: 2 },
            LocalMsg::Idle { conn: 7, request: 2 },
        ];
        for m in msgs {
            let mut out = BytesMut::new();
            encode(&m, &mut out);
            for cut in 0..out.len() {
                assert!(parse(&out[..cut]).unwrap().is_none());
            }
            assert_eq!(parse(&out).unwrap(), Some((m.clone(), out.len())));
            assert_eq!(m.carries_fd(), matches!(m, LocalMsg::Adopt { .. } | LocalMsg::HandBack { .. }));
        }
    }

    #[test]
    fn keep_serving_byte_literals_and_malformed_frames() {
        let frame = |m: &LocalMsg| {
            let mut out = BytesMut::new();
            encode(m, &mut out);
            out.to_vec()
        };
        assert_eq!(
            frame(&LocalMsg::Next { conn: 1, request: 2, bytes: b"G".to_vec() }),
            [&[0, 0, 0, 22, 10][..], &[0, 0, 0, 0, 0, 0, 0, 1], &[0, 0, 0, 0, 0, 0, 0, 2], &[0, 0, 0, 1, b'G']]
                .concat()
        );
        assert_eq!(
            frame(&LocalMsg::Serve { conn: 1, request: 2 }),
            [0, 0, 0, 17, 11, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]
        );
        assert_eq!(
            frame(&LocalMsg::Return { conn: 1, request: 2 }),
            [0, 0, 0, 17, 12, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]
        );
        assert_eq!(
            frame(&LocalMsg::Idle { conn: 1, request: 2 }),
            [0, 0, 0, 17, 13, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]
        );
        let adopt = LocalMsg::Adopt {
            conn: 1,
            epoch: 1,
            backend: "127.0.0.1:1".parse().unwrap(),
            idle_ms: 0x0102,
            pending: vec![],
        };
        let f = frame(&adopt);
        // kind, ids, address (family, 4 bytes, port), then idle_ms before the pending bytes.
        assert_eq!(&f[4 + 1 + 16 + 7..][..4], &[0, 0, 1, 2]);
        let mut next = frame(&LocalMsg::Next { conn: 1, request: 2, bytes: b"G".to_vec() });
        next[24] = 2;
        assert!(parse(&next).is_err(), "blob longer than the frame");
        let mut serve = frame(&LocalMsg::Serve { conn: 1, request: 2 });
        serve[3] += 1;
        serve.push(0);
        assert!(matches!(parse(&serve), Err(Error::Codec("trailing bytes in a local frame"))));
        let mut adopt_short = f.clone();
        adopt_short.truncate(f.len() - 6);
        adopt_short[3] -= 6;
        assert!(parse(&adopt_short).is_err(), "an Adopt without idle_ms and pending");
        for m in [LocalMsg::Next { conn: 1, request: 1, bytes: vec![] }, LocalMsg::Serve { conn: 1, request: 1 }] {
            assert!(!m.carries_fd());
        }
    }

    #[test]
    fn garbage_is_refused() {
        assert!(parse(&[0, 0, 0, 0]).is_err());
        assert!(parse(&[0xff, 0, 0, 0]).is_err());
        assert!(parse(&[0, 0, 0, 17, 99, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]).is_err());
        assert!(parse(&[0, 0, 0, 18, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0]).is_err());
    }
}
