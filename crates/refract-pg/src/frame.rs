//! Message framing: finds where one message ends without decoding it, so a proxy can relay
//! any message (including types it does not know) verbatim.
//!
//! After startup every message is `tag:u8, len:i32, body` where `len` counts itself but not
//! the tag. The first message a client sends has no tag: `len:i32, code:i32, body`.

use crate::error::{Error, Side};

/// PostgreSQL's own limit for a message (`PQ_LARGE_MESSAGE_LIMIT`, 1 GiB - 1).
pub const DEFAULT_MAX_MESSAGE_LEN: usize = (1 << 30) - 1;
/// PostgreSQL's own limit for a startup packet (`MAX_STARTUP_PACKET_LENGTH`).
pub const DEFAULT_MAX_STARTUP_LEN: usize = 10_000;

/// Size limits enforced while framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest typed message, tag excluded, length field included.
    pub max_message_len: usize,
    /// Largest startup-phase message, length field included.
    pub max_startup_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_message_len: DEFAULT_MAX_MESSAGE_LEN, max_startup_len: DEFAULT_MAX_STARTUP_LEN }
    }
}

/// Where a typed message is in a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The type byte, e.g. `b'Q'`.
    pub tag: u8,
    /// The whole message's size in bytes: tag, length field and body.
    pub total: usize,
}

impl Header {
    /// The body's range within the message (after tag and length).
    pub fn body(&self) -> std::ops::Range<usize> {
        5..self.total
    }
}

/// Checks a declared length against the minimum (4, itself) and `max`.
fn check_len(raw: i32, max: usize, from: Side) -> Result<usize, Error> {
    let len = usize::try_from(raw).map_err(|_| Error::BadLength { from, len: raw.into() })?;
    if len < 4 {
        return Err(Error::BadLength { from, len: raw.into() });
    }
    if len > max {
        return Err(Error::TooLarge { from, len, max });
    }
    Ok(len)
}

fn read_i32(buf: &[u8]) -> i32 {
    i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]])
}

/// Frames the typed message at the start of `buf`: `Ok(None)` until it is complete.
///
/// The length is checked as soon as it is readable, so an oversized message is refused before
/// its body is buffered.
pub fn peek(buf: &[u8], from: Side, limits: &Limits) -> Result<Option<Header>, Error> {
    let Some(h) = peek_head(buf, from, limits)? else { return Ok(None) };
    Ok((buf.len() >= h.total).then_some(h))
}

/// The header of the typed message at the start of `buf` as soon as its tag and length are
/// there, whether or not its body is (for relaying a large message in pieces, see
/// [`crate::stream`]).
pub fn peek_head(buf: &[u8], from: Side, limits: &Limits) -> Result<Option<Header>, Error> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let len = check_len(read_i32(&buf[1..5]), limits.max_message_len, from)?;
    Ok(Some(Header { tag: buf[0], total: len + 1 }))
}

/// Frames the untyped startup-phase message at the start of `buf`; returns its total size.
pub fn peek_startup(buf: &[u8], limits: &Limits) -> Result<Option<usize>, Error> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = check_len(read_i32(buf), limits.max_startup_len, Side::Client)?;
    if len < 8 {
        return Err(Error::BadLength { from: Side::Client, len: len as i64 });
    }
    Ok((buf.len() >= len).then_some(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_more_bytes() {
        let l = Limits::default();
        assert_eq!(peek(b"", Side::Client, &l), Ok(None));
        assert_eq!(peek(b"Q\0\0\0", Side::Client, &l), Ok(None));
        assert_eq!(peek(b"Q\0\0\0\x06a", Side::Client, &l), Ok(None));
        assert_eq!(peek_startup(b"\0\0\0", &l), Ok(None));
        assert_eq!(peek_startup(b"\0\0\0\x08\x04\xd2", &l), Ok(None));
    }

    #[test]
    fn frames_exactly_one_message() {
        let l = Limits::default();
        let h = peek(b"Q\0\0\0\x06a\0Sxx", Side::Client, &l).unwrap().unwrap();
        assert_eq!(h, Header { tag: b'Q', total: 7 });
        assert_eq!(h.body(), 5..7);
        assert_eq!(peek(b"S\0\0\0\x04", Side::Client, &l).unwrap().unwrap().total, 5);
        assert_eq!(peek_head(b"Q\0\0\0\x06", Side::Client, &l), Ok(Some(Header { tag: b'Q', total: 7 })));
        assert_eq!(peek_startup(b"\0\0\0\x08\x04\xd2\x16\x2fmore", &l), Ok(Some(8)));
    }

    #[test]
    fn refuses_bad_lengths() {
        let l = Limits { max_message_len: 100, max_startup_len: 50 };
        assert_eq!(peek(b"Q\0\0\0\x03", Side::Client, &l), Err(Error::BadLength { from: Side::Client, len: 3 }));
        assert_eq!(
            peek(b"Q\xff\xff\xff\xff", Side::Backend, &l),
            Err(Error::BadLength { from: Side::Backend, len: -1 })
        );
        assert_eq!(
            peek(b"Q\0\0\0\x65", Side::Client, &l),
            Err(Error::TooLarge { from: Side::Client, len: 101, max: 100 })
        );
        assert_eq!(peek_startup(b"\0\0\0\x07", &l), Err(Error::BadLength { from: Side::Client, len: 7 }));
        assert_eq!(peek_startup(b"\0\0\0\x33", &l), Err(Error::TooLarge { from: Side::Client, len: 51, max: 50 }));
    }
}
