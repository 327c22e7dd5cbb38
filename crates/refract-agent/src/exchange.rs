//! Serving adopted requests: each whole request buffered from the client goes to the backend,
//! and its response streams straight to the client socket (head tagged `x-refract-handover`).

use bytes::{Buf, BytesMut};
use refract_http::{BodyKind, ChunkedDecoder, RequestHead, ResponseHead};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest request or response head handled.
const MAX_HEAD: usize = 64 * 1024;
/// How much one backend read may take.
const READ_CHUNK: usize = 64 * 1024;

/// How serving adopted requests ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Served {
    /// At a request boundary with no whole request buffered: hand the connection back with
    /// these bytes (a partial request, or nothing).
    Boundary(Vec<u8>),
    /// The connection must close (the reason is for logs).
    Close(String),
}

/// A response the agent read the head of and holds (hybrid: it asked for the connection).
#[derive(Debug)]
pub struct Held {
    /// What was read of it: interim responses, the final head, maybe part of the body.
    pub buf: BytesMut,
    /// Where the final head starts in `buf` (after interim responses).
    pub head_at: usize,
    /// The final head.
    pub head: ResponseHead,
    /// Whether the request asked to keep the connection.
    pub keep_alive: bool,
}

/// The agent's end of one adopted connection: the client, the backend, the pending bytes.
pub struct Adopted<'a> {
    /// The client socket.
    pub client: &'a mut TcpStream,
    /// A connection to the local backend.
    pub backend: &'a mut TcpStream,
    /// Bytes from the client not consumed yet.
    pub pending: BytesMut,
    /// Bound on each backend read.
    pub timeout: Duration,
    /// The hand-over epoch, put in `x-refract-handover` on each response.
    pub epoch: u64,
    /// Bytes written to the client so far (reported to the dispatcher with the hand-back).
    pub sent: u64,
}

/// The length of the whole request at the start of `buf` (head and body), if it is all there.
/// A chunked body counts as not there: the dispatcher streams those itself.
pub fn whole_request(buf: &[u8]) -> Option<(usize, RequestHead)> {
    let head = RequestHead::parse(buf, MAX_HEAD).ok()??;
    let body = match head.body {
        BodyKind::None | BodyKind::UntilClose => 0,
        BodyKind::Length(n) => usize::try_from(n).ok()?,
        BodyKind::Chunked => return None,
    };
    let total = head.len.checked_add(body)?;
    (buf.len() >= total).then_some((total, head))
}

impl Adopted<'_> {
    /// Finishes the held response (if any), then serves every whole request buffered, in
    /// order; stops at the first boundary without one. Also returns the bytes written to the
    /// client (those of completed writes).
    pub async fn run(mut self, held: Option<Held>) -> (Served, u64) {
        let served = self.serve(held).await;
        (served, self.sent)
    }

    async fn serve(&mut self, held: Option<Held>) -> Served {
        if let Some(h) = held {
            let keep = h.keep_alive && h.head.keep_alive && h.head.body != BodyKind::UntilClose;
            if let Err(e) = self.finish(h).await {
                return Served::Close(format!("response cut short: {e}"));
            }
            if !keep {
                return Served::Close("the exchange asked for close".into());
            }
        }
        loop {
            let Some((len, head)) = whole_request(&self.pending) else {
                return Served::Boundary(self.pending.to_vec());
            };
            if let Err(e) = self.backend.write_all(&self.pending[..len]).await {
                // Nothing reached the client: the dispatcher gets the request back and relays it.
                return self.backend_failed(e);
            }
            let held = match read_response_head(self.backend, self.timeout, head.is_head()).await {
                Ok((buf, head_at, rh)) => Held { buf, head_at, head: rh, keep_alive: head.keep_alive },
                Err(e) => return self.backend_failed(e),
            };
            self.pending.advance(len);
            let keep = head.keep_alive && held.head.keep_alive && held.head.body != BodyKind::UntilClose;
            if let Err(e) = self.finish(held).await {
                return Served::Close(format!("response cut short: {e}"));
            }
            if !keep {
                return Served::Close("the exchange asked for close".into());
            }
        }
    }

    fn backend_failed(&self, e: std::io::Error) -> Served {
        tracing::debug!("backend failed before the response: {e}; handing the request back");
        Served::Boundary(self.pending.to_vec())
    }

    /// Writes a response whose head was read (tagged) and streams the rest of its body.
    async fn finish(&mut self, mut h: Held) -> std::io::Result<()> {
        self.write(&h.buf[..h.head_at]).await?;
        self.write(&tag(&h.buf[h.head_at..h.head_at + h.head.len], self.epoch)).await?;
        h.buf.advance(h.head_at + h.head.len);
        let mut body = BodyReader::new(h.head.body);
        while let Some(piece) = body.next(self.backend, &mut h.buf, self.timeout).await? {
            self.write(&piece).await?;
        }
        Ok(())
    }

    /// Writes to the client, counting what was written.
    async fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.client.write_all(bytes).await?;
        self.sent += bytes.len() as u64;
        Ok(())
    }
}

/// Reads interim responses and the final head of a response; returns what was read, where the
/// final head starts, and the head.
pub async fn read_response_head(
    s: &mut TcpStream,
    timeout: Duration,
    head_request: bool,
) -> std::io::Result<(BytesMut, usize, ResponseHead)> {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut at = 0;
    loop {
        let parsed = ResponseHead::parse(&buf[at..], MAX_HEAD, head_request)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        match parsed {
            Some(h) if h.is_interim() => at += h.len,
            Some(h) => return Ok((buf, at, h)),
            None if read_more(s, &mut buf, timeout).await? == 0 => return Err(eof()),
            None => {}
        }
    }
}

/// Pulls a response body off the backend in pieces, whatever its framing.
#[derive(Debug)]
pub struct BodyReader {
    kind: BodyKind,
    left: u64,
    dec: ChunkedDecoder,
    done: bool,
}

impl BodyReader {
    /// A reader for a body of `kind`.
    pub fn new(kind: BodyKind) -> Self {
        let left = if let BodyKind::Length(n) = kind { n } else { 0 };
        BodyReader { kind, left, dec: ChunkedDecoder::new(), done: kind == BodyKind::None }
    }

    /// The next piece of the body (from `buf` first, then the backend); `None` at its end.
    pub async fn next(
        &mut self,
        s: &mut TcpStream,
        buf: &mut BytesMut,
        timeout: Duration,
    ) -> std::io::Result<Option<bytes::Bytes>> {
        loop {
            if self.done || (self.kind != BodyKind::Chunked && self.kind != BodyKind::UntilClose && self.left == 0) {
                return Ok(None);
            }
            if !buf.is_empty() {
                let take = match self.kind {
                    BodyKind::Length(_) => {
                        let take = self.left.min(buf.len() as u64) as usize;
                        self.left -= take as u64;
                        take
                    }
                    BodyKind::Chunked => {
                        let take = self
                            .dec
                            .advance(buf)
                            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
                        self.done = self.dec.is_done();
                        take
                    }
                    _ => buf.len(),
                };
                if take > 0 {
                    return Ok(Some(buf.split_to(take).freeze()));
                }
            }
            if read_more(s, buf, timeout).await? == 0 {
                if self.kind == BodyKind::UntilClose {
                    self.done = true;
                    return Ok(None);
                }
                return Err(eof());
            }
        }
    }
}

fn eof() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "backend closed before the response was complete")
}

async fn read_more(s: &mut TcpStream, buf: &mut BytesMut, timeout: Duration) -> std::io::Result<usize> {
    buf.reserve(READ_CHUNK);
    match tokio::time::timeout(timeout, s.read_buf(buf)).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "backend response timed out")),
    }
}

/// The response head with `x-refract-handover: EPOCH` added before its blank line, so a
/// client (and the tests) can tell which responses came straight from the agent.
fn tag(head: &[u8], epoch: u64) -> Vec<u8> {
    let end = head.len().saturating_sub(2);
    let mut out = Vec::with_capacity(head.len() + 32);
    out.extend_from_slice(&head[..end]);
    out.extend_from_slice(format!("x-refract-handover: {epoch}\r\n\r\n").as_bytes());
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn whole_requests_only() {
        let get = b"GET /blob?bytes=1 HTTP/1.1\r\nhost: x\r\n\r\n";
        assert_eq!(whole_request(get).map(|(n, _)| n), Some(get.len()));
        assert!(whole_request(&get[..10]).is_none());
        let post = b"POST /blob HTTP/1.1\r\ncontent-length: 3\r\n\r\nab";
        assert!(whole_request(post).is_none());
        let post = b"POST /blob HTTP/1.1\r\ncontent-length: 3\r\n\r\nabcGET";
        assert_eq!(whole_request(post).map(|(n, _)| n), Some(post.len() - 3));
        assert!(whole_request(b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n").is_none());
    }

    #[test]
    fn the_tag_goes_before_the_blank_line() {
        assert_eq!(tag(b"HTTP/1.1 200 OK\r\n\r\n", 3), b"HTTP/1.1 200 OK\r\nx-refract-handover: 3\r\n\r\n");
    }
}
