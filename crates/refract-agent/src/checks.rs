//! Host checks at start: the VIP on `lo`, ARP suppressed, the guard attached (docs/handover.md,
//! "Host setup"). Every problem found is reported at once, each with the command that fixes it.

use std::net::{IpAddr, Ipv4Addr};

use refract_handover::Guard;

use crate::error::{Error, Problem, Result};

/// What the checks look at (from the config).
#[derive(Debug, Clone)]
pub struct HostSpec {
    /// The service address that must be on `lo`.
    pub vip: Ipv4Addr,
    /// The NIC facing the dispatcher.
    pub interface: String,
    /// Tombstone map capacity of the guard.
    pub map_capacity: u32,
}

/// Runs every check in the calling thread's network namespace; on success the guard is
/// attached to the interface and stays attached while the returned [`Guard`] lives.
pub fn check_host(spec: &HostSpec) -> Result<Guard> {
    let mut problems = Vec::new();
    let iface_ok = interface_exists(&spec.interface, &mut problems);
    vip_on_lo(spec.vip, &mut problems);
    let mut ifaces = vec!["all"];
    if iface_ok {
        ifaces.push(&spec.interface);
    }
    for iface in ifaces {
        sysctl_is(
            iface,
            "arp_ignore",
            1,
            "this host would answer ARP for the VIP and take the dispatcher's traffic",
            &mut problems,
        );
        sysctl_is(
            iface,
            "arp_announce",
            2,
            "its ARP requests would carry the VIP as source and teach neighbours this MAC for it",
            &mut problems,
        );
    }
    let guard = if iface_ok { attach_guard(spec, &mut problems) } else { None };
    match guard {
        Some(g) if problems.is_empty() => Ok(g),
        _ => Err(Error::Host(problems)),
    }
}

fn interface_exists(iface: &str, problems: &mut Vec<Problem>) -> bool {
    if nix::net::if_::if_nametoindex(iface).is_ok() {
        return true;
    }
    problems.push(Problem {
        what: format!("interface {iface} does not exist in this network namespace"),
        fix: "set `interface` in the agent's config to the NIC that faces the dispatcher (see `ip link`)".into(),
    });
    false
}

fn vip_on_lo(vip: Ipv4Addr, problems: &mut Vec<Problem>) {
    if lo_has(vip) {
        return;
    }
    problems.push(Problem {
        what: format!("the VIP {vip} is not on lo (the restored sockets bind to it: direct server return)"),
        fix: format!("ip addr add {vip}/32 dev lo"),
    });
}

fn lo_has(vip: Ipv4Addr) -> bool {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else { return false };
    addrs
        .into_iter()
        .filter(|a| a.interface_name == "lo")
        .any(|a| a.address.and_then(|s| s.as_sockaddr_in().map(|sin| IpAddr::V4(sin.ip()))) == Some(IpAddr::V4(vip)))
}

fn sysctl_is(iface: &str, name: &str, want: u32, why: &str, problems: &mut Vec<Problem>) {
    let key = format!("net.ipv4.conf.{iface}.{name}");
    let got = std::fs::read_to_string(format!("/proc/sys/net/ipv4/conf/{iface}/{name}"))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    if got == Some(want) {
        return;
    }
    let now = got.map_or_else(|| "unreadable".to_string(), |v| format!("is {v}"));
    problems
        .push(Problem { what: format!("{key} {now}, must be {want} ({why})"), fix: format!("sysctl -w {key}={want}") });
}

fn attach_guard(spec: &HostSpec, problems: &mut Vec<Problem>) -> Option<Guard> {
    match Guard::attach(&spec.interface, spec.vip, spec.map_capacity) {
        Ok(g) => Some(g),
        Err(e) => {
            problems.push(Problem {
                what: format!("cannot attach the guard to {}'s ingress: {e}", spec.interface),
                fix: "run the agent as root (or with CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON) on a kernel with \
                      eBPF and tc clsact"
                    .into(),
            });
            None
        }
    }
}
