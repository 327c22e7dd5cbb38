//! What refract refuses in a request head (docs/architecture.md, "What refract refuses in a
//! request head"). httparse is lenient where RFC 9112 lets a recipient be (a bare LF ends a
//! line); the parser behind refract need not be, and a head two parsers frame differently is
//! request smuggling. So a head is held to the one reading every conforming parser agrees on,
//! and refused (400; 501 for a transfer coding refract does not implement) otherwise.

use crate::error::Error;

/// Refuses a head with a line that does not end in CRLF: a bare LF (httparse ends the line
/// there, a CRLF-only backend does not, and reads the next "header" as part of this one) or a
/// bare CR (RFC 9112 §2.2: invalid).
pub(crate) fn line_ends(head: &[u8]) -> Result<(), Error> {
    let mut prev = 0u8;
    for &b in head {
        if b == b'\n' && prev != b'\r' {
            return Err(Error::Malformed("bare LF in the head (lines must end in CRLF)".into()));
        }
        if prev == b'\r' && b != b'\n' {
            return Err(Error::Malformed("bare CR in the head".into()));
        }
        prev = b;
    }
    Ok(())
}

/// How many bytes of empty lines (CRLF) precede the request line: httparse skips them (RFC
/// 9112 §2.2 says a server should), and refract does not forward them.
pub(crate) fn leading_empty_lines(head: &[u8]) -> usize {
    head.chunks_exact(2).take_while(|pair| *pair == b"\r\n").count() * 2
}

/// Checks a Host value (RFC 9110 §7.2: `uri-host [ ":" port ]`, never empty for http): only
/// the characters of a reg-name, an IP literal and a port. A `/`, `@`, `?`, space or control
/// character would make the authority mean something else to the next parser.
pub(crate) fn host(value: &[u8]) -> Result<&str, Error> {
    let ok = |b: u8| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=%:[]".contains(&b);
    let v = value.trim_ascii();
    if v.is_empty() {
        return Err(Error::BadHost("empty Host"));
    }
    if !v.iter().all(|&b| ok(b)) {
        return Err(Error::BadHost("Host is not a host[:port]"));
    }
    std::str::from_utf8(v).map_err(|_| Error::BadHost("Host is not a host[:port]"))
}

/// The request's Host (RFC 9112 §3.2): exactly one, valid, and required on HTTP/1.1.
pub(crate) fn request_host<'a>(hosts: &[&'a [u8]], minor: u8) -> Result<Option<&'a str>, Error> {
    match hosts {
        [] if minor >= 1 => Err(Error::BadHost("no Host in an HTTP/1.1 request")),
        [] => Ok(None),
        [one] => host(one).map(Some),
        _ => Err(Error::BadHost("more than one Host")),
    }
}

/// Whether a request with these Transfer-Encoding values (one per header line, in order) is
/// chunked. The only coding accepted is exactly `chunked`, once, on HTTP/1.1 (RFC 9112 §6.1,
/// §6.3): TE on HTTP/1.0 is faulty framing (400); chunked not last, twice, or a malformed list
/// leaves the length unknowable (400); any other coding is one refract does not implement (501).
pub(crate) fn request_chunked(values: &[&[u8]], minor: u8) -> Result<bool, Error> {
    if values.is_empty() {
        return Ok(false);
    }
    if minor == 0 {
        return Err(Error::BadFraming("Transfer-Encoding in an HTTP/1.0 request"));
    }
    let mut codings = Vec::new();
    for v in values {
        let s = std::str::from_utf8(v).map_err(|_| Error::BadFraming("Transfer-Encoding not ASCII"))?;
        codings.extend(s.split(',').map(|c| c.trim_matches([' ', '\t'])));
    }
    if codings.iter().any(|c| c.is_empty() || !c.bytes().all(is_tchar)) {
        return Err(Error::BadFraming("malformed Transfer-Encoding"));
    }
    let is_chunked = |c: &str| c.eq_ignore_ascii_case("chunked");
    if !codings.last().is_some_and(|c| is_chunked(c)) {
        return Err(Error::BadFraming("chunked is not the final transfer coding"));
    }
    if codings.iter().filter(|c| is_chunked(c)).count() > 1 {
        return Err(Error::BadFraming("chunked applied more than once"));
    }
    match codings.iter().find(|c| !is_chunked(c)) {
        Some(other) => Err(Error::UnsupportedCoding(other.to_ascii_lowercase())),
        None => Ok(true),
    }
}

/// A token character (RFC 9110 §5.6.2).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The origin form of a request target, or `None` when it already is one (or is `*` of an
/// OPTIONS). An absolute-form target (`http://host/path`) is turned into its path and query,
/// its authority checked against `host` (the Host header): a backend and refract's routing
/// rules must read the same path, and the Host the backend sees must be the target's.
pub(crate) fn origin_form(method: &str, target: &str, host: Option<&str>) -> Result<Option<String>, Error> {
    if target.contains('#') {
        return Err(Error::BadTarget("a fragment in the request target"));
    }
    if target.starts_with('/') || (target == "*" && method == "OPTIONS") {
        return Ok(None);
    }
    let scheme_len = ["http://", "https://"]
        .iter()
        .find(|s| target.get(..s.len()).is_some_and(|p| p.eq_ignore_ascii_case(s)))
        .map(|s| s.len())
        .ok_or(Error::BadTarget("the request target is neither origin nor absolute form"))?;
    let rest = &target[scheme_len..];
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    if authority.contains('@') {
        return Err(Error::BadTarget("userinfo in the request target"));
    }
    let authority = self::host(authority.as_bytes())?;
    if host.is_some_and(|h| !h.eq_ignore_ascii_case(authority)) {
        return Err(Error::BadHost("Host differs from the request target's authority"));
    }
    Ok(Some(if path.starts_with('/') { path.to_string() } else { format!("/{path}") }))
}

/// Refuses a path with a dot segment (`/a/../b`, `/./b`, also percent-encoded as `%2e`) or a
/// backslash. Routing rules match path prefixes: `/public/../admin` starts with `/public` but a
/// backend that resolves dot segments (RFC 3986 §5.2.4) or treats `\` as `/` serves `/admin`.
/// Clients do not send these (curl and browsers resolve them first), so refusing costs nothing
/// and leaves no second reading.
pub(crate) fn plain_path(target: &str) -> Result<(), Error> {
    let path = target.split('?').next().unwrap_or("");
    if path.contains('\\') {
        return Err(Error::BadTarget("a backslash in the request path"));
    }
    let dots = |seg: &str| {
        let decoded = seg.replace("%2e", ".").replace("%2E", ".");
        decoded == "." || decoded == ".."
    };
    match path.split('/').any(dots) {
        true => Err(Error::BadTarget("a dot segment (. or ..) in the request path")),
        false => Ok(()),
    }
}

/// Whether the Expect header asks for `100-continue`; any other expectation is refused with
/// 417 (RFC 9110 §10.1.1), as refract cannot tell whether a backend meets it.
pub(crate) fn expects_continue(values: &[&[u8]]) -> Result<bool, Error> {
    let mut cont = false;
    for v in values.iter().flat_map(|v| v.split(|&b| b == b',')) {
        let v = v.trim_ascii();
        if v.eq_ignore_ascii_case(b"100-continue") {
            cont = true;
        } else if !v.is_empty() {
            return Err(Error::UnsupportedExpectation(String::from_utf8_lossy(v).into_owned()));
        }
    }
    Ok(cont)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_crlf_ends_a_line() {
        assert_eq!(line_ends(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), Ok(()));
        for bad in [&b"GET / HTTP/1.1\nHost: x\r\n\r\n"[..], b"GET / HTTP/1.1\r\nX: a\nB: c\r\n\r\n", b"X\r\n\n"] {
            assert!(matches!(line_ends(bad), Err(Error::Malformed(m)) if m.contains("bare LF")), "{bad:?}");
        }
        assert!(
            matches!(line_ends(b"GET / HTTP/1.1\r\nX: a\rB\r\n\r\n"), Err(Error::Malformed(m)) if m.contains("bare CR"))
        );
        assert_eq!(leading_empty_lines(b"\r\n\r\nGET"), 4);
        assert_eq!(leading_empty_lines(b"GET"), 0);
    }

    #[test]
    fn host_is_an_authority() {
        for ok in ["x", "Example.COM:8080", "[::1]:80", "127.0.0.1", " x "] {
            assert!(host(ok.as_bytes()).is_ok(), "{ok}");
        }
        for bad in ["", " ", "x/y", "u@x", "x y", "x?", "x\\y", "x#"] {
            assert!(matches!(host(bad.as_bytes()), Err(Error::BadHost(_))), "{bad}");
        }
    }

    #[test]
    fn exactly_one_host_and_required_on_http_1_1() {
        assert_eq!(request_host(&[b"x"], 1), Ok(Some("x")));
        assert_eq!(request_host(&[], 0), Ok(None));
        assert_eq!(request_host(&[b"x"], 0), Ok(Some("x")));
        assert!(matches!(request_host(&[], 1), Err(Error::BadHost(_))));
        assert!(matches!(request_host(&[b"x", b"x"], 1), Err(Error::BadHost(_))));
        assert!(matches!(request_host(&[b"x", b"y"], 0), Err(Error::BadHost(_))));
    }

    #[test]
    fn transfer_encoding_is_exactly_chunked_on_http_1_1() {
        assert_eq!(request_chunked(&[], 1), Ok(false));
        assert_eq!(request_chunked(&[b"chunked"], 1), Ok(true));
        assert_eq!(request_chunked(&[b" Chunked "], 1), Ok(true));
        let bad = |v: &[&[u8]], minor| matches!(request_chunked(v, minor), Err(Error::BadFraming(_)));
        assert!(bad(&[b"chunked"], 0), "HTTP/1.0");
        assert!(bad(&[b"chunked, chunked"], 1));
        assert!(bad(&[b"chunked", b"chunked"], 1));
        assert!(bad(&[b"chunked, gzip"], 1));
        assert!(bad(&[b"gzip"], 1));
        assert!(bad(&[b""], 1));
        assert!(bad(&[b", chunked"], 1));
        assert!(bad(&[b"chunked;q=1"], 1));
        assert!(bad(&[b"chunked\x00"], 1));
        for other in ["identity, chunked", "gzip, chunked", "GZIP,chunked"] {
            let e = request_chunked(&[other.as_bytes()], 1).unwrap_err();
            assert!(matches!(&e, Error::UnsupportedCoding(_)), "{other}");
            assert_eq!(e.status(), 501);
        }
    }

    #[test]
    fn absolute_form_becomes_origin_form() {
        assert_eq!(origin_form("GET", "/a?b", Some("x")), Ok(None));
        assert_eq!(origin_form("OPTIONS", "*", Some("x")), Ok(None));
        assert_eq!(origin_form("GET", "http://x/a?b", Some("x")), Ok(Some("/a?b".into())));
        assert_eq!(origin_form("GET", "HTTPS://X:443", Some("x:443")), Ok(Some("/".into())));
        assert_eq!(origin_form("GET", "http://x?q=1", None), Ok(Some("/?q=1".into())));
        let bad_host = |t: &str, h| matches!(origin_form("GET", t, h), Err(Error::BadHost(_)));
        assert!(bad_host("http://y/a", Some("x")));
        assert!(bad_host("http://x:81/a", Some("x")));
        assert!(bad_host("http:///a", Some("x")), "empty authority");
        let bad_target = |m, t: &str| matches!(origin_form(m, t, Some("x")), Err(Error::BadTarget(_)));
        assert!(bad_target("GET", "http://u@x/a"));
        assert!(bad_target("GET", "*"));
        assert!(bad_target("CONNECT", "x:443"));
        assert!(bad_target("GET", "ftp://x/a"));
        assert!(bad_target("GET", "/a#frag"));
    }

    #[test]
    fn only_100_continue_is_an_expectation_refract_meets() {
        assert_eq!(expects_continue(&[]), Ok(false));
        assert_eq!(expects_continue(&[b"100-Continue "]), Ok(true));
        assert_eq!(expects_continue(&[b""]), Ok(false));
        let e = expects_continue(&[b"100-continue, x-other"]).unwrap_err();
        assert_eq!((e.status(), e), (417, Error::UnsupportedExpectation("x-other".into())));
    }

    #[test]
    fn dot_segments_and_backslashes_are_refused() {
        for ok in ["/", "/a/b", "/a/.b", "/a/..b/c", "/a...", "/a?x=/../y", "/a%2fb", "*"] {
            assert_eq!(plain_path(ok), Ok(()), "{ok}");
        }
        for bad in ["/public/../admin", "/./a", "/a/.", "/a/..", "/a/%2e%2e/b", "/a/%2E./b", "/a/.%2e", "/a\\..\\b"] {
            assert!(matches!(plain_path(bad), Err(Error::BadTarget(_))), "{bad}");
        }
    }
}
