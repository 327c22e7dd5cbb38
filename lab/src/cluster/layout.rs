//! Where a cluster's pieces live: in the lab (namespaces, 198.18.0.0/24) or on loopback.
//! The sweep, the demo and the cluster launcher all read addresses from here.

use crate::cluster::dispatch_config::DispatchConfig;
use crate::cluster::http_client::Client;
use crate::fabric::topology::{self, B1, B2, C1, C2, DISPATCHER, VIP};
use crate::support::state;
use anyhow::{Context, Result};

/// The lab's relay-only dispatcher (target `refract`); `examples/lab/relay.toml`, embedded
/// like every lab config, so the lab works from any directory.
pub const RELAY_TOML: &str = include_str!("../../../examples/lab/relay.toml");
/// The lab's hybrid dispatcher (target `hybrid`): `examples/lab/hybrid.toml`.
pub const HYBRID_TOML: &str = include_str!("../../../examples/lab/hybrid.toml");
/// The lab's hand-everything-over dispatcher (target `handover`): `examples/lab/handover.toml`.
pub const HANDOVER_TOML: &str = include_str!("../../../examples/lab/handover.toml");
/// The relay's busy-polling variant (target [`BUSY_POLL_TARGET`]): `examples/lab/relay-busypoll.toml`,
/// relay.toml with `busy_poll_us = 1000` on ports of its own.
pub const RELAY_BUSY_POLL_TOML: &str = include_str!("../../../examples/lab/relay-busypoll.toml");
/// The target of the busy-polling variant. refract ships with busy polling off, so every
/// headline figure uses the other dispatchers; this one's figures carry [`BUSY_POLL_LABEL`].
pub const BUSY_POLL_TARGET: &str = "refract-busypoll";
/// The label that goes wherever the busy-polling variant's figures appear.
pub const BUSY_POLL_LABEL: &str = "busy-polling variant";
/// The agents on b1 and b2: `examples/lab/agent-b1.toml`, `agent-b2.toml`.
pub const AGENT_TOMLS: [(&str, &str); 2] = [
    ("b1", include_str!("../../../examples/lab/agent-b1.toml")),
    ("b2", include_str!("../../../examples/lab/agent-b2.toml")),
];

/// Used only when `examples/loopback.toml` cannot be found: the same cluster, spelled out.
const LOOPBACK_FALLBACK: &str = r#"
[listen]
http = "127.0.0.1:8080"
admin = "127.0.0.1:8081"

[admin]
token = "change-me-to-a-long-random-secret"

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

/// One refract dispatcher of a cluster.
#[derive(Debug, Clone)]
pub struct Dispatcher {
    /// The sweep target it serves: `refract` (relay), `hybrid`, `handover` or `refract-busypoll`.
    pub target: &'static str,
    /// Process, log and pid-file name; its config is written to the state dir as `NAME.toml`.
    pub name: &'static str,
    /// Where the config comes from (`examples/lab/relay.toml`), for reports.
    pub source: &'static str,
    /// The config text.
    pub config_text: String,
    /// The parsed config.
    pub config: DispatchConfig,
}

impl Dispatcher {
    fn new(target: &'static str, name: &'static str, source: &'static str, text: &str) -> Result<Self> {
        let config = DispatchConfig::parse(text).with_context(|| source.to_string())?;
        Ok(Dispatcher { target, name, source, config_text: text.to_string(), config })
    }

    /// Its client-facing `IP:PORT`.
    pub fn addr(&self) -> &str {
        self.config.http_addr()
    }
}

/// An agent on a backend host.
#[derive(Debug, Clone)]
pub struct Agent {
    /// Process, log and pid-file name (`agent-b1`); its config goes to `NAME.toml`.
    pub name: String,
    /// The backend host's namespace.
    pub ns: String,
    /// The config text.
    pub config_text: String,
    /// Its control listener, `IP:PORT`.
    pub control: String,
    /// The shared control key.
    pub key: String,
    /// The Unix socket it reaches its backend on (`backend_socket`); the backend's blob
    /// server is started listening there too.
    pub backend_socket: Option<String>,
}

impl Agent {
    fn new(host: &str, text: &str) -> Result<Self> {
        let t: toml::Table = toml::from_str(text).with_context(|| format!("agent-{host}.toml"))?;
        let field = |k: &str| t.get(k).and_then(|v| v.as_str()).map(str::to_string);
        Ok(Agent {
            name: format!("agent-{host}"),
            ns: format!("{}{host}", topology::NS_PREFIX),
            config_text: text.to_string(),
            control: field("control").with_context(|| format!("agent-{host}.toml has no control"))?,
            key: field("key").with_context(|| format!("agent-{host}.toml has no inline key"))?,
            backend_socket: field("backend_socket"),
        })
    }
}

/// A cluster's layout.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Whether it lives in the lab's namespaces.
    pub lab: bool,
    /// The dispatchers; the first is the relay (its config is the one HAProxy mirrors). Of
    /// those that steer (`DispatchConfig::steers`) only one runs at a time: the first is
    /// started with the cluster, the others by [`crate::bench::sweep::switch::Switch`] in its place.
    pub dispatchers: Vec<Dispatcher>,
    /// The agents on the backend hosts (lab only).
    pub agents: Vec<Agent>,
    /// Backends `(name, IP:PORT)`.
    pub backends: Vec<(String, String)>,
    /// Where each load-generating client runs (namespace or root).
    pub clients: Vec<Option<String>>,
    /// HAProxy's address, if HAProxy is part of the cluster.
    pub haproxy: Option<String>,
}

impl Layout {
    /// The lab: b1, b2 with their agents; refract relay-only, hybrid (and, on demand, handing
    /// everything over), the relay's busy-polling variant on the VIP and HAProxy on the
    /// dispatcher host; clients c1, c2.
    pub fn lab() -> Result<Self> {
        let dispatchers = vec![
            Dispatcher::new("refract", "refract", "examples/lab/relay.toml", RELAY_TOML)?,
            Dispatcher::new("hybrid", "refract-hybrid", "examples/lab/hybrid.toml", HYBRID_TOML)?,
            Dispatcher::new("handover", "refract-handover", "examples/lab/handover.toml", HANDOVER_TOML)?,
            Dispatcher::new(
                BUSY_POLL_TARGET,
                "refract-busypoll",
                "examples/lab/relay-busypoll.toml",
                RELAY_BUSY_POLL_TOML,
            )?,
        ];
        let agents = AGENT_TOMLS.iter().map(|(host, text)| Agent::new(host, text)).collect::<Result<_>>()?;
        Ok(Layout {
            lab: true,
            backends: backends(&dispatchers[0].config),
            dispatchers,
            agents,
            clients: vec![Some(C1.ns()), Some(C2.ns())],
            haproxy: Some(format!("{}:{}", DISPATCHER.addr, topology::HAPROXY_PORT)),
        })
    }

    /// Loopback: the cluster of `examples/loopback.toml`; HAProxy on 127.0.0.1:8090 if present.
    pub fn loopback(with_haproxy: bool) -> Result<Self> {
        let relay = Dispatcher::new("refract", "refract", "examples/loopback.toml", &find_loopback_toml())?;
        Ok(Layout {
            lab: false,
            backends: backends(&relay.config),
            dispatchers: vec![relay],
            agents: Vec::new(),
            clients: vec![None, None],
            haproxy: with_haproxy.then(|| "127.0.0.1:8090".to_string()),
        })
    }

    /// The relay-only dispatcher (the config HAProxy mirrors; routing and backends).
    pub fn relay(&self) -> &Dispatcher {
        &self.dispatchers[0]
    }

    /// The relay's parsed config.
    pub fn config(&self) -> &DispatchConfig {
        &self.relay().config
    }

    /// Where the refract relay listens.
    pub fn refract_addr(&self) -> String {
        self.relay().addr().to_string()
    }

    /// The dispatcher serving a sweep target, if the target is one.
    pub fn dispatcher(&self, target: &str) -> Option<&Dispatcher> {
        self.dispatchers.iter().find(|d| d.target == target)
    }

    /// Whether a dispatcher is started with the cluster (not only in another's place).
    pub fn starts_with_cluster(&self, d: &Dispatcher) -> bool {
        !d.config.steers() || self.dispatchers.iter().find(|x| x.config.steers()).is_some_and(|x| x.name == d.name)
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
            "haproxy" => self.haproxy.clone().map(|a| vec![a; n]),
            "direct" => {
                let readers = self.config().readers();
                Some((0..n).map(|i| readers[i % readers.len()].addr.clone()).collect())
            }
            t => self.dispatcher(t).map(|d| vec![d.addr().to_string(); n]),
        }
    }

    /// The daemon (process, log and pid-file name) that dispatches for a target: `haproxy`,
    /// a refract dispatcher's name, or `None` for `direct` and unknown targets.
    pub fn daemon(&self, target: &str) -> Option<String> {
        match target {
            "haproxy" => self.haproxy.as_ref().map(|_| "haproxy".to_string()),
            t => self.dispatcher(t).map(|d| d.name.to_string()),
        }
    }

    /// The targets this layout can measure, in report order.
    pub fn targets(&self) -> Vec<String> {
        let mut v = vec!["direct".to_string()];
        v.extend(self.dispatchers.iter().map(|d| d.target.to_string()));
        v.extend(self.haproxy.iter().map(|_| "haproxy".to_string()));
        v
    }

    /// What a target is, one phrase for the report: `` `hybrid` = both clients → … ``.
    pub fn target_note(&self, target: &str) -> Option<String> {
        let note = match (target, self.dispatcher(target)) {
            ("direct", _) => {
                let readers: Vec<String> = self.config().readers().iter().map(|b| b.name.clone()).collect();
                format!("the clients straight to the backends, spread over {} (no dispatcher)", readers.join(" and "))
            }
            ("haproxy", _) => format!("both clients → HAProxy on {}", self.haproxy.as_deref()?),
            (_, Some(d)) => {
                let mode = match d.config.handover.as_ref().map(|h| h.mode.as_str()) {
                    Some("always") => "every read handed to the agent on its backend's host".to_string(),
                    Some("hybrid") => "hybrid: small results relayed, large ones handed to the agent".to_string(),
                    _ => "relay-only".to_string(),
                };
                let variant = variant(target).map(|v| format!(", the {v}")).unwrap_or_default();
                format!("both clients → refract on {} ({mode}{variant}; `{}`)", d.addr(), d.source)
            }
            _ => return None,
        };
        Some(format!("`{target}` = {note}"))
    }

    /// The processes the cluster starts: blob servers, agents, the dispatchers (of those that
    /// steer, the first), HAProxy. Configs are read from the state directory.
    pub fn procs(&self) -> Vec<Proc> {
        let mut v: Vec<Proc> = self
            .backends
            .iter()
            .map(|(name, addr)| {
                let mut args = strings(&["blob-server", "--listen", addr, "--name", name]);
                let agent = self.agents.iter().find(|a| a.name.strip_prefix("agent-") == Some(name.as_str()));
                if let Some(socket) = agent.and_then(|a| a.backend_socket.as_ref()) {
                    args.extend(strings(&["--unix", socket]));
                }
                Proc { name: name.clone(), ns: self.ns_of(addr), args, haproxy: false }
            })
            .collect();
        v.extend(self.agents.iter().map(|a| Proc {
            name: a.name.clone(),
            ns: Some(a.ns.clone()),
            args: strings(&["agent", "--config", &config_path(&a.name)]),
            haproxy: false,
        }));
        v.extend(self.dispatchers.iter().filter(|d| self.starts_with_cluster(d)).map(|d| self.proc_of(d)));
        if self.haproxy.is_some() {
            let cfg = state::path("haproxy.cfg").to_string_lossy().into_owned();
            v.push(Proc {
                name: "haproxy".into(),
                ns: self.d_ns(),
                args: strings(&["-db", "-f", &cfg]),
                haproxy: true,
            });
        }
        v
    }

    /// Every process the cluster may run (those started in another's place included).
    pub fn all_procs(&self) -> Vec<Proc> {
        let mut v = self.procs();
        v.extend(self.dispatchers.iter().filter(|d| !self.starts_with_cluster(d)).map(|d| self.proc_of(d)));
        v
    }

    /// A dispatcher's process.
    pub fn proc_of(&self, d: &Dispatcher) -> Proc {
        Proc {
            name: d.name.to_string(),
            ns: self.d_ns(),
            args: strings(&["dispatch", "--config", &config_path(d.name)]),
            haproxy: false,
        }
    }

    fn d_ns(&self) -> Option<String> {
        self.lab.then(|| DISPATCHER.ns())
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

/// A target as report tables name it: the busy-polling variant carries its label
/// (`refract-busypoll, busy-polling variant`), every other target is its own name.
pub fn label(target: &str) -> String {
    match variant(target) {
        Some(v) => format!("{target}, {v}"),
        None => target.to_string(),
    }
}

/// What makes a target a variant rather than a shipped configuration: the busy-polling
/// variant's label, `None` for every other target.
pub fn variant(target: &str) -> Option<&'static str> {
    (target == BUSY_POLL_TARGET).then_some(BUSY_POLL_LABEL)
}

/// Where a process's config is written: `STATE/NAME.toml`.
pub fn config_path(name: &str) -> String {
    state::path(&format!("{name}.toml")).to_string_lossy().into_owned()
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
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/loopback.toml"),
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
        assert_eq!(l.target_addrs("refract"), Some(vec!["198.18.0.100:8081".into(); 2]));
        assert_eq!(l.target_addrs("hybrid"), Some(vec!["198.18.0.100:8080".into(); 2]));
        assert_eq!(l.target_addrs("handover"), Some(vec!["198.18.0.100:8082".into(); 2]));
        assert_eq!(l.target_addrs("refract-busypoll"), Some(vec!["198.18.0.100:8083".into(); 2]));
        assert_eq!(l.target_addrs("haproxy"), Some(vec!["198.18.0.2:8090".into(); 2]));
        assert_eq!(l.target_addrs("nginx"), None);
        assert_eq!(l.targets(), ["direct", "refract", "hybrid", "handover", "refract-busypoll", "haproxy"]);
        assert_eq!(l.client(), Client::Curl("rf-c1".into()));
        let daemons: Vec<Option<String>> = l.targets().iter().map(|t| l.daemon(t)).collect();
        let names = [
            None,
            Some("refract"),
            Some("refract-hybrid"),
            Some("refract-handover"),
            Some("refract-busypoll"),
            Some("haproxy"),
        ];
        assert_eq!(daemons, names.map(|n| n.map(str::to_string)), "each target's process, none for direct");
        assert!(names.iter().flatten().all(|n| l.all_procs().iter().any(|p| p.name == *n)), "daemons are processes");
        assert_eq!(l.daemon("nginx"), None);
    }

    #[test]
    fn lab_processes() {
        let l = Layout::lab().expect("lab");
        let procs = l.procs();
        let names: Vec<(&str, Option<&str>)> = procs.iter().map(|p| (p.name.as_str(), p.ns.as_deref())).collect();
        assert_eq!(
            names,
            vec![
                ("b1", Some("rf-b1")),
                ("b2", Some("rf-b2")),
                ("agent-b1", Some("rf-b1")),
                ("agent-b2", Some("rf-b2")),
                ("refract", Some("rf-d")),
                ("refract-hybrid", Some("rf-d")),
                ("refract-busypoll", Some("rf-d")),
                ("haproxy", Some("rf-d"))
            ]
        );
        assert_eq!(
            procs[0].args.join(" "),
            "blob-server --listen 198.18.0.21:9000 --name b1 --unix /tmp/refract-lab/b1.sock"
        );
        assert!(
            procs[2].args.join(" ").starts_with("agent --config /") && procs[2].args[2].ends_with("/agent-b1.toml")
        );
        let all = l.all_procs();
        assert_eq!(all.last().map(|p| p.name.as_str()), Some("refract-handover"));
    }

    #[test]
    fn lab_ports_are_distinct_and_agents_match_the_dispatchers() {
        let l = Layout::lab().expect("lab");
        let mut ports: Vec<&str> = l.dispatchers.iter().map(|d| d.addr()).collect();
        ports.extend(l.dispatchers.iter().filter_map(|d| d.config.listen.admin.as_deref()));
        ports.extend(l.haproxy.as_deref());
        let n = ports.len();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), n, "a port is used twice: {ports:?}");
        for d in l.dispatchers.iter().filter(|d| d.config.hands_over()) {
            let text: toml::Table = toml::from_str(&d.config_text).expect("toml");
            let agents = text["handover"]["agents"].as_table().expect("agents");
            for a in &l.agents {
                let host = a.name.trim_start_matches("agent-");
                assert_eq!(agents[host].as_str(), Some(a.control.as_str()), "{} → {}", d.name, a.name);
            }
        }
        assert!(l.agents.iter().all(|a| a.key == l.agents[0].key && a.key.len() >= 16));
    }

    /// A config as a table, without its `[http] listen` and with the keys named removed from
    /// its `[listen]`.
    fn listen_without(text: &str, keys: &[&str]) -> toml::Table {
        let mut t: toml::Table = toml::from_str(text).expect("toml");
        t.get_mut("http").and_then(|h| h.as_table_mut()).expect("[http]").remove("listen");
        let listen = t.get_mut("listen").and_then(|l| l.as_table_mut()).expect("[listen]");
        for k in keys {
            listen.remove(*k);
        }
        t
    }

    #[test]
    fn the_headline_dispatchers_run_the_shipped_default_and_only_the_variant_busy_polls() {
        let l = Layout::lab().expect("lab");
        for d in &l.dispatchers {
            let t: toml::Table = toml::from_str(&d.config_text).expect("toml");
            let poll = t["listen"].get("busy_poll_us").and_then(|v| v.as_integer());
            let expected = (d.target == BUSY_POLL_TARGET).then_some(1000);
            assert_eq!(poll, expected, "{}: busy polling only in the labelled variant", d.source);
        }
        // The variant is the relay plus busy polling: every other key alike, its own ports.
        let variant = listen_without(RELAY_BUSY_POLL_TOML, &["admin", "busy_poll_us"]);
        assert_eq!(variant, listen_without(RELAY_TOML, &["admin"]), "relay-busypoll.toml drifted from relay.toml");
        let d = l.dispatcher(BUSY_POLL_TARGET).expect("the variant is a target");
        assert_eq!((d.name, d.addr()), ("refract-busypoll", "198.18.0.100:8083"));
        assert!(l.starts_with_cluster(d), "it does not steer, so it runs beside the relay");
    }

    #[test]
    fn the_variant_is_labelled_wherever_it_is_named() {
        let l = Layout::lab().expect("lab");
        assert_eq!(label("refract-busypoll"), "refract-busypoll, busy-polling variant");
        assert_eq!(label("refract"), "refract");
        let note = l.target_note(BUSY_POLL_TARGET).expect("note");
        assert!(note.contains("relay-only, the busy-polling variant; `examples/lab/relay-busypoll.toml`"), "{note}");
        let relay = l.target_note("refract").expect("note");
        assert!(!relay.contains("busy"), "{relay}");
    }

    #[test]
    fn loopback_layout() {
        let l = Layout::loopback(false).expect("loopback");
        assert!(l.procs().iter().all(|p| p.ns.is_none() && !p.haproxy));
        assert_eq!(l.targets(), ["direct", "refract"]);
        assert_eq!(l.client(), Client::Direct);
        assert!(l.refract_addr().starts_with("127.0.0.1:"));
    }
}
