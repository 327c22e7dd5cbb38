//! Messages refract sends to a client on its own behalf: errors, the authentication
//! handshake, and the end of a login.

use bytes::{Bytes, BytesMut};

use crate::backend::{Authentication, BackendMessage, TxStatus};
use crate::notice::ErrorFields;

/// The one-byte answer refusing an SSLRequest or GSSENCRequest.
pub const REFUSE_ENCRYPTION: &[u8] = b"N";
/// The one-byte answer accepting an SSLRequest (TLS handshake follows).
pub const ACCEPT_SSL: &[u8] = b"S";

/// An ErrorResponse with severity `ERROR`: the statement failed, the session goes on.
pub fn error(code: &str, message: &str) -> Bytes {
    BackendMessage::ErrorResponse(ErrorFields::new("ERROR", code, message)).to_bytes()
}

/// An ErrorResponse with severity `FATAL`: refract closes the connection after it.
pub fn fatal(code: &str, message: &str) -> Bytes {
    BackendMessage::ErrorResponse(ErrorFields::new("FATAL", code, message)).to_bytes()
}

/// A RowDescription of one text column `name`, then a DataRow per value: what refract answers
/// for its own SHOW and route traces (the caller adds the CommandComplete).
pub fn text_rows(name: &str, values: &[String]) -> Bytes {
    let field = crate::backend::FieldDescription {
        name: name.into(),
        table_oid: 0,
        column: 0,
        type_oid: 25, // text
        type_size: -1,
        type_modifier: -1,
        format: 0,
    };
    let mut out = BytesMut::new();
    out.extend_from_slice(&BackendMessage::RowDescription(vec![field]).to_bytes());
    for v in values {
        out.extend_from_slice(&BackendMessage::DataRow(vec![Some(Bytes::from(v.clone()))]).to_bytes());
    }
    out.freeze()
}

/// ReadyForQuery with the given transaction status.
pub fn ready_for_query(status: TxStatus) -> Bytes {
    BackendMessage::ReadyForQuery(status).to_bytes()
}

/// An authentication request (or AuthenticationOk).
pub fn authentication(a: Authentication) -> Bytes {
    BackendMessage::Authentication(a).to_bytes()
}

/// ParameterStatus.
pub fn parameter_status(name: &str, value: &str) -> Bytes {
    BackendMessage::ParameterStatus { name: name.into(), value: value.into() }.to_bytes()
}

/// BackendKeyData with refract's own key (refract maps it to the server's on CancelRequest).
pub fn backend_key_data(pid: i32, secret: [u8; 4]) -> Bytes {
    BackendMessage::BackendKeyData { pid, secret: Bytes::copy_from_slice(&secret) }.to_bytes()
}

/// Everything after a successful authentication: AuthenticationOk, the parameters, the
/// cancel key and ReadyForQuery(idle).
pub fn login_complete(params: &[(String, String)], pid: i32, secret: [u8; 4]) -> Bytes {
    let mut out = BytesMut::new();
    BackendMessage::Authentication(Authentication::Ok).encode(&mut out);
    for (name, value) in params {
        BackendMessage::ParameterStatus { name: name.clone(), value: value.clone() }.encode(&mut out);
    }
    BackendMessage::BackendKeyData { pid, secret: Bytes::copy_from_slice(&secret) }.encode(&mut out);
    BackendMessage::ReadyForQuery(TxStatus::Idle).encode(&mut out);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notice::sqlstate;

    #[test]
    fn error_bytes() {
        let got = error(sqlstate::PROTOCOL_VIOLATION, "bad");
        assert_eq!(&got[..], b"E\0\0\0\x1fSERROR\0VERROR\0C08P01\0Mbad\0\0");
    }

    #[test]
    fn login_bytes() {
        let got = login_complete(&[("server_version".into(), "15".into())], 1, [0, 0, 0, 2]);
        let want: &[u8] =
            b"R\0\0\0\x08\0\0\0\0S\0\0\0\x16server_version\x0015\0K\0\0\0\x0c\0\0\0\x01\0\0\0\x02Z\0\0\0\x05I";
        assert_eq!(&got[..], want);
    }
}
