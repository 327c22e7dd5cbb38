//! Zero-copy body streaming: `splice(2)` backend socket → pipe → client socket.
//!
//! After a hand-over the agent's work is moving a response body of known length from the
//! backend to the client. Copying it through user space (read, then write) costs two copies
//! per byte, which on a small host is the bottleneck at tens of Gbit/s; splicing through a pipe
//! moves page references instead, and the bytes never leave the kernel.
//!
//! The pipe is filled only when it is empty and drained until it is empty again: a splice
//! into a non-empty pipe that returns `EAGAIN` cannot say whether the socket had nothing or the
//! pipe was full (its slots, not its bytes, run out), and clearing the socket's readiness on a
//! full pipe would lose the wake-up. With an empty pipe `EAGAIN` means "no data", and draining a
//! non-empty pipe `EAGAIN` means "the client's send buffer is full": both unambiguous.

use std::io;
use std::os::fd::OwnedFd;
use std::time::Duration;

use nix::fcntl::{fcntl, splice, FcntlArg, OFlag, SpliceFFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::backend::BackendStream;
use crate::error::{eof, stalled, timed_out};

/// The pipe size asked for (`/proc/sys/fs/pipe-max-size` by default); a smaller pipe works too.
const PIPE_SIZE: i32 = 1 << 20;

/// A pipe to splice through, reused by the responses of one adopted connection. It is empty
/// between responses; one that failed mid-body must be dropped (it may hold bytes).
#[derive(Debug)]
pub(crate) struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Its capacity in bytes (the most one fill asks for).
    size: usize,
}

impl Pipe {
    /// A non-blocking pipe, enlarged to [`PIPE_SIZE`] where the limits allow; `None` when no
    /// pipe can be made (EMFILE, ENFILE): the caller copies instead.
    pub(crate) fn open() -> Option<Pipe> {
        let (read, write) = match nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC) {
            Ok(fds) => fds,
            Err(e) => {
                tracing::debug!("no pipe for splice ({e}); copying the body instead");
                return None;
            }
        };
        // Past pipe-max-size or the user's pipe-user-pages-soft the kernel refuses (or keeps
        // the pipe small): the default size still works, only with more system calls.
        let size = fcntl(&write, FcntlArg::F_SETPIPE_SZ(PIPE_SIZE))
            .or_else(|_| fcntl(&write, FcntlArg::F_GETPIPE_SZ))
            .ok()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n > 0)
            .unwrap_or(1 << 16);
        Some(Pipe { read, write, size })
    }

    /// Moves exactly `len` bytes from `from` to `to`, adding each byte the client socket
    /// accepted to `sent`. The backend closing first is an error, as is `timeout` passing
    /// without a byte from it, or `stall` without the client taking one.
    pub(crate) async fn stream(
        &mut self,
        from: &BackendStream,
        to: &TcpStream,
        len: u64,
        (timeout, stall): (Duration, Duration),
        sent: &mut u64,
    ) -> io::Result<()> {
        let mut left = len;
        while left > 0 {
            let want = usize::try_from(left).unwrap_or(usize::MAX).min(self.size);
            let mut held = self.fill(from, want, timeout).await?;
            left -= held as u64;
            while held > 0 {
                let n = self.drain(to, held, left > 0, stall).await?;
                held -= n;
                *sent += n as u64;
            }
        }
        Ok(())
    }

    /// Splices up to `want` bytes from the backend into the (empty) pipe; at least one.
    async fn fill(&self, from: &BackendStream, want: usize, timeout: Duration) -> io::Result<usize> {
        let deadline = tokio::time::Instant::now() + timeout;
        let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
        loop {
            match from.try_io(Interest::READABLE, || Ok(splice(from, None, &self.write, None, want, flags)?)) {
                Ok(0) => return Err(eof()),
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            match tokio::time::timeout_at(deadline, from.readable()).await {
                Ok(r) => r?,
                Err(_) => return Err(timed_out()),
            }
        }
    }

    /// Splices up to `held` bytes (all in the pipe) to the client; at least one. `more`: the
    /// body goes on after these (`SPLICE_F_MORE`, so TCP may wait to fill a segment); never on
    /// the last bytes of a body, which must go out at once. `stall` passing before the client
    /// takes a byte is an error.
    async fn drain(&self, to: &TcpStream, held: usize, more: bool, stall: Duration) -> io::Result<usize> {
        let deadline = tokio::time::Instant::now() + stall;
        let mut flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
        if more {
            flags |= SpliceFFlags::SPLICE_F_MORE;
        }
        loop {
            match to.try_io(Interest::WRITABLE, || Ok(splice(&self.read, None, to, None, held, flags)?)) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            match tokio::time::timeout_at(deadline, to.writable()).await {
                Ok(r) => r?,
                Err(_) => return Err(stalled(stall)),
            }
        }
    }
}
