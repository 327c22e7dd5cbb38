//! Field encoding of the hand-over messages: big-endian integers, length-prefixed bytes.
//!
//! `Reader` never panics: every read checks the remaining length and fails with a codec error.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};

use bytes::{BufMut, BytesMut};

use crate::bpf::FlowKey;
use crate::error::{Error, Result};
use crate::tcp_state::{RepairWindow, SockOpts, TcpOptions, TcpState};

/// Longest reason string a message may carry.
pub(crate) const MAX_REASON: usize = 1024;

/// A cursor over one frame's payload.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.buf.len() < n {
            return Err(Error::Codec("truncated field"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    pub(crate) fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(Error::Codec("boolean not 0 or 1")),
        }
    }

    /// A `u32` length, then that many bytes.
    pub(crate) fn blob(&mut self) -> Result<Vec<u8>> {
        let n = self.u32()? as usize;
        Ok(self.bytes(n)?.to_vec())
    }

    /// A `u16` length, then that many bytes of UTF-8 (at most [`MAX_REASON`]).
    pub(crate) fn string(&mut self) -> Result<String> {
        let n = self.u16()? as usize;
        if n > MAX_REASON {
            return Err(Error::Codec("string too long"));
        }
        let b = self.bytes(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| Error::Codec("string not UTF-8"))
    }

    pub(crate) fn addr(&mut self) -> Result<SocketAddr> {
        let family = self.u8()?;
        self.addr_of(family)
    }

    /// The rest of an address whose family byte (4 or 6) was read already.
    pub(crate) fn addr_of(&mut self, family: u8) -> Result<SocketAddr> {
        let ip = match family {
            4 => IpAddr::V4(Ipv4Addr::from(self.array::<4>()?)),
            6 => IpAddr::V6(Ipv6Addr::from(self.array::<16>()?)),
            _ => return Err(Error::Codec("unknown address family")),
        };
        Ok(SocketAddr::new(ip, self.u16()?))
    }

    pub(crate) fn flow(&mut self) -> Result<FlowKey> {
        let client = SocketAddrV4::new(Ipv4Addr::from(self.array::<4>()?), self.u16()?);
        let vip = SocketAddrV4::new(Ipv4Addr::from(self.array::<4>()?), self.u16()?);
        Ok(FlowKey::new(client, vip))
    }

    pub(crate) fn tcp_state(&mut self) -> Result<TcpState> {
        let local = self.addr()?;
        let peer = self.addr()?;
        let bits = self.u8()?;
        if bits > 7 {
            return Err(Error::Codec("unknown tcp option bits"));
        }
        let state = TcpState {
            local,
            peer,
            options: TcpOptions::from_bits(bits),
            snd_wscale: self.u8()?,
            rcv_wscale: self.u8()?,
            mss_clamp: self.u32()?,
            mss: self.u32()?,
            timestamp: self.u32()?,
            window: RepairWindow {
                snd_wl1: self.u32()?,
                snd_wnd: self.u32()?,
                max_window: self.u32()?,
                rcv_wnd: self.u32()?,
                rcv_wup: self.u32()?,
            },
            recv_seq: self.u32()?,
            send_seq: self.u32()?,
            recv_queue: self.blob()?,
            send_queue: self.blob()?,
            unsent: self.u32()?,
            sockopts: SockOpts { nodelay: self.bool()?, keepalive: self.bool()?, user_timeout_ms: self.u32()? },
        };
        // A state restore would refuse is refused here already, at the peer that sent it.
        state.validate().map_err(|_| Error::Codec("tcp state fails validation"))?;
        Ok(state)
    }

    /// Whether every byte was consumed.
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

pub(crate) fn put_blob(out: &mut BytesMut, b: &[u8]) {
    out.put_u32(b.len() as u32);
    out.put_slice(b);
}

/// Writes at most [`MAX_REASON`] bytes of `s`, cut at a character boundary.
pub(crate) fn put_string(out: &mut BytesMut, s: &str) {
    let mut end = s.len().min(MAX_REASON);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.put_u16(end as u16);
    out.put_slice(&s.as_bytes()[..end]);
}

pub(crate) fn put_addr(out: &mut BytesMut, a: &SocketAddr) {
    match a.ip() {
        IpAddr::V4(ip) => {
            out.put_u8(4);
            out.put_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.put_u8(6);
            out.put_slice(&ip.octets());
        }
    }
    out.put_u16(a.port());
}

pub(crate) fn put_flow(out: &mut BytesMut, f: &FlowKey) {
    for a in [f.client(), f.vip()] {
        out.put_slice(&a.ip().octets());
        out.put_u16(a.port());
    }
}

pub(crate) fn put_tcp_state(out: &mut BytesMut, s: &TcpState) {
    put_addr(out, &s.local);
    put_addr(out, &s.peer);
    out.put_u8(s.options.bits());
    out.put_u8(s.snd_wscale);
    out.put_u8(s.rcv_wscale);
    for v in [s.mss_clamp, s.mss, s.timestamp] {
        out.put_u32(v);
    }
    let w = &s.window;
    for v in [w.snd_wl1, w.snd_wnd, w.max_window, w.rcv_wnd, w.rcv_wup, s.recv_seq, s.send_seq] {
        out.put_u32(v);
    }
    put_blob(out, &s.recv_queue);
    put_blob(out, &s.send_queue);
    out.put_u32(s.unsent);
    out.put_u8(s.sockopts.nodelay as u8);
    out.put_u8(s.sockopts.keepalive as u8);
    out.put_u32(s.sockopts.user_timeout_ms);
}
