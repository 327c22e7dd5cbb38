//! Moving bytes: a request body from the client to a backend, and a response from a backend to
//! a sink (the client, or a buffer for fan-out). Bodies stream through a bounded buffer, so
//! memory per connection stays bounded whatever the size of a result.

use crate::conn::ClientConn;
use crate::error::Error;
use bytes::Buf;
use refract_core::backend::BackendConn;
use refract_http::{BodyKind, ChunkedDecoder, ResponseHead};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How much a backend read may take at once.
const READ_CHUNK: usize = 64 * 1024;

/// Streams a request body of `kind` from the client (its buffer first) to the backend.
pub async fn request_body(
    conn: &mut ClientConn,
    bc: &mut BackendConn,
    kind: BodyKind,
    backend: &str,
) -> Result<u64, Error> {
    let io = |source| Error::BackendIo { backend: backend.to_string(), source };
    let mut sent = 0u64;
    match kind {
        BodyKind::None | BodyKind::UntilClose => {}
        BodyKind::Length(n) => loop {
            let take = (n - sent).min(conn.buf.len() as u64) as usize;
            bc.stream.write_all(&conn.buf[..take]).await.map_err(io)?;
            conn.consume(take);
            sent += take as u64;
            if sent == n {
                break;
            }
            conn.fill().await?;
        },
        BodyKind::Chunked => {
            // Re-encoded (extensions and trailers dropped). A broken encoding is an error
            // before its bytes go out; the caller then drops the backend connection with the
            // half-request on it, never pooling it.
            let mut dec = ChunkedDecoder::new();
            let mut out = Vec::new();
            loop {
                out.clear();
                let take = dec.normalize(&conn.buf, &mut out)?;
                bc.stream.write_all(&out).await.map_err(io)?;
                conn.consume(take);
                sent += out.len() as u64;
                if dec.is_done() {
                    break;
                }
                conn.fill().await?;
            }
        }
    }
    Ok(sent)
}

/// Reads more of a response; EOF is an error unless `eof_ok`. Returns the bytes read.
async fn read_more(bc: &mut BackendConn, timeout: Duration, backend: &str, eof_ok: bool) -> Result<usize, Error> {
    bc.buf.reserve(READ_CHUNK);
    let read = tokio::time::timeout(timeout, bc.stream.read_buf(&mut bc.buf)).await;
    refract_core::spin::note();
    match read {
        Err(_) => Err(Error::ResponseTimeout { backend: backend.to_string() }),
        Ok(Err(source)) => Err(Error::BackendIo { backend: backend.to_string(), source }),
        Ok(Ok(0)) if !eof_ok => Err(Error::BackendIo {
            backend: backend.to_string(),
            source: std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed before the response was complete",
            ),
        }),
        Ok(Ok(n)) => Ok(n),
    }
}

/// Reads a response head into the backend buffer (not consumed).
pub async fn response_head(
    bc: &mut BackendConn,
    timeout: Duration,
    backend: &str,
    head_request: bool,
) -> Result<ResponseHead, Error> {
    loop {
        let parsed = ResponseHead::parse(&bc.buf, 64 * 1024, head_request);
        match parsed.map_err(|source| Error::BackendProtocol { backend: backend.to_string(), source })? {
            Some(h) => return Ok(h),
            None => read_more(bc, timeout, backend, false).await?,
        };
    }
}

/// Where a response goes, counting what reached it.
pub struct Sink<'a, W> {
    out: &'a mut W,
    /// Bytes written so far.
    pub written: u64,
    /// Longest wait for a write to make progress (a client); `None` for a buffer.
    stall: Option<Duration>,
}

impl<'a, W: AsyncWrite + Unpin> Sink<'a, W> {
    /// A sink over a buffer (fan-out), which never stalls.
    pub fn new(out: &'a mut W) -> Self {
        Sink { out, written: 0, stall: None }
    }

    /// A sink over a client socket: a write that makes no progress for `stall` fails the
    /// response with [`Error::ClientStalled`], so that a client that stops reading frees the
    /// backend connection and its slot within that time.
    pub fn client(out: &'a mut W, stall: Duration) -> Self {
        Sink { out, written: 0, stall: Some(stall) }
    }

    async fn put(&mut self, bytes: &[u8]) -> Result<(), Error> {
        if bytes.is_empty() {
            return Ok(());
        }
        crate::conn::write_within(self.out, bytes, self.stall).await?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Passes on the first `n` buffered bytes of `bc` and consumes them.
    pub async fn pass(&mut self, bc: &mut BackendConn, n: usize) -> Result<(), Error> {
        self.put(&bc.buf[..n]).await?;
        bc.buf.advance(n);
        Ok(())
    }

    /// Relays a whole response like [`Sink::response`], its head saying `Connection: close`:
    /// the dispatcher is draining and closes the client connection after it, and a client
    /// told so beforehand does not send another request into the close.
    pub async fn response_closing(
        &mut self,
        bc: &mut BackendConn,
        rh: &ResponseHead,
        timeout: Duration,
        backend: &str,
    ) -> Result<bool, Error> {
        self.put(&closing_head(&bc.buf[..rh.len])).await?;
        bc.buf.advance(rh.len);
        self.response(bc, &ResponseHead { len: 0, ..rh.clone() }, timeout, backend).await
    }

    /// Relays a whole response whose head `rh` starts `bc`'s buffer. Returns whether the
    /// backend connection may be reused.
    pub async fn response(
        &mut self,
        bc: &mut BackendConn,
        rh: &ResponseHead,
        timeout: Duration,
        backend: &str,
    ) -> Result<bool, Error> {
        match rh.body {
            BodyKind::None => self.pass(bc, rh.len).await?,
            BodyKind::Length(n) => self.fixed(bc, rh.len, n, timeout, backend).await?,
            BodyKind::Chunked => self.chunked(bc, rh.len, timeout, backend).await?,
            BodyKind::UntilClose => {
                self.pass(bc, bc.buf.len()).await?;
                while read_more(bc, timeout, backend, true).await? > 0 {
                    self.pass(bc, bc.buf.len()).await?;
                }
                return Ok(false);
            }
        }
        Ok(rh.keep_alive && bc.buf.is_empty())
    }

    async fn fixed(
        &mut self,
        bc: &mut BackendConn,
        head: usize,
        n: u64,
        timeout: Duration,
        backend: &str,
    ) -> Result<(), Error> {
        let first = n.min((bc.buf.len() - head) as u64);
        self.pass(bc, head + first as usize).await?;
        let mut left = n - first;
        while left > 0 {
            read_more(bc, timeout, backend, false).await?;
            let take = left.min(bc.buf.len() as u64);
            self.pass(bc, take as usize).await?;
            left -= take;
        }
        Ok(())
    }

    async fn chunked(
        &mut self,
        bc: &mut BackendConn,
        head: usize,
        timeout: Duration,
        backend: &str,
    ) -> Result<(), Error> {
        let bad = |source| Error::BackendProtocol { backend: backend.to_string(), source };
        let mut dec = ChunkedDecoder::new();
        let first = dec.advance(&bc.buf[head..]).map_err(bad)?;
        self.pass(bc, head + first).await?;
        while !dec.is_done() {
            read_more(bc, timeout, backend, false).await?;
            let take = dec.advance(&bc.buf).map_err(bad)?;
            self.pass(bc, take).await?;
        }
        Ok(())
    }
}

/// A complete response head with its `Connection` and `Keep-Alive` headers replaced by
/// `connection: close`.
pub fn closing_head(head: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(head.len() + 19);
    for (i, line) in head.split_inclusive(|&c| c == b'\n').enumerate() {
        if line == b"\r\n" || line == b"\n" {
            out.extend_from_slice(b"connection: close\r\n");
        } else if i > 0 && is_connection_header(line) {
            continue;
        }
        out.extend_from_slice(line);
    }
    out
}

fn is_connection_header(line: &[u8]) -> bool {
    let name = line.split(|&c| c == b':').next().unwrap_or_default().trim_ascii();
    name.eq_ignore_ascii_case(b"connection") || name.eq_ignore_ascii_case(b"keep-alive")
}

#[cfg(test)]
mod tests {
    use super::closing_head;

    #[test]
    fn closing_head_replaces_connection_headers() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n";
        assert_eq!(closing_head(head), b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nconnection: close\r\n\r\n");
        let bare = b"HTTP/1.1 204 No Content\r\n\r\n";
        assert_eq!(closing_head(bare), b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n");
    }
}
