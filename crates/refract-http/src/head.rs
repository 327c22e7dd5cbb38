//! Request and response heads: parsed with httparse, reduced to what a proxy needs to frame
//! the body and route the request, and held to the rules in `strict` (no head two parsers
//! could frame differently). The raw head bytes are forwarded as they came, except where
//! [`RequestHead::forwarded`] says otherwise.

use crate::error::Error;
use crate::strict;

/// Most headers a head may carry; more is refused as malformed (431 would also be fair).
const MAX_HEADERS: usize = 100;

/// How the body of a message is delimited (RFC 9112 §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// No body at all.
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the peer closes (responses only).
    UntilClose,
}

/// The parts of a request head a proxy acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// Method, e.g. `GET`.
    pub method: String,
    /// Request target in origin form, e.g. `/blob?bytes=1` (or `*`): an absolute-form target
    /// has been turned into this ([`Self::absolute_form`]).
    pub target: String,
    /// The client sent the target in absolute form (`http://host/path`); its authority was
    /// checked against Host, and the head goes on with [`Self::target`] instead.
    pub absolute_form: bool,
    /// Bytes of empty lines before the request line (skipped, not forwarded).
    pub skipped: usize,
    /// HTTP/1.`minor`.
    pub minor: u8,
    /// Body framing.
    pub body: BodyKind,
    /// Whether the client wants the connection kept after this exchange.
    pub keep_alive: bool,
    /// Value of `x-refract-route`, if present.
    pub route_hint: Option<String>,
    /// `x-refract-timeout-ms`: the client's deadline, relative to the request's arrival.
    pub timeout_ms: Option<u64>,
    /// `x-refract-priority`: `high`, `normal` or `low`.
    pub priority: Option<String>,
    /// `x-refract-user`: whose token bucket the request draws from.
    pub user: Option<String>,
    /// The head has a header only refract's own hops may set ([`INTERNAL_HEADERS`]); whoever
    /// sends the request on drops those lines first ([`without_internal_headers`]).
    pub internal: bool,
    /// `Expect: 100-continue` on HTTP/1.1: the client waits for `100 Continue` before it sends
    /// the body (RFC 9110 §10.1.1; HTTP/1.0 clients cannot ask, and the header is ignored).
    pub expect_continue: bool,
    /// Length of the head in bytes, including the final CRLF CRLF.
    pub len: usize,
}

/// Request headers that only refract itself adds on the way to a backend: the deadline the
/// dispatcher passes on, and the hand-over protocol's headers between an agent and its
/// backend (`crate::defer`). A client's copy would be taken for refract's, so the dispatcher
/// and the agent drop it; the client-facing `x-refract-*` headers (route, timeout, priority,
/// user) are not in this list.
pub const INTERNAL_HEADERS: [&str; 4] =
    ["x-refract-deadline-ms", crate::defer::DEFER, crate::defer::DEFERRED, "x-refract-handover"];

/// The request head `head` without its [`INTERNAL_HEADERS`] lines, or `None` when it has none.
pub fn without_internal_headers(head: &[u8]) -> Option<Vec<u8>> {
    crate::defer::without_headers(head, &INTERNAL_HEADERS)
}

/// The parts of a response head a proxy acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// Status code.
    pub status: u16,
    /// Body framing, already resolved against the request (HEAD, 204, 304 have none).
    pub body: BodyKind,
    /// Whether the server keeps the connection after this response.
    pub keep_alive: bool,
    /// Length of the head in bytes.
    pub len: usize,
}

/// Framing and connection headers common to requests and responses.
#[derive(Default)]
struct Framing<'a> {
    content_length: Option<u64>,
    /// Every Transfer-Encoding value, in order.
    transfer: Vec<&'a [u8]>,
    /// Every Host value, in order.
    hosts: Vec<&'a [u8]>,
    close: bool,
    keep_alive: bool,
    route_hint: Option<String>,
    timeout_ms: Option<u64>,
    priority: Option<String>,
    user: Option<String>,
    internal: bool,
    /// Every Expect value, in order.
    expect: Vec<&'a [u8]>,
}

fn scan_headers<'a>(headers: &[httparse::Header<'a>]) -> Result<Framing<'a>, Error> {
    let mut f = Framing::default();
    for h in headers {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = parse_length(h.value)?;
            if f.content_length.is_some_and(|old| old != n) {
                return Err(Error::BadFraming("conflicting Content-Length headers"));
            }
            f.content_length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            f.transfer.push(h.value);
        } else if h.name.eq_ignore_ascii_case("host") {
            f.hosts.push(h.value);
        } else if h.name.eq_ignore_ascii_case("connection") {
            scan_connection(h.value, &mut f);
        } else if h.name.eq_ignore_ascii_case("expect") {
            f.expect.push(h.value);
        } else if h.name.len() > 10 && h.name[..10].eq_ignore_ascii_case("x-refract-") {
            scan_refract_header(h, &mut f)?;
        }
    }
    Ok(f)
}

/// Refuses Transfer-Encoding with Content-Length (RFC 9112 §6.3 lets a server do so, and a
/// parser that took the length instead would see another request in the body).
fn no_length_with_chunked(chunked: bool, f: &Framing<'_>) -> Result<(), Error> {
    if chunked && f.content_length.is_some() {
        return Err(Error::BadFraming("both Content-Length and chunked"));
    }
    Ok(())
}

fn scan_refract_header(h: &httparse::Header<'_>, f: &mut Framing) -> Result<(), Error> {
    if INTERNAL_HEADERS.iter().any(|n| n.eq_ignore_ascii_case(h.name)) {
        f.internal = true;
        return Ok(());
    }
    let (name, slot) = match h.name[10..].to_ascii_lowercase().as_str() {
        "route" => ("x-refract-route", &mut f.route_hint),
        "priority" => ("x-refract-priority", &mut f.priority),
        "user" => {
            let v = std::str::from_utf8(h.value)
                .map_err(|_| Error::BadHeader { name: "x-refract-user", reason: "not UTF-8".into() })?;
            f.user = Some(v.trim().to_string());
            return Ok(());
        }
        "timeout-ms" => {
            let v = parse_length(h.value).map_err(|_| Error::BadHeader {
                name: "x-refract-timeout-ms",
                reason: "not a number of milliseconds".into(),
            })?;
            f.timeout_ms = Some(v);
            return Ok(());
        }
        _ => return Ok(()),
    };
    let v = std::str::from_utf8(h.value).map_err(|_| Error::BadHeader { name, reason: "not UTF-8".into() })?;
    *slot = Some(v.trim().to_ascii_lowercase());
    Ok(())
}

fn parse_length(v: &[u8]) -> Result<u64, Error> {
    let s = std::str::from_utf8(v).map_err(|_| Error::BadFraming("Content-Length not ASCII"))?;
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::BadFraming("Content-Length not a number"));
    }
    s.parse().map_err(|_| Error::BadFraming("Content-Length too large"))
}

/// A response's framing by Transfer-Encoding (a backend's: relayed as it is, so any codings
/// before a final `chunked` are the client's to decode).
fn response_chunked(values: &[&[u8]]) -> Result<bool, Error> {
    for v in values {
        transfer_is_chunked(v)?;
    }
    Ok(!values.is_empty())
}

fn transfer_is_chunked(v: &[u8]) -> Result<bool, Error> {
    let s = std::str::from_utf8(v).map_err(|_| Error::BadFraming("Transfer-Encoding not ASCII"))?;
    let last = s.rsplit(',').next().unwrap_or("").trim();
    if last.eq_ignore_ascii_case("chunked") {
        Ok(true)
    } else {
        // Any other final coding leaves the length unknowable for a request.
        Err(Error::BadFraming("unsupported Transfer-Encoding"))
    }
}

fn scan_connection(v: &[u8], f: &mut Framing) {
    for token in v.split(|&b| b == b',') {
        let t = token.trim_ascii();
        if t.eq_ignore_ascii_case(b"close") {
            f.close = true;
        } else if t.eq_ignore_ascii_case(b"keep-alive") {
            f.keep_alive = true;
        }
    }
}

fn keep_alive(minor: u8, f: &Framing<'_>) -> bool {
    if minor >= 1 {
        !f.close
    } else {
        f.keep_alive && !f.close
    }
}

fn check_size(buf: &[u8], max: usize) -> Result<(), Error> {
    if buf.len() > max {
        Err(Error::HeadTooLarge(max))
    } else {
        Ok(())
    }
}

impl RequestHead {
    /// Parses a request head from the front of `buf`. `Ok(None)` means more bytes are needed;
    /// `max` bounds the head size (a head not complete within `max` bytes is refused).
    pub fn parse(buf: &[u8], max: usize) -> Result<Option<Self>, Error> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        let len = match req.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return check_size(buf, max).map(|()| None),
            Err(e) => return Err(Error::Malformed(e.to_string())),
        };
        if len > max {
            return Err(Error::HeadTooLarge(max));
        }
        strict::line_ends(&buf[..len])?;
        let minor = req.version.unwrap_or(1);
        let f = scan_headers(req.headers)?;
        let chunked = strict::request_chunked(&f.transfer, minor)?;
        no_length_with_chunked(chunked, &f)?;
        let body = match (chunked, f.content_length) {
            (true, _) => BodyKind::Chunked,
            (false, Some(0)) | (false, None) => BodyKind::None,
            (false, Some(n)) => BodyKind::Length(n),
        };
        let method = req.method.unwrap_or("");
        let target = req.path.unwrap_or("");
        let host = strict::request_host(&f.hosts, minor)?;
        let origin = strict::origin_form(method, target, host)?;
        let expect_continue = minor >= 1 && strict::expects_continue(&f.expect)?;
        strict::plain_path(origin.as_deref().unwrap_or(target))?;
        Ok(Some(RequestHead {
            method: method.to_string(),
            absolute_form: origin.is_some(),
            target: origin.unwrap_or_else(|| target.to_string()),
            skipped: strict::leading_empty_lines(buf),
            minor,
            body,
            keep_alive: keep_alive(minor, &f),
            route_hint: f.route_hint,
            timeout_ms: f.timeout_ms,
            priority: f.priority,
            user: f.user,
            internal: f.internal,
            expect_continue,
            len,
        }))
    }

    /// The head as refract sends it on, when that differs from the bytes received (`raw`, this
    /// head's `len` bytes): without the empty lines before the request line, with the target
    /// in origin form, without [`INTERNAL_HEADERS`]. `None`: forward `raw` as it is.
    pub fn forwarded(&self, raw: &[u8]) -> Option<Vec<u8>> {
        if self.skipped == 0 && !self.absolute_form && !self.internal {
            return None;
        }
        let raw = &raw[self.skipped.min(raw.len())..];
        let mut out = if self.absolute_form {
            let eol = raw.windows(2).position(|w| w == b"\r\n").unwrap_or(raw.len());
            let mut out = format!("{} {} HTTP/1.{}\r\n", self.method, self.target, self.minor).into_bytes();
            out.extend_from_slice(raw.get(eol + 2..).unwrap_or_default());
            out
        } else {
            raw.to_vec()
        };
        if self.internal {
            out = without_internal_headers(&out).unwrap_or(out);
        }
        Some(out)
    }

    /// The path without the query string.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// The raw query string, if any.
    pub fn query(&self) -> Option<&str> {
        self.target.split_once('?').map(|(_, q)| q)
    }

    /// Whether the response to this request can have no body by definition.
    pub fn is_head(&self) -> bool {
        self.method == "HEAD"
    }
}

impl ResponseHead {
    /// Parses a response head to a request made with method HEAD when `head_request`.
    pub fn parse(buf: &[u8], max: usize, head_request: bool) -> Result<Option<Self>, Error> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut res = httparse::Response::new(&mut headers);
        let len = match res.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return check_size(buf, max).map(|()| None),
            Err(e) => return Err(Error::Malformed(e.to_string())),
        };
        // The same line ends as a request: a bare LF would frame differently at the client.
        strict::line_ends(&buf[..len])?;
        let status = res.code.unwrap_or(0);
        let minor = res.version.unwrap_or(1);
        let f = scan_headers(res.headers)?;
        let chunked = response_chunked(&f.transfer)?;
        no_length_with_chunked(chunked, &f)?;
        let bodyless = head_request || (100..200).contains(&status) || status == 204 || status == 304;
        let body = match (bodyless, chunked, f.content_length) {
            (true, _, _) => BodyKind::None,
            (false, true, _) => BodyKind::Chunked,
            (false, false, Some(0)) => BodyKind::None,
            (false, false, Some(n)) => BodyKind::Length(n),
            (false, false, None) => BodyKind::UntilClose,
        };
        // After a 101 the connection speaks another protocol: never pooled, never reused.
        let keep_alive = keep_alive(minor, &f) && body != BodyKind::UntilClose && status != 101;
        Ok(Some(ResponseHead { status, body, keep_alive, len }))
    }

    /// An interim (1xx) response, after which the final response follows.
    pub fn is_interim(&self) -> bool {
        (100..200).contains(&self.status) && self.status != 101
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_get_with_keep_alive() {
        let raw = b"GET /blob?bytes=4 HTTP/1.1\r\nHost: x\r\n\r\nNEXT";
        let h = RequestHead::parse(raw, 1024).unwrap().unwrap();
        assert_eq!(h.method, "GET");
        assert_eq!(h.path(), "/blob");
        assert_eq!(h.query(), Some("bytes=4"));
        assert_eq!(h.body, BodyKind::None);
        assert!(h.keep_alive);
        assert_eq!(h.len, raw.len() - 4);
    }

    #[test]
    fn internal_headers_are_flagged_and_dropped_but_client_ones_kept() {
        let raw = b"GET / HTTP/1.1\r\nHost: x\r\nx-refract-route: read\r\nX-Refract-Deadline-Ms: 9\r\n\r\n";
        let h = RequestHead::parse(raw, 1024).unwrap().unwrap();
        assert!(h.internal);
        assert_eq!(h.route_hint.as_deref(), Some("read"));
        assert_eq!(
            without_internal_headers(raw).unwrap(),
            b"GET / HTTP/1.1\r\nHost: x\r\nx-refract-route: read\r\n\r\n"
        );
        for name in INTERNAL_HEADERS {
            let raw = format!("GET / HTTP/1.1\r\nHost: x\r\n{name}: 1\r\n\r\n");
            assert!(RequestHead::parse(raw.as_bytes(), 1024).unwrap().unwrap().internal, "{name}");
        }
        let plain = b"GET / HTTP/1.1\r\nHost: x\r\nx-refract-timeout-ms: 5\r\nx-refract-priority: low\r\n\r\n";
        assert!(!RequestHead::parse(plain, 1024).unwrap().unwrap().internal);
        assert_eq!(without_internal_headers(plain), None);
    }

    #[test]
    fn partial_head_needs_more_bytes() {
        assert_eq!(RequestHead::parse(b"GET / HTTP/1.1\r\nHost: x\r\nHo", 1024), Ok(None));
    }

    #[test]
    fn oversized_partial_head_is_refused() {
        let mut raw = b"GET / HTTP/1.1\r\nHost: x\r\nX: ".to_vec();
        raw.extend(std::iter::repeat_n(b'a', 2000));
        assert_eq!(RequestHead::parse(&raw, 1024), Err(Error::HeadTooLarge(1024)));
    }

    #[test]
    fn garbage_is_malformed() {
        let e = RequestHead::parse(b"\x00\x01garbage\r\n\r\n", 1024).unwrap_err();
        assert!(matches!(e, Error::Malformed(_)));
        assert_eq!(e.status(), 400);
    }

    #[test]
    fn framing_headers() {
        let cl = RequestHead::parse(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n", 1024);
        assert_eq!(cl.unwrap().unwrap().body, BodyKind::Length(5));
        let ch = RequestHead::parse(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", 1024);
        assert_eq!(ch.unwrap().unwrap().body, BodyKind::Chunked);
        let both = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(matches!(RequestHead::parse(both, 1024), Err(Error::BadFraming(_))));
        let bad = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5x\r\n\r\n";
        assert!(matches!(RequestHead::parse(bad, 1024), Err(Error::BadFraming(_))));
        let gz = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n";
        assert!(matches!(RequestHead::parse(gz, 1024), Err(Error::BadFraming(_))));
    }

    #[test]
    fn connection_semantics() {
        let close = RequestHead::parse(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 1024);
        assert!(!close.unwrap().unwrap().keep_alive);
        let old = RequestHead::parse(b"GET / HTTP/1.0\r\n\r\n", 1024);
        assert!(!old.unwrap().unwrap().keep_alive);
        let old_ka = RequestHead::parse(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", 1024);
        assert!(old_ka.unwrap().unwrap().keep_alive);
    }

    #[test]
    fn deadline_and_priority_headers() {
        let raw = b"GET / HTTP/1.1\r\nHost: x\r\nX-Refract-Timeout-Ms: 250\r\nx-refract-priority: Low\r\n\r\n";
        let h = RequestHead::parse(raw, 1024).unwrap().unwrap();
        assert_eq!((h.timeout_ms, h.priority.as_deref()), (Some(250), Some("low")));
        let bad = RequestHead::parse(b"GET / HTTP/1.1\r\nHost: x\r\nx-refract-timeout-ms: soon\r\n\r\n", 1024);
        assert!(matches!(bad, Err(Error::BadHeader { name: "x-refract-timeout-ms", .. })));
    }

    #[test]
    fn route_hint_is_lowercased() {
        let h = RequestHead::parse(b"GET / HTTP/1.1\r\nHost: x\r\nX-Refract-Route: WRITE\r\n\r\n", 1024);
        assert_eq!(h.unwrap().unwrap().route_hint.as_deref(), Some("write"));
    }

    #[test]
    fn response_framing() {
        let r = ResponseHead::parse(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", 1024, false);
        let r = r.unwrap().unwrap();
        assert_eq!((r.status, r.body, r.keep_alive), (200, BodyKind::Length(3), true));
        let h = ResponseHead::parse(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", 1024, true);
        assert_eq!(h.unwrap().unwrap().body, BodyKind::None);
        let u = ResponseHead::parse(b"HTTP/1.1 200 OK\r\n\r\n", 1024, false).unwrap().unwrap();
        assert_eq!((u.body, u.keep_alive), (BodyKind::UntilClose, false));
        let c = ResponseHead::parse(b"HTTP/1.1 100 Continue\r\n\r\n", 1024, false).unwrap();
        assert!(c.unwrap().is_interim());
        let n = ResponseHead::parse(b"HTTP/1.1 204 No Content\r\n\r\n", 1024, false).unwrap();
        assert_eq!(n.unwrap().body, BodyKind::None);
        let up = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n";
        let up = ResponseHead::parse(up, 1024, false).unwrap().unwrap();
        assert_eq!((up.body, up.keep_alive, up.is_interim()), (BodyKind::None, false, false));
    }

    #[test]
    fn only_crlf_ends_a_line_in_requests_and_responses() {
        let lf = b"GET / HTTP/1.1\r\nHost: x\r\nX-A: b\nContent-Length: 5\r\n\r\nhello";
        assert!(matches!(RequestHead::parse(lf, 1024), Err(Error::Malformed(_))));
        let cr = b"GET / HTTP/1.1\r\nHost: x\r\nX-A: b\rContent-Length: 5\r\n\r\nhello";
        assert!(matches!(RequestHead::parse(cr, 1024), Err(Error::Malformed(_))));
        let res = b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok";
        assert!(matches!(ResponseHead::parse(res, 1024, false), Err(Error::Malformed(_))));
    }

    #[test]
    fn httparse_refuses_the_rest_of_what_two_parsers_could_read_differently() {
        for bad in [
            &b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length : 5\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: x\r\nX-A: b\r\n Content-Length: 5\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nX-A: b\0c\r\n\r\n",
            b"GET  / HTTP/1.1\r\nHost: x\r\n\r\n",
        ] {
            assert!(matches!(RequestHead::parse(bad, 1024), Err(Error::Malformed(_))), "{bad:?}");
        }
    }

    #[test]
    fn host_and_transfer_encoding_rules_apply_to_the_head() {
        let no_host = RequestHead::parse(b"GET / HTTP/1.1\r\n\r\n", 1024);
        assert!(matches!(no_host, Err(Error::BadHost(_))));
        let old = RequestHead::parse(b"GET / HTTP/1.0\r\n\r\n", 1024).unwrap().unwrap();
        assert_eq!(old.minor, 0);
        let two = RequestHead::parse(b"GET / HTTP/1.1\r\nHost: x\r\nhost: x\r\n\r\n", 1024);
        assert!(matches!(two, Err(Error::BadHost(_))));
        let te10 = b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(matches!(RequestHead::parse(te10, 1024), Err(Error::BadFraming(_))));
        let gz = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n";
        assert_eq!(RequestHead::parse(gz, 1024).unwrap_err().status(), 501);
        // A backend may relay codings before a final chunked: the client decodes them.
        let res = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n";
        assert_eq!(ResponseHead::parse(res, 1024, false).unwrap().unwrap().body, BodyKind::Chunked);
    }

    #[test]
    fn a_head_goes_on_in_origin_form_without_leading_empty_lines() {
        let raw = b"\r\nGET HTTP://X:8/a?b HTTP/1.1\r\nHost: x:8\r\nX-Refract-Deadline-Ms: 1\r\n\r\n";
        let h = RequestHead::parse(raw, 1024).unwrap().unwrap();
        assert_eq!((h.path(), h.query(), h.absolute_form, h.skipped, h.len), ("/a", Some("b"), true, 2, raw.len()));
        assert_eq!(h.forwarded(raw).unwrap(), b"GET /a?b HTTP/1.1\r\nHost: x:8\r\n\r\n");
        let plain = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(RequestHead::parse(plain, 1024).unwrap().unwrap().forwarded(plain), None);
        let other = b"GET http://y/a HTTP/1.1\r\nHost: x\r\n\r\n";
        assert!(matches!(RequestHead::parse(other, 1024), Err(Error::BadHost(_))));
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        fn token() -> impl Strategy<Value = String> {
            "[A-Za-z][A-Za-z0-9-]{0,15}"
        }

        proptest! {
            #[test]
            fn request_round_trip(
                method in "(GET|POST|PUT|DELETE|HEAD)",
                path in "/[a-z0-9/]{0,20}(\\?[a-z]=[0-9]{1,4})?",
                len in proptest::option::of(0u64..1_000_000),
                close: bool,
                extra in proptest::collection::vec((token(), "[ -~]{0,30}"), 0..6),
            ) {
                let mut raw = format!("{method} {path} HTTP/1.1\r\nHost: x\r\n");
                for (k, v) in &extra {
                    let lower = k.to_ascii_lowercase();
                    if ["content-length", "transfer-encoding", "connection", "x-refract-route", "host"].contains(&lower.as_str()) {
                        continue;
                    }
                    raw += &format!("{k}: {}\r\n", v.trim());
                }
                if let Some(n) = len {
                    raw += &format!("Content-Length: {n}\r\n");
                }
                if close {
                    raw += "Connection: close\r\n";
                }
                raw += "\r\n";
                let h = RequestHead::parse(raw.as_bytes(), 1 << 16).unwrap().unwrap();
                prop_assert_eq!(&h.method, &method);
                prop_assert_eq!(&h.target, &path);
                prop_assert_eq!(h.len, raw.len());
                prop_assert_eq!(h.keep_alive, !close);
                let want = match len { None | Some(0) => BodyKind::None, Some(n) => BodyKind::Length(n) };
                prop_assert_eq!(h.body, want);
                // Every proper prefix needs more bytes, never errs.
                for cut in [1, raw.len() / 2, raw.len() - 1] {
                    prop_assert_eq!(RequestHead::parse(&raw.as_bytes()[..cut], 1 << 16), Ok(None));
                }
            }

            #[test]
            fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..600)) {
                let _ = RequestHead::parse(&data, 256);
                let _ = ResponseHead::parse(&data, 256, false);
            }
        }
    }
}
