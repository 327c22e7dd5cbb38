//! `LocalLink`: one async Unix-stream link between dispatcher and agent on the same host, the
//! same-host [`Carrier`].
//!
//! The client socket rides as SCM_RIGHTS on the first bytes of the frame that carries it; the
//! kernel hands a descriptor out with the first read of those bytes and never merges a read
//! across frames with descriptors, so a frame is read as header (with `recvmsg`) then body.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;

use bytes::BytesMut;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, MsgFlags};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::UnixStream;

use crate::carrier::{fd_matches, local_may_carry, Carrier};
use crate::error::{Error, Result};
use crate::msg::{encode, parse, Msg, MAX_FRAME};

/// One same-host link (either end).
#[derive(Debug)]
pub struct LocalLink {
    stream: UnixStream,
}

impl LocalLink {
    /// Connects to an agent's local socket.
    pub async fn connect(path: &Path) -> Result<Self> {
        Ok(LocalLink { stream: UnixStream::connect(path).await? })
    }

    /// Wraps an accepted connection.
    pub fn new(stream: UnixStream) -> Self {
        LocalLink { stream }
    }

    /// Sends `msg`, with `fd` if the message carries the client socket (and only then). A
    /// message only TCP carries is refused.
    pub async fn send(&mut self, msg: &Msg, fd: Option<BorrowedFd<'_>>) -> Result<()> {
        local_may_carry(msg)?;
        fd_matches(msg, fd.is_some())?;
        let mut frame = BytesMut::new();
        encode(msg, &mut frame);
        let sent = match fd {
            Some(fd) => self.send_with_fd(&frame, fd).await?,
            None => 0,
        };
        self.stream.write_all(&frame[sent..]).await?;
        Ok(())
    }

    async fn send_with_fd(&self, frame: &[u8], fd: BorrowedFd<'_>) -> Result<usize> {
        let fds = [fd.as_raw_fd()];
        let raw = self.stream.as_raw_fd();
        loop {
            self.stream.writable().await?;
            let r = self.stream.try_io(Interest::WRITABLE, || {
                let cmsg = [ControlMessage::ScmRights(&fds)];
                let iov = [IoSlice::new(frame)];
                sendmsg::<()>(raw, &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None).map_err(std::io::Error::from)
            });
            match r {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(Error::Sys { op: "sendmsg(SCM_RIGHTS)", source: e }),
            }
        }
    }

    /// Receives the next message and the descriptor it carries. Fails with [`Error::Closed`]
    /// when the peer closed the link between frames, and with a codec error when a descriptor
    /// is missing or unexpected, or the message is one only TCP carries.
    pub async fn recv(&mut self) -> Result<(Msg, Option<OwnedFd>)> {
        let mut header = [0u8; 4];
        let (n, fd) = self.recv_header(&mut header).await?;
        if n == 0 {
            return Err(Error::Closed);
        }
        self.stream.read_exact(&mut header[n..]).await?;
        let len = u32::from_be_bytes(header) as usize;
        if len == 0 || len > MAX_FRAME {
            return Err(Error::Codec("local frame length out of range"));
        }
        let mut frame = vec![0u8; 4 + len];
        frame[..4].copy_from_slice(&header);
        self.stream.read_exact(&mut frame[4..]).await?;
        let (msg, _) = parse(&frame)?.ok_or(Error::Codec("short local frame"))?;
        local_may_carry(&msg)?;
        fd_matches(&msg, fd.is_some())?;
        Ok((msg, fd))
    }

    async fn recv_header(&self, header: &mut [u8; 4]) -> Result<(usize, Option<OwnedFd>)> {
        let raw = self.stream.as_raw_fd();
        loop {
            self.stream.readable().await?;
            let r = self.stream.try_io(Interest::READABLE, || recv_with_fd(raw, header));
            match r {
                Ok(x) => return x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(Error::Io(e)),
            }
        }
    }
}

impl Carrier for LocalLink {
    const SAME_HOST: bool = true;

    async fn send(&mut self, msg: &Msg, fd: Option<BorrowedFd<'_>>) -> Result<()> {
        LocalLink::send(self, msg, fd).await
    }

    async fn recv(&mut self) -> Result<(Msg, Option<OwnedFd>)> {
        LocalLink::recv(self).await
    }

    async fn beat(&mut self) -> Result<std::convert::Infallible> {
        std::future::pending().await // a Unix link has no dead-peer bound: a dead peer closes it
    }
}

/// One `recvmsg` into `header`; `Err(io)` only for the readiness loop (WouldBlock and the like).
fn recv_with_fd(raw: RawFd, header: &mut [u8; 4]) -> std::io::Result<Result<(usize, Option<OwnedFd>)>> {
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(header)];
    let msg =
        recvmsg::<()>(raw, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC).map_err(std::io::Error::from)?;
    let cmsgs = match msg.cmsgs() {
        Ok(c) => c,
        Err(e) => return Ok(Err(Error::nix("recvmsg cmsgs", e))),
    };
    let fd = crate::sys::passed_fd(cmsgs);
    if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
        return Ok(Err(Error::Codec("control data truncated")));
    }
    Ok(Ok((msg.bytes, fd)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::transfer::{Serving, Socket, Transfer};
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    #[tokio::test]
    async fn a_socket_and_its_pending_bytes_cross_and_come_back() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut d, mut agent) = (LocalLink::new(a), LocalLink::new(b));
        let (x, mut y) = std::os::unix::net::UnixStream::pair().unwrap();
        let serving = Serving { idle_ms: 0, backend: Some("127.0.0.1:1".parse().unwrap()) };
        let t = Transfer { conn: 1, epoch: 1, socket: Socket::Passed, pending: b"GET".to_vec(), serving, sent: 0 };
        let adopt = Msg::HandOff(Box::new(t));
        d.send(&adopt, Some(x.as_fd())).await.unwrap();
        d.send(&Msg::HandOffOk { conn: 1, epoch: 1 }, None).await.unwrap();
        drop(x);
        let (msg, fd) = agent.recv().await.unwrap();
        assert_eq!(msg, adopt);
        let mut moved = std::os::unix::net::UnixStream::from(fd.unwrap());
        moved.write_all(b"via the moved socket").unwrap();
        let mut got = [0u8; 20];
        y.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"via the moved socket");
        let (msg, fd) = agent.recv().await.unwrap();
        assert_eq!((msg, fd.is_none()), (Msg::HandOffOk { conn: 1, epoch: 1 }, true));
        assert!(d.send(&Msg::HandOffOk { conn: 1, epoch: 1 }, Some(moved.as_fd())).await.is_err());
        drop(d);
        assert!(matches!(agent.recv().await, Err(Error::Closed)));
    }

    #[tokio::test]
    async fn tcp_only_messages_are_refused_both_ways() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut d, mut agent) = (LocalLink::new(a), LocalLink::new(b));
        assert!(matches!(d.send(&Msg::Heartbeat, None).await, Err(Error::Codec(_))));
        assert!(matches!(d.send(&Msg::Hello { version: 3, nonce: [0; 32] }, None).await, Err(Error::Codec(_))));
        let mut raw = BytesMut::new();
        encode(&Msg::Proof { proof: [1; 32] }, &mut raw);
        d.stream.write_all(&raw).await.unwrap();
        assert!(matches!(agent.recv().await, Err(Error::Codec("a TCP-only message on a same-host link"))));
    }
}
