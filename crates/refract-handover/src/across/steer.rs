//! The dispatcher's ingress map for cross-host hand-over (docs/handover.md, "Host setup"): FREEZE a
//! flow before its snapshot, STEER it to the agent's MAC just before `HandOff`, remove it once the
//! socket is back here. Attached once, on first use, to `[handover] interface`.

use super::{Declined, Why};
use crate::{FlowKey, SteerTarget, Steering, SteeringStats};
use std::net::Ipv4Addr;
use std::sync::{Mutex, OnceLock};

static STEERING: OnceLock<Result<Mutex<Steering>, String>> = OnceLock::new();

/// Runs `f` on the ingress map of `iface` (attaching it with room for `capacity` flows the
/// first time; a failed attach is remembered and every hand-over relays).
pub fn with<T>(iface: &str, capacity: u32, f: impl FnOnce(&mut Steering) -> crate::Result<T>) -> Result<T, Declined> {
    let map = STEERING.get_or_init(|| {
        Steering::attach(iface, capacity).map(Mutex::new).map_err(|e| format!("steering on {iface}: {e}"))
    });
    let map = map.as_ref().map_err(|e| Declined::new(Why::Steering, e.clone()))?;
    let mut guard = map.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut guard).map_err(|e| match e {
        crate::Error::MapFull(_) => Declined::new(Why::MapFull, e.to_string()),
        _ => Declined::new(Why::Steering, e.to_string()),
    })
}

/// The attached map's entry count, capacity and packet counters (`None`: no program attached;
/// `Some(Err)`: unreadable), for the metrics.
pub fn view() -> Option<crate::Result<(usize, u32, SteeringStats)>> {
    let Some(Ok(map)) = STEERING.get() else { return None };
    let map = map.lock().unwrap_or_else(|p| p.into_inner());
    Some(map.len().and_then(|n| Ok((n, map.capacity(), map.stats()?))))
}

/// Removes the flow's entry (its packets reach this host's stack again); failures are logged.
pub(crate) fn release(iface: &str, capacity: u32, flow: &FlowKey) {
    if let Err(e) = with(iface, capacity, |m| m.remove(flow)) {
        tracing::warn!("steering entry not removed: {e}");
    }
}

/// Where STEER sends packets for the agent at `agent`: out of `iface` (hairpin), to the agent's
/// MAC (from the neighbour table: the control connection just resolved it), from ours (★).
pub(crate) fn target(iface: &str, agent: Ipv4Addr) -> Result<SteerTarget, Declined> {
    target_of(iface, agent).map_err(|e| Declined::new(Why::Steering, e))
}

fn target_of(iface: &str, agent: Ipv4Addr) -> Result<SteerTarget, String> {
    let sys = |f: &str| {
        std::fs::read_to_string(format!("/sys/class/net/{iface}/{f}")).map_err(|e| format!("{iface} {f}: {e}"))
    };
    let ifindex = sys("ifindex")?.trim().parse().map_err(|_| format!("{iface}: bad ifindex"))?;
    let src_mac = parse_mac(sys("address")?.trim()).ok_or(format!("{iface}: bad MAC"))?;
    let arp = std::fs::read_to_string("/proc/net/arp").map_err(|e| format!("/proc/net/arp: {e}"))?;
    let dst_mac = neighbour(&arp, agent, iface).ok_or(format!("no neighbour entry for {agent} on {iface}"))?;
    Ok(SteerTarget { ifindex, dst_mac, src_mac })
}

/// The complete neighbour entry of `ip` on `iface` in `/proc/net/arp` text.
fn neighbour(arp: &str, ip: Ipv4Addr, iface: &str) -> Option<[u8; 6]> {
    arp.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let complete = f.get(2).is_some_and(|flags| *flags != "0x0");
        (f.len() >= 6 && f[0] == ip.to_string() && f[5] == iface && complete).then(|| parse_mac(f[3]))?
    })
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn neighbours_from_proc_net_arp() {
        let arp = "IP address       HW type     Flags       HW address            Mask     Device\n\
                   198.18.0.21      0x1         0x2         02:00:00:00:00:15     *        eth0\n\
                   198.18.0.22      0x1         0x0         00:00:00:00:00:00     *        eth0\n";
        let ip = |s: &str| s.parse().unwrap();
        assert_eq!(neighbour(arp, ip("198.18.0.21"), "eth0"), Some([2, 0, 0, 0, 0, 0x15]));
        assert_eq!(neighbour(arp, ip("198.18.0.21"), "eth1"), None);
        assert_eq!(neighbour(arp, ip("198.18.0.22"), "eth0"), None, "incomplete");
        assert_eq!(parse_mac("02:00:00:00:00:15:00"), None);
    }
}
