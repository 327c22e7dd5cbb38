//! [`Splitter`]: cuts a stream of typed messages into pieces a relay can pass on without ever
//! holding a large message whole: small messages come whole, a large one of a type the relay
//! lets through unread comes as its head (tag and length) and then its body in pieces as the
//! bytes arrive.
//!
//! Pure like [`crate::frame`]: it looks at the buffered bytes and says how many to take; the
//! caller consumes exactly [`Piece::len`] bytes from the front of its buffer before asking again.

use crate::error::{Error, Side};
use crate::frame::{self, Header, Limits};

/// Bytes of a message's head: the tag and the length field.
pub const HEAD_LEN: usize = 5;

/// What is at the front of the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    /// A whole message.
    Whole(Header),
    /// The tag and length of a large message whose body follows as [`Piece::Body`] pieces.
    Head(Header),
    /// The next `len` bytes of the body being streamed; `last` when it ends the message.
    Body {
        /// Bytes of body at the front of the buffer (at least one).
        len: usize,
        /// This piece ends the message.
        last: bool,
    },
}

impl Piece {
    /// How many bytes the piece covers at the front of the buffer.
    pub fn len(&self) -> usize {
        match self {
            Piece::Whole(h) => h.total,
            Piece::Head(_) => HEAD_LEN,
            Piece::Body { len, .. } => *len,
        }
    }

    /// Never: a piece covers at least one byte (here for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Splits one direction of a connection; remembers how much of a streamed body is left.
#[derive(Debug, Clone)]
pub struct Splitter {
    limits: Limits,
    /// Messages longer than this (whole size) are streamed if their type allows it.
    stream_above: usize,
    /// Who sends (for error attribution).
    from: Side,
    /// Body bytes of the streamed message not passed on yet.
    left: usize,
}

impl Splitter {
    /// A splitter streaming the messages longer than `stream_above` bytes (tag included) whose
    /// type the caller allows.
    pub fn new(from: Side, limits: Limits, stream_above: usize) -> Self {
        Splitter { limits, stream_above: stream_above.max(HEAD_LEN), from, left: 0 }
    }

    /// Whether a streamed message's body is still being passed on.
    pub fn in_body(&self) -> bool {
        self.left > 0
    }

    /// The piece at the front of `buf`, `Ok(None)` until enough bytes are there. `streamable`
    /// says which message types may be streamed; others are only ever returned whole.
    pub fn next(&mut self, buf: &[u8], streamable: impl Fn(u8) -> bool) -> Result<Option<Piece>, Error> {
        if self.left > 0 {
            if buf.is_empty() {
                return Ok(None);
            }
            let len = self.left.min(buf.len());
            self.left -= len;
            return Ok(Some(Piece::Body { len, last: self.left == 0 }));
        }
        let Some(h) = frame::peek_head(buf, self.from, &self.limits)? else { return Ok(None) };
        if h.total > self.stream_above && streamable(h.tag) {
            self.left = h.total - HEAD_LEN;
            return Ok(Some(Piece::Head(h)));
        }
        Ok((buf.len() >= h.total).then_some(Piece::Whole(h)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_rows(_: u8) -> bool {
        true
    }

    #[test]
    fn small_messages_come_whole() {
        let mut s = Splitter::new(Side::Backend, Limits::default(), 16);
        assert_eq!(s.next(b"D\0\0\0\x06ab", data_rows), Ok(Some(Piece::Whole(Header { tag: b'D', total: 7 }))));
        assert_eq!(s.next(b"D\0\0\0\x06a", data_rows), Ok(None));
        assert!(!s.in_body());
    }

    #[test]
    fn a_large_message_comes_as_head_and_body_pieces() {
        let mut s = Splitter::new(Side::Backend, Limits::default(), 8);
        let msg = b"D\0\0\0\x0cabcdefgh";
        assert_eq!(s.next(&msg[..5], data_rows), Ok(Some(Piece::Head(Header { tag: b'D', total: 13 }))));
        assert!(s.in_body());
        assert_eq!(s.next(b"", data_rows), Ok(None));
        assert_eq!(s.next(b"abc", data_rows), Ok(Some(Piece::Body { len: 3, last: false })));
        assert_eq!(s.next(b"defghZ\0\0\0\x05I", data_rows), Ok(Some(Piece::Body { len: 5, last: true })));
        assert!(!s.in_body());
        let z = Piece::Whole(Header { tag: b'Z', total: 6 });
        assert_eq!(s.next(b"Z\0\0\0\x05I", data_rows), Ok(Some(z)));
    }

    #[test]
    fn other_types_wait_until_whole() {
        let mut s = Splitter::new(Side::Backend, Limits::default(), 8);
        let only_d = |t: u8| t == b'D';
        assert_eq!(s.next(b"E\0\0\0\x0cabc", only_d), Ok(None));
        assert!(s.next(b"E\0\0\0\x0cabcdefgh", only_d).unwrap().is_some_and(|p| p.len() == 13));
    }

    #[test]
    fn lengths_are_checked_before_streaming() {
        let limits = Limits { max_message_len: 100, max_startup_len: 50 };
        let mut s = Splitter::new(Side::Backend, limits, 8);
        assert_eq!(s.next(b"D\0\0\0\x65", data_rows), Err(Error::TooLarge { from: Side::Backend, len: 101, max: 100 }));
        assert!(s.next(b"D\0\0\0\x02", data_rows).is_err());
    }
}
