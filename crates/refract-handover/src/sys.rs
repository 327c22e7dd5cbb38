//! Thin wrappers over the socket options and ioctls TCP_REPAIR needs (libc has no safe API),
//! and every other `unsafe` of the crate: taking ownership of descriptors received by
//! SCM_RIGHTS, and the `aya::Pod` promises of the `#[repr(C)]` map types.
//!
//! Every function takes a `BorrowedFd`, so the descriptor is open for the whole call; buffers
//! are Rust slices whose lengths are passed to the kernel, so it never reads or writes past them.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::sys::socket::ControlMessageOwned;

use crate::error::{Error, Result};

// Linux uapi values (include/uapi/linux/tcp.h, linux/sockios.h); stable ABI.
pub(crate) const TCP_MAXSEG: i32 = 2;
pub(crate) const TCP_INFO: i32 = 11;
pub(crate) const TCP_REPAIR: i32 = 19;
pub(crate) const TCP_REPAIR_QUEUE: i32 = 20;
pub(crate) const TCP_QUEUE_SEQ: i32 = 21;
pub(crate) const TCP_REPAIR_OPTIONS: i32 = 22;
pub(crate) const TCP_TIMESTAMP: i32 = 24;
pub(crate) const TCP_REPAIR_WINDOW: i32 = 29;

pub(crate) const REPAIR_ON: i32 = 1;
/// Repair off, sending a window probe (`TCP_REPAIR_OFF`).
pub(crate) const REPAIR_OFF: i32 = 0;
/// Repair off without sending a window probe (`TCP_REPAIR_OFF_NO_WP`).
pub(crate) const REPAIR_OFF_NO_WP: i32 = -1;

pub(crate) const NO_QUEUE: i32 = 0;
pub(crate) const RECV_QUEUE: i32 = 1;
pub(crate) const SEND_QUEUE: i32 = 2;

pub(crate) const TCPOPT_MAXSEG: u32 = 2;
pub(crate) const TCPOPT_WINDOW: u32 = 3;
pub(crate) const TCPOPT_SACK_PERM: u32 = 4;
pub(crate) const TCPOPT_TIMESTAMP: u32 = 8;

pub(crate) const SIOCINQ: libc::c_ulong = 0x541B;
pub(crate) const SIOCOUTQ: libc::c_ulong = 0x5411;
pub(crate) const SIOCOUTQNSD: libc::c_ulong = 0x894B;

/// `setsockopt(fd, level, opt, &v, 4)` for an `int` option.
pub(crate) fn set_int(fd: BorrowedFd<'_>, level: i32, opt: i32, v: i32, op: &'static str) -> Result<()> {
    set_bytes(fd, level, opt, &v.to_ne_bytes(), op)
}

/// `setsockopt` with an arbitrary option buffer.
pub(crate) fn set_bytes(fd: BorrowedFd<'_>, level: i32, opt: i32, buf: &[u8], op: &'static str) -> Result<()> {
    let len = libc::socklen_t::try_from(buf.len()).map_err(|_| Error::InvalidState("option too long"))?;
    // SAFETY: `fd` is a live descriptor for the call; the kernel reads `len` bytes from `buf`,
    // which is exactly the slice's length.
    let rc = unsafe { libc::setsockopt(fd.as_raw_fd(), level, opt, buf.as_ptr().cast(), len) };
    if rc < 0 {
        return Err(Error::last_os(op));
    }
    Ok(())
}

/// `getsockopt` into `buf`; returns how many bytes the kernel wrote.
pub(crate) fn get_bytes(fd: BorrowedFd<'_>, level: i32, opt: i32, buf: &mut [u8], op: &'static str) -> Result<usize> {
    let mut len = libc::socklen_t::try_from(buf.len()).map_err(|_| Error::InvalidState("option too long"))?;
    // SAFETY: `fd` is live; the kernel writes at most `len` (the slice's length) bytes into
    // `buf` and stores the length it wrote in `len`, a valid local.
    let rc = unsafe { libc::getsockopt(fd.as_raw_fd(), level, opt, buf.as_mut_ptr().cast(), &mut len) };
    if rc < 0 {
        return Err(Error::last_os(op));
    }
    Ok(len as usize)
}

/// `getsockopt` of a 4-byte TCP option.
pub(crate) fn get_u32(fd: BorrowedFd<'_>, opt: i32, op: &'static str) -> Result<u32> {
    let mut buf = [0u8; 4];
    get_bytes(fd, libc::IPPROTO_TCP, opt, &mut buf, op)?;
    Ok(u32::from_ne_bytes(buf))
}

/// `setsockopt` of a 4-byte TCP option.
pub(crate) fn set_tcp(fd: BorrowedFd<'_>, opt: i32, v: i32, op: &'static str) -> Result<()> {
    set_int(fd, libc::IPPROTO_TCP, opt, v, op)
}

/// An `ioctl` that returns an `int` (SIOCINQ, SIOCOUTQ, SIOCOUTQNSD).
pub(crate) fn ioctl_int(fd: BorrowedFd<'_>, req: libc::c_ulong, op: &'static str) -> Result<u32> {
    let mut v: libc::c_int = 0;
    // SAFETY: `fd` is live; these requests write one `int` through the pointer, which points to
    // a valid local of that type.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, &mut v as *mut libc::c_int) };
    if rc < 0 {
        return Err(Error::last_os(op));
    }
    u32::try_from(v).map_err(|_| Error::InvalidState("negative queue length"))
}

/// `send(fd, buf, flags)`; the raw `io::Error` is kept so callers can react to ENOMEM/EAGAIN.
pub(crate) fn send(fd: BorrowedFd<'_>, buf: &[u8], flags: i32) -> std::io::Result<usize> {
    // SAFETY: `fd` is live; the kernel reads at most `buf.len()` bytes from `buf`.
    let n = unsafe { libc::send(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), flags | libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// `recv(fd, buf, flags)`.
pub(crate) fn recv(fd: BorrowedFd<'_>, buf: &mut [u8], flags: i32) -> std::io::Result<usize> {
    // SAFETY: `fd` is live; the kernel writes at most `buf.len()` bytes into `buf`.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// `connect(fd, AF_UNSPEC)`: dissolves the association at once (tcp_disconnect), whoever else
/// still holds the file.
pub(crate) fn disconnect(fd: BorrowedFd<'_>) -> Result<()> {
    // SAFETY: an all-zero sockaddr_storage is a valid value (family AF_UNSPEC).
    let mut sa: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    sa.ss_family = libc::AF_UNSPEC as libc::sa_family_t;
    let len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `fd` is live; the kernel reads `len` bytes from `sa`, a local of that size.
    let rc = unsafe { libc::connect(fd.as_raw_fd(), (&sa as *const libc::sockaddr_storage).cast(), len) };
    if rc < 0 {
        return Err(Error::last_os("connect(AF_UNSPEC)"));
    }
    Ok(())
}

/// The bytes waiting in a socket's receive queue (`SIOCINQ`, alias `FIONREAD`).
pub fn queued_bytes(fd: BorrowedFd<'_>) -> Result<u32> {
    ioctl_int(fd, SIOCINQ, "ioctl(SIOCINQ)")
}

/// Owns every descriptor that arrived in `cmsgs` (the control messages of one `recvmsg`) and
/// returns the first; the others (none expected) are closed.
pub(crate) fn passed_fd(cmsgs: impl Iterator<Item = ControlMessageOwned>) -> Option<OwnedFd> {
    let mut fd = None;
    for c in cmsgs {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for raw in fds {
                // SAFETY: the kernel just installed `raw` in our table for us (SCM_RIGHTS, parsed
                // by nix from the control data of our `recvmsg`); no one else owns it, so it is
                // wrapped exactly once and closed when dropped.
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                fd.get_or_insert(owned);
            }
        }
    }
    fd
}

// The map types the eBPF programs share with us: `aya` copies them to and from the kernel as
// plain bytes, which `Pod` promises is sound.
//
// SAFETY: `FlowKey` is `repr(C)`, `Copy`, made only of byte arrays (no padding, no pointers),
// so every bit pattern is valid and its bytes can be handed to the kernel as they are.
unsafe impl aya::Pod for crate::bpf::FlowKey {}
// SAFETY: `FlowValue` is `repr(C)` and `Copy`, made only of integers and byte arrays with an
// explicit `pad` field, so it has no implicit padding (the size test checks 40 bytes) and every
// bit pattern is a valid value.
unsafe impl aya::Pod for crate::steering::FlowValue {}
