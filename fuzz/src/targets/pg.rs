//! Targets for refract-pg: framing (`frame::peek`, `stream::Splitter`), the typed message
//! decoders of both directions, the untyped startup-phase packets, and the shard-key readers
//! of Bind parameters (arrays in text and binary form).

use bytes::BytesMut;
use refract_pg::auth::{decode_password, SaslInitialResponse};
use refract_pg::frame::{self, Header};
use refract_pg::frontend::bind_names;
use refract_pg::stream::Splitter;
use refract_pg::{BackendMessage, FrontendMessage, Limits, Side, StartupPacket};
use refract_shard::copyrows::{self, CopyFormat, Force, Piece, Rows};
use refract_shard::keyparam::{binary_array, text_array, Params};
use refract_shard::partition::KeyType;

/// Small enough that the fuzzer reaches `TooLarge`, large enough for any seed.
const LIMITS: Limits = Limits { max_message_len: 1 << 16, max_startup_len: frame::DEFAULT_MAX_STARTUP_LEN };

/// Messages above this (whole) are streamed by the splitter when their type allows.
const STREAM_ABOVE: usize = 32;

/// Client messages one after another, as a session reads them after startup; then the same
/// bytes through the relay's splitter.
pub fn pg_frontend(data: &[u8]) {
    let mut buf = data;
    while let Ok(Some((msg, n))) = FrontendMessage::parse(buf, &LIMITS) {
        framed_as_decoded(buf, n, Side::Client);
        let mut out = BytesMut::new();
        msg.encode(&mut out);
        assert_eq!(&out[..], &buf[..n], "{msg:?} does not encode to the bytes it came from");
        frontend_parts(&msg, &buf[5..n]);
        buf = &buf[n..];
    }
    let _ = bind_names(data);
    split(data, Side::Client);
}

/// The decoders that read inside a message body: auth answers and a Bind's names.
fn frontend_parts(msg: &FrontendMessage, body: &[u8]) {
    match msg {
        FrontendMessage::AuthResponse(b) => {
            let _ = SaslInitialResponse::decode(b);
            let _ = decode_password(b);
        }
        FrontendMessage::Bind(b) => {
            let names = bind_names(body);
            let names = names.as_ref().ok().and_then(Option::as_ref).map(|(p, s, _)| (p, s));
            assert_eq!(names, Some((&b.portal, &b.statement)), "bind_names reads another Bind");
        }
        _ => {}
    }
}

/// Server messages one after another, as a backend link reads them; then the splitter.
pub fn pg_backend(data: &[u8]) {
    let mut buf = data;
    while let Ok(Some((msg, n))) = BackendMessage::parse(buf, &LIMITS) {
        framed_as_decoded(buf, n, Side::Backend);
        assert_eq!(&msg.to_bytes()[..], &buf[..n], "{msg:?} does not encode to the bytes it came from");
        buf = &buf[n..];
    }
    split(data, Side::Backend);
}

/// A decoded message took exactly the bytes framing says it has.
fn framed_as_decoded(buf: &[u8], n: usize, from: Side) {
    assert!((5..=buf.len()).contains(&n), "decoded {n} of {} bytes", buf.len());
    assert_eq!(frame::peek(buf, from, &LIMITS), Ok(Some(Header { tag: buf[0], total: n })));
}

/// The splitter over `data` arriving 7 bytes at a time: every piece covers at least one
/// buffered byte, and each message it starts is framed as `frame::peek_head` frames it.
fn split(data: &[u8], from: Side) {
    let mut s = Splitter::new(from, LIMITS, STREAM_ABOVE);
    let (mut pos, mut end) = (0, 0);
    loop {
        let in_body = s.in_body();
        match s.next(&data[pos..end], |tag| matches!(tag, b'D' | b'd')) {
            Ok(Some(piece)) => {
                assert!(!piece.is_empty() && pos + piece.len() <= end, "piece {piece:?} at {pos}, {end} buffered");
                if !in_body {
                    let head = frame::peek_head(&data[pos..end], from, &LIMITS);
                    assert!(head.is_ok_and(|h| h.is_some()), "a piece where no message starts");
                }
                pos += piece.len();
            }
            Ok(None) if end < data.len() => end = (end + 7).min(data.len()),
            _ => break,
        }
    }
}

/// Startup-phase packets one after another, as a login reads them: an SSLRequest or
/// GSSENCRequest (answered `N`) may come before the StartupMessage; anything else ends the
/// startup phase.
pub fn pg_startup(data: &[u8]) {
    let mut buf = data;
    while let Ok(Some((packet, n))) = StartupPacket::parse(buf, &LIMITS) {
        assert_eq!(frame::peek_startup(buf, &LIMITS), Ok(Some(n)));
        let mut out = BytesMut::new();
        packet.encode(&mut out);
        assert_eq!(&out[..], &buf[..n], "{packet:?} does not encode to the bytes it came from");
        if let StartupPacket::Startup(s) = &packet {
            let _ = (s.user(), s.database());
        }
        buf = &buf[n..];
        if !matches!(packet, StartupPacket::SslRequest | StartupPacket::GssEncRequest) {
            break;
        }
    }
}

/// The shard-key readers of a Bind parameter: the bytes as an array in text and in binary form,
/// and as a key of every type in both formats. Nothing may panic; every element found lies
/// within the input.
pub fn pg_keyparam(data: &[u8]) {
    for elems in [text_array(data), binary_array(data)].into_iter().flatten() {
        let bytes: usize = elems.iter().flatten().map(Vec::len).sum();
        assert!(bytes <= data.len(), "{bytes} element bytes from {} input bytes", data.len());
    }
    for ty in [KeyType::Int2, KeyType::Int4, KeyType::Int8, KeyType::Text, KeyType::Uuid] {
        for format in [0i16, 1] {
            let p = Params { formats: &[format], values: &[Some(data)] };
            let _ = p.array(1, ty);
            let _ = ty.parse_text(data);
            let _ = ty.parse_binary(data);
        }
    }
}

/// The COPY FROM row scanner (`refract-shard` `copyrows.rs`): byte 0 picks the format (bit 0 csv,
/// bit 1 HEADER, bit 2 the `\.` end marker, bit 3 `;` delimiter with `'` quote and `\`
/// escape), byte 1 the size of the CopyData pieces; the rest is the data. Nothing may panic;
/// the pieces found are the same whatever the message sizes, and joined they give the data
/// back (up to the end marker, or up to the error and what was pending then).
pub fn pg_copyrows(data: &[u8]) {
    let [flags, size, rest @ ..] = data else { return };
    let mut fmt = CopyFormat::new(flags & 1 != 0);
    fmt.header = flags & 2 != 0;
    fmt.end_marker = flags & 4 != 0;
    if flags & 8 != 0 {
        (fmt.delimiter, fmt.quote, fmt.escape) = (b';', b'\'', b'\\');
    }
    let whole = copy_pieces(&fmt, rest, rest.len().max(1));
    let chunked = copy_pieces(&fmt, rest, usize::from(*size).max(1));
    assert_eq!((&whole.0, whole.1), (&chunked.0, chunked.1), "the pieces depend on the CopyData sizes");
    for (pieces, failed, pending) in [&whole, &chunked] {
        let mut joined: Vec<u8> = pieces.iter().flat_map(|p| piece_bytes(p).to_vec()).collect();
        let ended = matches!(pieces.last(), Some(Piece::End(_)));
        if *failed {
            joined.extend_from_slice(pending);
            assert!(rest.starts_with(&joined), "the pieces before an error are not the data");
        } else if ended {
            assert!(rest.starts_with(&joined), "the pieces up to the end marker are not the data");
        } else {
            assert_eq!(joined, rest, "the pieces joined are not the data");
        }
    }
    for p in &whole.0 {
        if let Piece::Row(row) = p {
            for n in 0..3 {
                if let Ok(copyrows::Field::Value(v)) = copyrows::field(&fmt, row, n, Force::default()) {
                    assert!(v.len() <= row.len(), "a field longer than its row");
                }
            }
        }
    }
}

/// The pieces of `data` pushed `size` bytes at a time, whether it failed, what was pending then.
fn copy_pieces(fmt: &CopyFormat, data: &[u8], size: usize) -> (Vec<Piece>, bool, Vec<u8>) {
    let mut rows = Rows::new(fmt.clone());
    let mut out = vec![];
    for chunk in data.chunks(size) {
        rows.push(chunk);
        loop {
            match rows.next_piece() {
                Ok(Some(p)) => out.push(p),
                Ok(None) => break,
                Err(_) => return (out, true, rows.pending().to_vec()),
            }
        }
    }
    rows.finish();
    loop {
        match rows.next_piece() {
            Ok(Some(p)) => out.push(p),
            Ok(None) => return (out, false, vec![]),
            Err(_) => return (out, true, rows.pending().to_vec()),
        }
    }
}

fn piece_bytes(p: &Piece) -> &[u8] {
    match p {
        Piece::Header(b) | Piece::Row(b) | Piece::End(b) => b,
    }
}
