//! Restore (target side): rebuild a socket from a [`TcpState`], in the order of docs/handover.md,
//! "Restore".

use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, SockaddrStorage};

use crate::error::{Error, Result};
use crate::sys;
use crate::tcp_state::TcpState;
use crate::Rules;

/// Largest chunk handed to one `send` while re-injecting a queue; halved on ENOMEM.
const INJECT_CHUNK: usize = 256 * 1024;

/// The largest value `setsockopt(TCP_MAXSEG)` accepts (the kernel's MAX_TCP_WINDOW): loopback's
/// clamp (65495) is above it, so such links restore with a smaller MSS.
const MAX_USER_MSS: u32 = 32767;

/// Bytes the timestamp option takes in every segment.
const TCPOLEN_TSTAMP_ALIGNED: u32 = 12;

/// Rebuilds the connection `state` describes and returns it as a normal, blocking socket bound
/// to `state.local` and connected to `state.peer` (docs/handover.md, "Restore" steps 1–10).
///
/// Steer the peer's packets to this host right after: the restored socket starts cold (cwnd 10,
/// RTO of a fresh socket), so a lost segment now costs seconds. Bytes the old socket never
/// transmitted are written normally at the end, so they go out as soon as the peer's window
/// allows. On error the half-built socket is closed in repair mode, silently.
pub fn restore(state: &TcpState) -> Result<OwnedFd> {
    restore_with(state, Rules::ALL)
}

/// [`restore`] with some of the ★ rules switched off; only for the negative-control tests.
#[doc(hidden)]
pub fn restore_with(state: &TcpState, rules: Rules) -> Result<OwnedFd> {
    state.validate()?;
    let sock = open_repair(state.local, rules, user_mss(state))?;
    let fd = sock.as_fd();
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrStorage::from(state.local))
        .map_err(|e| Error::nix("bind", e))?;
    select(fd, sys::RECV_QUEUE)?;
    sys::set_tcp(fd, sys::TCP_QUEUE_SEQ, state.recv_queue_start() as i32, "setsockopt(TCP_QUEUE_SEQ recv)")?;
    select(fd, sys::SEND_QUEUE)?;
    sys::set_tcp(fd, sys::TCP_QUEUE_SEQ, state.send_queue_start() as i32, "setsockopt(TCP_QUEUE_SEQ send)")?;
    // Repair mode: no SYN; the socket goes straight to ESTABLISHED.
    connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrStorage::from(state.peer))
        .map_err(|e| Error::nix("connect", e))?;
    set_options(fd, state)?;
    inject(fd, sys::RECV_QUEUE, &state.recv_queue)?;
    inject(fd, sys::SEND_QUEUE, state.sent_unacked())?;
    let window = state.window.to_ne_bytes();
    sys::set_bytes(fd, libc::IPPROTO_TCP, sys::TCP_REPAIR_WINDOW, &window, "setsockopt(TCP_REPAIR_WINDOW)")?;
    select(fd, sys::NO_QUEUE)?;
    sys::set_tcp(fd, sys::TCP_REPAIR, sys::REPAIR_OFF_NO_WP, "setsockopt(TCP_REPAIR off)")?;
    if rules.reuseaddr_after_repair {
        // ★ Repair off resets sk_reuse; without this a listener re-bind on the port fails.
        set_sol(fd, libc::SO_REUSEADDR, 1, "setsockopt(SO_REUSEADDR)")?;
    }
    apply_sockopts(fd, state)?;
    send_unsent(fd, state.never_sent())?;
    Ok(sock)
}

/// The `TCP_MAXSEG` to set before connect so that connect() computes the MSS the old socket used.
/// The protocol's prototype set the clamp; but a socket whose peer advertised a small window had
/// its MSS bounded to half that window, and a restored socket whose MSS exceeds the peer's window
/// only sends through the persist timer (seconds per segment). So: the MSS in use plus the
/// timestamp option it excludes, never above the clamp, nor above what the kernel accepts.
pub(crate) fn user_mss(state: &TcpState) -> u32 {
    let ts = if state.options.timestamps { TCPOLEN_TSTAMP_ALIGNED } else { 0 };
    let mss = if state.mss == 0 { state.mss_clamp } else { state.mss + ts };
    mss.min(state.mss_clamp).min(MAX_USER_MSS)
}

/// Steps 1–2: a socket in repair mode with the MSS set before it connects.
fn open_repair(local: SocketAddr, rules: Rules, user_mss: u32) -> Result<OwnedFd> {
    let family = match local {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let sock = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).map_err(|e| Error::nix("socket", e))?;
    let fd = sock.as_fd();
    set_sol(fd, libc::SO_REUSEADDR, 1, "setsockopt(SO_REUSEADDR)")?;
    sys::set_tcp(fd, sys::TCP_REPAIR, sys::REPAIR_ON, "setsockopt(TCP_REPAIR on)")?;
    if rules.maxseg_before_connect {
        // ★ connect() computes the MSS from user_mss; without it the clamp is 536 (MSS 524).
        sys::set_tcp(fd, sys::TCP_MAXSEG, user_mss as i32, "setsockopt(TCP_MAXSEG)")?;
    }
    Ok(sock)
}

/// Step 6: the negotiated options (only those the snapshot had), then the timestamp clock.
fn set_options(fd: BorrowedFd<'_>, state: &TcpState) -> Result<()> {
    let mut opts: Vec<(u32, u32)> = Vec::with_capacity(4);
    if state.options.sack {
        opts.push((sys::TCPOPT_SACK_PERM, 0));
    }
    if state.options.window_scaling {
        let scales = u32::from(state.snd_wscale) | (u32::from(state.rcv_wscale) << 16);
        opts.push((sys::TCPOPT_WINDOW, scales));
    }
    if state.options.timestamps {
        opts.push((sys::TCPOPT_TIMESTAMP, 0));
    }
    opts.push((sys::TCPOPT_MAXSEG, state.mss_clamp));
    let bytes: Vec<u8> =
        opts.iter().flat_map(|(code, val)| code.to_ne_bytes().into_iter().chain(val.to_ne_bytes())).collect();
    sys::set_bytes(fd, libc::IPPROTO_TCP, sys::TCP_REPAIR_OPTIONS, &bytes, "setsockopt(TCP_REPAIR_OPTIONS)")?;
    if state.options.timestamps {
        sys::set_tcp(fd, sys::TCP_TIMESTAMP, state.timestamp as i32, "setsockopt(TCP_TIMESTAMP)")?;
    }
    Ok(())
}

/// Step 7: writes `data` into the selected queue, halving the chunk when the kernel has no
/// memory for it (one skb per send must fit the socket's receive budget).
fn inject(fd: BorrowedFd<'_>, queue: i32, data: &[u8]) -> Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    select(fd, queue)?;
    let mut chunk = INJECT_CHUNK;
    let mut rest = data;
    while !rest.is_empty() {
        let n = rest.len().min(chunk);
        match sys::send(fd, &rest[..n], 0) {
            Ok(sent) => rest = &rest[sent..],
            Err(e) if e.raw_os_error() == Some(libc::ENOMEM) && chunk > 1024 => chunk /= 2,
            Err(source) => return Err(Error::Sys { op: "send(repair queue)", source }),
        }
    }
    Ok(())
}

/// Step 10: options TCP_REPAIR does not carry.
fn apply_sockopts(fd: BorrowedFd<'_>, state: &TcpState) -> Result<()> {
    let o = state.sockopts;
    if o.nodelay {
        sys::set_tcp(fd, libc::TCP_NODELAY, 1, "setsockopt(TCP_NODELAY)")?;
    }
    if o.keepalive {
        set_sol(fd, libc::SO_KEEPALIVE, 1, "setsockopt(SO_KEEPALIVE)")?;
    }
    if o.user_timeout_ms != 0 {
        let ms = i32::try_from(o.user_timeout_ms).unwrap_or(i32::MAX);
        sys::set_tcp(fd, libc::TCP_USER_TIMEOUT, ms, "setsockopt(TCP_USER_TIMEOUT)")?;
    }
    Ok(())
}

/// Bytes never transmitted go through the normal send path, so they leave as soon as the
/// peer's window allows. If the fresh socket's send buffer is smaller than the old one's was,
/// it is raised once to fit them (that pins its size; rare, since hand-over waits for I3).
fn send_unsent(fd: BorrowedFd<'_>, mut rest: &[u8]) -> Result<()> {
    let mut raised = false;
    while !rest.is_empty() {
        match sys::send(fd, rest, libc::MSG_DONTWAIT) {
            Ok(n) => rest = &rest[n..],
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && !raised => {
                let want = i32::try_from(rest.len().saturating_mul(2)).unwrap_or(i32::MAX);
                set_sol(fd, libc::SO_SNDBUF, want, "setsockopt(SO_SNDBUF)")?;
                raised = true;
            }
            Err(source) => return Err(Error::Sys { op: "send(unsent)", source }),
        }
    }
    Ok(())
}

fn select(fd: BorrowedFd<'_>, queue: i32) -> Result<()> {
    sys::set_tcp(fd, sys::TCP_REPAIR_QUEUE, queue, "setsockopt(TCP_REPAIR_QUEUE)")
}

fn set_sol(fd: BorrowedFd<'_>, opt: i32, v: i32, op: &'static str) -> Result<()> {
    sys::set_int(fd, libc::SOL_SOCKET, opt, v, op)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp_state::{RepairWindow, SockOpts, TcpOptions};

    fn state(mss_clamp: u32, mss: u32, ts: bool) -> TcpState {
        TcpState {
            local: "127.0.0.1:1".parse().unwrap(),
            peer: "127.0.0.1:2".parse().unwrap(),
            options: TcpOptions { timestamps: ts, sack: true, window_scaling: true },
            snd_wscale: 7,
            rcv_wscale: 7,
            mss_clamp,
            mss,
            timestamp: 0,
            window: RepairWindow::default(),
            recv_seq: 0,
            send_seq: 0,
            recv_queue: Vec::new(),
            send_queue: Vec::new(),
            unsent: 0,
            sockopts: SockOpts::default(),
        }
    }

    #[test]
    fn user_mss_reproduces_the_mss_in_use() {
        assert_eq!(user_mss(&state(1460, 1448, true)), 1460);
        assert_eq!(user_mss(&state(1460, 1460, false)), 1460);
        assert_eq!(user_mss(&state(1460, 2036, true)), 1460, "never above the clamp");
        assert_eq!(user_mss(&state(1460, 1012, true)), 1024, "bounded by a small window");
        assert_eq!(user_mss(&state(65495, 65483, true)), 32767, "the kernel's limit");
        assert_eq!(user_mss(&state(1460, 0, true)), 1460, "no MSS recorded: the clamp");
    }
}
