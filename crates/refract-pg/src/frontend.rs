//! Typed messages a client sends after startup (simple and extended query, COPY, auth).

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{Error, Side};
use crate::frame::{self, Limits};
use crate::wire::{self, Reader};

/// What a Describe or Close names: a prepared statement or a portal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `S`: a prepared statement.
    Statement,
    /// `P`: a portal.
    Portal,
}

impl Target {
    fn parse(r: &mut Reader<'_>) -> Result<Self, Error> {
        match r.u8("target")? {
            b'S' => Ok(Target::Statement),
            b'P' => Ok(Target::Portal),
            b => Err(Error::malformed(Side::Client, format!("unknown describe/close target {b:#x}"))),
        }
    }

    fn byte(self) -> u8 {
        match self {
            Target::Statement => b'S',
            Target::Portal => b'P',
        }
    }
}

/// A Bind message: parameters for a prepared statement, creating a portal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bind {
    /// Destination portal ("" is the unnamed portal).
    pub portal: String,
    /// Source prepared statement ("" is the unnamed statement).
    pub statement: String,
    /// Parameter format codes (0 text, 1 binary); none means all text, one means all that.
    pub param_formats: Vec<i16>,
    /// Parameter values; `None` is SQL NULL.
    pub params: Vec<Option<Bytes>>,
    /// Result column format codes, same conventions as `param_formats`.
    pub result_formats: Vec<i16>,
}

/// A message from client to server after startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrontendMessage {
    /// `Q`: a simple query (one or more statements).
    Query(String),
    /// `P`: prepare `query` as statement `name` with the given parameter type OIDs (0 = unspecified).
    Parse {
        /// Statement name ("" is the unnamed statement).
        name: String,
        /// The SQL text.
        query: String,
        /// Parameter type OIDs.
        param_types: Vec<u32>,
    },
    /// `B`: bind parameters.
    Bind(Bind),
    /// `D`: describe a statement or portal.
    Describe(Target, String),
    /// `E`: execute a portal, at most `max_rows` rows (0 = all).
    Execute {
        /// Portal name.
        portal: String,
        /// Row limit; 0 for no limit.
        max_rows: i32,
    },
    /// `S`: end of an extended-query batch.
    Sync,
    /// `H`: ask the server to flush its output.
    Flush,
    /// `C`: close a statement or portal.
    Close(Target, String),
    /// `X`: the client is leaving.
    Terminate,
    /// `p`: PasswordMessage, SASLInitialResponse, SASLResponse or GSSResponse. Which one
    /// depends on the authentication request it answers; see [`crate::auth`] to decode it.
    AuthResponse(Bytes),
    /// `d`: COPY data.
    CopyData(Bytes),
    /// `c`: COPY finished.
    CopyDone,
    /// `f`: COPY aborted with a message.
    CopyFail(String),
    /// Any other type (e.g. `F` FunctionCall), kept raw so it can be relayed verbatim.
    Unknown {
        /// The type byte.
        tag: u8,
        /// The body.
        body: Bytes,
    },
}

impl FrontendMessage {
    /// Decodes the message at the start of `buf`; `Ok(None)` if it is not complete yet.
    pub fn parse(buf: &[u8], limits: &Limits) -> Result<Option<(FrontendMessage, usize)>, Error> {
        let Some(h) = frame::peek(buf, Side::Client, limits)? else { return Ok(None) };
        let body = &buf[h.body()];
        Ok(Some((Self::decode(h.tag, body)?, h.total)))
    }

    /// Decodes a body whose type byte is `tag`.
    pub fn decode(tag: u8, body: &[u8]) -> Result<FrontendMessage, Error> {
        let mut r = Reader::new(body, Side::Client);
        let msg = match tag {
            b'Q' => FrontendMessage::Query(r.cstr("query")?),
            b'P' => decode_parse(&mut r)?,
            b'B' => FrontendMessage::Bind(decode_bind(&mut r)?),
            b'D' => FrontendMessage::Describe(Target::parse(&mut r)?, r.cstr("name")?),
            b'E' => FrontendMessage::Execute { portal: r.cstr("portal")?, max_rows: r.i32("max rows")? },
            b'S' => FrontendMessage::Sync,
            b'H' => FrontendMessage::Flush,
            b'C' => FrontendMessage::Close(Target::parse(&mut r)?, r.cstr("name")?),
            b'X' => FrontendMessage::Terminate,
            b'p' => FrontendMessage::AuthResponse(Bytes::copy_from_slice(r.rest())),
            b'd' => FrontendMessage::CopyData(Bytes::copy_from_slice(r.rest())),
            b'c' => FrontendMessage::CopyDone,
            b'f' => FrontendMessage::CopyFail(r.cstr("copy failure message")?),
            tag => FrontendMessage::Unknown { tag, body: Bytes::copy_from_slice(r.rest()) },
        };
        r.finish("frontend message")?;
        Ok(msg)
    }

    /// The type byte.
    pub fn tag(&self) -> u8 {
        match self {
            FrontendMessage::Query(_) => b'Q',
            FrontendMessage::Parse { .. } => b'P',
            FrontendMessage::Bind(_) => b'B',
            FrontendMessage::Describe(..) => b'D',
            FrontendMessage::Execute { .. } => b'E',
            FrontendMessage::Sync => b'S',
            FrontendMessage::Flush => b'H',
            FrontendMessage::Close(..) => b'C',
            FrontendMessage::Terminate => b'X',
            FrontendMessage::AuthResponse(_) => b'p',
            FrontendMessage::CopyData(_) => b'd',
            FrontendMessage::CopyDone => b'c',
            FrontendMessage::CopyFail(_) => b'f',
            FrontendMessage::Unknown { tag, .. } => *tag,
        }
    }

    /// Appends the encoded message to `dst`.
    pub fn encode(&self, dst: &mut BytesMut) {
        let at = wire::begin(dst, self.tag());
        self.encode_body(dst);
        wire::finish(dst, at);
    }

    fn encode_body(&self, dst: &mut BytesMut) {
        match self {
            FrontendMessage::Query(q) | FrontendMessage::CopyFail(q) => wire::put_cstr(dst, q),
            FrontendMessage::Parse { name, query, param_types } => {
                wire::put_cstr(dst, name);
                wire::put_cstr(dst, query);
                dst.put_i16(wire::len_i16(param_types.len()));
                param_types.iter().for_each(|t| dst.put_u32(*t));
            }
            FrontendMessage::Bind(b) => encode_bind(b, dst),
            FrontendMessage::Describe(t, name) | FrontendMessage::Close(t, name) => {
                dst.put_u8(t.byte());
                wire::put_cstr(dst, name);
            }
            FrontendMessage::Execute { portal, max_rows } => {
                wire::put_cstr(dst, portal);
                dst.put_i32(*max_rows);
            }
            FrontendMessage::AuthResponse(b) | FrontendMessage::CopyData(b) => dst.put_slice(b),
            FrontendMessage::Unknown { body, .. } => dst.put_slice(body),
            FrontendMessage::Sync | FrontendMessage::Flush | FrontendMessage::Terminate | FrontendMessage::CopyDone => {
            }
        }
    }
}

/// The start of a Bind that is relayed in pieces (its parameters are not held): the portal
/// and statement names, and the bytes they take at the front of the body; `Ok(None)` while
/// `body` (what has arrived of it) does not hold both yet.
pub fn bind_names(body: &[u8]) -> Result<Option<(String, String, usize)>, Error> {
    let mut nul = body.iter().enumerate().filter(|(_, b)| **b == 0).map(|(i, _)| i);
    let (Some(_portal), Some(end_statement)) = (nul.next(), nul.next()) else { return Ok(None) };
    let mut r = Reader::new(&body[..=end_statement], Side::Client);
    Ok(Some((r.cstr("portal")?, r.cstr("statement")?, end_statement + 1)))
}

/// Appends the head of a Bind whose body is `portal`, `statement` and then `rest` more bytes
/// (formats, parameters, result formats) that the caller sends after it.
pub fn encode_bind_head(portal: &str, statement: &str, rest: usize, dst: &mut BytesMut) {
    let at = wire::begin(dst, b'B');
    wire::put_cstr(dst, portal);
    wire::put_cstr(dst, statement);
    let len = dst.len() - at + rest;
    dst[at..at + 4].copy_from_slice(&wire::len_i32(len).to_be_bytes());
}

fn decode_parse(r: &mut Reader<'_>) -> Result<FrontendMessage, Error> {
    let name = r.cstr("statement name")?;
    let query = r.cstr("query")?;
    let n = r.count16("parameter type count")?;
    let param_types = (0..n).map(|_| r.u32("parameter type")).collect::<Result<_, _>>()?;
    Ok(FrontendMessage::Parse { name, query, param_types })
}

fn decode_formats(r: &mut Reader<'_>) -> Result<Vec<i16>, Error> {
    let n = r.count16("format count")?;
    (0..n).map(|_| r.i16("format code")).collect()
}

fn decode_bind(r: &mut Reader<'_>) -> Result<Bind, Error> {
    let portal = r.cstr("portal")?;
    let statement = r.cstr("statement")?;
    let param_formats = decode_formats(r)?;
    let n = r.count16("parameter count")?;
    let params = (0..n).map(|_| r.nullable("parameter")).collect::<Result<_, _>>()?;
    let result_formats = decode_formats(r)?;
    Ok(Bind { portal, statement, param_formats, params, result_formats })
}

fn encode_formats(formats: &[i16], dst: &mut BytesMut) {
    dst.put_i16(wire::len_i16(formats.len()));
    formats.iter().for_each(|f| dst.put_i16(*f));
}

fn encode_bind(b: &Bind, dst: &mut BytesMut) {
    wire::put_cstr(dst, &b.portal);
    wire::put_cstr(dst, &b.statement);
    encode_formats(&b.param_formats, dst);
    dst.put_i16(wire::len_i16(b.params.len()));
    b.params.iter().for_each(|p| wire::put_nullable(dst, p.as_deref()));
    encode_formats(&b.result_formats, dst);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(buf: &[u8]) -> Result<Option<(FrontendMessage, usize)>, Error> {
        FrontendMessage::parse(buf, &Limits::default())
    }

    fn round_trip(buf: &[u8], want: FrontendMessage) {
        assert_eq!(parse(buf).unwrap(), Some((want.clone(), buf.len())));
        let mut out = BytesMut::new();
        want.encode(&mut out);
        assert_eq!(&out[..], buf);
    }

    #[test]
    fn simple_query() {
        round_trip(b"Q\0\0\0\x0dselect 1\0", FrontendMessage::Query("select 1".into()));
        assert_eq!(parse(b"Q\0\0\0\x0dselect 1").unwrap(), None);
    }

    #[test]
    fn extended_query_batch() {
        round_trip(
            b"P\0\0\0\x17s1\0select $1\0\0\x01\0\0\0\x17",
            FrontendMessage::Parse { name: "s1".into(), query: "select $1".into(), param_types: vec![23] },
        );
        let bind = Bind {
            portal: String::new(),
            statement: "s1".into(),
            param_formats: vec![],
            params: vec![Some(Bytes::from_static(b"42")), None],
            result_formats: vec![1],
        };
        round_trip(b"B\0\0\0\x1a\0s1\0\0\0\0\x02\0\0\0\x0242\xff\xff\xff\xff\0\x01\0\x01", FrontendMessage::Bind(bind));
        round_trip(b"D\0\0\0\x06P\0", FrontendMessage::Describe(Target::Portal, String::new()));
        round_trip(b"E\0\0\0\x09\0\0\0\0\0", FrontendMessage::Execute { portal: String::new(), max_rows: 0 });
        round_trip(b"C\0\0\0\x08Ss1\0", FrontendMessage::Close(Target::Statement, "s1".into()));
        round_trip(b"S\0\0\0\x04", FrontendMessage::Sync);
        round_trip(b"H\0\0\0\x04", FrontendMessage::Flush);
        round_trip(b"X\0\0\0\x04", FrontendMessage::Terminate);
    }

    #[test]
    fn copy_and_auth() {
        round_trip(b"d\0\0\0\x071\t2", FrontendMessage::CopyData(Bytes::from_static(b"1\t2")));
        round_trip(b"c\0\0\0\x04", FrontendMessage::CopyDone);
        round_trip(b"f\0\0\0\x09oops\0", FrontendMessage::CopyFail("oops".into()));
        round_trip(b"p\0\0\0\x0bsecret\0", FrontendMessage::AuthResponse(Bytes::from_static(b"secret\0")));
    }

    #[test]
    fn a_bind_head_is_read_and_written_without_its_parameters() {
        let bind = b"B\0\0\0\x13p\0s1\0\0\0\0\x01\0\0\0\0\0\0";
        assert_eq!(bind_names(&bind[5..7]), Ok(None), "the statement name is not in yet");
        assert_eq!(bind_names(&bind[5..10]), Ok(Some(("p".into(), "s1".into(), 5))));
        let mut head = BytesMut::new();
        encode_bind_head("p", "s1", bind.len() - 10, &mut head);
        assert_eq!(&head[..], &bind[..10]);
        let mut renamed = BytesMut::new();
        encode_bind_head("p", "global", bind.len() - 10, &mut renamed);
        renamed.extend_from_slice(&bind[10..]);
        let Some((FrontendMessage::Bind(b), n)) = parse(&renamed).unwrap() else { panic!("not a Bind") };
        assert_eq!((b.statement.as_str(), b.params.len(), n), ("global", 1, renamed.len()));
    }

    #[test]
    fn text_in_other_encodings_round_trips() {
        let name = crate::text::decode(b"s\xe9");
        let parse_msg =
            FrontendMessage::Parse { name, query: crate::text::decode(b"SELECT '\xe9'"), param_types: vec![] };
        round_trip(b"P\0\0\0\x14s\xe9\0SELECT '\xe9'\0\0\0", parse_msg);
        round_trip(b"f\0\0\0\x06\xff\0", FrontendMessage::CopyFail(crate::text::decode(b"\xff")));
    }

    #[test]
    fn unknown_types_pass_through() {
        round_trip(b"F\0\0\0\x06ab", FrontendMessage::Unknown { tag: b'F', body: Bytes::from_static(b"ab") });
    }

    #[test]
    fn refuses_malformed_bodies() {
        assert!(parse(b"Q\0\0\0\x06ab").is_err(), "unterminated query");
        assert!(parse(b"D\0\0\0\x06X\0").is_err(), "bad target");
        assert!(parse(b"S\0\0\0\x05x").is_err(), "trailing byte");
        assert!(parse(b"P\0\0\0\x0as\0q\0\xff\xff").is_err(), "negative count");
        assert!(parse(b"B\0\0\0\x0e\0\0\0\0\0\x01\xff\xff\xff\xfe").is_err(), "negative param length");
    }
}
