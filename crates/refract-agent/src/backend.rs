//! The agent's connection to the backend it fronts: TCP, or a Unix socket when the backend
//! listens on one (`backend_socket`). The backend is on the agent's own host, so a Unix socket
//! skips the TCP/IP stack both ways (no segments, no ACKs, no loopback softirq): on this
//! path every result byte of a hand-over passes, so its per-byte cost is the hand-over's.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::options::LocalOptions;

/// One connection to the local backend.
#[derive(Debug)]
pub enum BackendStream {
    /// Over TCP (`backend`).
    Tcp(TcpStream),
    /// Over a Unix socket (`backend_socket`).
    Unix(UnixStream),
}

impl BackendStream {
    /// Runs the non-blocking `f` if the socket may be ready for `interest`, clearing the
    /// readiness when it reports `WouldBlock` (tokio's `try_io`).
    pub fn try_io<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        match self {
            BackendStream::Tcp(s) => s.try_io(interest, f),
            BackendStream::Unix(s) => s.try_io(interest, f),
        }
    }

    /// Waits until the socket may be readable.
    pub async fn readable(&self) -> io::Result<()> {
        match self {
            BackendStream::Tcp(s) => s.readable().await,
            BackendStream::Unix(s) => s.readable().await,
        }
    }
}

impl AsFd for BackendStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            BackendStream::Tcp(s) => s.as_fd(),
            BackendStream::Unix(s) => s.as_fd(),
        }
    }
}

impl AsyncRead for BackendStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BackendStream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            BackendStream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for BackendStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            BackendStream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            BackendStream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BackendStream::Tcp(s) => Pin::new(s).poll_flush(cx),
            BackendStream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BackendStream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            BackendStream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// A new connection to the backend (over its Unix socket when configured); `Err` says why not.
pub(crate) async fn connect_backend(opts: &LocalOptions) -> Result<BackendStream, String> {
    let bound = opts.backend_timeout.min(Duration::from_secs(1));
    let (r, name) = match &opts.backend_socket {
        Some(path) => {
            let r = tokio::time::timeout(bound, tokio::net::UnixStream::connect(path)).await;
            (r.map(|c| c.map(BackendStream::Unix)), path.display().to_string())
        }
        None => {
            let r = tokio::time::timeout(bound, TcpStream::connect(opts.backend)).await;
            let r = r.map(|c| {
                c.map(|s| {
                    let _ = s.set_nodelay(true);
                    BackendStream::Tcp(s)
                })
            });
            (r, opts.backend.to_string())
        }
    };
    match r {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(format!("backend {name}: {e}")),
        Err(_) => Err(format!("backend {name}: connect timed out")),
    }
}
