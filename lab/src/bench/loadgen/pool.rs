//! `Pool`: the load generator's keep-alive connections to one address — an idle one is reused,
//! a new one is opened when all are busy, up to a maximum — and the one HTTP/1.1 exchange it
//! performs on them.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest response head accepted.
const MAX_HEAD: usize = 16 * 1024;

/// Keep-alive connections to one address.
#[derive(Debug)]
pub struct Pool {
    addr: SocketAddr,
    max: usize,
    open: Arc<AtomicUsize>,
    idle: Mutex<Vec<Conn>>,
}

/// One connection; it counts against the pool's maximum until dropped.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    reused: bool,
    _slot: Slot,
}

/// A place among the pool's open connections, given back on drop.
#[derive(Debug)]
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why an exchange failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Every connection is busy and the pool is at its maximum.
    PoolFull,
    /// Connecting, writing or reading failed, or the answer was malformed.
    Io(String),
}

/// What the exchange brought back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// `x-served-by`, if present.
    pub served_by: Option<String>,
    /// Whether the connection may carry another request.
    pub keep_alive: bool,
}

impl Pool {
    /// A pool of at most `max` connections to `addr`.
    pub fn new(addr: SocketAddr, max: usize) -> Self {
        Pool { addr, max, open: Arc::default(), idle: Mutex::default() }
    }

    /// Connections open right now (idle and busy).
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// An idle connection, or a new one if the maximum allows.
    pub async fn checkout(&self) -> Result<Conn, Failure> {
        if let Some(c) = self.idle.lock().map(|mut v| v.pop()).unwrap_or(None) {
            return Ok(c);
        }
        self.connect().await
    }

    /// A fresh connection, if the maximum allows.
    pub async fn connect(&self) -> Result<Conn, Failure> {
        if self.open.fetch_add(1, Ordering::Relaxed) >= self.max {
            self.open.fetch_sub(1, Ordering::Relaxed);
            return Err(Failure::PoolFull);
        }
        let slot = Slot(self.open.clone());
        let stream = TcpStream::connect(self.addr).await.map_err(|e| Failure::Io(format!("connect: {e}")))?;
        let _ = stream.set_nodelay(true);
        Ok(Conn { stream, buf: Vec::with_capacity(4096), reused: false, _slot: slot })
    }

    /// Give a connection back for reuse.
    pub fn checkin(&self, mut c: Conn) {
        c.reused = true;
        if let Ok(mut v) = self.idle.lock() {
            v.push(c);
        }
    }

    /// Send `request` and read the answer, on a pooled connection. A reused connection that
    /// the server closed while idle (nothing read yet) is replaced by a fresh one once.
    pub async fn exchange(&self, request: &[u8]) -> Result<Reply, Failure> {
        let mut c = self.checkout().await?;
        let mut r = c.exchange(request).await;
        if r.is_err() && c.reused && c.buf.is_empty() {
            c = self.connect().await?;
            r = c.exchange(request).await;
        }
        let reply = r?;
        if reply.keep_alive {
            self.checkin(c);
        }
        Ok(reply)
    }
}

impl Conn {
    /// Write the request, read one whole response.
    async fn exchange(&mut self, request: &[u8]) -> Result<Reply, Failure> {
        self.buf.clear();
        self.stream.write_all(request).await.map_err(|e| Failure::Io(format!("write: {e}")))?;
        loop {
            if let Some((reply, used)) = parse(&self.buf, false)? {
                self.buf.drain(..used);
                return Ok(reply);
            }
            let n = self.stream.read_buf(&mut self.buf).await.map_err(|e| Failure::Io(format!("read: {e}")))?;
            if n == 0 {
                return match parse(&self.buf, true)? {
                    Some((reply, _)) => Ok(Reply { keep_alive: false, ..reply }),
                    None => Err(Failure::Io("connection closed before a whole response".into())),
                };
            }
        }
    }
}

/// Parse a buffered response: `Ok(None)` while more bytes are needed; at EOF, a body without a
/// length ends where the bytes end.
pub fn parse(buf: &[u8], eof: bool) -> Result<Option<(Reply, usize)>, Failure> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            return Err(Failure::Io("response head too large".into()))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(Failure::Io(format!("bad response: {e}"))),
    };
    let status = resp.code.unwrap_or(0);
    let header = |name: &str| {
        resp.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_string())
    };
    let close = header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
    let keep_alive = !close && resp.version == Some(1);
    let served_by = header("x-served-by");
    let body = &buf[head_len..];
    let body_len = if let Some(len) = header("content-length") {
        let len: usize = len.parse().map_err(|_| Failure::Io("bad content-length".into()))?;
        (body.len() >= len).then_some(len)
    } else if header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        chunked_len(body)?
    } else if status == 204 || status == 304 || (100..200).contains(&status) {
        Some(0)
    } else {
        // No length: the body runs to EOF, and the connection cannot be reused.
        return Ok(eof.then_some((Reply { status, served_by, keep_alive: false }, buf.len())));
    };
    Ok(body_len.map(|n| (Reply { status, served_by, keep_alive }, head_len + n)))
}

/// The length of a whole chunked body (through the last chunk and the empty trailer), or
/// `None` while incomplete.
fn chunked_len(body: &[u8]) -> Result<Option<usize>, Failure> {
    let mut at = 0;
    loop {
        let Some(eol) = find(&body[at..], b"\r\n") else {
            return Ok(None);
        };
        let line = String::from_utf8_lossy(&body[at..at + eol]);
        let hex = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(hex, 16).map_err(|_| Failure::Io("bad chunk size".into()))?;
        at += eol + 2;
        if size == 0 {
            // Trailers end with an empty line; without trailers that is the next CRLF.
            let rest = &body[at..];
            return Ok(find(rest, b"\r\n\r\n")
                .filter(|_| !rest.starts_with(b"\r\n"))
                .map(|i| at + i + 4)
                .or_else(|| rest.starts_with(b"\r\n").then_some(at + 2)));
        }
        if body.len() < at + size + 2 {
            return Ok(None);
        }
        at += size + 2;
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, by: Option<&str>, keep_alive: bool) -> Reply {
        Reply { status, served_by: by.map(str::to_string), keep_alive }
    }

    #[test]
    fn content_length() {
        let raw = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nx-served-by: b2\r\n\r\nabcHTTP/1.1";
        let (r, used) = parse(raw, false).expect("parse").expect("complete");
        assert_eq!((r, used), (reply(200, Some("b2"), true), raw.len() - 8));
        assert_eq!(parse(&raw[..raw.len() - 9], false).expect("parse"), None);
    }

    #[test]
    fn refusal_with_close() {
        let raw = b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\nconnection: close\r\n\
                    content-length: 2\r\n\r\n{}";
        let (r, _) = parse(raw, false).expect("parse").expect("complete");
        assert_eq!(r, reply(503, None, false));
    }

    #[test]
    fn chunked_and_until_eof() {
        let raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        let (r, used) = parse(raw, false).expect("parse").expect("complete");
        assert_eq!((r.status, used), (200, raw.len()));
        assert_eq!(parse(&raw[..raw.len() - 2], false).expect("parse"), None);
        let eof = b"HTTP/1.0 200 OK\r\n\r\nbody";
        assert_eq!(parse(eof, false).expect("parse"), None);
        let (r, _) = parse(eof, true).expect("parse").expect("complete");
        assert_eq!(r, reply(200, None, false));
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse(b"SSH-2.0-x\r\n\r\n", false).is_err());
    }
}
