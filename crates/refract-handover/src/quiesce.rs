//! Waiting for quiescence (docs/handover.md, I3) without waiting for a delayed ACK.
//!
//! A client that sent a request and then receives a short reply tail is in Linux's interactive
//! ("pingpong") mode: it acknowledges that last segment only when its delayed-ACK timer fires,
//! 40 ms or more later. Every hand-over that waits for quiescence behind such a tail paid it
//! (measured in the lab: 40–43 ms of a PostgreSQL hand-over's 41–44 ms). So once everything is
//! transmitted and the acknowledgements stopped moving for one round trip, this asks for the ACK
//! the way the kernel itself does when a repaired socket resumes: a window probe, a segment one
//! byte behind what the peer acknowledged, which a receiver answers at once with an ACK of
//! everything it holds (RFC 9293 3.10.7.4: an unacceptable segment is answered with an ACK).
//! Linux answers such segments at most once per 500 ms per connection
//! (`net.ipv4.tcp_invalid_ratelimit`), so one probe per wait; without an answer the wait goes on
//! as before.

use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::snapshot::{unacked, unsent};
use crate::sys;

/// How often the acknowledged count is looked at.
const POLL: Duration = Duration::from_millis(1);
/// Shortest stall before the probe: below this the ACK clock itself is still running.
const MIN_STALL: Duration = Duration::from_millis(1);
/// Longest stall before the probe (a long smoothed RTT must not hold the probe back longer
/// than the delayed ACK it stands in for).
const MAX_STALL: Duration = Duration::from_millis(20);

/// Waits until the peer has acknowledged everything written to `s` (`SIOCOUTQ` is 0), asking for
/// a held-back ACK once (see the module). `Err(NotQuiescent)` after `bound`.
pub async fn quiesce(s: impl AsFd, bound: Duration) -> Result<()> {
    let fd = s.as_fd();
    let deadline = Instant::now() + bound;
    let (mut last, mut since, mut asked) = (unacked(fd)?, Instant::now(), false);
    loop {
        let left = unacked(fd)?;
        if left == 0 {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::NotQuiescent(left));
        }
        if left != last {
            (last, since) = (left, now);
        } else if !asked && now - since >= stall(fd)? && unsent(fd)? == 0 {
            ask_for_ack(fd)?;
            asked = true;
            tracing::trace!(left, "asked the peer for its held-back ACK");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// How long the acknowledgements must stand still before the probe: one smoothed round trip
/// (everything transmitted has arrived by then; a peer still receiving ACKs every second
/// segment), within [`MIN_STALL`], [`MAX_STALL`].
fn stall(fd: BorrowedFd<'_>) -> Result<Duration> {
    Ok(srtt(fd)?.clamp(MIN_STALL, MAX_STALL))
}

/// `tcpi_rtt`: the smoothed round-trip time.
fn srtt(fd: BorrowedFd<'_>) -> Result<Duration> {
    const TCPI_RTT: usize = 68;
    let mut info = [0u8; TCPI_RTT + 4];
    let n = sys::get_bytes(fd, libc::IPPROTO_TCP, sys::TCP_INFO, &mut info, "getsockopt(TCP_INFO)")?;
    let Some(b) = info.get(TCPI_RTT..TCPI_RTT + 4).filter(|_| n >= TCPI_RTT + 4) else {
        return Ok(MIN_STALL); // an old kernel's shorter struct: no RTT, the shortest stall
    };
    Ok(Duration::from_micros(u64::from(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))))
}

/// Sends a window probe on the live socket: repair on, then repair off with a probe
/// (`TCP_REPAIR_OFF`; `tcp_send_window_probe`: a segment at `snd_una - 1`). Repair on forces
/// `SO_REUSEADDR` and repair off clears it: the socket's own setting is put back.
fn ask_for_ack(fd: BorrowedFd<'_>) -> Result<()> {
    let mut reuse = [0u8; 4];
    sys::get_bytes(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, &mut reuse, "getsockopt(SO_REUSEADDR)")?;
    sys::set_tcp(fd, sys::TCP_REPAIR, sys::REPAIR_ON, "setsockopt(TCP_REPAIR on)")?;
    sys::set_tcp(fd, sys::TCP_REPAIR, sys::REPAIR_OFF, "setsockopt(TCP_REPAIR off, probe)")?;
    sys::set_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, i32::from_ne_bytes(reuse), "setsockopt(SO_REUSEADDR)")
}
