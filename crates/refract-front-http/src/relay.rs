//! Moving bytes: a request body from the client to a backend, and a response from a backend to
//! a sink (the client, or a buffer for fan-out). Bodies stream through a bounded buffer, so
//! memory per connection stays bounded whatever the size of a result.
//!
//! A client that stops reading holds its backend only while nobody else needs it: when the
//! client has taken no byte for `[timeouts] contended_stall_ms` and another request waits for
//! the backend's slot ([`Permit::contended`]), the sink lets the backend go. The rest of the
//! response is read into a spill (within `[limits] spill_bytes` and the shared
//! `spill_total_bytes`) and written to the client once the slot is given back; a rest that does
//! not fit fails the response with a contended [`Error::ClientStalled`] instead.
//!
//! Progress is the client taking bytes, not a write returning: the kernel wakes a blocked
//! writer only once a third or so of the send buffer (up to megabytes) has drained, which a
//! slow reader can take seconds to do. While a write is blocked the sink therefore also looks
//! at the bytes the client has not acknowledged yet (`SIOCOUTQ`): fewer than at the last look
//! is progress.

use crate::conn::ClientConn;
use crate::error::Error;
use bytes::Buf;
use refract_core::backend::BackendConn;
use refract_core::overload::{Permit, Spill, SpillBudget};
use refract_http::{BodyKind, ChunkedDecoder, ResponseHead};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

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

/// What a sink writes to: whether the peer has taken what was written.
pub trait Taken {
    /// Bytes written and not yet acknowledged by the peer; `None` when that cannot be known.
    fn unacked(&self) -> Option<u32>;
}

impl Taken for TcpStream {
    fn unacked(&self) -> Option<u32> {
        refract_handover::unacked(self).ok()
    }
}

impl Taken for Vec<u8> {
    fn unacked(&self) -> Option<u32> {
        None
    }
}

/// What lets a client sink give its backend up: the slot others may want, and the bounds of a
/// spill.
pub struct Watch<'a> {
    /// The exchange's admission slot.
    pub permit: &'a Permit,
    /// How long a write may make no progress while another request waits for the slot.
    pub after: Duration,
    /// The dispatcher's spill budget (shared by a spill only once one starts: no atomic
    /// traffic per request).
    pub budget: &'a Arc<SpillBudget>,
    /// `[limits] spill_bytes`.
    pub max: usize,
    /// `[limits] spill_total_bytes`.
    pub total: usize,
}

/// Where a response goes, counting what reached it.
pub struct Sink<'a, W> {
    out: &'a mut W,
    /// Bytes written so far (not counting a spill).
    pub written: u64,
    /// Longest wait for a write to make progress (a client); `None` for a buffer.
    stall: Option<Duration>,
    /// Giving the backend up for a client that stopped reading (a relayed response).
    watch: Option<Watch<'a>>,
    /// Body bytes the backend still has to send after those being passed (`None`: unknown).
    to_come: Option<u64>,
    /// The rest of the response, once the backend was let go.
    spill: Option<Spill>,
}

impl<'a, W: AsyncWrite + Taken + Unpin> Sink<'a, W> {
    /// A sink over a buffer (fan-out), which never stalls.
    pub fn new(out: &'a mut W) -> Self {
        Sink { out, written: 0, stall: None, watch: None, to_come: None, spill: None }
    }

    /// A sink over a client socket: a write that makes no progress for `stall` fails the
    /// response with [`Error::ClientStalled`], so that a client that stops reading frees the
    /// backend connection and its slot within that time; with `watch`, within
    /// `watch.after` when another request waits for the slot.
    pub fn client(out: &'a mut W, stall: Duration, watch: Option<Watch<'a>>) -> Self {
        Sink { out, written: 0, stall: Some(stall), watch, to_come: None, spill: None }
    }

    /// The rest of the response kept for the client after its backend was let go.
    pub fn into_spill(self) -> Option<Spill> {
        self.spill
    }

    async fn put(&mut self, bytes: &[u8]) -> Result<(), Error> {
        if bytes.is_empty() {
            return Ok(());
        }
        if let Some(spill) = &mut self.spill {
            return if spill.push(bytes) { Ok(()) } else { Err(self.cut()) };
        }
        let sent = match (&self.watch, self.stall) {
            (Some(w), Some(stall)) => write_watched(self.out, bytes, stall, w).await?,
            _ => {
                crate::conn::write_within(self.out, bytes, self.stall).await?;
                bytes.len()
            }
        };
        self.written += sent as u64;
        if sent < bytes.len() {
            self.start_spill(&bytes[sent..])?;
        }
        Ok(())
    }

    /// Another request wants the slot of a client that stopped reading: keeps `rest`, and what
    /// the backend still sends, for the client; a response that cannot fit fails at once.
    fn start_spill(&mut self, rest: &[u8]) -> Result<(), Error> {
        let Some(w) = &self.watch else { return Err(self.cut()) };
        let mut spill = Spill::new(w.budget.clone(), w.max, w.total);
        let known = (rest.len() as u64).saturating_add(self.to_come.unwrap_or(0));
        if !spill.fits(known) || !spill.push(rest) {
            return Err(self.cut());
        }
        self.spill = Some(spill);
        Ok(())
    }

    /// The response given up for a client that stopped reading while others waited.
    fn cut(&self) -> Error {
        let ms = self.watch.as_ref().map_or(0, |w| w.after.as_millis() as u64);
        Error::ClientStalled { ms, contended: true }
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
            BodyKind::None => {
                self.to_come = Some(0);
                self.pass(bc, rh.len).await?
            }
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
        self.to_come = Some(n - first);
        self.pass(bc, head + first as usize).await?;
        let mut left = n - first;
        while left > 0 {
            read_more(bc, timeout, backend, false).await?;
            let take = left.min(bc.buf.len() as u64);
            self.to_come = Some(left - take);
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

/// Writes `bytes` to a client like [`crate::conn::write_within`], but stops when the client has
/// taken nothing for `w.after` and another request wants the backend's slot (this holder having
/// claimed the making of room for it). Returns how many bytes went out: fewer than
/// `bytes.len()` when it stopped.
async fn write_watched<W: AsyncWrite + Taken + Unpin>(
    out: &mut W,
    bytes: &[u8],
    stall: Duration,
    w: &Watch<'_>,
) -> Result<usize, Error> {
    let look = (w.after.min(stall) / 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut done = 0;
    // The last progress, and the client's unacknowledged bytes at the last look while blocked.
    let (mut last, mut seen) = (Instant::now(), None);
    while done < bytes.len() {
        let idle = last.elapsed() >= w.after;
        tokio::select! {
            biased;
            r = out.write(&bytes[done..]) => {
                done += wrote(r)?;
                (last, seen) = (Instant::now(), None);
                continue;
            }
            () = w.permit.contended(), if idle => {}
            () = tokio::time::sleep(look) => {}
        }
        let now = out.unacked();
        if now.is_some_and(|n| seen.is_some_and(|s| n < s)) {
            last = Instant::now();
        }
        seen = now;
        if last.elapsed() >= stall {
            return Err(Error::ClientStalled { ms: stall.as_millis() as u64, contended: false });
        }
        if last.elapsed() >= w.after && w.permit.claim() {
            return Ok(done);
        }
    }
    Ok(done)
}

/// What one write took, or why it failed.
fn wrote(r: std::io::Result<usize>) -> Result<usize, Error> {
    match r {
        Ok(0) => Err(Error::ClientIo(std::io::ErrorKind::WriteZero.into())),
        Ok(n) => Ok(n),
        Err(e) => Err(Error::ClientIo(e)),
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
