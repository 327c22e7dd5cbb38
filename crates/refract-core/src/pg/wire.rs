//! [`Wire`]: one PostgreSQL socket and its read buffer, framed with refract-pg's `peek`.

use super::error::PgError;
use bytes::{Bytes, BytesMut};
use refract_pg::{frame, Limits, Side};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A socket that yields whole messages (tag, length and body, as received).
#[derive(Debug)]
pub struct Wire {
    stream: TcpStream,
    buf: BytesMut,
    /// Who is at the other end (for error attribution).
    peer: Side,
}

/// A raw message: its type byte and its bytes (tag included).
pub type Frame = (u8, Bytes);

impl Wire {
    /// Wraps a connected socket.
    pub fn new(stream: TcpStream, peer: Side) -> Self {
        Wire { stream, buf: BytesMut::with_capacity(8 * 1024), peer }
    }

    /// The next buffered message, if a whole one is there.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, PgError> {
        let limits = Limits::default();
        match frame::peek(&self.buf, self.peer, &limits)? {
            Some(h) => Ok(Some((h.tag, self.buf.split_to(h.total).freeze()))),
            None => Ok(None),
        }
    }

    /// Reads more bytes; end of stream is an error (the peer left mid-conversation).
    pub async fn fill(&mut self) -> Result<(), PgError> {
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(16 * 1024);
        }
        let n = self.stream.read_buf(&mut self.buf).await.map_err(|e| PgError::io(self.peer, e))?;
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

    /// Writes all of `bytes`.
    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), PgError> {
        self.stream.write_all(bytes).await.map_err(|e| PgError::io(self.peer, e))
    }

    /// The bytes read but not consumed yet.
    pub fn buffered(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Shuts the write side down (best effort).
    pub async fn close(&mut self) {
        let _ = self.stream.shutdown().await;
    }
}
