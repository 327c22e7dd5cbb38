//! Typed messages a server sends, and the encoders refract uses when it answers a client itself.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{Error, Side};
use crate::frame::{self, Limits};
use crate::notice::ErrorFields;
use crate::wire::{self, Reader};

/// An authentication request or outcome (`R`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authentication {
    /// 0: authentication succeeded.
    Ok,
    /// 3: send the password in clear text.
    CleartextPassword,
    /// 5: send `md5(md5(password + user) + salt)`.
    Md5Password {
        /// The salt.
        salt: [u8; 4],
    },
    /// 10: start SASL with one of these mechanisms.
    Sasl {
        /// e.g. `SCRAM-SHA-256`.
        mechanisms: Vec<String>,
    },
    /// 11: a SASL challenge.
    SaslContinue(Bytes),
    /// 12: the SASL outcome.
    SaslFinal(Bytes),
    /// Any other method (Kerberos, GSS, SSPI), kept raw.
    Other {
        /// The method code.
        code: i32,
        /// The rest of the body.
        data: Bytes,
    },
}

/// Transaction status in ReadyForQuery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxStatus {
    /// `I`: not in a transaction.
    Idle,
    /// `T`: in a transaction block.
    InTransaction,
    /// `E`: in a failed transaction block (queries are refused until it ends).
    Failed,
}

impl TxStatus {
    fn from_byte(b: u8) -> Result<Self, Error> {
        match b {
            b'I' => Ok(TxStatus::Idle),
            b'T' => Ok(TxStatus::InTransaction),
            b'E' => Ok(TxStatus::Failed),
            b => Err(Error::malformed(Side::Backend, format!("unknown transaction status {b:#x}"))),
        }
    }

    /// The status byte.
    pub fn byte(self) -> u8 {
        match self {
            TxStatus::Idle => b'I',
            TxStatus::InTransaction => b'T',
            TxStatus::Failed => b'E',
        }
    }
}

/// One column of a RowDescription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldDescription {
    /// Column name.
    pub name: String,
    /// OID of the source table, or 0.
    pub table_oid: u32,
    /// Attribute number in the source table, or 0.
    pub column: i16,
    /// Data type OID.
    pub type_oid: u32,
    /// Data type size (negative for variable width).
    pub type_size: i16,
    /// Type modifier.
    pub type_modifier: i32,
    /// 0 text, 1 binary.
    pub format: i16,
}

/// The header of CopyInResponse, CopyOutResponse and CopyBothResponse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyResponse {
    /// Overall format: 0 text, 1 binary.
    pub format: u8,
    /// Per-column format codes.
    pub column_formats: Vec<i16>,
}

/// A message from server to client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendMessage {
    /// `R`.
    Authentication(Authentication),
    /// `S`: a run-time parameter's current value.
    ParameterStatus {
        /// Parameter name.
        name: String,
        /// Its value.
        value: String,
    },
    /// `K`: the key a CancelRequest must present.
    BackendKeyData {
        /// Server process id.
        pid: i32,
        /// Secret key (4 bytes in protocol 3.0).
        secret: Bytes,
    },
    /// `Z`: ready for a new query.
    ReadyForQuery(TxStatus),
    /// `T`.
    RowDescription(Vec<FieldDescription>),
    /// `D`: one row; `None` is SQL NULL.
    DataRow(Vec<Option<Bytes>>),
    /// `C`: a command finished, e.g. `INSERT 0 1`.
    CommandComplete(String),
    /// `I`: the query string was empty.
    EmptyQueryResponse,
    /// `E`.
    ErrorResponse(ErrorFields),
    /// `N`.
    NoticeResponse(ErrorFields),
    /// `1`.
    ParseComplete,
    /// `2`.
    BindComplete,
    /// `3`.
    CloseComplete,
    /// `n`.
    NoData,
    /// `s`: Execute's row limit was reached.
    PortalSuspended,
    /// `t`: parameter type OIDs of a statement.
    ParameterDescription(Vec<u32>),
    /// `G`.
    CopyInResponse(CopyResponse),
    /// `H`.
    CopyOutResponse(CopyResponse),
    /// `W`.
    CopyBothResponse(CopyResponse),
    /// `d`.
    CopyData(Bytes),
    /// `c`.
    CopyDone,
    /// `A`: a NOTIFY delivered to this session.
    NotificationResponse {
        /// The notifying server process.
        pid: i32,
        /// Channel name.
        channel: String,
        /// Payload.
        payload: String,
    },
    /// `v`: the server does not support the requested minor version or options.
    NegotiateProtocolVersion {
        /// The newest protocol version the server speaks for the requested major version, whole
        /// (`major << 16 | minor`: 196608 for 3.0), as PostgreSQL sends it. The protocol page
        /// calls it the "newest minor version", but libpq reads the whole number and refuses a
        /// "downgrade to pre-3.0" when it is a bare minor such as 0.
        version: i32,
        /// Options it did not recognise.
        options: Vec<String>,
    },
    /// Any other type (e.g. `V` FunctionCallResponse), kept raw.
    Unknown {
        /// The type byte.
        tag: u8,
        /// The body.
        body: Bytes,
    },
}

impl BackendMessage {
    /// Decodes the message at the start of `buf`; `Ok(None)` if it is not complete yet.
    pub fn parse(buf: &[u8], limits: &Limits) -> Result<Option<(BackendMessage, usize)>, Error> {
        let Some(h) = frame::peek(buf, Side::Backend, limits)? else { return Ok(None) };
        Ok(Some((Self::decode(h.tag, &buf[h.body()])?, h.total)))
    }

    /// Decodes a body whose type byte is `tag`.
    pub fn decode(tag: u8, body: &[u8]) -> Result<BackendMessage, Error> {
        let mut r = Reader::new(body, Side::Backend);
        let msg = match tag {
            b'R' => BackendMessage::Authentication(decode_auth(&mut r)?),
            b'S' => BackendMessage::ParameterStatus { name: r.cstr("name")?, value: r.cstr("value")? },
            b'K' => BackendMessage::BackendKeyData { pid: r.i32("pid")?, secret: Bytes::copy_from_slice(r.rest()) },
            b'Z' => BackendMessage::ReadyForQuery(TxStatus::from_byte(r.u8("status")?)?),
            b'T' => BackendMessage::RowDescription(decode_fields(&mut r)?),
            b'D' => BackendMessage::DataRow(decode_row(&mut r)?),
            b'C' => BackendMessage::CommandComplete(r.cstr("command tag")?),
            b'E' => BackendMessage::ErrorResponse(ErrorFields::decode(&mut r)?),
            b'N' => BackendMessage::NoticeResponse(ErrorFields::decode(&mut r)?),
            b't' => BackendMessage::ParameterDescription(decode_oids(&mut r)?),
            b'G' => BackendMessage::CopyInResponse(decode_copy(&mut r)?),
            b'H' => BackendMessage::CopyOutResponse(decode_copy(&mut r)?),
            b'W' => BackendMessage::CopyBothResponse(decode_copy(&mut r)?),
            b'd' => BackendMessage::CopyData(Bytes::copy_from_slice(r.rest())),
            b'A' => decode_notification(&mut r)?,
            b'v' => decode_negotiate(&mut r)?,
            tag => empty_or_unknown(tag, &mut r),
        };
        r.finish("server message")?;
        Ok(msg)
    }

    /// The type byte.
    pub fn tag(&self) -> u8 {
        use BackendMessage as B;
        match self {
            B::Authentication(_) => b'R',
            B::ParameterStatus { .. } => b'S',
            B::BackendKeyData { .. } => b'K',
            B::ReadyForQuery(_) => b'Z',
            B::RowDescription(_) => b'T',
            B::DataRow(_) => b'D',
            B::CommandComplete(_) => b'C',
            B::EmptyQueryResponse => b'I',
            B::ErrorResponse(_) => b'E',
            B::NoticeResponse(_) => b'N',
            B::ParseComplete => b'1',
            B::BindComplete => b'2',
            B::CloseComplete => b'3',
            B::NoData => b'n',
            B::PortalSuspended => b's',
            B::ParameterDescription(_) => b't',
            B::CopyInResponse(_) => b'G',
            B::CopyOutResponse(_) => b'H',
            B::CopyBothResponse(_) => b'W',
            B::CopyData(_) => b'd',
            B::CopyDone => b'c',
            B::NotificationResponse { .. } => b'A',
            B::NegotiateProtocolVersion { .. } => b'v',
            B::Unknown { tag, .. } => *tag,
        }
    }

    /// Appends the encoded message to `dst`.
    pub fn encode(&self, dst: &mut BytesMut) {
        let at = wire::begin(dst, self.tag());
        self.encode_body(dst);
        wire::finish(dst, at);
    }

    /// The encoded message as bytes.
    pub fn to_bytes(&self) -> Bytes {
        let mut dst = BytesMut::new();
        self.encode(&mut dst);
        dst.freeze()
    }

    fn encode_body(&self, dst: &mut BytesMut) {
        use BackendMessage as B;
        match self {
            B::Authentication(a) => encode_auth(a, dst),
            B::ParameterStatus { name, value } => {
                wire::put_cstr(dst, name);
                wire::put_cstr(dst, value);
            }
            B::BackendKeyData { pid, secret } => {
                dst.put_i32(*pid);
                dst.put_slice(secret);
            }
            B::ReadyForQuery(s) => dst.put_u8(s.byte()),
            B::RowDescription(fields) => encode_fields(fields, dst),
            B::DataRow(values) => {
                dst.put_i16(wire::len_i16(values.len()));
                values.iter().for_each(|v| wire::put_nullable(dst, v.as_deref()));
            }
            B::CommandComplete(tag) => wire::put_cstr(dst, tag),
            B::ErrorResponse(f) | B::NoticeResponse(f) => f.encode(dst),
            B::ParameterDescription(oids) => {
                dst.put_i16(wire::len_i16(oids.len()));
                oids.iter().for_each(|o| dst.put_u32(*o));
            }
            B::CopyInResponse(c) | B::CopyOutResponse(c) | B::CopyBothResponse(c) => encode_copy(c, dst),
            B::CopyData(b) | B::Unknown { body: b, .. } => dst.put_slice(b),
            B::NotificationResponse { pid, channel, payload } => {
                dst.put_i32(*pid);
                wire::put_cstr(dst, channel);
                wire::put_cstr(dst, payload);
            }
            B::NegotiateProtocolVersion { version, options } => {
                dst.put_i32(*version);
                dst.put_i32(wire::len_i32(options.len()));
                options.iter().for_each(|o| wire::put_cstr(dst, o));
            }
            B::EmptyQueryResponse | B::ParseComplete | B::BindComplete | B::CloseComplete => {}
            B::NoData | B::PortalSuspended | B::CopyDone => {}
        }
    }
}

/// Messages without a body, or unknown ones (kept raw).
fn empty_or_unknown(tag: u8, r: &mut Reader<'_>) -> BackendMessage {
    let msg = match tag {
        b'I' => BackendMessage::EmptyQueryResponse,
        b'1' => BackendMessage::ParseComplete,
        b'2' => BackendMessage::BindComplete,
        b'3' => BackendMessage::CloseComplete,
        b'n' => BackendMessage::NoData,
        b's' => BackendMessage::PortalSuspended,
        b'c' => BackendMessage::CopyDone,
        tag => return BackendMessage::Unknown { tag, body: Bytes::copy_from_slice(r.rest()) },
    };
    // A known empty message with a body is left to `finish` to refuse.
    msg
}

fn decode_auth(r: &mut Reader<'_>) -> Result<Authentication, Error> {
    let code = r.i32("authentication code")?;
    Ok(match code {
        0 => Authentication::Ok,
        3 => Authentication::CleartextPassword,
        5 => {
            let s = r.take(4, "md5 salt")?;
            Authentication::Md5Password { salt: [s[0], s[1], s[2], s[3]] }
        }
        10 => Authentication::Sasl { mechanisms: decode_mechanisms(r)? },
        11 => Authentication::SaslContinue(Bytes::copy_from_slice(r.rest())),
        12 => Authentication::SaslFinal(Bytes::copy_from_slice(r.rest())),
        code => Authentication::Other { code, data: Bytes::copy_from_slice(r.rest()) },
    })
}

fn decode_mechanisms(r: &mut Reader<'_>) -> Result<Vec<String>, Error> {
    let mut mechanisms = Vec::new();
    loop {
        let m = r.cstr("SASL mechanism")?;
        if m.is_empty() {
            return Ok(mechanisms);
        }
        mechanisms.push(m);
    }
}

fn encode_auth(a: &Authentication, dst: &mut BytesMut) {
    match a {
        Authentication::Ok => dst.put_i32(0),
        Authentication::CleartextPassword => dst.put_i32(3),
        Authentication::Md5Password { salt } => {
            dst.put_i32(5);
            dst.put_slice(salt);
        }
        Authentication::Sasl { mechanisms } => {
            dst.put_i32(10);
            mechanisms.iter().for_each(|m| wire::put_cstr(dst, m));
            dst.put_u8(0);
        }
        Authentication::SaslContinue(d) => {
            dst.put_i32(11);
            dst.put_slice(d);
        }
        Authentication::SaslFinal(d) => {
            dst.put_i32(12);
            dst.put_slice(d);
        }
        Authentication::Other { code, data } => {
            dst.put_i32(*code);
            dst.put_slice(data);
        }
    }
}

fn decode_fields(r: &mut Reader<'_>) -> Result<Vec<FieldDescription>, Error> {
    let n = r.count16("field count")?;
    (0..n)
        .map(|_| {
            Ok(FieldDescription {
                name: r.cstr("field name")?,
                table_oid: r.u32("table oid")?,
                column: r.i16("column number")?,
                type_oid: r.u32("type oid")?,
                type_size: r.i16("type size")?,
                type_modifier: r.i32("type modifier")?,
                format: r.i16("format")?,
            })
        })
        .collect()
}

fn encode_fields(fields: &[FieldDescription], dst: &mut BytesMut) {
    dst.put_i16(wire::len_i16(fields.len()));
    for f in fields {
        wire::put_cstr(dst, &f.name);
        dst.put_u32(f.table_oid);
        dst.put_i16(f.column);
        dst.put_u32(f.type_oid);
        dst.put_i16(f.type_size);
        dst.put_i32(f.type_modifier);
        dst.put_i16(f.format);
    }
}

fn decode_row(r: &mut Reader<'_>) -> Result<Vec<Option<Bytes>>, Error> {
    let n = r.count16("column count")?;
    (0..n).map(|_| r.nullable("column value")).collect()
}

fn decode_oids(r: &mut Reader<'_>) -> Result<Vec<u32>, Error> {
    let n = r.count16("parameter count")?;
    (0..n).map(|_| r.u32("parameter type")).collect()
}

fn decode_copy(r: &mut Reader<'_>) -> Result<CopyResponse, Error> {
    let format = r.u8("copy format")?;
    let n = r.count16("copy column count")?;
    let column_formats = (0..n).map(|_| r.i16("copy column format")).collect::<Result<_, _>>()?;
    Ok(CopyResponse { format, column_formats })
}

fn encode_copy(c: &CopyResponse, dst: &mut BytesMut) {
    dst.put_u8(c.format);
    dst.put_i16(wire::len_i16(c.column_formats.len()));
    c.column_formats.iter().for_each(|f| dst.put_i16(*f));
}

fn decode_notification(r: &mut Reader<'_>) -> Result<BackendMessage, Error> {
    Ok(BackendMessage::NotificationResponse {
        pid: r.i32("pid")?,
        channel: r.cstr("channel")?,
        payload: r.cstr("payload")?,
    })
}

fn decode_negotiate(r: &mut Reader<'_>) -> Result<BackendMessage, Error> {
    let version = r.i32("protocol version")?;
    let n = r.i32("option count")?;
    let n = usize::try_from(n).map_err(|_| Error::malformed(Side::Backend, "negative option count"))?;
    // Each option takes at least one byte, which bounds the allocation by the message size.
    let mut options = Vec::new();
    for _ in 0..n {
        if r.is_empty() {
            return Err(Error::malformed(Side::Backend, "truncated options"));
        }
        options.push(r.cstr("option")?);
    }
    Ok(BackendMessage::NegotiateProtocolVersion { version, options })
}

#[cfg(test)]
mod tests;
