//! The embedded eBPF objects and what loading and attaching them has in common.

use std::net::{Ipv4Addr, SocketAddrV4};

use aya::programs::tc::{self, NlOptions, TcAttachOptions};
use aya::programs::{SchedClassifier, TcAttachType};
use aya::{Ebpf, EbpfLoader};

use crate::error::{Error, Result};

/// `bpf/ingress.bpf.c`, compiled by build.rs (aligned: the ELF parser reads it in place).
pub(crate) static INGRESS_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ingress.bpf.o"));
/// `bpf/guard.bpf.c`, compiled by build.rs.
pub(crate) static GUARD_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/guard.bpf.o"));

/// One direction of a TCP flow, client → VIP, as the programs see it (network byte order).
/// Layout must match `struct flow_key` in `bpf/common.h`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowKey {
    saddr: [u8; 4],
    daddr: [u8; 4],
    sport: [u8; 2],
    dport: [u8; 2],
}

// Its `aya::Pod` impl (a promise the compiler cannot check) is in `sys.rs`.

impl FlowKey {
    /// The flow of packets from `client` to `vip` (what arrives at the ingress).
    pub fn new(client: SocketAddrV4, vip: SocketAddrV4) -> Self {
        FlowKey {
            saddr: client.ip().octets(),
            daddr: vip.ip().octets(),
            sport: client.port().to_be_bytes(),
            dport: vip.port().to_be_bytes(),
        }
    }

    /// The client's address.
    pub fn client(&self) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::from(self.saddr), u16::from_be_bytes(self.sport))
    }

    /// The VIP and port.
    pub fn vip(&self) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::from(self.daddr), u16::from_be_bytes(self.dport))
    }
}

/// Turns any aya error into ours.
pub(crate) fn bpf_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Bpf(format!("{what}: {e}"))
}

/// Loads `obj` with the named map sized to `capacity` and the `globals` (u32 constants) set.
pub(crate) fn load(obj: &[u8], map: &str, capacity: u32, globals: &[(&str, &u32)]) -> Result<Ebpf> {
    if capacity == 0 {
        return Err(Error::Bpf(format!("{map}: capacity must be at least 1")));
    }
    let mut loader = EbpfLoader::new();
    loader.set_max_entries(map, capacity);
    for (name, value) in globals {
        loader.set_global(name, *value, true);
    }
    loader.load(obj).map_err(|e| bpf_err("load", e))
}

/// Loads program `name` and attaches it as a tc cls_bpf direct-action filter on `iface`'s
/// ingress (adding the clsact qdisc if missing). The filter goes when the `Ebpf` is dropped.
///
/// Each attach adds a filter of its own beside any already there (another dispatcher's, or
/// another agent's): priority 0 and handle 0 let the kernel choose (a new priority, numbered in
/// front of the existing filters; 49152 on an empty chain), and aya asks with `NLM_F_CREATE |
/// NLM_F_EXCL`, so nothing is replaced. Detaching deletes by that priority and handle: only
/// this filter goes. The programs hand what is not theirs to the next filter (TC_ACT_UNSPEC).
pub(crate) fn attach_ingress(ebpf: &mut Ebpf, name: &str, iface: &str) -> Result<()> {
    if let Err(e) = tc::qdisc_add_clsact(iface) {
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(bpf_err(&format!("add clsact qdisc on {iface}"), e));
        }
    }
    let prog: &mut SchedClassifier = ebpf
        .program_mut(name)
        .ok_or_else(|| Error::Bpf(format!("program {name} missing from object")))?
        .try_into()
        .map_err(|e| bpf_err(name, e))?;
    prog.load().map_err(|e| bpf_err(&format!("load {name}"), e))?;
    // Netlink (cls_bpf, direct action), not TCX: visible to `tc filter show` like any filter.
    prog.attach_with_options(iface, TcAttachType::Ingress, TcAttachOptions::Netlink(NlOptions::default()))
        .map_err(|e| bpf_err(&format!("attach {name} to {iface}"), e))?;
    Ok(())
}

/// Reads counter `i` of an ARRAY of u64.
pub(crate) fn counter(arr: &aya::maps::Array<aya::maps::MapData, u64>, i: u32) -> Result<u64> {
    arr.get(&i, 0).map_err(|e| bpf_err("read counter", e))
}

/// Whether a map error is the kernel saying the map is full.
pub(crate) fn is_full(e: &aya::maps::MapError) -> bool {
    matches!(e, aya::maps::MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::E2BIG))
}

/// Whether a map error is "no such key".
pub(crate) fn is_missing(e: &aya::maps::MapError) -> bool {
    match e {
        aya::maps::MapError::KeyNotFound => true,
        aya::maps::MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_key_is_in_network_order() {
        let k = FlowKey::new("198.18.1.1:40000".parse().unwrap(), "198.18.1.100:8080".parse().unwrap());
        // The layout the programs read: the fields in order, no padding.
        assert_eq!(std::mem::size_of::<FlowKey>(), 12);
        let offsets = [
            std::mem::offset_of!(FlowKey, saddr),
            std::mem::offset_of!(FlowKey, daddr),
            std::mem::offset_of!(FlowKey, sport),
            std::mem::offset_of!(FlowKey, dport),
        ];
        assert_eq!(offsets, [0, 4, 8, 10]);
        let bytes = [&k.saddr[..], &k.daddr, &k.sport, &k.dport].concat();
        assert_eq!(bytes, [198, 18, 1, 1, 198, 18, 1, 100, 0x9c, 0x40, 0x1f, 0x90]);
        assert_eq!(k.client().port(), 40000);
        assert_eq!(k.vip().to_string(), "198.18.1.100:8080");
    }
}
