//! Target for the in-band signals of the PostgreSQL result hand-over (`refract_pg::hybrid`):
//! the agent reads refract's HybridRequest, refract reads the agent's acceptance and then its
//! reports among the server's messages — `WANT` (a large result is waiting) and the
//! `DELIVERED` digest, whose body refract replays as server messages.

use bytes::BytesMut;
use refract_pg::frame::{self, Header};
use refract_pg::hybrid::{self, HybridRequest, DELIVERED, HYBRID_ACCEPTED, HYBRID_REQUEST_LEN, WANT};
use refract_pg::{BackendMessage, Limits, Side};

/// As refract reads a server connection.
const LIMITS: Limits = Limits { max_message_len: 1 << 16, max_startup_len: frame::DEFAULT_MAX_STARTUP_LEN };

/// The input three ways: the first bytes of a connection to the agent (a HybridRequest?), the
/// agent's 9-byte answer, and after that answer what refract reads from the agent.
pub fn pg_hybrid(data: &[u8]) {
    request(data);
    if let Some(answer) = data.get(..9).and_then(|a| <&[u8; 9]>::try_from(a).ok()) {
        accepted(answer);
        reports(&data[9..]);
    }
}

/// A request the agent reads encodes to the bytes it came from; anything else is not one.
fn request(first: &[u8]) {
    match HybridRequest::parse(first) {
        Some(r) => {
            let mut out = BytesMut::new();
            r.encode(&mut out);
            assert_eq!(&out[..], &first[..HYBRID_REQUEST_LEN], "{r:?} does not encode to its bytes");
        }
        None => assert!(first.len() < HYBRID_REQUEST_LEN || first[..8] != header(), "a request refused"),
    }
}

/// The length and code a HybridRequest starts with.
fn header() -> [u8; 8] {
    let mut out = BytesMut::new();
    HybridRequest { threshold: 0 }.encode(&mut out);
    let mut h = [0u8; 8];
    h.copy_from_slice(&out[..8]);
    h
}

/// The agent's answer is accepted exactly when it starts with `H`, and then round trips.
fn accepted(answer: &[u8; 9]) {
    match hybrid::parse_accepted(answer) {
        Ok(id) => {
            let mut out = BytesMut::new();
            hybrid::encode_accepted(id, &mut out);
            assert_eq!(&out[..], &answer[..], "connection {id} does not encode to its bytes");
        }
        Err(_) => assert_ne!(answer[0], HYBRID_ACCEPTED, "an `H` answer refused"),
    }
}

/// The messages refract reads from the agent: a marker frames as a message and encodes back to
/// its bytes; a `DELIVERED` body is replayed message by message, as the session replays it.
fn reports(mut buf: &[u8]) {
    while let Ok(Some(Header { tag, total })) = frame::peek(buf, Side::Backend, &LIMITS) {
        let (msg, body) = (&buf[..total], &buf[5..total]);
        match tag {
            WANT | DELIVERED => {
                let mut out = BytesMut::new();
                hybrid::encode_marker(tag, body, &mut out);
                assert_eq!(&out[..], msg, "a marker does not encode to its bytes");
                if tag == WANT && body.len() == 8 {
                    let mut want = BytesMut::new();
                    hybrid::encode_want(u64::from_be_bytes(body.try_into().unwrap_or_default()), &mut want);
                    assert_eq!(&want[..], msg, "WANT does not encode to its bytes");
                }
                if tag == DELIVERED {
                    replay(body);
                }
            }
            _ => server_message(msg),
        }
        buf = &buf[total..];
    }
}

/// A digest's messages one after another, each framed as it decodes.
fn replay(mut digest: &[u8]) {
    while let Ok(Some(Header { total, .. })) = frame::peek(digest, Side::Backend, &LIMITS) {
        server_message(&digest[..total]);
        digest = &digest[total..];
    }
}

/// A server message decodes to exactly its frame and encodes back to it.
fn server_message(msg: &[u8]) {
    if let Ok(Some((m, n))) = BackendMessage::parse(msg, &LIMITS) {
        assert_eq!(n, msg.len(), "{m:?} took {n} of its frame's {} bytes", msg.len());
        assert_eq!(&m.to_bytes()[..], msg, "{m:?} does not encode to the bytes it came from");
    }
}
