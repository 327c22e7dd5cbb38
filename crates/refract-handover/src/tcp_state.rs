//! `TcpState`: everything needed to rebuild one established TCP connection on another host.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// The TCP options negotiated at the handshake (`tcpi_options`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TcpOptions {
    /// RFC 7323 timestamps.
    pub timestamps: bool,
    /// Selective acknowledgements permitted.
    pub sack: bool,
    /// Window scaling (the shifts are in [`TcpState`]).
    pub window_scaling: bool,
}

impl TcpOptions {
    const TS: u8 = 1;
    const SACK: u8 = 2;
    const WSCALE: u8 = 4;

    /// Decodes `tcpi_options`.
    pub fn from_bits(bits: u8) -> Self {
        TcpOptions {
            timestamps: bits & Self::TS != 0,
            sack: bits & Self::SACK != 0,
            window_scaling: bits & Self::WSCALE != 0,
        }
    }

    /// Encodes as `tcpi_options` (the wire codec uses this form).
    pub fn bits(self) -> u8 {
        (self.timestamps as u8 * Self::TS) | (self.sack as u8 * Self::SACK) | (self.window_scaling as u8 * Self::WSCALE)
    }
}

/// `struct tcp_repair_window`: the window state TCP_REPAIR reads and writes as one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RepairWindow {
    /// Segment sequence number used for the last window update.
    pub snd_wl1: u32,
    /// The peer's advertised window (already scaled).
    pub snd_wnd: u32,
    /// The largest window the peer ever advertised.
    pub max_window: u32,
    /// The window we advertise.
    pub rcv_wnd: u32,
    /// `rcv_nxt` when `rcv_wnd` was last advertised.
    pub rcv_wup: u32,
}

impl RepairWindow {
    /// Size of the kernel struct.
    pub(crate) const LEN: usize = 20;

    pub(crate) fn from_ne_bytes(b: &[u8; Self::LEN]) -> Self {
        let w = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        RepairWindow { snd_wl1: w(0), snd_wnd: w(4), max_window: w(8), rcv_wnd: w(12), rcv_wup: w(16) }
    }

    pub(crate) fn to_ne_bytes(self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        let fields = [self.snd_wl1, self.snd_wnd, self.max_window, self.rcv_wnd, self.rcv_wup];
        for (chunk, v) in b.chunks_exact_mut(4).zip(fields) {
            chunk.copy_from_slice(&v.to_ne_bytes());
        }
        b
    }
}

/// Socket options TCP_REPAIR does not carry, re-applied after restore (docs/handover.md,
/// "Restore" step 10).
/// Buffer sizes are deliberately not carried: setting them locks out the kernel's autotuning,
/// which a restored socket streaming a large result needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SockOpts {
    /// TCP_NODELAY.
    pub nodelay: bool,
    /// SO_KEEPALIVE.
    pub keepalive: bool,
    /// TCP_USER_TIMEOUT in milliseconds (0: the kernel default).
    pub user_timeout_ms: u32,
}

/// One established TCP connection, as the kernel holds it, captured in repair mode.
///
/// Sequence numbers follow the kernel's `TCP_QUEUE_SEQ`: `recv_seq` is the sequence number
/// after the last byte of `recv_queue` (`rcv_nxt`), `send_seq` the one after the last byte of
/// `send_queue` (`write_seq`). The last `unsent` bytes of `send_queue` were never transmitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpState {
    /// Our address (the VIP and the service port).
    pub local: SocketAddr,
    /// The client's address.
    pub peer: SocketAddr,
    /// Negotiated options.
    pub options: TcpOptions,
    /// Our send window shift (the peer's advertised scale).
    pub snd_wscale: u8,
    /// Our receive window shift.
    pub rcv_wscale: u8,
    /// The MSS clamp (TCP_MAXSEG in repair mode): the largest segment the peer accepts.
    pub mss_clamp: u32,
    /// The MSS in use (TCP_MAXSEG before repair mode): the clamp less options, and bounded by
    /// half the largest window the peer advertised.
    pub mss: u32,
    /// The current timestamp clock value (0 without timestamps).
    pub timestamp: u32,
    /// Window state.
    pub window: RepairWindow,
    /// `rcv_nxt`: sequence number after the receive queue.
    pub recv_seq: u32,
    /// `write_seq`: sequence number after the send queue.
    pub send_seq: u32,
    /// Bytes received, not yet read by the application.
    pub recv_queue: Vec<u8>,
    /// Bytes written by the application, not yet acknowledged by the peer.
    pub send_queue: Vec<u8>,
    /// How many of the last bytes of `send_queue` were never transmitted.
    pub unsent: u32,
    /// Options re-applied after restore.
    pub sockopts: SockOpts,
}

impl TcpState {
    /// Sequence number of the first byte of the receive queue.
    pub fn recv_queue_start(&self) -> u32 {
        self.recv_seq.wrapping_sub(self.recv_queue.len() as u32)
    }

    /// Sequence number of the first byte of the send queue (`snd_una`).
    pub fn send_queue_start(&self) -> u32 {
        self.send_seq.wrapping_sub(self.send_queue.len() as u32)
    }

    /// The part of the send queue that was transmitted but not acknowledged.
    pub fn sent_unacked(&self) -> &[u8] {
        &self.send_queue[..self.send_queue.len() - self.unsent_len()]
    }

    /// The part of the send queue that was never transmitted.
    pub fn never_sent(&self) -> &[u8] {
        &self.send_queue[self.send_queue.len() - self.unsent_len()..]
    }

    fn unsent_len(&self) -> usize {
        (self.unsent as usize).min(self.send_queue.len())
    }

    /// Checks what restore relies on: matching address families, sane lengths.
    pub fn validate(&self) -> crate::Result<()> {
        if self.local.is_ipv4() != self.peer.is_ipv4() {
            return Err(crate::Error::InvalidState("local and peer address families differ"));
        }
        if self.unsent as usize > self.send_queue.len() {
            return Err(crate::Error::InvalidState("unsent longer than the send queue"));
        }
        if self.snd_wscale > 14 || self.rcv_wscale > 14 {
            return Err(crate::Error::InvalidState("window scale above 14"));
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> TcpState {
        TcpState {
            local: "198.18.1.100:8080".parse().unwrap(),
            peer: "198.18.1.1:40000".parse().unwrap(),
            options: TcpOptions::from_bits(7),
            snd_wscale: 7,
            rcv_wscale: 9,
            mss_clamp: 1460,
            mss: 1448,
            timestamp: 123_456,
            window: RepairWindow { snd_wl1: 1, snd_wnd: 2, max_window: 3, rcv_wnd: 4, rcv_wup: 5 },
            recv_seq: 10,
            send_seq: 3,
            recv_queue: b"GET / HTTP/1.1\r\n\r\n".to_vec(),
            send_queue: b"abcdef".to_vec(),
            unsent: 2,
            sockopts: SockOpts { nodelay: true, keepalive: false, user_timeout_ms: 0 },
        }
    }

    #[test]
    fn options_bits_round_trip() {
        for bits in 0..8 {
            assert_eq!(TcpOptions::from_bits(bits).bits(), bits);
        }
        assert_eq!(TcpOptions::from_bits(0xf8), TcpOptions::default());
    }

    #[test]
    fn window_bytes_round_trip() {
        let w = sample().window;
        assert_eq!(RepairWindow::from_ne_bytes(&w.to_ne_bytes()), w);
    }

    #[test]
    fn queue_starts_wrap_around() {
        let s = sample();
        assert_eq!(s.recv_queue_start(), 10u32.wrapping_sub(18));
        assert_eq!(s.send_queue_start(), u32::MAX - 2);
        assert_eq!(s.sent_unacked(), b"abcd");
        assert_eq!(s.never_sent(), b"ef");
    }

    #[test]
    fn validate_refuses_impossible_states() {
        assert!(sample().validate().is_ok());
        let mut s = sample();
        s.peer = "[::1]:1".parse().unwrap();
        assert!(s.validate().is_err());
        let mut s = sample();
        s.unsent = 7;
        assert!(s.validate().is_err());
        let mut s = sample();
        s.rcv_wscale = 15;
        assert!(s.validate().is_err());
    }

    #[test]
    fn serde_round_trip() {
        let s = sample();
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<TcpState>(&json).unwrap(), s);
    }
}
