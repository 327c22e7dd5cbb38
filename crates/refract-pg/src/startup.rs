//! The first message a client sends, which has no type byte: StartupMessage, SSLRequest,
//! GSSENCRequest or CancelRequest.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{Error, Side};
use crate::frame::{self, Limits};
use crate::wire::{self, Reader};

/// Protocol version 3.0, what every current client speaks.
pub const PROTOCOL_3_0: i32 = 196_608;
/// Protocol version 3.2 (PostgreSQL 18: longer cancel keys).
pub const PROTOCOL_3_2: i32 = 196_610;
/// The request code of an SSLRequest.
pub const SSL_REQUEST_CODE: i32 = 80_877_103;
/// The request code of a GSSENCRequest.
pub const GSSENC_REQUEST_CODE: i32 = 80_877_104;
/// The request code of a CancelRequest.
pub const CANCEL_REQUEST_CODE: i32 = 80_877_102;

/// A StartupMessage: protocol version and connection parameters, in the client's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Startup {
    /// Requested protocol version (major << 16 | minor).
    pub protocol: i32,
    /// `user`, `database`, `application_name`, `options`, ... as sent.
    pub params: Vec<(String, String)>,
}

impl Startup {
    /// The value of a parameter, if the client sent it.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The user name (required by PostgreSQL).
    pub fn user(&self) -> Option<&str> {
        self.param("user")
    }

    /// The database, which defaults to the user name.
    pub fn database(&self) -> Option<&str> {
        self.param("database").or_else(|| self.user())
    }
}

/// A CancelRequest: the key of the backend whose query is to be cancelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelRequest {
    /// The server process id from BackendKeyData.
    pub pid: i32,
    /// The secret key (4 bytes in protocol 3.0, up to 256 in 3.2).
    pub secret: Bytes,
}

/// A startup-phase message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupPacket {
    /// Open a session.
    Startup(Startup),
    /// Ask for TLS; the answer is one byte, `S` or `N`.
    SslRequest,
    /// Ask for GSSAPI encryption; the answer is one byte, `G` or `N`.
    GssEncRequest,
    /// Cancel a running query (sent on a new connection).
    Cancel(CancelRequest),
}

impl StartupPacket {
    /// Decodes the startup-phase message at the start of `buf`; `Ok(None)` if incomplete.
    pub fn parse(buf: &[u8], limits: &Limits) -> Result<Option<(StartupPacket, usize)>, Error> {
        let Some(total) = frame::peek_startup(buf, limits)? else { return Ok(None) };
        let mut r = Reader::new(&buf[4..total], Side::Client);
        let code = r.i32("request code")?;
        let packet = match code {
            SSL_REQUEST_CODE => StartupPacket::SslRequest,
            GSSENC_REQUEST_CODE => StartupPacket::GssEncRequest,
            CANCEL_REQUEST_CODE => parse_cancel(&mut r)?,
            c if c >> 16 == 3 => StartupPacket::Startup(Startup { protocol: c, params: parse_params(&mut r)? }),
            c => return Err(Error::malformed(Side::Client, format!("unsupported protocol version {c:#x}"))),
        };
        r.finish("startup packet")?;
        Ok(Some((packet, total)))
    }

    /// Appends the encoded message to `dst`.
    pub fn encode(&self, dst: &mut BytesMut) {
        let at = wire::begin_untyped(dst);
        match self {
            StartupPacket::SslRequest => dst.put_i32(SSL_REQUEST_CODE),
            StartupPacket::GssEncRequest => dst.put_i32(GSSENC_REQUEST_CODE),
            StartupPacket::Cancel(c) => {
                dst.put_i32(CANCEL_REQUEST_CODE);
                dst.put_i32(c.pid);
                dst.put_slice(&c.secret);
            }
            StartupPacket::Startup(s) => {
                dst.put_i32(s.protocol);
                for (k, v) in &s.params {
                    wire::put_cstr(dst, k);
                    wire::put_cstr(dst, v);
                }
                dst.put_u8(0);
            }
        }
        wire::finish(dst, at);
    }
}

fn parse_cancel(r: &mut Reader<'_>) -> Result<StartupPacket, Error> {
    let pid = r.i32("cancel pid")?;
    let secret = Bytes::copy_from_slice(r.rest());
    if secret.len() < 4 || secret.len() > 256 {
        return Err(Error::malformed(Side::Client, "cancel key must be 4 to 256 bytes"));
    }
    Ok(StartupPacket::Cancel(CancelRequest { pid, secret }))
}

fn parse_params(r: &mut Reader<'_>) -> Result<Vec<(String, String)>, Error> {
    let mut params = Vec::new();
    loop {
        let name = r.cstr("parameter name")?;
        if name.is_empty() {
            return Ok(params);
        }
        let value = r.cstr("parameter value")?;
        params.push((name, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(buf: &[u8]) -> Result<Option<(StartupPacket, usize)>, Error> {
        StartupPacket::parse(buf, &Limits::default())
    }

    #[test]
    fn ssl_and_gss_requests() {
        assert_eq!(parse(b"\0\0\0\x08\x04\xd2\x16\x2f").unwrap(), Some((StartupPacket::SslRequest, 8)));
        assert_eq!(parse(b"\0\0\0\x08\x04\xd2\x16\x30").unwrap(), Some((StartupPacket::GssEncRequest, 8)));
    }

    #[test]
    fn startup_message_from_psql() {
        let buf = b"\0\0\0\x28\0\x03\0\0user\0refract\0database\0postgres\0\0";
        let (p, n) = parse(buf).unwrap().unwrap();
        assert_eq!(n, buf.len());
        let StartupPacket::Startup(s) = &p else { panic!("not a startup: {p:?}") };
        assert_eq!(s.protocol, PROTOCOL_3_0);
        assert_eq!(s.user(), Some("refract"));
        assert_eq!(s.database(), Some("postgres"));
        let mut out = BytesMut::new();
        p.encode(&mut out);
        assert_eq!(&out[..], &buf[..]);
    }

    #[test]
    fn database_defaults_to_user() {
        let s = Startup { protocol: PROTOCOL_3_0, params: vec![("user".into(), "bob".into())] };
        assert_eq!(s.database(), Some("bob"));
    }

    #[test]
    fn cancel_request() {
        let buf = b"\0\0\0\x10\x04\xd2\x16\x2e\0\0\x30\x39\xde\xad\xbe\xef";
        let want = StartupPacket::Cancel(CancelRequest { pid: 12345, secret: Bytes::from_static(b"\xde\xad\xbe\xef") });
        assert_eq!(parse(buf).unwrap(), Some((want, 16)));
        assert!(parse(b"\0\0\0\x0e\x04\xd2\x16\x2e\0\0\x30\x39\xde\xad").is_err());
    }

    #[test]
    fn refuses_garbage() {
        assert!(parse(b"\0\0\0\x08\0\x02\0\0").is_err(), "protocol 2");
        assert!(parse(b"\0\0\0\x0c\0\x03\0\0user").is_err(), "unterminated");
        assert!(parse(b"\0\0\0\x0c\x04\xd2\x16\x2fxxxx").is_err(), "trailing bytes");
    }
}
