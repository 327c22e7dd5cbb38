//! `Guard`: the agent host's ingress guard (no RST for flows it does not own) and tombstones.

use std::net::Ipv4Addr;

use aya::maps::{Array, HashMap, MapData};
use aya::Ebpf;

use crate::bpf::{self, bpf_err, FlowKey};
use crate::error::{Error, Result};

/// Totals since the guard was attached (exported as metrics by the agent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GuardStats {
    /// Segments to the VIP that found their socket.
    pub passed: u64,
    /// Segments to the VIP without a socket, dropped instead of answered with RST.
    pub orphan_drops: u64,
    /// Segments of tombstoned flows, dropped.
    pub tombstone_drops: u64,
}

/// The guard program attached to the agent host's interface, and its tombstone map.
pub struct Guard {
    tombstones: HashMap<MapData, FlowKey, u64>,
    stats: Array<MapData, u64>,
    capacity: u32,
    _ebpf: Ebpf,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard").field("capacity", &self.capacity).finish_non_exhaustive()
    }
}

impl Guard {
    /// Loads the guard for `vip` with room for `tombstones` flows and attaches it to `iface`'s
    /// ingress (in the calling thread's network namespace).
    pub fn attach(iface: &str, vip: Ipv4Addr, tombstones: u32) -> Result<Self> {
        // The program compares with the address as it is in the packet: network order.
        let vip_be = u32::from_ne_bytes(vip.octets());
        let mut ebpf = bpf::load(bpf::GUARD_OBJ, "tombstones", tombstones, &[("VIP", &vip_be)])?;
        bpf::attach_ingress(&mut ebpf, "refract_guard", iface)?;
        let map = ebpf.take_map("tombstones").ok_or_else(|| Error::Bpf("tombstones map missing".into()))?;
        let tombs = HashMap::try_from(map).map_err(|e| bpf_err("tombstones map", e))?;
        let map = ebpf.take_map("guard_stats").ok_or_else(|| Error::Bpf("guard_stats map missing".into()))?;
        let stats = Array::try_from(map).map_err(|e| bpf_err("guard_stats map", e))?;
        Ok(Guard { tombstones: tombs, stats, capacity: tombstones, _ebpf: ebpf })
    }

    /// Drops every packet of the flow from now on (hand-back step 1).
    pub fn tombstone(&mut self, key: FlowKey) -> Result<()> {
        match self.tombstones.insert(key, 0u64, 0) {
            Ok(()) => Ok(()),
            Err(e) if bpf::is_full(&e) => Err(Error::MapFull(self.capacity)),
            Err(e) => Err(bpf_err("add tombstone", e)),
        }
    }

    /// Ends the tombstone (after the grace period); false if there was none.
    pub fn remove(&mut self, key: &FlowKey) -> Result<bool> {
        match self.tombstones.remove(key) {
            Ok(()) => Ok(true),
            Err(e) if bpf::is_missing(&e) => Ok(false),
            Err(e) => Err(bpf_err("remove tombstone", e)),
        }
    }

    /// Packets dropped by the flow's tombstone, if it has one.
    pub fn tombstone_drops(&self, key: &FlowKey) -> Result<Option<u64>> {
        match self.tombstones.get(key, 0) {
            Ok(n) => Ok(Some(n)),
            Err(e) if bpf::is_missing(&e) => Ok(None),
            Err(e) => Err(bpf_err("look up tombstone", e)),
        }
    }

    /// How many tombstones exist.
    pub fn len(&self) -> Result<usize> {
        let mut n = 0;
        for k in self.tombstones.keys() {
            k.map_err(|e| bpf_err("walk tombstones", e))?;
            n += 1;
        }
        Ok(n)
    }

    /// Whether there are no tombstones.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Totals since attach.
    pub fn stats(&self) -> Result<GuardStats> {
        Ok(GuardStats {
            passed: bpf::counter(&self.stats, 0)?,
            orphan_drops: bpf::counter(&self.stats, 1)?,
            tombstone_drops: bpf::counter(&self.stats, 2)?,
        })
    }
}
