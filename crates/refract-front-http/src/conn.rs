//! A client connection: the socket and the bytes read from it but not yet consumed. Keeping
//! the buffer here, not in a reader task, is what lets a later hand-over carry pipelined
//! requests along with the connection at a request boundary.
//!
//! Every wait on the client is bounded by its [`ClientTimeouts`] (taken from the
//! configuration when the connection starts): the keep-alive idle time before a request's
//! first byte, the head and body timeouts between two reads of a request, the write-stall
//! timeout between two writes of a response. Between requests the connection holds no buffer:
//! it waits for readability and allocates only once the client sends (docs/operations.md,
//! "Timeouts").

use crate::error::Error;
use bytes::{Buf, Bytes, BytesMut};
use refract_core::config::Timeouts;
use refract_http::{BodyKind, ChunkedDecoder, RequestHead};
use std::future::Future;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

/// What a request head is read into first (grown as needed, up to the head limit): most heads
/// are a few hundred bytes, and an idle connection holds none.
const HEAD_CHUNK: usize = 4 * 1024;
/// What a body read reserves.
const BODY_CHUNK: usize = 16 * 1024;

/// The client-side timeouts of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientTimeouts {
    /// Between requests: how long to wait for the first byte of the next one.
    pub idle: Duration,
    /// Inactivity while a request head arrives (408 past it).
    pub head: Duration,
    /// Inactivity while a request body arrives (408 past it, if nothing was answered yet).
    pub body: Duration,
    /// No progress writing a response to the client (the connection is reset past it).
    pub write: Duration,
    /// No progress writing a response while another request waits for its backend's slot (the
    /// backend is let go past it).
    pub contended: Duration,
}

impl ClientTimeouts {
    /// The client-side timeouts of a configuration.
    pub fn of(t: &Timeouts) -> Self {
        let ms = Duration::from_millis;
        ClientTimeouts {
            idle: ms(t.client_idle_ms),
            head: ms(t.head_ms),
            body: ms(t.body_ms),
            write: ms(t.write_stall_ms),
            contended: ms(t.contended_stall_ms),
        }
    }
}

/// Why no request head came.
#[derive(Debug, PartialEq, Eq)]
pub enum Idle {
    /// The client closed between requests.
    Closed,
    /// The client stayed idle too long, or the dispatcher is draining.
    TimedOut,
}

/// A socket a client connection can live on: TCP (clients, admin) or a Unix socket (the admin
/// socket).
pub trait ClientStream: AsyncRead + AsyncWrite + Unpin + Send {
    /// Waits until the socket is readable.
    fn readable(&self) -> impl Future<Output = std::io::Result<()>> + Send;
    /// Reads what is there without waiting.
    fn try_read_buf(&self, buf: &mut BytesMut) -> std::io::Result<usize>;
    /// Drops what is unsent at close (TCP: zero linger, so the close is a reset).
    fn discard_unsent(&self) {}
}

impl ClientStream for TcpStream {
    fn readable(&self) -> impl Future<Output = std::io::Result<()>> + Send {
        TcpStream::readable(self)
    }
    fn try_read_buf(&self, buf: &mut BytesMut) -> std::io::Result<usize> {
        TcpStream::try_read_buf(self, buf)
    }
    fn discard_unsent(&self) {
        let _ = self.set_zero_linger();
    }
}

impl ClientStream for UnixStream {
    fn readable(&self) -> impl Future<Output = std::io::Result<()>> + Send {
        UnixStream::readable(self)
    }
    fn try_read_buf(&self, buf: &mut BytesMut) -> std::io::Result<usize> {
        UnixStream::try_read_buf(self, buf)
    }
}

/// One client connection.
#[derive(Debug)]
pub struct ClientConn<S = TcpStream> {
    /// The socket.
    pub stream: S,
    /// Bytes received and not yet consumed (the start of the next request, pipelined ones).
    pub buf: BytesMut,
    /// This connection's timeouts.
    pub timeouts: ClientTimeouts,
    /// The client's address, when known: its requests count against its share of a backend's
    /// slots.
    pub peer: Option<std::net::IpAddr>,
    /// A write made no progress for `timeouts.write`: the connection is reset, not closed.
    stalled: bool,
}

impl<S: ClientStream> ClientConn<S> {
    /// Wraps an accepted socket, with the default timeouts.
    pub fn new(stream: S) -> Self {
        Self::with_timeouts(stream, ClientTimeouts::of(&Timeouts::default()))
    }

    /// Wraps an accepted socket.
    pub fn with_timeouts(stream: S, timeouts: ClientTimeouts) -> Self {
        ClientConn { stream, buf: BytesMut::new(), timeouts, peer: None, stalled: false }
    }

    /// Reads until a whole request head is buffered. Between requests, waits at most `idle`
    /// for its first byte (holding no buffer) and gives up at once on `stop`; once a head has
    /// started, each read waits at most the head timeout (then: [`Error::ClientTimeout`]).
    pub async fn read_head(
        &mut self,
        max: usize,
        idle: Duration,
        stop: &CancellationToken,
    ) -> Result<Result<RequestHead, Idle>, Error> {
        loop {
            if let Some(head) = RequestHead::parse(&self.buf, max)? {
                return Ok(Ok(head));
            }
            if self.buf.is_empty() {
                if let Err(idle) = self.await_request(idle, stop).await? {
                    return Ok(Err(idle));
                }
                continue;
            }
            self.read_more(HEAD_CHUNK, self.timeouts.head, "head").await?;
        }
    }

    /// Between requests: releases the buffer, waits until the client sends (at most `idle`,
    /// not past `stop`), then reads what it sent. `Err(Idle)`: nothing came.
    async fn await_request(&mut self, idle: Duration, stop: &CancellationToken) -> Result<Result<(), Idle>, Error> {
        self.release();
        let ready = tokio::select! {
            r = timeout(idle, self.stream.readable()) => r,
            _ = stop.cancelled() => return Ok(Err(Idle::TimedOut)),
        };
        match ready {
            Err(_) => return Ok(Err(Idle::TimedOut)),
            Ok(Err(e)) => return Err(Error::ClientIo(e)),
            Ok(Ok(())) => {}
        }
        self.buf.reserve(HEAD_CHUNK);
        let read = self.stream.try_read_buf(&mut self.buf);
        refract_core::spin::note();
        match read {
            Ok(0) => Ok(Err(Idle::Closed)),
            Ok(_) => Ok(Ok(())),
            // A spurious wake-up: wait again, without the buffer.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(Ok(())),
            Err(e) => Err(Error::ClientIo(e)),
        }
    }

    /// Drops the buffer's memory when nothing is buffered (an idle connection holds none).
    pub fn release(&mut self) {
        if self.buf.is_empty() && self.buf.capacity() > 0 {
            self.buf = BytesMut::new();
        }
    }

    /// Reads more of a request (`what`: head or body), waiting at most `wait` for a byte;
    /// EOF is an error (a request was under way).
    async fn read_more(&mut self, chunk: usize, wait: Duration, what: &'static str) -> Result<(), Error> {
        if self.buf.capacity() - self.buf.len() < chunk / 2 {
            self.buf.reserve(chunk);
        }
        let read = timeout(wait, self.stream.read_buf(&mut self.buf)).await;
        refract_core::spin::note();
        match read {
            Err(_) => Err(Error::ClientTimeout { what, ms: wait.as_millis() as u64 }),
            Ok(Ok(0)) => Err(Error::ClientIo(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(Error::ClientIo(e)),
        }
    }

    /// Reads more bytes of a body from the client into the buffer, waiting at most the body
    /// timeout; EOF is an error (a body was expected).
    pub async fn fill(&mut self) -> Result<(), Error> {
        self.read_more(BODY_CHUNK, self.timeouts.body, "body").await
    }

    /// Reads a whole body as it goes on (chunked stays chunked, re-encoded), at most `limit` bytes.
    pub async fn read_body(&mut self, kind: BodyKind, limit: usize) -> Result<Bytes, Error> {
        match kind {
            BodyKind::None | BodyKind::UntilClose => Ok(Bytes::new()),
            BodyKind::Length(n) if n > limit as u64 => Err(Error::BodyTooLarge(limit)),
            BodyKind::Length(n) => {
                while (self.buf.len() as u64) < n {
                    self.fill().await?;
                }
                Ok(self.buf.split_to(n as usize).freeze())
            }
            BodyKind::Chunked => self.read_chunked(limit).await,
        }
    }

    /// A whole chunked body, re-encoded as it goes on (extensions and trailers dropped).
    async fn read_chunked(&mut self, limit: usize) -> Result<Bytes, Error> {
        let mut dec = ChunkedDecoder::new();
        let (mut seen, mut out) = (0, Vec::new());
        loop {
            seen += dec.normalize(&self.buf[seen..], &mut out)?;
            if dec.is_done() {
                self.consume(seen);
                return Ok(out.into());
            }
            if seen > limit {
                return Err(Error::BodyTooLarge(limit));
            }
            self.fill().await?;
        }
    }

    /// Buffers a body that will be streamed, up to `limit` bytes of it, without consuming it:
    /// a body of at most `limit` bytes is then all here before a backend slot is taken, so a
    /// client that stalls sending it holds no backend (as nginx buffers request bodies).
    pub async fn read_ahead(&mut self, kind: BodyKind, limit: usize) -> Result<(), Error> {
        match kind {
            BodyKind::None | BodyKind::UntilClose => {}
            BodyKind::Length(n) => {
                let want = n.min(limit as u64) as usize;
                while self.buf.len() < want {
                    self.fill().await?;
                }
            }
            BodyKind::Chunked => {
                let mut dec = ChunkedDecoder::new();
                let mut seen = 0;
                loop {
                    seen += dec.advance(&self.buf[seen..])?;
                    if dec.is_done() || self.buf.len() >= limit {
                        break;
                    }
                    self.fill().await?;
                }
            }
        }
        Ok(())
    }

    /// Writes a complete reply; a client that takes none of it for the write-stall timeout
    /// fails it with [`Error::ClientStalled`] (and the connection will be reset).
    pub async fn reply(&mut self, bytes: &[u8]) -> Result<(), Error> {
        let r = write_within(&mut self.stream, bytes, Some(self.timeouts.write)).await;
        if let Err(e) = &r {
            self.note(e);
        }
        r
    }

    /// Remembers a write that stalled: the connection is then reset, not closed gracefully.
    pub fn note(&mut self, err: &Error) {
        if let Error::ClientStalled { .. } = err {
            self.stalled = true;
        }
    }

    /// Closes without losing the last reply: half-close, then read and drop what the client
    /// still sends for a short while (closing with unread data would send RST, and the client
    /// could lose the reply). A client whose writes stalled is reset instead: what is still
    /// unsent is dropped at once rather than held by the kernel for a client that reads nothing.
    pub async fn close_gracefully(mut self) {
        if self.stalled {
            self.stream.discard_unsent();
            return;
        }
        let _ = self.stream.shutdown().await;
        let drain = async {
            let mut total = 0usize;
            // On the heap, and only now: a buffer here would sit in every session's future.
            let mut scrap = vec![0u8; 4096];
            while total < (8 << 20) {
                match self.stream.read(&mut scrap).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => total += n,
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_millis(500), drain).await;
    }

    /// Drops the first `n` buffered bytes.
    pub fn consume(&mut self, n: usize) {
        self.buf.advance(n);
    }
}

/// Writes all of `bytes` to `out`; with `stall`, fails with [`Error::ClientStalled`] when a
/// write makes no progress for that long (progress, not the whole write, is bounded: a slow
/// reader that keeps reading is served).
pub(crate) async fn write_within<W: AsyncWrite + Unpin>(
    out: &mut W,
    mut bytes: &[u8],
    stall: Option<Duration>,
) -> Result<(), Error> {
    let Some(stall) = stall else {
        return out.write_all(bytes).await.map_err(Error::ClientIo);
    };
    while !bytes.is_empty() {
        match timeout(stall, out.write(bytes)).await {
            Err(_) => return Err(Error::ClientStalled { ms: stall.as_millis() as u64, contended: false }),
            Ok(Ok(0)) => return Err(Error::ClientIo(std::io::ErrorKind::WriteZero.into())),
            Ok(Ok(n)) => bytes = &bytes[n..],
            Ok(Err(e)) => return Err(Error::ClientIo(e)),
        }
    }
    Ok(())
}
