//! Targets for refract-http: request and response heads (httparse plus refract's strict checks)
//! and the chunked-transfer decoder.

use refract_http::chunked::decode_all;
use refract_http::head::without_internal_headers;
use refract_http::{BodyKind, ChunkedDecoder, RequestHead, ResponseHead};

/// The head limit the targets parse with (the dispatcher's default order of magnitude; a
/// small one would only make the fuzzer find `HeadTooLarge`).
const MAX_HEAD: usize = 16 * 1024;

/// `RequestHead::parse` (and through it every check in `strict.rs`), `ResponseHead::parse`,
/// and the internal-header filter, on the same bytes.
pub fn http_head(data: &[u8]) {
    request(data);
    response(data, false);
    response(data, true);
    let _ = without_internal_headers(data);
}

fn request(data: &[u8]) {
    let Ok(Some(head)) = RequestHead::parse(data, MAX_HEAD) else { return };
    assert!(head.len <= data.len() && head.skipped <= head.len, "head length out of range: {head:?}");
    let raw = &data[..head.len];
    // What follows the head (a body, the next request) must not change how the head reads.
    let alone = RequestHead::parse(raw, MAX_HEAD);
    assert_eq!(alone.as_ref().ok().and_then(Option::as_ref), Some(&head), "the head alone reads differently");
    let _ = (head.path(), head.query(), head.is_head());
    if let Some(out) = head.forwarded(raw) {
        forwarded_reads_the_same(&head, &out);
    }
}

/// What refract sends on in place of a head is a head refract itself accepts, framed and
/// routed the same, with nothing left to rewrite (a backend must read what refract read).
fn forwarded_reads_the_same(head: &RequestHead, out: &[u8]) {
    let again = match RequestHead::parse(out, usize::MAX) {
        Ok(Some(h)) => h,
        other => panic!("the forwarded head {:?} does not parse: {other:?}", String::from_utf8_lossy(out)),
    };
    assert_eq!(again.len, out.len(), "the forwarded head has bytes after its end");
    let same = (&again.method, &again.target, again.minor, again.body, again.keep_alive);
    assert_eq!(same, (&head.method, &head.target, head.minor, head.body, head.keep_alive));
    assert_eq!((again.route_hint.as_ref(), again.timeout_ms), (head.route_hint.as_ref(), head.timeout_ms));
    assert!(again.skipped == 0 && !again.absolute_form && !again.internal, "forwarded head not final: {again:?}");
    assert!(again.forwarded(out).is_none());
}

fn response(data: &[u8], head_request: bool) {
    let Ok(Some(head)) = ResponseHead::parse(data, MAX_HEAD, head_request) else { return };
    assert!(head.len <= data.len(), "response head length out of range: {head:?}");
    if head_request {
        assert_eq!(head.body, BodyKind::None, "a response to HEAD has no body");
    }
    let _ = head.is_interim();
}

/// `ChunkedDecoder`: the first byte says where to cut the rest in two (bytes arrive in
/// pieces); `advance` over the whole and `normalize` over the pieces must agree, and the
/// normalized body must be canonical (it normalizes to itself) with the same data.
pub fn http_chunked(data: &[u8]) {
    let Some((&cut, body)) = data.split_first() else { return };
    let mut whole = ChunkedDecoder::new();
    let advanced = whole.advance(body);
    if let Ok(n) = advanced {
        assert!(n <= body.len(), "consumed {n} of {} bytes", body.len());
        assert!(whole.is_done() || n == body.len(), "stopped at {n} of {} before the end of the body", body.len());
    }
    let cut = usize::from(cut).min(body.len());
    let (mut pieces, mut out) = (ChunkedDecoder::new(), Vec::new());
    let normalized =
        pieces.normalize(&body[..cut], &mut out).and_then(|a| Ok(a + pieces.normalize(&body[cut..], &mut out)?));
    assert_eq!(advanced, normalized, "advance and normalize (cut at {cut}) disagree");
    assert_eq!(whole.is_done(), pieces.is_done());
    if let (Ok(n), true) = (advanced, whole.is_done()) {
        canonical(&body[..n], &out);
    }
}

fn canonical(raw: &[u8], out: &[u8]) {
    let (mut d, mut again) = (ChunkedDecoder::new(), Vec::new());
    assert_eq!(d.normalize(out, &mut again), Ok(out.len()), "the normalized body {out:?} is refused");
    assert!(d.is_done());
    assert_eq!(again, out, "the normalized body is not canonical");
    assert_eq!(decode_all(raw), decode_all(out), "normalizing changed the data");
}
