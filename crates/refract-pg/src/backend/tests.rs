//! Byte-literal tests of server messages, taken from what PostgreSQL 15 sends.

use super::*;

fn parse(buf: &[u8]) -> Result<Option<(BackendMessage, usize)>, Error> {
    BackendMessage::parse(buf, &Limits::default())
}

fn round_trip(buf: &[u8], want: BackendMessage) {
    assert_eq!(parse(buf).unwrap(), Some((want.clone(), buf.len())));
    assert_eq!(&want.to_bytes()[..], buf);
}

#[test]
fn authentication_requests() {
    round_trip(b"R\0\0\0\x08\0\0\0\0", BackendMessage::Authentication(Authentication::Ok));
    round_trip(b"R\0\0\0\x08\0\0\0\x03", BackendMessage::Authentication(Authentication::CleartextPassword));
    round_trip(
        b"R\0\0\0\x0c\0\0\0\x05\x01\x02\x03\x04",
        BackendMessage::Authentication(Authentication::Md5Password { salt: [1, 2, 3, 4] }),
    );
    round_trip(
        b"R\0\0\0\x17\0\0\0\x0aSCRAM-SHA-256\0\0",
        BackendMessage::Authentication(Authentication::Sasl { mechanisms: vec!["SCRAM-SHA-256".into()] }),
    );
    round_trip(
        b"R\0\0\0\x0b\0\0\0\x0br=x",
        BackendMessage::Authentication(Authentication::SaslContinue(Bytes::from_static(b"r=x"))),
    );
    round_trip(
        b"R\0\0\0\x0b\0\0\0\x0cv=y",
        BackendMessage::Authentication(Authentication::SaslFinal(Bytes::from_static(b"v=y"))),
    );
    assert!(parse(b"R\0\0\0\x0a\0\0\0\x05\x01\x02").is_err(), "short salt");
}

#[test]
fn login_sequence() {
    round_trip(
        b"S\0\0\0\x19client_encoding\0UTF8\0",
        BackendMessage::ParameterStatus { name: "client_encoding".into(), value: "UTF8".into() },
    );
    round_trip(
        b"K\0\0\0\x0c\0\0\x30\x39\xde\xad\xbe\xef",
        BackendMessage::BackendKeyData { pid: 12345, secret: Bytes::from_static(b"\xde\xad\xbe\xef") },
    );
    round_trip(b"Z\0\0\0\x05I", BackendMessage::ReadyForQuery(TxStatus::Idle));
    round_trip(b"Z\0\0\0\x05T", BackendMessage::ReadyForQuery(TxStatus::InTransaction));
    round_trip(b"Z\0\0\0\x05E", BackendMessage::ReadyForQuery(TxStatus::Failed));
    assert!(parse(b"Z\0\0\0\x05X").is_err());
}

#[test]
fn query_results() {
    let field = FieldDescription {
        name: "n".into(),
        table_oid: 0,
        column: 0,
        type_oid: 23,
        type_size: 4,
        type_modifier: -1,
        format: 0,
    };
    round_trip(
        b"T\0\0\0\x1a\0\x01n\0\0\0\0\0\0\0\0\0\0\x17\0\x04\xff\xff\xff\xff\0\0",
        BackendMessage::RowDescription(vec![field]),
    );
    round_trip(
        b"D\0\0\0\x0f\0\x02\0\0\0\x011\xff\xff\xff\xff",
        BackendMessage::DataRow(vec![Some(Bytes::from_static(b"1")), None]),
    );
    round_trip(b"C\0\0\0\x0dSELECT 1\0", BackendMessage::CommandComplete("SELECT 1".into()));
    round_trip(b"I\0\0\0\x04", BackendMessage::EmptyQueryResponse);
    assert!(parse(b"D\0\0\0\x0a\0\x01\0\0\0\x05").is_err(), "value longer than message");
}

#[test]
fn error_response_with_sqlstate() {
    let buf = b"E\0\0\0\x3aSERROR\0VERROR\0C42P01\0Mrelation \"nope\" does not exist\0\0";
    let (msg, n) = parse(buf).unwrap().unwrap();
    assert_eq!(n, buf.len());
    let BackendMessage::ErrorResponse(f) = &msg else { panic!("{msg:?}") };
    assert_eq!(f.code(), Some("42P01"));
    assert_eq!(f.severity(), Some("ERROR"));
    assert_eq!(f.message(), Some("relation \"nope\" does not exist"));
    assert_eq!(&msg.to_bytes()[..], &buf[..]);
    let notice = b"N\0\0\0\x10SNOTICE\0Mx\0\0";
    assert!(matches!(parse(notice).unwrap(), Some((BackendMessage::NoticeResponse(_), 17))));
}

#[test]
fn extended_query_replies() {
    round_trip(b"1\0\0\0\x04", BackendMessage::ParseComplete);
    round_trip(b"2\0\0\0\x04", BackendMessage::BindComplete);
    round_trip(b"3\0\0\0\x04", BackendMessage::CloseComplete);
    round_trip(b"n\0\0\0\x04", BackendMessage::NoData);
    round_trip(b"s\0\0\0\x04", BackendMessage::PortalSuspended);
    round_trip(b"t\0\0\0\x0a\0\x01\0\0\0\x17", BackendMessage::ParameterDescription(vec![23]));
    assert!(parse(b"1\0\0\0\x05x").is_err(), "body on an empty message");
}

#[test]
fn copy_and_notifications() {
    let copy = CopyResponse { format: 0, column_formats: vec![0, 0] };
    round_trip(b"G\0\0\0\x0b\0\0\x02\0\0\0\0", BackendMessage::CopyInResponse(copy.clone()));
    round_trip(b"H\0\0\0\x0b\0\0\x02\0\0\0\0", BackendMessage::CopyOutResponse(copy.clone()));
    round_trip(b"W\0\0\0\x0b\0\0\x02\0\0\0\0", BackendMessage::CopyBothResponse(copy));
    round_trip(b"d\0\0\0\x06a\n", BackendMessage::CopyData(Bytes::from_static(b"a\n")));
    round_trip(b"c\0\0\0\x04", BackendMessage::CopyDone);
    round_trip(
        b"A\0\0\0\x10\0\0\0\x07chan\0hi\0",
        BackendMessage::NotificationResponse { pid: 7, channel: "chan".into(), payload: "hi".into() },
    );
    round_trip(
        b"v\0\0\0\x15\0\x03\0\0\0\0\0\x01_pq_.foo\0",
        BackendMessage::NegotiateProtocolVersion { version: 196_608, options: vec!["_pq_.foo".into()] },
    );
    assert!(parse(b"v\0\0\0\x0c\0\0\0\0\x7f\xff\xff\xff").is_err(), "huge option count");
}

#[test]
fn unknown_types_pass_through() {
    round_trip(b"V\0\0\0\x08\0\0\0\0", BackendMessage::Unknown { tag: b'V', body: Bytes::from_static(b"\0\0\0\0") });
}
