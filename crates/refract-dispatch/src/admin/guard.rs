//! Who may use the admin listener, decided from the request head alone: a browser page's
//! request (an `Origin` that is not this listener) is refused, a missing or wrong bearer token
//! is refused, and writes must be JSON (a form or `text/plain` POST, which a page may send
//! without a CORS preflight, is refused). `/health` and `/metrics` stay open to scrapers.

use bytes::Bytes;
use refract_core::config::AdminConfig;
use refract_http::RequestHead;

/// Why a request was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub status: u16,
    pub message: &'static str,
}

impl Refusal {
    /// The response: a JSON error; a 401 also names the scheme.
    pub(crate) fn reply(&self, close: bool) -> Bytes {
        let (reason, challenge) = match self.status {
            401 => ("Unauthorized", "www-authenticate: Bearer realm=\"refract-admin\"\r\n"),
            403 => ("Forbidden", ""),
            _ => ("Unsupported Media Type", ""),
        };
        let body = serde_json::json!({ "error": self.message, "status": self.status }).to_string();
        let conn = if close { "connection: close\r\n" } else { "" };
        let head = format!(
            "HTTP/1.1 {} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{challenge}{conn}\r\n",
            self.status,
            body.len()
        );
        Bytes::from([head.as_bytes(), body.as_bytes()].concat())
    }
}

/// Checks one request (its parsed `head`, and the `raw` head bytes for the headers refract's
/// parser does not keep).
/// On the Unix admin socket (`local`) the file's permissions decide who connects: no token.
pub(crate) fn check(cfg: &AdminConfig, head: &RequestHead, raw: &[u8], local: bool) -> Result<(), Refusal> {
    let host = header(raw, "host");
    if let Some(origin) = headers(raw, "origin").next() {
        if headers(raw, "origin").nth(1).is_some() || host.is_none_or(|h| !same_origin(origin, h)) {
            return Err(Refusal { status: 403, message: "cross-origin requests are refused" });
        }
    }
    let open = local || (head.method == "GET" && matches!(head.path(), "/health" | "/metrics"));
    match &cfg.token {
        _ if open => {}
        Some(token) => {
            let given = header(raw, "authorization")
                .and_then(|v| v.split_once(' '))
                .and_then(|(scheme, t)| scheme.eq_ignore_ascii_case("bearer").then_some(t));
            if !given.is_some_and(|g| same_secret(g.trim().as_bytes(), token.as_bytes())) {
                return Err(Refusal { status: 401, message: "a valid bearer token is required" });
            }
        }
        // No token (loopback only): refuse a Host that is a name, which is what a page that
        // rebinds its DNS name to 127.0.0.1 sends.
        None if !host.is_some_and(is_loopback_host) => {
            return Err(Refusal { status: 403, message: "without a token, Host must be a loopback address" });
        }
        None => {}
    }
    let write = !matches!(head.method.as_str(), "GET" | "HEAD");
    let json = header(raw, "content-type").is_some_and(is_json);
    let has_body = !matches!(head.body, refract_http::BodyKind::None | refract_http::BodyKind::Length(0));
    if write && (head.method == "POST" || has_body) && !json {
        return Err(Refusal { status: 415, message: "admin writes take Content-Type: application/json" });
    }
    Ok(())
}

/// Every value of header `name` in a raw head.
fn headers<'a>(raw: &'a [u8], name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    let text = std::str::from_utf8(raw).unwrap_or("");
    text.lines().skip(1).filter_map(move |line| {
        let (k, v) = line.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The value of header `name` when it appears exactly once.
fn header<'a>(raw: &'a [u8], name: &'a str) -> Option<&'a str> {
    let mut all = headers(raw, name);
    let first = all.next()?;
    all.next().is_none().then_some(first)
}

/// Whether `origin` (scheme://host[:port]) names this listener as the client reached it.
fn same_origin(origin: &str, host: &str) -> bool {
    origin.strip_prefix("http://").is_some_and(|o| o.eq_ignore_ascii_case(host))
}

fn is_json(content_type: &str) -> bool {
    let media = content_type.split(';').next().unwrap_or("").trim();
    media.eq_ignore_ascii_case("application/json")
}

/// Whether a Host header names a loopback address (`localhost`, `127.x`, `[::1]`, any port).
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Compares two secrets in time that depends only on their lengths, never on where they
/// first differ.
fn same_secret(given: &[u8], want: &[u8]) -> bool {
    let n = given.len().max(want.len());
    let diff = (0..n).fold(given.len() ^ want.len(), |acc, i| {
        acc | usize::from(given.get(i).copied().unwrap_or(0) ^ want.get(i).copied().unwrap_or(0))
    });
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> RequestHead {
        RequestHead::parse(raw.as_bytes(), 64 << 10).unwrap().unwrap()
    }

    fn run(cfg: &AdminConfig, raw: &str) -> Result<(), u16> {
        check(cfg, &head(raw), raw.as_bytes(), false).map_err(|r| r.status)
    }

    #[test]
    fn token_origin_and_json_rules() {
        let cfg = AdminConfig { token: Some("0123456789abcdef".into()), ..Default::default() };
        let ok = "authorization: Bearer 0123456789abcdef\r\n";
        let host = "host: 127.0.0.1:8081\r\n";
        assert_eq!(run(&cfg, &format!("GET /backends HTTP/1.1\r\n{host}\r\n")), Err(401));
        assert_eq!(
            run(&cfg, &format!("GET /backends HTTP/1.1\r\n{host}authorization: Bearer 0123456789abcdeX\r\n\r\n")),
            Err(401)
        );
        assert_eq!(run(&cfg, &format!("GET /backends HTTP/1.1\r\n{host}{ok}\r\n")), Ok(()));
        assert_eq!(run(&cfg, &format!("GET /metrics HTTP/1.1\r\n{host}\r\n")), Ok(()), "metrics stay open");
        let post = format!("POST /backends HTTP/1.1\r\n{host}{ok}content-length: 2\r\n");
        assert_eq!(run(&cfg, &format!("{post}content-type: text/plain\r\n\r\n")), Err(415));
        assert_eq!(run(&cfg, &format!("{post}content-type: application/json; charset=utf-8\r\n\r\n")), Ok(()));
        let json = "content-type: application/json\r\n";
        assert_eq!(run(&cfg, &format!("{post}{json}origin: http://evil.example\r\n\r\n")), Err(403));
        assert_eq!(run(&cfg, &format!("{post}{json}origin: null\r\n\r\n")), Err(403));
        assert_eq!(run(&cfg, &format!("{post}{json}origin: http://127.0.0.1:8081\r\n\r\n")), Ok(()));
        assert_eq!(run(&cfg, &format!("DELETE /backends/b1 HTTP/1.1\r\n{host}{ok}\r\n")), Ok(()));
    }

    #[test]
    fn without_a_token_only_loopback_hosts() {
        let cfg = AdminConfig { insecure_loopback: true, ..Default::default() };
        assert_eq!(run(&cfg, "GET /backends HTTP/1.1\r\nhost: localhost:8081\r\n\r\n"), Ok(()));
        assert_eq!(run(&cfg, "GET /backends HTTP/1.1\r\nhost: [::1]:8081\r\n\r\n"), Ok(()));
        assert_eq!(run(&cfg, "GET /backends HTTP/1.1\r\nhost: rebound.example:8081\r\n\r\n"), Err(403));
    }

    #[test]
    fn the_unix_socket_needs_no_token_but_keeps_the_other_rules() {
        let cfg = AdminConfig { token: Some("0123456789abcdef".into()), ..Default::default() };
        let local = |raw: &str| check(&cfg, &head(raw), raw.as_bytes(), true).map_err(|r| r.status);
        assert_eq!(local("GET /backends HTTP/1.1\r\nhost: localhost\r\n\r\n"), Ok(()));
        let post = "POST /reload HTTP/1.1\r\nhost: localhost\r\ncontent-length: 2\r\n";
        assert_eq!(local(&format!("{post}content-type: text/plain\r\n\r\n")), Err(415));
        let json = "content-type: application/json\r\n";
        assert_eq!(local(&format!("{post}{json}origin: http://evil.example\r\n\r\n")), Err(403));
        assert_eq!(local(&format!("{post}{json}\r\n")), Ok(()));
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
        assert!(!same_secret(b"", b"a"));
    }
}
