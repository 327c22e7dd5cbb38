//! Authentication, both ways: [`ServerAuth`] checks a client against refract's configured users
//! (SCRAM-SHA-256, md5, trust); [`ClientAuth`] logs refract into a PostgreSQL server. Both are
//! closed state machines fed one message at a time; neither does I/O.

pub mod md5;
pub mod scram;

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{Error, Side};
use crate::frontend::FrontendMessage;
use crate::wire::{self, Reader};

pub use client::{ClientAuth, ClientStep};
pub use scram::{ScramClient, ScramServer, ScramVerifier};
pub use server::{AuthMethod, Credential, ServerAuth, ServerStep};

mod client;
mod server;

/// SASLInitialResponse: the chosen mechanism and its first message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaslInitialResponse {
    /// e.g. `SCRAM-SHA-256`.
    pub mechanism: String,
    /// The client-first-message (absent if the length was -1).
    pub data: Option<Bytes>,
}

impl SaslInitialResponse {
    /// Decodes the body of a `p` message sent in answer to AuthenticationSASL.
    pub fn decode(body: &[u8]) -> Result<Self, Error> {
        let mut r = Reader::new(body, Side::Client);
        let mechanism = r.cstr("SASL mechanism")?;
        let data = r.nullable("SASL data")?;
        r.finish("SASLInitialResponse")?;
        Ok(SaslInitialResponse { mechanism, data })
    }

    /// As a frontend `p` message.
    pub fn to_message(&self) -> FrontendMessage {
        let mut body = BytesMut::new();
        wire::put_cstr(&mut body, &self.mechanism);
        wire::put_nullable(&mut body, self.data.as_deref());
        FrontendMessage::AuthResponse(body.freeze())
    }
}

/// Decodes the body of a PasswordMessage (cleartext or md5 answer).
pub fn decode_password(body: &[u8]) -> Result<String, Error> {
    let mut r = Reader::new(body, Side::Client);
    let pw = r.cstr("password")?;
    r.finish("PasswordMessage")?;
    Ok(pw)
}

/// A PasswordMessage carrying `password` (cleartext or an md5 answer).
pub fn password_message(password: &str) -> FrontendMessage {
    let mut body = BytesMut::with_capacity(password.len() + 1);
    body.put_slice(password.as_bytes());
    body.put_u8(0);
    FrontendMessage::AuthResponse(body.freeze())
}

/// The body of a `p` message, or a protocol error naming what was expected instead.
fn auth_body<'a>(msg: &'a FrontendMessage, expected: &str) -> Result<&'a [u8], Error> {
    match msg {
        FrontendMessage::AuthResponse(body) => Ok(body),
        other => Err(Error::AuthProtocol {
            from: Side::Client,
            reason: format!("expected {expected}, got message type '{}'", char::from(other.tag())),
        }),
    }
}

#[cfg(test)]
mod tests;
