//! Same-host hand-over: pass a socket and a byte payload to another process over a Unix socket
//! (SCM_RIGHTS), when dispatcher and agent share a host and TCP_REPAIR is not needed.
//!
//! A frame is a 4-byte big-endian payload length, carrying the descriptor, then the payload.
//! The calls block; use them on a blocking socket (e.g. from `spawn_blocking`).

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, MsgFlags};

use crate::error::{Error, Result};
use crate::sys;

/// Sends `fd` and `payload` as one frame. The receiver gets its own descriptor for the same
/// open socket; the sender may close its copy once this returns.
pub fn send_fd(sock: &UnixStream, fd: BorrowedFd<'_>, payload: &[u8]) -> Result<()> {
    let len = u32::try_from(payload.len()).map_err(|_| Error::Codec("payload too large"))?;
    let header = len.to_be_bytes();
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let iov = [IoSlice::new(&header)];
    // The descriptor rides on the header; a stream socket may take the 4 bytes in one go only.
    let sent = sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None)
        .map_err(|e| Error::nix("sendmsg(SCM_RIGHTS)", e))?;
    if sent != header.len() {
        return Err(Error::Codec("short write of the fd frame header"));
    }
    (&*sock).write_all(payload)?;
    Ok(())
}

/// Receives one frame: the descriptor and a payload of at most `max_payload` bytes.
pub fn recv_fd(sock: &UnixStream, max_payload: usize) -> Result<(OwnedFd, Vec<u8>)> {
    let mut header = [0u8; 4];
    let fd = recv_header(sock, &mut header)?;
    let len = u32::from_be_bytes(header) as usize;
    if len > max_payload {
        return Err(Error::Codec("fd frame payload above the limit"));
    }
    let mut payload = vec![0u8; len];
    (&*sock).read_exact(&mut payload)?;
    Ok((fd, payload))
}

fn recv_header(sock: &UnixStream, header: &mut [u8; 4]) -> Result<OwnedFd> {
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(header)];
    let msg = recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(|e| Error::nix("recvmsg(SCM_RIGHTS)", e))?;
    let fd = sys::passed_fd(msg.cmsgs().map_err(|e| Error::nix("recvmsg cmsgs", e))?);
    let bytes = msg.bytes;
    if bytes == 0 {
        return Err(Error::Io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
        return Err(Error::Codec("control data truncated"));
    }
    let fd = fd.ok_or(Error::Codec("fd frame without a descriptor"))?;
    if bytes < header.len() {
        // The rest of the header follows without the descriptor.
        let mut sock_ref = sock;
        sock_ref.read_exact(&mut header[bytes..])?;
    }
    Ok(fd)
}

/// One `sendmsg` of `bytes` on the Unix socket `sock` with `fd` attached, for non-blocking
/// sockets (a `WouldBlock` error means try again when writable). Returns the bytes sent: the
/// descriptor travels with the first of them, so a short count means the rest goes without it.
pub fn send_with_fd(sock: BorrowedFd<'_>, fd: BorrowedFd<'_>, bytes: &[u8]) -> std::io::Result<usize> {
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let iov = [IoSlice::new(bytes)];
    Ok(sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT, None)?)
}

/// One `recvmsg` into `buf` on the Unix socket `sock`, for non-blocking sockets (a
/// `WouldBlock` error means try again when readable): the bytes read (0 at end of stream) and
/// the descriptor that came with them, if any.
pub fn recv_with_fd(sock: BorrowedFd<'_>, buf: &mut [u8]) -> std::io::Result<(usize, Option<OwnedFd>)> {
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(buf)];
    let flags = MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT;
    let msg = recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut space), flags)?;
    let fd = sys::passed_fd(msg.cmsgs()?);
    if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "control data truncated"));
    }
    Ok((msg.bytes, fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn frame_without_a_descriptor_is_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&[0, 0, 0, 1, 9]).unwrap();
        assert!(matches!(recv_fd(&b, 16), Err(Error::Codec(_))));
    }

    #[test]
    fn one_call_moves_bytes_with_a_descriptor_or_without() {
        let (a, b) = UnixStream::pair().unwrap();
        let (x, y) = UnixStream::pair().unwrap();
        assert_eq!(send_with_fd(a.as_fd(), x.as_fd(), b"SINK").unwrap(), 4);
        let mut buf = [0u8; 4];
        let (n, fd) = recv_with_fd(b.as_fd(), &mut buf).unwrap();
        assert_eq!((n, &buf), (4, b"SINK"));
        // The descriptor received is the same socket: what is written to it reaches `y`.
        let passed = UnixStream::from(fd.unwrap());
        (&passed).write_all(b"via").unwrap();
        let mut got = [0u8; 3];
        (&y).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"via");
        (&a).write_all(b"HERE").unwrap();
        let (n, fd) = recv_with_fd(b.as_fd(), &mut buf).unwrap();
        assert_eq!((n, &buf, fd.is_none()), (4, b"HERE", true));
        b.set_nonblocking(true).unwrap();
        let e = recv_with_fd(b.as_fd(), &mut buf).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        drop(a);
        assert_eq!(recv_with_fd(b.as_fd(), &mut buf).unwrap().0, 0, "end of stream");
    }

    #[test]
    fn payload_above_the_limit_is_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        let (x, _y) = UnixStream::pair().unwrap();
        send_fd(&a, x.as_fd(), &[0u8; 100]).unwrap();
        assert!(matches!(recv_fd(&b, 99), Err(Error::Codec(_))));
    }
}
