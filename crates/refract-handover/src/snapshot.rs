//! Snapshot (source side): put a socket in repair mode and read its state, in the order of
//! docs/handover.md, "Snapshot".

use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use nix::sys::socket::{getpeername, getsockname, SockaddrStorage};

use crate::error::{Error, Result};
use crate::sys;
use crate::tcp_state::{RepairWindow, SockOpts, TcpOptions, TcpState};
use crate::Rules;

const TCP_ESTABLISHED: u8 = 1;

/// Takes a snapshot of an established, frozen socket (docs/handover.md, "Snapshot" steps 3–9).
///
/// The caller has quiesced the connection ([`unacked`] is 0) and frozen its packets at this
/// host's ingress. On success the socket is left in repair mode: closing it now is silent (no
/// FIN, no RST); [`resume`] turns it back into a normal socket instead. On error the socket has
/// been resumed and can keep serving locally.
pub fn snapshot(fd: impl AsFd) -> Result<TcpState> {
    Repair::begin(fd.as_fd(), Rules::ALL)?.capture()
}

/// Bytes written but not yet acknowledged by the peer (`SIOCOUTQ`); 0 means quiescent (I3).
pub fn unacked(fd: impl AsFd) -> Result<u32> {
    sys::ioctl_int(fd.as_fd(), sys::SIOCOUTQ, "ioctl(SIOCOUTQ)")
}

/// Bytes written but never transmitted (`SIOCOUTQNSD`), e.g. held back by a closed window.
pub fn unsent(fd: impl AsFd) -> Result<u32> {
    sys::ioctl_int(fd.as_fd(), sys::SIOCOUTQNSD, "ioctl(SIOCOUTQNSD)")
}

/// Gets rid of a socket after a successful snapshot, silently (no FIN, no RST), and frees its
/// 4-tuple at once so the connection can be restored on this host too. A plain `close` frees it
/// only when the last reference goes, and a child process forked at that moment (any
/// `Command::spawn` in the process) briefly holds one: a restore then fails with EADDRNOTAVAIL.
pub fn discard(fd: std::os::fd::OwnedFd) -> Result<()> {
    // In repair mode tcp_disconnect() sends nothing; it only unhashes the socket.
    sys::disconnect(fd.as_fd())
}

/// Like [`discard`] for a socket the caller cannot give up yet (e.g. one an event loop owns):
/// it is unhashed now, silently, and its later `close` sends nothing either.
pub fn discard_in_place(fd: impl AsFd) -> Result<()> {
    sys::disconnect(fd.as_fd())
}

/// Takes a socket out of repair mode after a successful snapshot, to keep serving locally.
pub fn resume(fd: impl AsFd) -> Result<()> {
    repair_off(fd.as_fd(), true)
}

fn repair_off(fd: BorrowedFd<'_>, reuse: bool) -> Result<()> {
    sys::set_tcp(fd, sys::TCP_REPAIR_QUEUE, sys::NO_QUEUE, "setsockopt(TCP_REPAIR_QUEUE)")?;
    sys::set_tcp(fd, sys::TCP_REPAIR, sys::REPAIR_OFF_NO_WP, "setsockopt(TCP_REPAIR off)")?;
    // Repair on forced `sk_reuse`; repair off clears it. Put back what an accepted socket has.
    sys::set_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, reuse as i32, "setsockopt(SO_REUSEADDR)")
}

/// A socket in repair mode whose state is being read. Dropping it before [`Repair::capture`]
/// succeeded takes the socket out of repair mode again (abort: resume locally).
#[derive(Debug)]
pub struct Repair<'fd> {
    fd: BorrowedFd<'fd>,
    rules: Rules,
    reuse: bool,
    mss: u32,
    unsent_at_start: u32,
    captured: bool,
}

impl<'fd> Repair<'fd> {
    /// Steps 3–4: repair on, ★ select the SEND queue at once, record `SIOCOUTQNSD`.
    pub fn begin(fd: BorrowedFd<'fd>, rules: Rules) -> Result<Self> {
        let mut reuse = [0u8; 4];
        sys::get_bytes(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, &mut reuse, "getsockopt(SO_REUSEADDR)")?;
        // Outside repair mode TCP_MAXSEG is the MSS in use; inside, the clamp.
        let mss = sys::get_u32(fd, sys::TCP_MAXSEG, "getsockopt(TCP_MAXSEG)")?;
        sys::set_tcp(fd, sys::TCP_REPAIR, sys::REPAIR_ON, "setsockopt(TCP_REPAIR on)")?;
        let mut repair =
            Repair { fd, rules, reuse: u32::from_ne_bytes(reuse) != 0, mss, unsent_at_start: 0, captured: false };
        if rules.select_send_queue_first {
            // Without this, an ACK arriving now lets tcp_write_xmit() put unsent bytes on the
            // wire behind the snapshot's back, and the restored flow stalls.
            repair.select(sys::SEND_QUEUE)?;
        }
        repair.unsent_at_start = repair.ioctl(sys::SIOCOUTQNSD, "ioctl(SIOCOUTQNSD)")?;
        Ok(repair)
    }

    /// Steps 5–9: read the state and both queues, re-check, collect addresses.
    pub fn capture(self) -> Result<TcpState> {
        self.capture_interleaved(|| ())
    }

    /// [`Repair::capture`] with `mid` run after the queues are read and before the ★ re-check.
    /// Only for tests that show what the re-check catches.
    #[doc(hidden)]
    pub fn capture_interleaved(mut self, mid: impl FnOnce()) -> Result<TcpState> {
        let (options, snd_wscale, rcv_wscale) = self.tcp_info()?;
        let outq = self.ioctl(sys::SIOCOUTQ, "ioctl(SIOCOUTQ)")?;
        let unsent = self.ioctl(sys::SIOCOUTQNSD, "ioctl(SIOCOUTQNSD)")?;
        let inq = self.ioctl(sys::SIOCINQ, "ioctl(SIOCINQ)")?;
        let mss_clamp = sys::get_u32(self.fd, sys::TCP_MAXSEG, "getsockopt(TCP_MAXSEG)")?;
        let timestamp = match options.timestamps {
            true => sys::get_u32(self.fd, sys::TCP_TIMESTAMP, "getsockopt(TCP_TIMESTAMP)")?,
            false => 0,
        };
        let window = self.window()?;
        self.select(sys::RECV_QUEUE)?;
        let recv_seq = sys::get_u32(self.fd, sys::TCP_QUEUE_SEQ, "getsockopt(TCP_QUEUE_SEQ)")?;
        let recv_queue = self.peek("recv", inq)?;
        self.select(sys::SEND_QUEUE)?;
        let send_seq = sys::get_u32(self.fd, sys::TCP_QUEUE_SEQ, "getsockopt(TCP_QUEUE_SEQ)")?;
        let send_queue = self.peek("send", outq)?;
        mid();
        if self.rules.recheck_queues {
            self.recheck(unsent, recv_seq, inq)?;
        }
        let state = TcpState {
            local: self.addr(getsockname::<SockaddrStorage>, "getsockname")?,
            peer: self.addr(getpeername::<SockaddrStorage>, "getpeername")?,
            options,
            snd_wscale,
            rcv_wscale,
            mss_clamp,
            mss: self.mss,
            timestamp,
            window,
            recv_seq,
            send_seq,
            recv_queue,
            send_queue,
            unsent,
            sockopts: self.sockopts()?,
        };
        self.captured = true;
        Ok(state)
    }

    /// Step 8 (★): if the send queue transmitted or data arrived, the snapshot is stale.
    fn recheck(&self, unsent: u32, recv_seq: u32, inq: u32) -> Result<()> {
        self.select(sys::RECV_QUEUE)?;
        let seq_now = sys::get_u32(self.fd, sys::TCP_QUEUE_SEQ, "getsockopt(TCP_QUEUE_SEQ)")?;
        let inq_now = self.ioctl(sys::SIOCINQ, "ioctl(SIOCINQ)")?;
        self.select(sys::SEND_QUEUE)?;
        let unsent_now = self.ioctl(sys::SIOCOUTQNSD, "ioctl(SIOCOUTQNSD)")?;
        if seq_now != recv_seq || inq_now != inq {
            return Err(Error::QueueMoved("receive"));
        }
        if unsent_now != unsent || unsent != self.unsent_at_start {
            return Err(Error::QueueMoved("send"));
        }
        Ok(())
    }

    fn tcp_info(&self) -> Result<(TcpOptions, u8, u8)> {
        // The first 8 bytes of struct tcp_info: state, ca_state, retransmits, probes, backoff,
        // options, snd_wscale:4 | rcv_wscale:4 (low nibble first), flags.
        let mut info = [0u8; 8];
        let n = sys::get_bytes(self.fd, libc::IPPROTO_TCP, sys::TCP_INFO, &mut info, "getsockopt(TCP_INFO)")?;
        if n < 7 {
            return Err(Error::InvalidState("short tcp_info"));
        }
        if info[0] != TCP_ESTABLISHED {
            return Err(Error::NotEstablished(info[0]));
        }
        Ok((TcpOptions::from_bits(info[5]), info[6] & 0x0f, info[6] >> 4))
    }

    fn window(&self) -> Result<RepairWindow> {
        let mut w = [0u8; RepairWindow::LEN];
        let n = sys::get_bytes(
            self.fd,
            libc::IPPROTO_TCP,
            sys::TCP_REPAIR_WINDOW,
            &mut w,
            "getsockopt(TCP_REPAIR_WINDOW)",
        )?;
        if n != RepairWindow::LEN {
            return Err(Error::InvalidState("short tcp_repair_window"));
        }
        Ok(RepairWindow::from_ne_bytes(&w))
    }

    /// Reads the selected queue without consuming it; one extra byte proves nothing follows.
    fn peek(&self, queue: &'static str, len: u32) -> Result<Vec<u8>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; len as usize + 1];
        let got = sys::recv(self.fd, &mut buf, libc::MSG_PEEK | libc::MSG_DONTWAIT)
            .map_err(|source| Error::Sys { op: "recv(MSG_PEEK)", source })?;
        if got != len as usize {
            return Err(Error::QueueLength { queue, expected: len, got });
        }
        buf.truncate(got);
        Ok(buf)
    }

    fn sockopts(&self) -> Result<SockOpts> {
        let int = |level, opt, op| -> Result<u32> {
            let mut b = [0u8; 4];
            sys::get_bytes(self.fd, level, opt, &mut b, op)?;
            Ok(u32::from_ne_bytes(b))
        };
        Ok(SockOpts {
            nodelay: int(libc::IPPROTO_TCP, libc::TCP_NODELAY, "getsockopt(TCP_NODELAY)")? != 0,
            keepalive: int(libc::SOL_SOCKET, libc::SO_KEEPALIVE, "getsockopt(SO_KEEPALIVE)")? != 0,
            user_timeout_ms: int(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, "getsockopt(TCP_USER_TIMEOUT)")?,
        })
    }

    fn addr(
        &self,
        get: fn(std::os::fd::RawFd) -> nix::Result<SockaddrStorage>,
        op: &'static str,
    ) -> Result<SocketAddr> {
        let sa = get(self.fd.as_raw_fd()).map_err(|e| Error::nix(op, e))?;
        if let Some(v4) = sa.as_sockaddr_in() {
            return Ok(SocketAddr::V4((*v4).into()));
        }
        if let Some(v6) = sa.as_sockaddr_in6() {
            return Ok(SocketAddr::V6((*v6).into()));
        }
        Err(Error::InvalidState("not an inet socket"))
    }

    fn select(&self, queue: i32) -> Result<()> {
        sys::set_tcp(self.fd, sys::TCP_REPAIR_QUEUE, queue, "setsockopt(TCP_REPAIR_QUEUE)")
    }

    fn ioctl(&self, req: libc::c_ulong, op: &'static str) -> Result<u32> {
        sys::ioctl_int(self.fd, req, op)
    }
}

impl Drop for Repair<'_> {
    fn drop(&mut self) {
        if !self.captured {
            // Abort: best effort; if even this fails the caller's next I/O reports it.
            let _ = repair_off(self.fd, self.reuse);
        }
    }
}

/// What `TCP_INFO` and `TCP_MAXSEG` say about a socket (diagnostics and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnInfo {
    /// `tcpi_state` (1 = ESTABLISHED).
    pub state: u8,
    /// Negotiated options.
    pub options: TcpOptions,
    /// Send window shift.
    pub snd_wscale: u8,
    /// Receive window shift.
    pub rcv_wscale: u8,
    /// `TCP_MAXSEG`: the current MSS (the clamp while in repair mode).
    pub mss: u32,
}

/// Reads [`ConnInfo`] of a socket.
pub fn conn_info(fd: impl AsFd) -> Result<ConnInfo> {
    let fd = fd.as_fd();
    let mut info = [0u8; 8];
    sys::get_bytes(fd, libc::IPPROTO_TCP, sys::TCP_INFO, &mut info, "getsockopt(TCP_INFO)")?;
    Ok(ConnInfo {
        state: info[0],
        options: TcpOptions::from_bits(info[5]),
        snd_wscale: info[6] & 0x0f,
        rcv_wscale: info[6] >> 4,
        mss: sys::get_u32(fd, sys::TCP_MAXSEG, "getsockopt(TCP_MAXSEG)")?,
    })
}
