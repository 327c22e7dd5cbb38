//! Primitive readers and writers for message bodies: big-endian integers and C strings.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{Error, Side};

/// Reads fields from one message body, failing (never panicking) on truncation.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    from: Side,
}

impl<'a> Reader<'a> {
    /// A reader over `buf`, whose errors blame `from`.
    pub(crate) fn new(buf: &'a [u8], from: Side) -> Self {
        Reader { buf, from }
    }

    fn short(&self, what: &str) -> Error {
        Error::malformed(self.from, format!("truncated {what}"))
    }

    /// Takes exactly `n` bytes.
    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], Error> {
        if self.buf.len() < n {
            return Err(self.short(what));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, Error> {
        Ok(self.take(1, what)?[0])
    }

    pub(crate) fn i16(&mut self, what: &str) -> Result<i16, Error> {
        let b = self.take(2, what)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn i32(&mut self, what: &str) -> Result<i32, Error> {
        let b = self.take(4, what)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, Error> {
        Ok(self.i32(what)? as u32)
    }

    /// A count field (i16) that must not be negative.
    pub(crate) fn count16(&mut self, what: &str) -> Result<usize, Error> {
        let n = self.i16(what)?;
        usize::try_from(n).map_err(|_| Error::malformed(self.from, format!("negative {what}")))
    }

    /// A NUL-terminated string, in whatever encoding: bytes that are not UTF-8 are kept as
    /// escapes ([`crate::text`]).
    pub(crate) fn cstr(&mut self, what: &str) -> Result<String, Error> {
        let end = self.buf.iter().position(|&b| b == 0).ok_or_else(|| self.short(what))?;
        let s = crate::text::decode(&self.buf[..end]);
        self.buf = &self.buf[end + 1..];
        Ok(s)
    }

    /// A value prefixed by an i32 length, where -1 means NULL.
    pub(crate) fn nullable(&mut self, what: &str) -> Result<Option<Bytes>, Error> {
        let n = self.i32(what)?;
        if n == -1 {
            return Ok(None);
        }
        let n = usize::try_from(n).map_err(|_| Error::malformed(self.from, format!("negative {what} length")))?;
        Ok(Some(Bytes::copy_from_slice(self.take(n, what)?)))
    }

    /// Everything left.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Fails if bytes are left over: a message must be consumed exactly.
    pub(crate) fn finish(self, what: &str) -> Result<(), Error> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(Error::malformed(self.from, format!("{} trailing bytes in {what}", self.buf.len())))
        }
    }
}

/// Writes a NUL-terminated string (escaped bytes as they were, [`crate::text`]).
pub(crate) fn put_cstr(dst: &mut BytesMut, s: &str) {
    crate::text::encode(s, dst);
    dst.put_u8(0);
}

/// Writes a value prefixed by its i32 length (-1 for NULL).
pub(crate) fn put_nullable(dst: &mut BytesMut, v: Option<&[u8]>) {
    match v {
        None => dst.put_i32(-1),
        Some(v) => {
            dst.put_i32(len_i32(v.len()));
            dst.put_slice(v);
        }
    }
}

/// A length or count as the protocol's i32; saturates (a message that large is refused on parse).
pub(crate) fn len_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A count as the protocol's i16; saturates.
pub(crate) fn len_i16(n: usize) -> i16 {
    i16::try_from(n).unwrap_or(i16::MAX)
}

/// Starts a typed message: writes the tag and a length placeholder; returns where the length is.
pub(crate) fn begin(dst: &mut BytesMut, tag: u8) -> usize {
    dst.put_u8(tag);
    begin_untyped(dst)
}

/// Starts an untyped (startup-phase) message: writes a length placeholder.
pub(crate) fn begin_untyped(dst: &mut BytesMut) -> usize {
    let at = dst.len();
    dst.put_i32(0);
    at
}

/// Patches the length of the message started at `at` (the length counts itself, not the tag).
pub(crate) fn finish(dst: &mut BytesMut, at: usize) {
    let len = len_i32(dst.len() - at);
    dst[at..at + 4].copy_from_slice(&len.to_be_bytes());
}
