//! Property tests of the message codecs: every message survives encode → parse, a message is
//! never reported complete before its last byte, and arbitrary bytes never panic a parser.
#![allow(clippy::unwrap_used)]

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use refract_pg::backend::{CopyResponse, FieldDescription};
use refract_pg::frontend::{Bind, Target};
use refract_pg::startup::{CancelRequest, Startup, PROTOCOL_3_0};
use refract_pg::stream::{Piece, Splitter, HEAD_LEN};
use refract_pg::{
    frame, Authentication, BackendMessage, ErrorFields, FrontendMessage, Limits, StartupPacket, TxStatus,
};

// No NUL, and no character of the escape range U+10FF00..=U+10FFFF (`refract_pg::text`): such a
// character stands for a raw byte, so it is not the decoded form of any text (decoding escapes
// a real one byte by byte), and the escape of byte 0 would end a C string early.
fn text() -> impl Strategy<Value = String> {
    "[^\u{0}\u{10FF00}-\u{10FFFF}]{0,12}"
}

fn nonempty_text() -> impl Strategy<Value = String> {
    "[^\u{0}\u{10FF00}-\u{10FFFF}]{1,12}"
}

fn blob() -> impl Strategy<Value = Bytes> {
    prop::collection::vec(any::<u8>(), 0..24).prop_map(Bytes::from)
}

fn value() -> impl Strategy<Value = Option<Bytes>> {
    prop::option::of(blob())
}

fn unknown_tag(known: &'static [u8]) -> impl Strategy<Value = u8> {
    any::<u8>().prop_filter("known tag", move |t| !known.contains(t))
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![Just(Target::Statement), Just(Target::Portal)]
}

fn bind() -> impl Strategy<Value = Bind> {
    let formats = || prop::collection::vec(0i16..2, 0..4);
    (text(), text(), formats(), prop::collection::vec(value(), 0..4), formats()).prop_map(
        |(portal, statement, param_formats, params, result_formats)| Bind {
            portal,
            statement,
            param_formats,
            params,
            result_formats,
        },
    )
}

fn frontend() -> impl Strategy<Value = FrontendMessage> {
    use FrontendMessage as F;
    prop_oneof![
        text().prop_map(F::Query),
        (text(), text(), prop::collection::vec(any::<u32>(), 0..4)).prop_map(|(name, query, param_types)| F::Parse {
            name,
            query,
            param_types
        }),
        bind().prop_map(F::Bind),
        (target(), text()).prop_map(|(t, n)| F::Describe(t, n)),
        (text(), any::<i32>()).prop_map(|(portal, max_rows)| F::Execute { portal, max_rows }),
        Just(F::Sync),
        Just(F::Flush),
        (target(), text()).prop_map(|(t, n)| F::Close(t, n)),
        Just(F::Terminate),
        blob().prop_map(F::AuthResponse),
        blob().prop_map(F::CopyData),
        Just(F::CopyDone),
        text().prop_map(F::CopyFail),
        (unknown_tag(b"QPBDESHCXpdcf"), blob()).prop_map(|(tag, body)| F::Unknown { tag, body }),
    ]
}

fn authentication() -> impl Strategy<Value = Authentication> {
    use Authentication as A;
    prop_oneof![
        Just(A::Ok),
        Just(A::CleartextPassword),
        any::<[u8; 4]>().prop_map(|salt| A::Md5Password { salt }),
        prop::collection::vec(nonempty_text(), 0..3).prop_map(|mechanisms| A::Sasl { mechanisms }),
        blob().prop_map(A::SaslContinue),
        blob().prop_map(A::SaslFinal),
        (any::<i32>().prop_filter("known", |c| ![0, 3, 5, 10, 11, 12].contains(c)), blob())
            .prop_map(|(code, data)| A::Other { code, data }),
    ]
}

fn field() -> impl Strategy<Value = FieldDescription> {
    (text(), any::<u32>(), any::<i16>(), any::<u32>(), any::<i16>(), any::<i32>(), 0i16..2).prop_map(
        |(name, table_oid, column, type_oid, type_size, type_modifier, format)| FieldDescription {
            name,
            table_oid,
            column,
            type_oid,
            type_size,
            type_modifier,
            format,
        },
    )
}

fn error_fields() -> impl Strategy<Value = ErrorFields> {
    prop::collection::vec((1u8.., text()), 0..5).prop_map(|fields| ErrorFields { fields })
}

fn copy() -> impl Strategy<Value = CopyResponse> {
    (0u8..2, prop::collection::vec(0i16..2, 0..4))
        .prop_map(|(format, column_formats)| CopyResponse { format, column_formats })
}

fn backend() -> impl Strategy<Value = BackendMessage> {
    use BackendMessage as B;
    let status = prop_oneof![Just(TxStatus::Idle), Just(TxStatus::InTransaction), Just(TxStatus::Failed)];
    prop_oneof![
        authentication().prop_map(B::Authentication),
        (text(), text()).prop_map(|(name, value)| B::ParameterStatus { name, value }),
        (any::<i32>(), blob()).prop_map(|(pid, secret)| B::BackendKeyData { pid, secret }),
        status.prop_map(B::ReadyForQuery),
        prop::collection::vec(field(), 0..3).prop_map(B::RowDescription),
        prop::collection::vec(value(), 0..4).prop_map(B::DataRow),
        text().prop_map(B::CommandComplete),
        Just(B::EmptyQueryResponse),
        error_fields().prop_map(B::ErrorResponse),
        error_fields().prop_map(B::NoticeResponse),
        prop_oneof![Just(B::ParseComplete), Just(B::BindComplete), Just(B::CloseComplete)],
        prop_oneof![Just(B::NoData), Just(B::PortalSuspended), Just(B::CopyDone)],
        prop::collection::vec(any::<u32>(), 0..4).prop_map(B::ParameterDescription),
        copy().prop_map(B::CopyInResponse),
        copy().prop_map(B::CopyOutResponse),
        copy().prop_map(B::CopyBothResponse),
        blob().prop_map(B::CopyData),
        (any::<i32>(), text(), text()).prop_map(|(pid, channel, payload)| B::NotificationResponse {
            pid,
            channel,
            payload
        }),
        (any::<i32>(), prop::collection::vec(text(), 0..3))
            .prop_map(|(version, options)| B::NegotiateProtocolVersion { version, options }),
        (unknown_tag(b"RSKZTDCIEN123nstGHWdcAv"), blob()).prop_map(|(tag, body)| B::Unknown { tag, body }),
    ]
}

fn startup() -> impl Strategy<Value = StartupPacket> {
    prop_oneof![
        Just(StartupPacket::SslRequest),
        Just(StartupPacket::GssEncRequest),
        (any::<i32>(), prop::collection::vec(any::<u8>(), 4..=256))
            .prop_map(|(pid, s)| StartupPacket::Cancel(CancelRequest { pid, secret: Bytes::from(s) })),
        prop::collection::vec((nonempty_text(), text()), 0..4)
            .prop_map(|params| StartupPacket::Startup(Startup { protocol: PROTOCOL_3_0, params })),
    ]
}

fn encoded(f: impl FnOnce(&mut BytesMut)) -> BytesMut {
    let mut buf = BytesMut::new();
    f(&mut buf);
    buf
}

proptest! {
    #[test]
    fn frontend_round_trip(msg in frontend(), trailing in blob()) {
        let mut buf = encoded(|b| msg.encode(b));
        let n = buf.len();
        for cut in 0..n {
            prop_assert_eq!(FrontendMessage::parse(&buf[..cut], &Limits::default()).unwrap(), None);
        }
        buf.extend_from_slice(&trailing);
        prop_assert_eq!(FrontendMessage::parse(&buf, &Limits::default()).unwrap(), Some((msg, n)));
    }

    #[test]
    fn backend_round_trip(msg in backend(), trailing in blob()) {
        let mut buf = encoded(|b| msg.encode(b));
        let n = buf.len();
        for cut in 0..n {
            prop_assert_eq!(BackendMessage::parse(&buf[..cut], &Limits::default()).unwrap(), None);
        }
        buf.extend_from_slice(&trailing);
        prop_assert_eq!(BackendMessage::parse(&buf, &Limits::default()).unwrap(), Some((msg, n)));
    }

    #[test]
    fn startup_round_trip(msg in startup()) {
        let buf = encoded(|b| msg.encode(b));
        prop_assert_eq!(StartupPacket::parse(&buf, &Limits::default()).unwrap(), Some((msg, buf.len())));
    }

    #[test]
    fn arbitrary_bytes_never_panic(buf in prop::collection::vec(any::<u8>(), 0..64), max in 0usize..80) {
        let limits = Limits { max_message_len: max, max_startup_len: max };
        for l in [Limits::default(), limits] {
            let _ = FrontendMessage::parse(&buf, &l);
            let _ = BackendMessage::parse(&buf, &l);
            let _ = StartupPacket::parse(&buf, &l);
        }
    }

    #[test]
    fn any_body_decodes_or_errors(tag in any::<u8>(), body in prop::collection::vec(any::<u8>(), 0..64)) {
        let _ = FrontendMessage::decode(tag, &body);
        let _ = BackendMessage::decode(tag, &body);
    }

    #[test]
    fn framing_matches_decoding(msg in backend()) {
        let buf = encoded(|b| msg.encode(b));
        let h = frame::peek(&buf, refract_pg::Side::Backend, &Limits::default()).unwrap().unwrap();
        prop_assert_eq!(h.total, buf.len());
        prop_assert_eq!(h.tag, msg.tag());
    }
}

proptest! {
    /// Valid frames with corrupted bodies reach deep into the decoders, which random bytes
    /// (mostly absurd lengths) rarely do.
    #[test]
    fn corrupted_messages_never_panic(
        f in frontend(),
        b in backend(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut fb = encoded(|x| f.encode(x));
        let mut bb = encoded(|x| b.encode(x));
        for (i, v) in &flips {
            // Keep the frame (tag and length) so the body decoder is what gets exercised.
            if fb.len() > 5 { let at = 5 + i.index(fb.len() - 5); fb[at] = *v; }
            if bb.len() > 5 { let at = 5 + i.index(bb.len() - 5); bb[at] = *v; }
        }
        let _ = FrontendMessage::parse(&fb, &Limits::default());
        let _ = BackendMessage::parse(&bb, &Limits::default());
    }
}

/// A message stream as a relay sees it: `(tag, body)` pairs, encoded back to back.
fn stream_of_messages() -> impl Strategy<Value = Vec<(u8, Vec<u8>)>> {
    let tag = prop_oneof![Just(b'D'), Just(b'd'), Just(b'T'), Just(b'Z'), any::<u8>()];
    prop::collection::vec((tag, prop::collection::vec(any::<u8>(), 0..300)), 0..8)
}

/// Feeds `wire` to a splitter `chunks` bytes at a time, as reads would deliver it; returns the
/// pieces with their bytes.
fn split(wire: &[u8], chunks: &[usize], stream_above: usize) -> Result<Vec<(Piece, Vec<u8>)>, TestCaseError> {
    let mut s = Splitter::new(refract_pg::Side::Backend, Limits::default(), stream_above);
    let (mut buf, mut fed, mut out) = (Vec::new(), 0, Vec::new());
    let mut sizes = chunks.iter().cycle();
    loop {
        match s.next(&buf, |t| t == b'D' || t == b'd').unwrap() {
            Some(p) => {
                prop_assert!(!p.is_empty() && p.len() <= buf.len());
                out.push((p, buf.drain(..p.len()).collect()));
            }
            None if fed == wire.len() => {
                prop_assert!(buf.is_empty() && !s.in_body(), "bytes left over");
                return Ok(out);
            }
            None => {
                let n = (*sizes.next().unwrap_or(&1)).min(wire.len() - fed);
                buf.extend_from_slice(&wire[fed..fed + n]);
                fed += n;
            }
        }
    }
}

proptest! {
    /// However the bytes arrive, the pieces put back together are the messages sent, in order;
    /// only large messages of the streamed types come in pieces, and a piece never needs more
    /// than what was buffered.
    #[test]
    fn splitter_pieces_reassemble_the_stream(
        msgs in stream_of_messages(),
        chunks in prop::collection::vec(1usize..400, 1..6),
        stream_above in 0usize..200,
    ) {
        let mut wire = Vec::new();
        for (tag, body) in &msgs {
            wire.push(*tag);
            wire.extend_from_slice(&i32::try_from(body.len() + 4).unwrap().to_be_bytes());
            wire.extend_from_slice(body);
        }
        let pieces = split(&wire, &chunks, stream_above)?;
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut open: Option<Vec<u8>> = None;
        for (p, bytes) in pieces {
            match p {
                Piece::Whole(h) => {
                    prop_assert!(open.is_none());
                    prop_assert!(h.total <= stream_above.max(HEAD_LEN) || !matches!(h.tag, b'D' | b'd'));
                    got.push(bytes);
                }
                Piece::Head(h) => {
                    prop_assert!(open.is_none());
                    prop_assert!(matches!(h.tag, b'D' | b'd') && h.total > stream_above.max(HEAD_LEN));
                    open = Some(bytes);
                }
                Piece::Body { last, .. } => {
                    let Some(mut m) = open.take() else { return Err(TestCaseError::fail("body without head")) };
                    m.extend_from_slice(&bytes);
                    if last { got.push(m) } else { open = Some(m) }
                }
            }
        }
        let want: Vec<Vec<u8>> = msgs
            .iter()
            .map(|(tag, body)| {
                let mut m = vec![*tag];
                m.extend_from_slice(&i32::try_from(body.len() + 4).unwrap().to_be_bytes());
                m.extend_from_slice(body);
                m
            })
            .collect();
        prop_assert_eq!(got, want);
    }
}
