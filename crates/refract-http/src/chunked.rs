//! A chunked-transfer state machine (RFC 9112 §7.1). It tells how many of the offered bytes
//! belong to the body and when the body (with its trailers) is complete; broken encodings are
//! errors. Responses are relayed verbatim ([`ChunkedDecoder::advance`]); a request body goes on
//! re-encoded ([`ChunkedDecoder::normalize`]): chunk extensions and trailers dropped, so what
//! a backend's parser reads is only sizes and data refract has checked. Extensions are still
//! checked before they are dropped: a control character (NUL), a bare CR or LF, or a line over
//! [`MAX_LINE`] bytes is refused.

use crate::error::Error;

/// Longest chunk-size line (with extensions) or trailer line accepted.
pub const MAX_LINE: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading hex digits of a chunk size.
    Size { digits: u8 },
    /// Whitespace after the size: only more of it or `;` may follow.
    SizeBws,
    /// Skipping a chunk extension up to CR.
    Ext,
    /// Expecting LF after the size line.
    SizeLf,
    /// Inside chunk data, this many bytes left.
    Data(u64),
    /// Expecting CR after chunk data.
    DataCr,
    /// Expecting LF after chunk data.
    DataLf,
    /// At the start of a trailer line (or the final CRLF).
    TrailerStart,
    /// Inside a trailer line.
    Trailer,
    /// Expecting LF after a trailer line.
    TrailerLf,
    /// Expecting the final LF.
    EndLf,
    /// The body is complete.
    Done,
}

/// Tracks the framing of one chunked body.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
    size: u64,
    line: usize,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedDecoder {
    /// A decoder at the start of a body.
    pub fn new() -> Self {
        ChunkedDecoder { state: State::Size { digits: 0 }, size: 0, line: 0 }
    }

    /// Whether the whole body, trailers included, has been seen.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Consumes body bytes from the front of `input`; returns how many belong to the body.
    /// Stops at the end of the body, so the rest of `input` is the next message.
    pub fn advance(&mut self, input: &[u8]) -> Result<usize, Error> {
        self.run(input, None)
    }

    /// Like [`Self::advance`], and appends to `out` the consumed part of the body as refract
    /// forwards it: each size line as bare hex (extensions dropped), the data, and the last
    /// chunk without trailers. On an error, what `out` got from this call must not be sent.
    pub fn normalize(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, Error> {
        self.run(input, Some(out))
    }

    fn run(&mut self, input: &[u8], mut out: Option<&mut Vec<u8>>) -> Result<usize, Error> {
        let mut i = 0;
        while i < input.len() && self.state != State::Done {
            if let State::Data(left) = self.state {
                let take = left.min((input.len() - i) as u64) as usize;
                if let Some(o) = out.as_deref_mut() {
                    o.extend_from_slice(&input[i..i + take]);
                }
                i += take;
                self.state = if left == take as u64 { State::DataCr } else { State::Data(left - take as u64) };
                continue;
            }
            let before = self.state;
            self.step(input[i])?;
            i += 1;
            if let Some(o) = out.as_deref_mut() {
                self.emit(before, o);
            }
        }
        Ok(i)
    }

    /// The canonical bytes a transition from `before` completes: a size line, the CRLF after
    /// chunk data, the final empty line.
    fn emit(&self, before: State, out: &mut Vec<u8>) {
        match (before, self.state) {
            (State::SizeLf, _) => out.extend_from_slice(format!("{:x}\r\n", self.size).as_bytes()),
            (State::DataLf, _) | (_, State::Done) => out.extend_from_slice(b"\r\n"),
            _ => {}
        }
    }

    fn step(&mut self, b: u8) -> Result<(), Error> {
        self.line += 1;
        if self.line > MAX_LINE {
            return Err(Error::BadChunk("line too long"));
        }
        self.state = match self.state {
            State::Size { digits } => self.size_byte(b, digits)?,
            State::SizeBws => match b {
                b' ' | b'\t' => State::SizeBws,
                b';' => State::Ext,
                _ => return Err(Error::BadChunk("whitespace after a chunk size not followed by ';'")),
            },
            State::Ext => match b {
                b'\r' => State::SizeLf,
                b'\n' => return Err(Error::BadChunk("bare LF in chunk extension")),
                b if is_ctl(b) => return Err(Error::BadChunk("control character in chunk extension")),
                _ => State::Ext,
            },
            State::SizeLf => self.end_size_line(b)?,
            State::DataCr => expect(b, b'\r', State::DataLf, "missing CR after chunk data")?,
            State::DataLf => self.new_line(expect(b, b'\n', State::Size { digits: 0 }, "missing LF after chunk data")?),
            State::TrailerStart => match b {
                b'\r' => State::EndLf,
                b'\n' => return Err(Error::BadChunk("bare LF in trailers")),
                b if is_ctl(b) => return Err(Error::BadChunk("control character in trailer")),
                _ => State::Trailer,
            },
            State::Trailer => match b {
                b'\r' => State::TrailerLf,
                b'\n' => return Err(Error::BadChunk("bare LF in trailer")),
                b if is_ctl(b) => return Err(Error::BadChunk("control character in trailer")),
                _ => State::Trailer,
            },
            State::TrailerLf => self.new_line(expect(b, b'\n', State::TrailerStart, "missing LF after trailer")?),
            State::EndLf => expect(b, b'\n', State::Done, "missing final LF")?,
            State::Data(_) | State::Done => self.state,
        };
        Ok(())
    }

    fn new_line(&mut self, s: State) -> State {
        self.line = 0;
        if s == (State::Size { digits: 0 }) {
            self.size = 0;
        }
        s
    }

    fn size_byte(&mut self, b: u8, digits: u8) -> Result<State, Error> {
        if let Some(d) = (b as char).to_digit(16) {
            if digits >= 15 {
                return Err(Error::BadChunk("chunk size too large"));
            }
            self.size = self.size * 16 + u64::from(d);
            return Ok(State::Size { digits: digits + 1 });
        }
        if digits == 0 {
            return Err(Error::BadChunk("chunk size is not hexadecimal"));
        }
        match b {
            b'\r' => Ok(State::SizeLf),
            b';' => Ok(State::Ext),
            b' ' | b'\t' => Ok(State::SizeBws),
            _ => Err(Error::BadChunk("chunk size is not hexadecimal")),
        }
    }

    fn end_size_line(&mut self, b: u8) -> Result<State, Error> {
        if b != b'\n' {
            return Err(Error::BadChunk("missing LF after chunk size"));
        }
        self.line = 0;
        Ok(if self.size == 0 { State::TrailerStart } else { State::Data(self.size) })
    }
}

/// A control character (other than HTAB), which no field or extension may hold.
fn is_ctl(b: u8) -> bool {
    (b < 0x20 && b != b'\t') || b == 0x7f
}

fn expect(b: u8, want: u8, next: State, why: &'static str) -> Result<State, Error> {
    if b == want {
        Ok(next)
    } else {
        Err(Error::BadChunk(why))
    }
}

/// The data of a chunked body that [`ChunkedDecoder`] accepted (extensions and trailers dropped).
pub fn decode_all(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") {
        // Only the size is read: an extension may hold any byte but a control (obs-text too).
        let digits = raw[..eol].split(|b| matches!(b, b';' | b' ' | b'\t')).next().unwrap_or_default();
        let size = std::str::from_utf8(digits).ok().and_then(|d| usize::from_str_radix(d, 16).ok()).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = eol + 2;
        let end = start.saturating_add(size).min(raw.len());
        out.extend_from_slice(&raw[start..end]);
        raw = &raw[end.saturating_add(2).min(raw.len())..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode(chunks: &[Vec<u8>], trailer: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for c in chunks.iter().filter(|c| !c.is_empty()) {
            out.extend(format!("{:x}\r\n", c.len()).bytes());
            out.extend(c);
            out.extend(b"\r\n");
        }
        out.extend(b"0\r\n");
        if trailer {
            out.extend(b"X-Sum: 1\r\n");
        }
        out.extend(b"\r\n");
        out
    }

    #[test]
    fn whole_body_then_next_message() {
        let mut raw = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n".to_vec();
        let body_len = raw.len();
        raw.extend(b"GET / HTTP/1.1\r\n");
        let mut d = ChunkedDecoder::new();
        assert_eq!(d.advance(&raw), Ok(body_len));
        assert!(d.is_done());
    }

    fn normalized(raw: &[u8]) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        let n = ChunkedDecoder::new().normalize(raw, &mut out)?;
        assert_eq!(n, raw.len());
        Ok(out)
    }

    #[test]
    fn extensions_and_trailers_are_dropped() {
        let raw = b"5;a=b\r\nhello\r\n6 ; x=\"y z\"\r\n world\r\nA\t;k\r\n0123456789\r\n0;end\r\nX-Sum: 1\r\n\r\n";
        assert_eq!(normalized(raw).unwrap(), b"5\r\nhello\r\n6\r\n world\r\na\r\n0123456789\r\n0\r\n\r\n");
        assert_eq!(normalized(b"0\r\n\r\n").unwrap(), b"0\r\n\r\n");
        assert_eq!(normalized(b"005\r\nhello\r\n0\r\n\r\n").unwrap(), b"5\r\nhello\r\n0\r\n\r\n");
    }

    #[test]
    fn invalid_extensions_are_refused() {
        let long = format!("5;{}\r\nhello\r\n0\r\n\r\n", "a".repeat(MAX_LINE));
        for bad in [
            &b"5;a=\0\r\nhello\r\n"[..],
            b"5;a\nb\r\n",
            b"5;a\rb\r\n",
            b"5;\x7f\r\n",
            b"5 x\r\n",
            b"5 \r\n",
            long.as_bytes(),
        ] {
            assert!(matches!(normalized(bad), Err(Error::BadChunk(_))), "{bad:?}");
        }
        assert!(matches!(normalized(b"0\r\nX: \0\r\n\r\n"), Err(Error::BadChunk(_))), "NUL in a trailer");
    }

    #[test]
    fn decode_all_reassembles() {
        assert_eq!(decode_all(b"3\r\nabc\r\n2;x\r\nde\r\n0\r\n\r\n"), b"abcde");
    }

    #[test]
    fn decode_all_reads_past_an_extension_that_is_not_utf8() {
        // Found by fuzz/ (http_chunked): the decoder accepts obs-text in an extension, and
        // decode_all took the whole line for "0" and returned no data.
        let raw = b"3;a=\xb4\r\nabc\r\n2 ; x=\"\xff\"\r\nde\r\n0\r\n\r\n";
        assert_eq!(ChunkedDecoder::new().advance(raw), Ok(raw.len()));
        assert_eq!(decode_all(raw), b"abcde");
    }

    #[test]
    fn broken_encodings_are_errors() {
        for bad in [&b"zz\r\n"[..], b"5\r\nhelloXX", b"5\nhello", b"0\r\n\r\r", b"\r\n"] {
            assert!(ChunkedDecoder::new().advance(bad).is_err(), "{bad:?}");
        }
        assert!(ChunkedDecoder::new().advance(b"fffffffffffffffff\r\n").is_err());
    }

    proptest! {
        #[test]
        fn any_split_finds_the_same_end(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..6),
            trailer: bool,
            split in 0usize..2000,
        ) {
            let raw = encode(&chunks, trailer);
            let cut = split.min(raw.len());
            let mut d = ChunkedDecoder::new();
            let a = d.advance(&raw[..cut]).unwrap();
            prop_assert_eq!(a, cut);
            let b = d.advance(&raw[cut..]).unwrap();
            prop_assert_eq!(a + b, raw.len());
            prop_assert!(d.is_done());
        }

        #[test]
        fn a_canonical_body_normalizes_to_itself_whatever_the_split(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..6),
            split in 0usize..2000,
        ) {
            let raw = encode(&chunks, false);
            let cut = split.min(raw.len());
            let (mut d, mut out) = (ChunkedDecoder::new(), Vec::new());
            let a = d.normalize(&raw[..cut], &mut out).unwrap();
            let b = d.normalize(&raw[cut..], &mut out).unwrap();
            prop_assert_eq!(a + b, raw.len());
            prop_assert!(d.is_done());
            prop_assert_eq!(out, raw);
        }

        #[test]
        fn never_panics_on_garbage(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut d = ChunkedDecoder::new();
            let _ = d.advance(&data);
        }
    }
}
