//! A client connection: the socket and the bytes read from it but not yet consumed. Keeping
//! the buffer here, not in a reader task, is what lets a later hand-over carry pipelined
//! requests along with the connection at a request boundary.

use crate::error::Error;
use bytes::{Buf, Bytes, BytesMut};
use refract_http::{BodyKind, ChunkedDecoder, RequestHead};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Initial read buffer of a client connection.
const CLIENT_BUF: usize = 16 * 1024;

/// Why no request head came.
#[derive(Debug, PartialEq, Eq)]
pub enum Idle {
    /// The client closed between requests.
    Closed,
    /// The client stayed idle too long, or the dispatcher is draining.
    TimedOut,
}

/// One client connection.
#[derive(Debug)]
pub struct ClientConn {
    /// The socket.
    pub stream: TcpStream,
    /// Bytes received and not yet consumed (the start of the next request, pipelined ones).
    pub buf: BytesMut,
}

impl ClientConn {
    /// Wraps an accepted socket.
    pub fn new(stream: TcpStream) -> Self {
        ClientConn { stream, buf: BytesMut::with_capacity(CLIENT_BUF) }
    }

    /// Reads until a whole request head is buffered. Between requests, waits at most `idle`
    /// and gives up at once on `stop`; a partial head must complete within `idle` too.
    pub async fn read_head(
        &mut self,
        max: usize,
        idle: Duration,
        stop: &CancellationToken,
    ) -> Result<Result<RequestHead, Idle>, Error> {
        let deadline = tokio::time::Instant::now() + idle;
        loop {
            if let Some(head) = RequestHead::parse(&self.buf, max)? {
                return Ok(Ok(head));
            }
            let between = self.buf.is_empty();
            let read = tokio::select! {
                r = tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf)) => r,
                _ = stop.cancelled(), if between => return Ok(Err(Idle::TimedOut)),
            };
            crate::spin::note();
            match read {
                Err(_) => return Ok(Err(Idle::TimedOut)),
                Ok(Ok(0)) if between => return Ok(Err(Idle::Closed)),
                Ok(Ok(0)) => return Err(Error::ClientIo(std::io::ErrorKind::UnexpectedEof.into())),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(Error::ClientIo(e)),
            }
        }
    }

    /// Reads more bytes from the client into the buffer; EOF is an error (a body was expected).
    pub async fn fill(&mut self) -> Result<(), Error> {
        self.buf.reserve(CLIENT_BUF);
        match self.stream.read_buf(&mut self.buf).await {
            Ok(0) => Err(Error::ClientIo(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(_) => Ok(()),
            Err(e) => Err(Error::ClientIo(e)),
        }
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

    /// Writes a complete reply.
    pub async fn reply(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.stream.write_all(bytes).await.map_err(Error::ClientIo)
    }

    /// Closes without losing the last reply: half-close, then read and drop what the client
    /// still sends for a short while (closing with unread data would send RST, and the client
    /// could lose the reply).
    pub async fn close_gracefully(mut self) {
        let _ = self.stream.shutdown().await;
        self.buf.clear();
        let drain = async {
            let mut total = 0usize;
            while total < (8 << 20) {
                self.buf.clear();
                match self.stream.read_buf(&mut self.buf).await {
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
