//! Where a cluster's pieces live: in the lab (namespaces, 198.18.0.0/24) or on loopback.
//! The sweep, the demo and the cluster launcher all read addresses from here.

use crate::dispatch_config::DispatchConfig;
use crate::http_client::Client;
use crate::topology::{self, B1, B2, C1, C2, DISPATCHER, VIP};
use anyhow::Result;

/// The dispatcher config for the lab (relay mode); `examples/lab/relay.toml`, embedded.
pub const RELAY_TOML: &str = include_str!("../../../examples/lab/relay.toml");

/// Used only when `examples/loopback.toml` cannot be found: the same cluster, spelled out.
const LOOPBACK_FALLBACK: &str = r#"
[listen]
http = "127.0.0.1:8080"
admin = "127.0.0.1:8081"

[balance]
policy = "round-robin"

[[backend]]
name = "b1"
addr = "127.0.0.1:9001"
role = "primary"

[[backend]]
name = "b2"
addr = "127.0.0.1:9002"
role = "replica"

[[backend]]
name = "b3"
addr = "127.0.0.1:9003"
role = "replica"
"#;

/// One process of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proc {
    /// Short name; also the log (`NAME.log`) and pid file (`NAME.pid`) name.
    pub name: String,
    /// The namespace it runs in (lab) or `None` (loopback).
    pub ns: Option<String>,
    /// `refract` arguments (`blob-server …`, `dispatch …`) or, for HAProxy, its own.
    pub args: Vec<String>,
    /// Whether this is HAProxy rather than refract itself.
    pub haproxy: bool,
}

/// A cluster's layout.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Whether it lives in the lab's namespaces.
    pub lab: bool,
    /// The dispatcher config text (written to the state dir as `dispatch.toml`).
    pub config_text: String,
    /// The parsed config.
    pub config: DispatchConfig,
    /// Backends `(name, IP:PORT)`.
    pub backends: Vec<(String, String)>,
    /// Where each load-generating client runs (namespace or root).
    pub clients: Vec<Option<String>>,
    /// HAProxy's address, if HAProxy is part of the cluster.
    pub haproxy: Option<String>,
}

impl Layout {
    /// The lab: b1, b2, refract on the VIP, HAProxy on the dispatcher host; clients c1, c2.
    pub fn lab() -> Result<Self> {
        let config = DispatchConfig::parse(RELAY_TOML)?;
        Ok(Layout {
            lab: true,
            config_text: RELAY_TOML.to_string(),
            backends: backends(&config),
            config,
            clients: vec![Some(C1.ns()), Some(C2.ns())],
            haproxy: Some(format!("{}:{}", DISPATCHER.addr, topology::HAPROXY_PORT)),
        })
    }

    /// Loopback: the cluster of `examples/loopback.toml`; HAProxy on 127.0.0.1:8090 if present.
    pub fn loopback(with_haproxy: bool) -> Result<Self> {
        let config_text = find_loopback_toml();
        let config = DispatchConfig::parse(&config_text)?;
        Ok(Layout {
            lab: false,
            backends: backends(&config),
            config_text,
            config,
            clients: vec![None, None],
            haproxy: with_haproxy.then(|| "127.0.0.1:8090".to_string()),
        })
    }

    /// Where the refract relay listens.
    pub fn refract_addr(&self) -> String {
        self.config.listen.http.clone()
    }

    /// The client for single requests (demo, probes): curl in c1, or direct.
    pub fn client(&self) -> Client {
        match &self.clients.first() {
            Some(Some(ns)) => Client::Curl(ns.clone()),
            _ => Client::Direct,
        }
    }

    /// The address each client targets for a target name (`direct` spreads clients over the
    /// backends that serve reads: c1 → b1, c2 → b2 in the lab).
    pub fn target_addrs(&self, target: &str) -> Option<Vec<String>> {
        let n = self.clients.len();
        match target {
            "refract" => Some(vec![self.refract_addr(); n]),
            "haproxy" => self.haproxy.clone().map(|a| vec![a; n]),
            "direct" => {
                let readers = self.config.readers();
                Some((0..n).map(|i| readers[i % readers.len()].addr.clone()).collect())
            }
            _ => None,
        }
    }

    /// The processes to start: blob servers, the dispatcher, HAProxy.
    pub fn procs(&self, config_path: &str, haproxy_cfg: &str) -> Vec<Proc> {
        let mut v: Vec<Proc> = self
            .backends
            .iter()
            .map(|(name, addr)| Proc {
                name: name.clone(),
                ns: self.ns_of(addr),
                args: strings(&["blob-server", "--listen", addr, "--name", name]),
                haproxy: false,
            })
            .collect();
        let d_ns = self.lab.then(|| DISPATCHER.ns());
        v.push(Proc {
            name: "refract".into(),
            ns: d_ns.clone(),
            args: strings(&["dispatch", "--config", config_path]),
            haproxy: false,
        });
        if self.haproxy.is_some() {
            v.push(Proc {
                name: "haproxy".into(),
                ns: d_ns,
                args: strings(&["-db", "-f", haproxy_cfg]),
                haproxy: true,
            });
        }
        v
    }

    /// The namespace owning an address (lab), or none (loopback).
    fn ns_of(&self, addr: &str) -> Option<String> {
        let ip = addr.split(':').next().unwrap_or_default();
        if !self.lab {
            return None;
        }
        let hosts = [B1, B2, DISPATCHER, C1, C2];
        let by_addr = hosts.iter().find(|h| h.addr == ip).map(|h| h.ns());
        by_addr.or_else(|| (ip == VIP).then(|| DISPATCHER.ns()))
    }
}

fn backends(config: &DispatchConfig) -> Vec<(String, String)> {
    config.backends.iter().map(|b| (b.name.clone(), b.addr.clone())).collect()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// `examples/loopback.toml` from the current directory or from the source tree this was built
/// from; the built-in copy otherwise.
fn find_loopback_toml() -> String {
    let candidates = [
        std::path::PathBuf::from("examples/loopback.toml"),
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/loopback.toml"),
    ];
    candidates.iter().find_map(|p| std::fs::read_to_string(p).ok()).unwrap_or_else(|| LOOPBACK_FALLBACK.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_targets() {
        let l = Layout::lab().expect("lab");
        assert_eq!(l.target_addrs("direct"), Some(vec!["198.18.0.21:9000".into(), "198.18.0.22:9000".into()]));
        assert_eq!(l.target_addrs("refract"), Some(vec!["198.18.0.100:8080".into(); 2]));
        assert_eq!(l.target_addrs("haproxy"), Some(vec!["198.18.0.2:8090".into(); 2]));
        assert_eq!(l.target_addrs("nginx"), None);
        assert_eq!(l.client(), Client::Curl("rf-c1".into()));
    }

    #[test]
    fn lab_processes() {
        let l = Layout::lab().expect("lab");
        let procs = l.procs("/tmp/refract-lab/dispatch.toml", "/tmp/refract-lab/haproxy.cfg");
        let names: Vec<(&str, Option<&str>)> = procs.iter().map(|p| (p.name.as_str(), p.ns.as_deref())).collect();
        assert_eq!(
            names,
            vec![("b1", Some("rf-b1")), ("b2", Some("rf-b2")), ("refract", Some("rf-d")), ("haproxy", Some("rf-d"))]
        );
        assert_eq!(procs[0].args.join(" "), "blob-server --listen 198.18.0.21:9000 --name b1");
    }

    #[test]
    fn loopback_layout() {
        let l = Layout::loopback(false).expect("loopback");
        assert!(l.procs("c", "h").iter().all(|p| p.ns.is_none() && !p.haproxy));
        assert_eq!(l.client(), Client::Direct);
        assert!(l.refract_addr().starts_with("127.0.0.1:"));
    }
}
