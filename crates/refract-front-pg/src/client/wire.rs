//! [`Wire`]: one PostgreSQL socket (plain TCP or TLS) and its read buffer, framed with
//! refract-pg's `peek`; large messages of the types a relay passes on unread go through in
//! pieces ([`Wire::pipe_large`]), so no buffer holds them whole.

use crate::error::PgError;
use bytes::{Bytes, BytesMut};
use refract_pg::stream::{Piece, Splitter};
use refract_pg::{frame, Limits, Side};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// A socket that yields whole messages (tag, length and body, as received).
#[derive(Debug)]
pub struct Wire {
    stream: Stream,
    buf: BytesMut,
    /// Who is at the other end (for error attribution).
    peer: Side,
    /// Bytes written so far (a statement's sample for the adaptive limit is dropped when its
    /// answer was larger than a socket buffer: its time then includes the client's reading).
    sent: u64,
}

/// The transport under a [`Wire`]. An enum rather than a generic: the plain-TCP path costs one
/// predictable branch, and the session code stays free of type parameters.
#[derive(Debug)]
enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    /// Only while a TLS handshake owns the socket (or after it failed).
    Detached,
}

/// A raw message: its type byte and its bytes (tag included).
pub type Frame = (u8, Bytes);

/// What [`Wire::recv_unless_large`] found at the front of the buffer.
#[derive(Debug)]
pub enum Incoming {
    /// A whole message.
    Whole(Frame),
    /// The header of a large message of a type the caller relays in pieces; nothing of it has
    /// been consumed.
    Large(frame::Header),
}

/// Messages longer than this (tag included) are relayed in pieces by [`Wire::pipe_large`]
/// when their type allows it.
pub const STREAM_ABOVE: usize = 64 * 1024;
/// A buffer that grew past this for one large message is given back once the message is out,
/// so a connection's memory follows its current message, not its largest one ever.
pub const KEEP_CAPACITY: usize = 256 * 1024;
/// How much a read may bring in while a large message streams through.
const PIPE_READ: usize = 64 * 1024;

impl Wire {
    /// Wraps a connected socket.
    pub fn new(stream: TcpStream, peer: Side) -> Self {
        Wire { stream: Stream::Plain(stream), buf: BytesMut::with_capacity(8 * 1024), peer, sent: 0 }
    }

    /// The next buffered message, if a whole one is there.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, PgError> {
        let limits = Limits::default();
        match frame::peek(&self.buf, self.peer, &limits)? {
            Some(h) => {
                let frame = self.buf.split_to(h.total).freeze();
                if h.total > KEEP_CAPACITY {
                    // The buffer still shares the large allocation with `frame`: start afresh.
                    self.buf = BytesMut::from(&self.buf[..]);
                }
                Ok(Some((h.tag, frame)))
            }
            None => Ok(None),
        }
    }

    /// If the next message is longer than [`STREAM_ABOVE`] and `streamable` accepts its type,
    /// sends it on to `to` piece by piece as it arrives and returns `true`; else consumes
    /// nothing and returns `false` (also while its tag and length are not all in yet).
    ///
    /// Once the head is out the message cannot be taken back. If the server sends it and fails
    /// before its end, the client's stream is torn: the failure is reported as the client's
    /// (`Closed(Client)`), which ends the session without a word more to it and discards the
    /// server connection with it. If the client sends it and fails, its own error does that.
    pub async fn pipe_large(&mut self, to: &mut Wire, streamable: fn(u8) -> bool) -> Result<bool, PgError> {
        let mut split = Splitter::new(self.peer, Limits::default(), STREAM_ABOVE);
        let Some(head @ Piece::Head(h)) = split.next(&self.buf, streamable)? else { return Ok(false) };
        let head = self.buf.split_to(head.len());
        to.send(&head).await?;
        while split.in_body() {
            match split.next(&self.buf, streamable)? {
                Some(Piece::Body { len, .. }) => {
                    let chunk = self.buf.split_to(len);
                    to.send(&chunk).await?;
                }
                _ => self.fill_piece(h.tag).await?,
            }
        }
        Ok(true)
    }

    /// The next message, or the header alone of one longer than [`STREAM_ABOVE`] whose type
    /// `large` accepts, as soon as its tag and length are in (so it is never read whole).
    pub async fn recv_unless_large(&mut self, large: fn(u8) -> bool) -> Result<Incoming, PgError> {
        loop {
            if let Some(h) = frame::peek_head(&self.buf, self.peer, &Limits::default())? {
                if h.total > STREAM_ABOVE && large(h.tag) {
                    return Ok(Incoming::Large(h));
                }
            }
            if let Some(f) = self.next_frame()? {
                return Ok(Incoming::Whole(f));
            }
            self.fill().await?;
        }
    }

    /// Passes the next `left` bytes of this stream on to `to` (or drops them, with `None`) as
    /// they arrive, a bounded read at a time. If `to` fails, the bytes are still read to the end,
    /// so that this stream stays framed, and `to`'s error is returned then.
    pub async fn pass_on(&mut self, mut to: Option<&mut Wire>, mut left: usize) -> Result<(), PgError> {
        let mut failed = None;
        while left > 0 {
            if self.buf.is_empty() {
                self.fill_piece(0).await?;
            }
            let chunk = self.buf.split_to(left.min(self.buf.len()));
            left -= chunk.len();
            if let (None, Some(to)) = (&failed, to.as_deref_mut()) {
                failed = to.send(&chunk).await.err();
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Reads the next piece of a message being streamed (a bounded read).
    async fn fill_piece(&mut self, tag: u8) -> Result<(), PgError> {
        if self.buf.capacity() - self.buf.len() < PIPE_READ / 4 {
            self.buf.reserve(PIPE_READ);
        }
        match self.fill().await {
            Err(e) if self.peer == Side::Backend => {
                let tag = char::from(tag);
                tracing::warn!(error = %e, "the server failed in the middle of a '{tag}' message: closing the client");
                Err(PgError::Closed(Side::Client))
            }
            result => result,
        }
    }

    /// Reads more bytes; end of stream is an error (the peer left mid-conversation).
    pub async fn fill(&mut self) -> Result<(), PgError> {
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(16 * 1024);
        }
        let n = self.stream.read_buf(&mut self.buf).await.map_err(|e| PgError::io(self.peer, e))?;
        refract_core::spin::note();
        if n == 0 {
            return Err(PgError::Closed(self.peer));
        }
        Ok(())
    }

    /// The next message, reading as needed.
    pub async fn recv(&mut self) -> Result<Frame, PgError> {
        loop {
            if let Some(f) = self.next_frame()? {
                return Ok(f);
            }
            self.fill().await?;
        }
    }

    /// Writes all of `bytes` (and, over TLS, flushes the records out).
    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), PgError> {
        let peer = self.peer;
        self.sent += bytes.len() as u64;
        match &mut self.stream {
            Stream::Plain(s) => s.write_all(bytes).await.map_err(|e| PgError::io(peer, e)),
            Stream::Tls(s) => {
                s.write_all(bytes).await.map_err(|e| PgError::io(peer, e))?;
                s.flush().await.map_err(|e| PgError::io(peer, e))
            }
            Stream::Detached => Err(PgError::io(peer, detached())),
        }
    }

    /// How many bytes were written to the peer so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// The bytes read but not consumed yet.
    pub fn buffered(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// An idle plain-TCP connection is still open and has sent nothing: its peer neither
    /// closed it nor spoke out of turn (a read that would block). Reads at most one byte,
    /// which only an unusable connection has.
    pub fn open_and_quiet(&self) -> bool {
        match &self.stream {
            Stream::Plain(s) => {
                self.buf.is_empty()
                    && matches!(s.try_read(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            }
            _ => true,
        }
    }

    /// The socket of a plain-TCP connection (`None` on TLS: its session cannot move).
    pub fn plain_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        match &self.stream {
            Stream::Plain(s) => Some(s.as_fd()),
            _ => None,
        }
    }

    /// Counts `n` bytes another process wrote into this connection (the agent of a hand-over):
    /// what the client received, whoever wrote it.
    pub fn count_sent_elsewhere(&mut self, n: u64) {
        self.sent += n;
    }

    /// The socket of a plain-TCP connection, to move it (`None` on TLS).
    pub fn plain_stream(&mut self) -> Option<&mut TcpStream> {
        match &mut self.stream {
            Stream::Plain(s) => Some(s),
            _ => None,
        }
    }

    /// Whether the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self.stream, Stream::Tls(_))
    }

    /// Runs a server-side TLS handshake on the plain socket (after refract answered `S`).
    /// Bytes the client sent after its SSLRequest but before the handshake would be plaintext
    /// injected into the encrypted session, so they are refused (as PostgreSQL does).
    pub async fn accept_tls(&mut self, acceptor: &TlsAcceptor) -> Result<(), PgError> {
        if !self.buf.is_empty() {
            return Err(PgError::Unavailable("refract: unencrypted data after SSL request".into()));
        }
        let Stream::Plain(tcp) = std::mem::replace(&mut self.stream, Stream::Detached) else {
            return Err(PgError::Unavailable("refract: TLS requested twice".into()));
        };
        let tls = acceptor.accept(tcp).await.map_err(|e| PgError::io(self.peer, e))?;
        self.stream = Stream::Tls(Box::new(tls));
        Ok(())
    }

    /// Registers a plain socket with the current thread's event loop (it was opened on another
    /// shard's). A TLS socket stays where it is: it works from here too, with cross-thread
    /// wake-ups.
    pub fn rehome(&mut self) -> io::Result<()> {
        match std::mem::replace(&mut self.stream, Stream::Detached) {
            Stream::Plain(tcp) => self.stream = Stream::Plain(TcpStream::from_std(tcp.into_std()?)?),
            other => self.stream = other,
        }
        Ok(())
    }

    /// Shuts the write side down (best effort; over TLS, sends close_notify first).
    pub async fn close(&mut self) {
        let _ = self.stream.shutdown().await;
    }
}

fn detached() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "socket detached by a failed TLS handshake")
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Detached => Poll::Ready(Err(detached())),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Detached => Poll::Ready(Err(detached())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Detached => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::Detached => Poll::Ready(Ok(())),
        }
    }
}
