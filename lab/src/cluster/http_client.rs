//! A tiny blocking HTTP/1.1 client for the demo and readiness probes: either straight over a
//! std `TcpStream` (loopback), or by running curl inside a lab namespace.

use crate::support::sh;
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// One response: status code and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// HTTP status.
    pub status: u16,
    /// Body, as text (lossy).
    pub body: String,
}

/// Where requests are sent from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Client {
    /// From this process, over `TcpStream`.
    Direct,
    /// With curl, run inside a namespace (`ip netns exec NS curl …`).
    Curl(String),
}

impl Client {
    /// `GET http://ADDR/PATH`.
    pub fn get(&self, addr: &str, path: &str) -> Result<Response> {
        self.request("GET", addr, path, None)
    }

    /// `POST http://ADDR/PATH` with a body of the given content type.
    pub fn post(&self, addr: &str, path: &str, ctype: &str, body: &str) -> Result<Response> {
        self.request("POST", addr, path, Some((ctype, body)))
    }

    fn request(&self, method: &str, addr: &str, path: &str, body: Option<(&str, &str)>) -> Result<Response> {
        match self {
            Client::Direct => direct(method, addr, path, body),
            Client::Curl(ns) => curl(ns, method, addr, path, body),
        }
    }
}

/// The request bytes (`Connection: close`, so the response ends at EOF at the latest).
pub fn encode_request(method: &str, addr: &str, path: &str, body: Option<(&str, &str)>) -> String {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some((ctype, body)) = body {
        req.push_str(&format!("Content-Type: {ctype}\r\nContent-Length: {}\r\n", body.len()));
        req.push_str("\r\n");
        req.push_str(body);
    } else {
        req.push_str("\r\n");
    }
    req
}

fn direct(method: &str, addr: &str, path: &str, body: Option<(&str, &str)>) -> Result<Response> {
    let sock: std::net::SocketAddr = addr.parse().with_context(|| format!("bad address {addr}"))?;
    let mut s =
        TcpStream::connect_timeout(&sock, Duration::from_secs(2)).with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(encode_request(method, addr, path, body).as_bytes())?;
    let mut raw = Vec::new();
    read_response(&mut s, &mut raw).with_context(|| format!("{method} http://{addr}{path}"))?;
    parse_response(&raw)?.context("incomplete response")
}

/// Read until a whole response is buffered (or EOF).
fn read_response(s: &mut TcpStream, raw: &mut Vec<u8>) -> Result<()> {
    let mut buf = [0u8; 16 * 1024];
    loop {
        if parse_response(raw)?.is_some() {
            return Ok(());
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        raw.extend_from_slice(&buf[..n]);
    }
}

/// Parse a buffered response; `Ok(None)` while more bytes are needed.
/// Handles `Content-Length`, `Transfer-Encoding: chunked` and read-to-EOF bodies only at EOF
/// (the caller treats what it has at EOF as the body).
pub fn parse_response(raw: &[u8]) -> Result<Option<Response>> {
    let Some(head_end) = find(raw, b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = String::from_utf8_lossy(&raw[..head_end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad status line {status_line:?}"))?;
    let header = |name: &str| {
        head.split("\r\n").skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    let rest = &raw[head_end + 4..];
    let body = if let Some(len) = header("content-length") {
        let len: usize = len.parse().context("bad Content-Length")?;
        match rest.get(..len) {
            Some(b) => b.to_vec(),
            None => return Ok(None),
        }
    } else if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        match dechunk(rest)? {
            Some(b) => b,
            None => return Ok(None),
        }
    } else {
        rest.to_vec()
    };
    let body = String::from_utf8_lossy(&body).into_owned();
    Ok(Some(Response { status, body }))
}

/// Decode a chunked body; `Ok(None)` until the last chunk has arrived.
fn dechunk(mut rest: &[u8]) -> Result<Option<Vec<u8>>> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = find(rest, b"\r\n") else {
            return Ok(None);
        };
        let size_text = String::from_utf8_lossy(&rest[..eol]);
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16).context("bad chunk size")?;
        let data = &rest[eol + 2..];
        if size == 0 {
            return Ok(Some(out));
        }
        if data.len() < size + 2 {
            return Ok(None);
        }
        out.extend_from_slice(&data[..size]);
        rest = &data[size + 2..];
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The same request with curl inside a namespace; the status comes from `-w %{http_code}`.
fn curl(ns: &str, method: &str, addr: &str, path: &str, body: Option<(&str, &str)>) -> Result<Response> {
    let url = format!("http://{addr}{path}");
    let mut args = vec!["-sS", "--max-time", "10", "-X", method, "-w", "\n%{http_code}"];
    let ctype;
    if let Some((ct, b)) = body {
        ctype = format!("Content-Type: {ct}");
        args.extend_from_slice(&["-H", &ctype, "--data-binary", b]);
    }
    args.push(&url);
    let out = sh::run(sh::cmd(Some(ns), "curl", &args))?;
    let (body, code) = out.rsplit_once('\n').context("curl printed no status")?;
    let status = code.trim().parse().with_context(|| format!("bad status from curl: {code:?}"))?;
    if status == 0 {
        bail!("no response from {url}");
    }
    Ok(Response { status, body: body.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_bytes() {
        let r = encode_request("POST", "127.0.0.1:8080", "/blob", Some(("text/plain", "hi")));
        assert_eq!(
            r,
            "POST /blob HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nConnection: close\r\n\
             Content-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi"
        );
    }

    #[test]
    fn content_length_response() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nx-served-by: b1\r\n\r\nhello";
        let r = parse_response(raw).expect("parse").expect("complete");
        assert_eq!((r.status, r.body.as_str()), (200, "hello"));
        assert_eq!(parse_response(&raw[..raw.len() - 1]).expect("parse"), None);
        assert_eq!(parse_response(b"HTTP/1.1 200 OK\r\n").expect("parse"), None);
    }

    #[test]
    fn chunked_response() {
        let raw = b"HTTP/1.1 503 Busy\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        let r = parse_response(raw).expect("parse").expect("complete");
        assert_eq!((r.status, r.body.as_str()), (503, "abcde"));
        assert_eq!(parse_response(&raw[..raw.len() - 7]).expect("parse"), None);
    }

    #[test]
    fn garbage_status_is_an_error() {
        assert!(parse_response(b"SSH-2.0-x\r\n\r\n").is_err());
    }
}
