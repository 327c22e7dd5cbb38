//! The fields of ErrorResponse and NoticeResponse, with SQLSTATE codes refract itself uses.

use bytes::{BufMut, BytesMut};

use crate::error::Error;
use crate::wire::{self, Reader};

/// SQLSTATE codes refract answers with when it speaks for itself.
pub mod sqlstate {
    /// `08P01` protocol_violation: malformed or unexpected messages.
    pub const PROTOCOL_VIOLATION: &str = "08P01";
    /// `08006` connection_failure: a server went away.
    pub const CONNECTION_FAILURE: &str = "08006";
    /// `08001` sqlclient_unable_to_establish_sqlconnection: no server could be reached.
    pub const CANNOT_CONNECT: &str = "08001";
    /// `28P01` invalid_password: wrong password.
    pub const INVALID_PASSWORD: &str = "28P01";
    /// `28000` invalid_authorization_specification: unknown user, method not allowed.
    pub const INVALID_AUTHORIZATION: &str = "28000";
    /// `3D000` invalid_catalog_name: unknown database.
    pub const INVALID_CATALOG_NAME: &str = "3D000";
    /// `53300` too_many_connections.
    pub const TOO_MANY_CONNECTIONS: &str = "53300";
    /// `54000` program_limit_exceeded: a message over the size limit.
    pub const PROGRAM_LIMIT_EXCEEDED: &str = "54000";
    /// `57014` query_canceled: as for `statement_timeout`, a statement's deadline passed.
    pub const QUERY_CANCELED: &str = "57014";
    /// `57P01` admin_shutdown.
    pub const ADMIN_SHUTDOWN: &str = "57P01";
    /// `25006` read_only_sql_transaction.
    pub const READ_ONLY_SQL_TRANSACTION: &str = "25006";
    /// `0A000` feature_not_supported.
    pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
    /// `XX000` internal_error.
    pub const INTERNAL_ERROR: &str = "XX000";
}

/// Field codes (the byte before each field).
pub mod field {
    /// Severity, possibly localized.
    pub const SEVERITY: u8 = b'S';
    /// Severity, never localized (9.6+).
    pub const SEVERITY_NONLOCALIZED: u8 = b'V';
    /// SQLSTATE code.
    pub const CODE: u8 = b'C';
    /// Primary message.
    pub const MESSAGE: u8 = b'M';
    /// Detail.
    pub const DETAIL: u8 = b'D';
    /// Hint.
    pub const HINT: u8 = b'H';
}

/// The fields of an ErrorResponse or NoticeResponse, in the order sent.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ErrorFields {
    /// `(code, value)` pairs.
    pub fields: Vec<(u8, String)>,
}

impl ErrorFields {
    /// An error as refract reports it: severity `ERROR` (or `FATAL`), SQLSTATE and message.
    pub fn new(severity: &str, code: &str, message: impl Into<String>) -> Self {
        let fields = vec![
            (field::SEVERITY, severity.to_owned()),
            (field::SEVERITY_NONLOCALIZED, severity.to_owned()),
            (field::CODE, code.to_owned()),
            (field::MESSAGE, message.into()),
        ];
        ErrorFields { fields }
    }

    /// Adds a field (e.g. a hint) and returns self.
    pub fn with(mut self, code: u8, value: impl Into<String>) -> Self {
        self.fields.push((code, value.into()));
        self
    }

    /// The first value of field `code`.
    pub fn get(&self, code: u8) -> Option<&str> {
        self.fields.iter().find(|(c, _)| *c == code).map(|(_, v)| v.as_str())
    }

    /// The SQLSTATE code.
    pub fn code(&self) -> Option<&str> {
        self.get(field::CODE)
    }

    /// The primary message.
    pub fn message(&self) -> Option<&str> {
        self.get(field::MESSAGE)
    }

    /// The severity, preferring the non-localized one.
    pub fn severity(&self) -> Option<&str> {
        self.get(field::SEVERITY_NONLOCALIZED).or_else(|| self.get(field::SEVERITY))
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, Error> {
        let mut fields = Vec::new();
        loop {
            let code = r.u8("error field code")?;
            if code == 0 {
                return Ok(ErrorFields { fields });
            }
            fields.push((code, r.cstr("error field")?));
        }
    }

    pub(crate) fn encode(&self, dst: &mut BytesMut) {
        for (code, value) in self.fields.iter().filter(|(c, _)| *c != 0) {
            dst.put_u8(*code);
            wire::put_cstr(dst, value);
        }
        dst.put_u8(0);
    }
}
