//! `Steering`: the dispatcher's ingress program and its per-flow FREEZE / STEER map.

use aya::maps::{Array, HashMap, MapData};
use aya::Ebpf;

use crate::bpf::{self, bpf_err, FlowKey};
use crate::error::{Error, Result};

const ACT_FREEZE: u32 = 1;
const ACT_STEER: u32 = 2;

/// The value of one flow entry; layout must match `struct flow_val` in `bpf/ingress.bpf.c`.
/// Its `aya::Pod` impl (a promise the compiler cannot check) is in `sys.rs`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FlowValue {
    action: u32,
    ifindex: u32,
    dmac: [u8; 6],
    smac: [u8; 6],
    pad: u32,
    epoch: u64,
    packets: u64,
}

/// Where STEER sends a flow: out of `ifindex` with these MACs (docs/handover.md, "Host setup").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SteerTarget {
    /// Interface to redirect out of (the client-facing one: hairpin).
    pub ifindex: u32,
    /// The agent host's MAC.
    pub dst_mac: [u8; 6],
    /// This host's MAC on that interface (★ or the bridge learns the client's MAC here).
    pub src_mac: [u8; 6],
}

/// What the map holds for one flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowAction {
    /// Packets are dropped.
    Freeze,
    /// Packets are rewritten and redirected to the agent that owns the flow at `epoch`.
    Steer {
        /// Where to.
        target: SteerTarget,
        /// The hand-over epoch this entry belongs to.
        epoch: u64,
    },
}

/// One flow's entry: its action and the packets that met it since it was last set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowEntry {
    /// What happens to the flow's packets.
    pub action: FlowAction,
    /// Packets counted since the action was set.
    pub packets: u64,
}

/// Totals since the program was attached (exported as metrics by the dispatcher).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SteeringStats {
    /// Packets dropped because their flow was frozen.
    pub frozen_drops: u64,
    /// Packets redirected to an agent.
    pub steered: u64,
    /// Redirects the kernel refused.
    pub redirect_errors: u64,
}

/// The ingress program attached to the dispatcher's client-facing interface, and its map.
/// Dropping it detaches the program and frees the map (every entry with it).
pub struct Steering {
    flows: HashMap<MapData, FlowKey, FlowValue>,
    stats: Array<MapData, u64>,
    capacity: u32,
    _ebpf: Ebpf,
}

impl std::fmt::Debug for Steering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steering").field("capacity", &self.capacity).finish_non_exhaustive()
    }
}

impl Steering {
    /// Loads the program with room for `capacity` flows and attaches it to `iface`'s ingress
    /// (in the calling thread's network namespace).
    pub fn attach(iface: &str, capacity: u32) -> Result<Self> {
        let mut ebpf = bpf::load(bpf::INGRESS_OBJ, "flows", capacity, &[])?;
        bpf::attach_ingress(&mut ebpf, "refract_ingress", iface)?;
        let flows = take(&mut ebpf, "flows")?;
        let flows = HashMap::try_from(flows).map_err(|e| bpf_err("flows map", e))?;
        let stats = take(&mut ebpf, "ingress_stats")?;
        let stats = Array::try_from(stats).map_err(|e| bpf_err("ingress_stats map", e))?;
        Ok(Steering { flows, stats, capacity, _ebpf: ebpf })
    }

    /// The number of flows the map can hold.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Drops the flow's packets from now on (snapshot step 2).
    pub fn freeze(&mut self, key: FlowKey) -> Result<()> {
        self.set(key, FlowValue { action: ACT_FREEZE, ..FlowValue::default() })
    }

    /// Sends the flow's packets to `target` from now on (hand-off step 4).
    pub fn steer(&mut self, key: FlowKey, target: SteerTarget, epoch: u64) -> Result<()> {
        let v = FlowValue {
            action: ACT_STEER,
            ifindex: target.ifindex,
            dmac: target.dst_mac,
            smac: target.src_mac,
            epoch,
            ..FlowValue::default()
        };
        self.set(key, v)
    }

    /// Lets the flow's packets reach this host's stack again; false if it had no entry.
    pub fn remove(&mut self, key: &FlowKey) -> Result<bool> {
        match self.flows.remove(key) {
            Ok(()) => Ok(true),
            Err(e) if bpf::is_missing(&e) => Ok(false),
            Err(e) => Err(bpf_err("remove flow", e)),
        }
    }

    /// The flow's entry, if it has one.
    pub fn entry(&self, key: &FlowKey) -> Result<Option<FlowEntry>> {
        match self.flows.get(key, 0) {
            Ok(v) => Ok(Some(decode(v)?)),
            Err(e) if bpf::is_missing(&e) => Ok(None),
            Err(e) => Err(bpf_err("look up flow", e)),
        }
    }

    /// How many flows have an entry (walks the map: for metrics and tests, not per packet).
    pub fn len(&self) -> Result<usize> {
        let mut n = 0;
        for k in self.flows.keys() {
            k.map_err(|e| bpf_err("walk flows", e))?;
            n += 1;
        }
        Ok(n)
    }

    /// Whether no flow has an entry.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Totals since attach.
    pub fn stats(&self) -> Result<SteeringStats> {
        Ok(SteeringStats {
            frozen_drops: bpf::counter(&self.stats, 0)?,
            steered: bpf::counter(&self.stats, 1)?,
            redirect_errors: bpf::counter(&self.stats, 2)?,
        })
    }

    fn set(&mut self, key: FlowKey, v: FlowValue) -> Result<()> {
        match self.flows.insert(key, v, 0) {
            Ok(()) => Ok(()),
            Err(e) if bpf::is_full(&e) => Err(Error::MapFull(self.capacity)),
            Err(e) => Err(bpf_err("update flow", e)),
        }
    }
}

fn take(ebpf: &mut Ebpf, name: &str) -> Result<aya::maps::Map> {
    ebpf.take_map(name).ok_or_else(|| Error::Bpf(format!("map {name} missing from object")))
}

fn decode(v: FlowValue) -> Result<FlowEntry> {
    let action = match v.action {
        ACT_FREEZE => FlowAction::Freeze,
        ACT_STEER => FlowAction::Steer {
            target: SteerTarget { ifindex: v.ifindex, dst_mac: v.dmac, src_mac: v.smac },
            epoch: v.epoch,
        },
        other => return Err(Error::Bpf(format!("unknown flow action {other}"))),
    };
    Ok(FlowEntry { action, packets: v.packets })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_value_matches_the_c_layout() {
        // u32, u32, u8[6], u8[6], u32 pad, u64, u64: no implicit padding.
        assert_eq!(std::mem::size_of::<FlowValue>(), 40);
        assert_eq!(std::mem::offset_of!(FlowValue, epoch), 24);
        assert_eq!(std::mem::offset_of!(FlowValue, packets), 32);
    }
}
