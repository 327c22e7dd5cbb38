//! The lab's fixed topology: five hosts on one switch, addresses from 198.18.0.0/24.
//!
//! Only these namespaces and addresses are ever used; everything the lab sends stays on them.

/// Namespace that holds the bridge (the switch).
pub const SWITCH_NS: &str = "rf-sw";
/// The bridge inside [`SWITCH_NS`].
pub const BRIDGE: &str = "br0";
/// The interface name of each host's link (inside its own namespace).
pub const HOST_IF: &str = "eth0";
/// Prefix length of the lab subnet.
pub const PREFIX: u8 = 24;
/// The service address (VIP) clients talk to; lives on the dispatcher host.
pub const VIP: &str = "198.18.0.100";
/// Every namespace the lab creates starts with this.
pub const NS_PREFIX: &str = "rf-";

// The ports (examples/lab/README.md): refract hybrid on VIP:8080, relay-only on VIP:8081,
// hand-over `always` on VIP:8082, the relay's busy-polling variant on VIP:8083, each with its
// admin listener on the dispatcher's own address at port + 100; the configs in examples/lab/
// set them, the harness reads them from there.

/// HAProxy's port (on the dispatcher's own address).
pub const HAPROXY_PORT: u16 = 8090;
/// Blob servers' port.
pub const BLOB_PORT: u16 = 9000;

/// One host of the lab.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Host {
    /// Short name: `c1`, `d`, `b1`…
    pub name: &'static str,
    /// The host's own address.
    pub addr: &'static str,
}

impl Host {
    /// The namespace: `rf-c1`.
    pub fn ns(&self) -> String {
        format!("{NS_PREFIX}{}", self.name)
    }

    /// The switch-side port of this host's link: `p-c1` (inside [`SWITCH_NS`]).
    /// Prefixed because bare names like `d` or `tx` are taken by `ip` as keywords.
    pub fn port(&self) -> String {
        format!("p-{}", self.name)
    }

    /// The addresses configured on the host's link (the dispatcher also carries the VIP).
    pub fn addrs(&self) -> Vec<&'static str> {
        if self.name == DISPATCHER.name {
            vec![self.addr, VIP]
        } else {
            vec![self.addr]
        }
    }
}

/// Client 1.
pub const C1: Host = Host { name: "c1", addr: "198.18.0.11" };
/// Client 2.
pub const C2: Host = Host { name: "c2", addr: "198.18.0.12" };
/// The dispatcher host (refract and HAProxy run here).
pub const DISPATCHER: Host = Host { name: "d", addr: "198.18.0.2" };
/// Backend 1 (the primary).
pub const B1: Host = Host { name: "b1", addr: "198.18.0.21" };
/// Backend 2 (a replica).
pub const B2: Host = Host { name: "b2", addr: "198.18.0.22" };

/// The backend hosts; each runs an agent, so each has the VIP on `lo` with ARP suppressed.
pub const AGENT_HOSTS: [Host; 2] = [B1, B2];

/// All hosts, in creation order.
pub const HOSTS: [Host; 5] = [C1, C2, DISPATCHER, B1, B2];

/// Look a host up by short name (`c1`) or namespace name (`rf-c1`).
pub fn host(name: &str) -> Option<Host> {
    let short = name.strip_prefix(NS_PREFIX).unwrap_or(name);
    HOSTS.iter().copied().find(|h| h.name == short)
}

/// Every namespace of the lab, switch included.
pub fn all_namespaces() -> Vec<String> {
    let mut v: Vec<String> = HOSTS.iter().map(Host::ns).collect();
    v.push(SWITCH_NS.to_string());
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_addresses() {
        assert_eq!(host("rf-b2"), Some(B2));
        assert_eq!(host("c1").map(|h| h.ns()), Some("rf-c1".to_string()));
        assert_eq!(host("x"), None);
        assert_eq!(DISPATCHER.addrs(), vec!["198.18.0.2", VIP]);
        for h in HOSTS {
            assert!(h.addr.starts_with("198.18.0."), "{h:?} outside the lab range");
            assert!(h.ns().starts_with("rf-"));
        }
        assert_eq!(all_namespaces().len(), 6);
    }
}
