//! Several dispatchers behind one address (`lab up --cluster --dispatchers N`, `lab
//! kill-dispatcher`): hosts rf-d1 … rf-dN, each with the VIP on `lo` (ARP suppressed, as the
//! backend hosts have it), a router rf-r whose route to the VIP is an ECMP multipath over them
//! hashed on each packet's 5-tuple (the kernel's own multipath routing, as a top-of-rack router
//! does for an anycast address; see [`up_kinds`] for why the hash policy is 3, not 1), and
//! etcd in rf-e. The clients reach the VIP through rf-r; answers go straight back (from a
//! dispatcher, or from an agent after a hand-over). Every new link is shaped like the others.
//!
//! Each dispatcher host runs the lab's relay-only dispatcher (VIP:8081) and its hybrid one
//! (VIP:8080), or their PostgreSQL counterparts ([`PG_KINDS`]), each with `[cluster]` on the
//! etcd in rf-e (one prefix per kind), its admin listener on the host's own address. Killing a dispatcher (`kill-dispatcher`)
//! kills its processes and withdraws its next hop from rf-r's route, as a BGP withdrawal would.

use crate::cluster::http_client::Client;
use crate::cluster::layout::{HYBRID_TOML, RELAY_TOML};
use crate::cluster::pid_of;
use crate::fabric::topology::{Host, C1, C2, DISPATCHER, HOST_IF, NS_PREFIX, VIP};
use crate::fabric::{self, congestion};
use crate::support::sh::{self, cmd};
use crate::support::state;
use crate::support::units::Rate;
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::time::{Duration, Instant};

/// The router in front of the dispatchers.
pub const ROUTER: Host = Host { name: "r", addr: "198.18.0.1" };
/// The etcd host.
pub const ETCD: Host = Host { name: "e", addr: "198.18.0.5" };
/// The dispatcher hosts, in order (`--dispatchers N` uses the first N).
pub const DISPATCHERS: [Host; 2] = [Host { name: "d1", addr: "198.18.0.3" }, Host { name: "d2", addr: "198.18.0.4" }];
/// etcd's client endpoint.
pub const ETCD_URL: &str = "http://198.18.0.5:2379";
/// The clients that reach the VIP through the router.
const CLIENTS: [Host; 2] = [C1, C2];

/// A kind of dispatcher the hosts run: the one-dispatcher lab's config of that kind, with the
/// host's own address for the dispatcher host's (`198.18.0.2`) and `[cluster]` added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// `relay`, `hybrid`, `pg-relay` or `pg-hybrid`.
    pub name: &'static str,
    /// Its client port on the VIP.
    pub port: u16,
    /// Its admin port (on the host's own address).
    pub admin_port: u16,
    base: &'static str,
}

impl Kind {
    /// Whether it serves PostgreSQL.
    pub fn is_pg(&self) -> bool {
        self.name.starts_with("pg-")
    }
}

/// The HTTP cluster's dispatchers (examples/lab/relay.toml, hybrid.toml).
pub const HTTP_KINDS: [Kind; 2] = [
    Kind { name: "relay", port: 8081, admin_port: 8181, base: RELAY_TOML },
    Kind { name: "hybrid", port: 8080, admin_port: 8180, base: HYBRID_TOML },
];

/// The PostgreSQL cluster's dispatchers (examples/lab/pg-relay.toml, pg-hybrid.toml), which
/// forward CancelRequests to each other (`cancel_listen` on port [`CANCEL_PORT`]).
pub const PG_KINDS: [Kind; 2] = [
    Kind { name: "pg-relay", port: 6433, admin_port: 6533, base: crate::pglab::layout::PG_RELAY_TOML },
    Kind { name: "pg-hybrid", port: 6432, admin_port: 6532, base: crate::pglab::layout::PG_HYBRID_TOML },
];

/// `[postgres] pool_size` of the PostgreSQL dispatchers here (20 on the one-dispatcher host).
pub const PG_POOL_SIZE: usize = 40;

/// Each PostgreSQL dispatcher's `cancel_listen` port (relay; hybrid is one more).
pub const CANCEL_PORT: u16 = 6590;

/// The key file of forwarded cancels (`[cluster] peer_key_file`), in the state directory.
const PEER_KEY: &str = "peer.key";

/// One dispatcher process: `d1-relay`, `d2-pg-hybrid`…
#[derive(Debug, Clone)]
pub struct Node {
    /// Its host.
    pub host: Host,
    /// What it is.
    pub kind: Kind,
}

impl Node {
    /// Its name: the log, pid file and `[cluster] node_id`.
    pub fn name(&self) -> String {
        format!("{}-{}", self.host.name, self.kind.name)
    }

    /// Its client port on the VIP.
    pub fn port(&self) -> u16 {
        self.kind.port
    }

    /// Its admin listener (on the host's own address).
    pub fn admin(&self) -> String {
        format!("{}:{}", self.host.addr, self.kind.admin_port)
    }

    /// Its config: the one-dispatcher lab's, on the host's own address, with `[cluster]`.
    pub fn config(&self) -> String {
        let mut text = self.kind.base.replace(&format!("\"{}:", DISPATCHER.addr), &format!("\"{}:", self.host.addr));
        if self.kind.is_pg() {
            // Room for 100 clients' statements at once over two dispatchers and two servers
            // (the cancel check), with an uneven spread: 2 × 2 × 40 connections.
            text = text.replace("pool_size = 20", &format!("pool_size = {PG_POOL_SIZE}"));
        }
        let mut cluster = format!(
            "{text}\n# Added by `refract lab up --dispatchers`: state shared with the other dispatchers.\n\
             [cluster]\netcd = [\"{ETCD_URL}\"]\nnode_id = \"{}\"\nprefix = \"/refract-lab/{}\"\nlease_ttl_s = 2\n",
            self.name(),
            self.kind.name
        );
        if self.kind.is_pg() {
            let port = CANCEL_PORT + u16::from(self.kind.name == "pg-hybrid");
            let key = state::path(PEER_KEY);
            cluster +=
                &format!("cancel_listen = \"{}:{port}\"\npeer_key_file = \"{}\"\n", self.host.addr, key.display());
        }
        cluster
    }
}

/// The dispatcher processes of `n` hosts, of `kinds`.
pub fn nodes_of(n: usize, kinds: &[Kind]) -> Vec<Node> {
    DISPATCHERS[..n.min(DISPATCHERS.len())]
        .iter()
        .flat_map(|h| kinds.iter().map(|k| Node { host: *h, kind: *k }))
        .collect()
}

/// The HTTP dispatcher processes of `n` hosts.
pub fn nodes(n: usize) -> Vec<Node> {
    nodes_of(n, &HTTP_KINDS)
}

/// Brings up (or repairs) `n` dispatcher hosts, the router and etcd on the running lab (its
/// fabric and HTTP cluster must be up), starts etcd and the dispatchers, and routes the
/// clients' VIP traffic through the router.
pub fn up(n: usize, rate: Rate, refract_bin: &Path) -> Result<()> {
    up_kinds(n, &HTTP_KINDS, rate, refract_bin)
}

/// [`up`] with the dispatchers of `kinds` ([`HTTP_KINDS`] or [`PG_KINDS`]).
pub fn up_kinds(n: usize, kinds: &[Kind], rate: Rate, refract_bin: &Path) -> Result<()> {
    if !(1..=DISPATCHERS.len()).contains(&n) {
        bail!("--dispatchers must be 1 to {}", DISPATCHERS.len());
    }
    let cc = congestion::prepare(&congestion::requested(None))?;
    let etcd_fresh = !exists(&ETCD);
    for h in hosts() {
        if !exists(&h) {
            make_host(&h).with_context(|| format!("building {}", h.ns()))?;
            if DISPATCHERS.contains(&h) {
                fabric::prepare_agent_host(&h)?; // the VIP on lo, no ARP for it
            }
        }
        congestion::pin(&h.ns(), &cc)?;
        fabric::set_qdisc(&h.ns(), HOST_IF, rate)?;
        fabric::set_qdisc(fabric::topology::SWITCH_NS, &h.port(), rate)?;
    }
    let router = ROUTER.ns();
    // The 5-tuple read from each packet's headers, as a hardware router hashes it. Not policy
    // 1: for a forwarded packet that already carries an L4 hash, policy 1 takes that hash, and
    // over veth it is the sending socket's random `txhash` (which Linux changes after a
    // retransmission timeout): rf-r would then send a connection wherever that hash says, and
    // move it when it changes. Policy 3 with these fields always reads the headers.
    fabric::sysctl(&router, &["net.ipv4.ip_forward=1", "net.ipv4.fib_multipath_hash_policy=3"])?;
    fabric::sysctl(&router, &["net.ipv4.fib_multipath_hash_fields=0x0037"])?; // src/dst IP, proto, ports
    fabric::sysctl(
        &router,
        &["net.ipv4.conf.all.send_redirects=0", &format!("net.ipv4.conf.{HOST_IF}.send_redirects=0")],
    )?;
    start_etcd(etcd_fresh)?;
    if kinds.iter().any(Kind::is_pg) && state::read(PEER_KEY).is_none() {
        let key: String = (0..32).map(|_| char::from(b'a' + rand::random::<u8>() % 26)).collect();
        crate::cluster::write_private(&state::path(PEER_KEY), &key)?;
    }
    for node in nodes_of(n, kinds) {
        start_node(&node, refract_bin)?;
    }
    route(&DISPATCHERS[..n])?;
    for c in CLIENTS {
        fabric::sysctl(&c.ns(), &["net.ipv4.conf.all.accept_redirects=0"])?;
        fabric::ns_ip(&c.ns(), &["route", "replace", &format!("{VIP}/32"), "via", ROUTER.addr])?;
    }
    wait_ready(&nodes_of(n, kinds))
}

/// The hosts this module adds to the lab.
fn hosts() -> Vec<Host> {
    let mut v = vec![ROUTER, ETCD];
    v.extend(DISPATCHERS);
    v
}

fn exists(h: &Host) -> bool {
    fabric::lab_namespaces().unwrap_or_default().contains(&h.ns())
}

fn make_host(h: &Host) -> Result<()> {
    let ns = h.ns();
    sh::ip(&["netns", "add", &ns])?;
    fabric::ns_ip(&ns, &["link", "set", "lo", "up"])?;
    fabric::quiet_ipv6(&ns);
    fabric::link(h)
}

/// rf-r's route to the VIP: a multipath over `hosts` (one next hop: a plain route).
pub fn route(hosts: &[Host]) -> Result<()> {
    let mut args = vec!["route".to_string(), "replace".into(), format!("{VIP}/32")];
    match hosts {
        [] => bail!("no dispatcher left to route to"),
        [one] => args.extend(["via".into(), one.addr.into()]),
        many => {
            for h in many {
                args.extend(["nexthop".into(), "via".into(), h.addr.into()]);
            }
        }
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    fabric::ns_ip(&ROUTER.ns(), &args).map(drop)
}

/// The next hops of rf-r's route to the VIP now.
pub fn next_hops() -> Vec<String> {
    let out = fabric::ns_ip(&ROUTER.ns(), &["route", "show", &format!("{VIP}/32")]).unwrap_or_default();
    let words: Vec<&str> = out.split_whitespace().collect();
    words.windows(2).filter(|w| w[0] == "via").map(|w| w[1].to_string()).collect()
}

/// The dispatcher host rf-r's hash sends a TCP connection from `client`:`sport` to VIP:`dport`
/// (`ip route get … ipproto tcp sport … dport …`, the kernel's own multipath choice).
pub fn hop_of(client: &Host, sport: u16, dport: u16) -> Option<Host> {
    let (sport, dport) = (sport.to_string(), dport.to_string());
    let args =
        ["route", "get", VIP, "from", client.addr, "iif", HOST_IF, "ipproto", "tcp", "sport", &sport, "dport", &dport];
    let out = fabric::ns_ip(&ROUTER.ns(), &args).ok()?;
    let words: Vec<&str> = out.split_whitespace().collect();
    let via = words.windows(2).find(|w| w[0] == "via").map(|w| w[1])?;
    DISPATCHERS.iter().find(|h| h.addr == via).copied()
}

/// Source ports for `per_hop` connections from `client` to VIP:`dport` through each of the
/// dispatcher hosts rf-r routes to now, searched from port `from` on: `(port, host)`.
pub fn ports_per_hop(client: &Host, dport: u16, per_hop: usize, from: u16) -> Result<Vec<(u16, Host)>> {
    let hops = next_hops();
    let mut picked: Vec<(u16, Host)> = vec![];
    for port in from..from.saturating_add(2000) {
        let Some(h) = hop_of(client, port, dport) else { continue };
        if hops.iter().any(|a| a == h.addr) && picked.iter().filter(|(_, p)| *p == h).count() < per_hop {
            picked.push((port, h));
        }
        if picked.len() == per_hop * hops.len() {
            return Ok(picked);
        }
    }
    bail!("rf-r's hash gave no {per_hop} ports per dispatcher from {} in 2000 tries", client.name)
}

/// Starts etcd in rf-e unless it runs; `fresh`: on an empty data directory (a new lab), else on
/// the data it had when it stopped.
pub fn start_etcd(fresh: bool) -> Result<()> {
    if listening(&ETCD.ns(), "198.18.0.5:2379") {
        return Ok(());
    }
    let dir = state::ensure()?.join("etcd");
    if fresh {
        let _ = std::fs::remove_dir_all(&dir);
    }
    std::fs::create_dir_all(&dir)?;
    let peer = format!("http://{}:2380", ETCD.addr);
    let args = [
        "--name=rf-e".to_string(),
        format!("--data-dir={}", dir.join("data").display()),
        format!("--listen-client-urls={ETCD_URL}"),
        format!("--advertise-client-urls={ETCD_URL}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=rf-e={peer}"),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    crate::pglab::spawn(&ETCD.ns(), "etcd", Path::new("etcd"), &args)?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !listening(&ETCD.ns(), "198.18.0.5:2379") {
        if Instant::now() > deadline {
            bail!("etcd did not listen within 20 s ({})", state::log_tail("etcd.log", 10));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Stops etcd (SIGTERM; its data stays for [`start_etcd`]).
pub fn stop_etcd() {
    fabric::kill_all(&ETCD.ns());
}

fn listening(ns: &str, addr: &str) -> bool {
    !sh::run(cmd(Some(ns), "ss", &["-ltnH", "src", addr])).unwrap_or_default().trim().is_empty()
}

fn start_node(node: &Node, refract_bin: &Path) -> Result<()> {
    if listening(&node.host.ns(), &node.admin()) {
        return Ok(());
    }
    let path = state::write(&format!("{}.toml", node.name()), &node.config())?;
    crate::pglab::spawn(&node.host.ns(), &node.name(), refract_bin, &["dispatch", "--config", &path.to_string_lossy()])
}

/// Waits until every node's client port serves a blob (asked from its own host, where the VIP
/// is its own: its backends are up) and its `/health` says it reached etcd.
fn wait_ready(nodes: &[Node]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    for n in nodes {
        let client = format!("{VIP}:{}", n.port());
        let local = Client::Curl(n.host.ns());
        let serves = || {
            n.kind.is_pg() && listening(&n.host.ns(), &client)
                || local.get(&client, "/blob?bytes=1").is_ok_and(|r| r.status == 200)
        };
        let shares = || local.get(&n.admin(), "/health").is_ok_and(|r| r.body.contains("etcd: up"));
        while !(serves() && shares()) {
            if Instant::now() > deadline {
                let log = format!("{}.log", n.name());
                bail!("{} not ready after 30 s; {log}:\n{}", n.name(), state::log_tail(&log, 20));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

/// Stops the dispatchers of `kinds` on every dispatcher host (SIGTERM, then SIGKILL after 2 s).
pub fn stop_nodes(kinds: &[Kind]) {
    let pids: Vec<u32> = nodes_of(DISPATCHERS.len(), kinds).iter().filter_map(|n| pid_of(&n.name())).collect();
    sh::stop_pids(&pids);
}

/// `lab kill-dispatcher NAME`: kills the dispatchers of host `name` (`d2`) with SIGKILL, as a
/// host failure would, and withdraws its next hop from rf-r's route.
pub fn kill_dispatcher(name: &str) -> Result<()> {
    let short = name.strip_prefix(NS_PREFIX).unwrap_or(name);
    let Some(host) = DISPATCHERS.iter().find(|h| h.name == short) else {
        bail!("unknown dispatcher host {name:?} (d1 or d2)");
    };
    let left: Vec<Host> =
        DISPATCHERS.iter().filter(|h| h.name != short && next_hops().iter().any(|a| a == h.addr)).copied().collect();
    route(&left)?;
    for kind in HTTP_KINDS.iter().chain(&PG_KINDS) {
        if let Some(pid) = pid_of(&Node { host: *host, kind: *kind }.name()) {
            sh::signal(pid, "KILL");
        }
    }
    Ok(())
}

/// Entries in the hash maps (the dispatcher's FREEZE/STEER flows, the agent's tombstones) of
/// the programs on `host`'s ingress, read with `bpftool`; `None` if it cannot tell.
pub fn flow_entries(host: &Host) -> Option<usize> {
    let filters = sh::run(cmd(Some(&host.ns()), "tc", &["filter", "show", "dev", HOST_IF, "ingress"])).ok()?;
    let words: Vec<&str> = filters.split_whitespace().collect();
    let progs: Vec<&str> = words.windows(2).filter(|w| w[0] == "id").map(|w| w[1]).collect();
    let mut total = 0;
    for prog in progs {
        let shown = sh::run(cmd(None, "bpftool", &["prog", "show", "id", prog, "--json"])).ok()?;
        let shown: serde_json::Value = serde_json::from_str(&shown).ok()?;
        for map in shown["map_ids"].as_array()? {
            let id = map.as_u64()?.to_string();
            let info: serde_json::Value =
                serde_json::from_str(&sh::run(cmd(None, "bpftool", &["map", "show", "id", &id, "--json"])).ok()?)
                    .ok()?;
            if info["type"] != "hash" {
                continue;
            }
            let dump: serde_json::Value =
                serde_json::from_str(&sh::run(cmd(None, "bpftool", &["map", "dump", "id", &id, "--json"])).ok()?)
                    .ok()?;
            total += dump.as_array()?.len();
        }
    }
    Some(total)
}

/// The clients reach the VIP on the one-dispatcher host again (routes through rf-r removed);
/// best effort, as the routes may not be there.
pub fn clients_direct() {
    for c in CLIENTS {
        let _ = fabric::ns_ip(&c.ns(), &["route", "del", &format!("{VIP}/32")]);
    }
}

/// Stops the dispatchers and etcd and removes the hosts this module added.
pub fn down() {
    clients_direct();
    let existing = fabric::lab_namespaces().unwrap_or_default();
    for h in hosts() {
        if existing.contains(&h.ns()) {
            fabric::kill_all(&h.ns());
            let _ = sh::ip(&["netns", "del", &h.ns()]);
        }
    }
}

/// Whether the hosts of `--dispatchers` are up.
pub fn is_up() -> bool {
    exists(&ROUTER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_has_its_own_admin_address_and_cluster_identity() {
        let all = nodes(2);
        assert_eq!(all.iter().map(Node::name).collect::<Vec<_>>(), ["d1-relay", "d1-hybrid", "d2-relay", "d2-hybrid"]);
        let pg = nodes_of(2, &PG_KINDS);
        let relay = pg[2].config();
        assert!(
            relay.contains("listen = \"198.18.0.4:6633\"") && relay.contains("admin = \"198.18.0.4:6533\""),
            "{relay}"
        );
        assert!(relay.contains("cancel_listen = \"198.18.0.4:6590\"") && relay.contains("peer_key_file"), "{relay}");
        assert!(relay.contains("pool_size = 40"), "{relay}");
        let settings: Vec<&str> = relay.lines().filter(|l| !l.trim_start().starts_with('#')).collect();
        assert!(
            !settings.iter().any(|l| l.contains("198.18.0.2:")),
            "nothing on the one-dispatcher host's address: {relay}"
        );
        let relay = all[2].config();
        assert!(relay.contains("admin = \"198.18.0.4:8181\""), "{relay}");
        assert!(!relay.contains("198.18.0.2:8181"), "not the one-dispatcher host's admin address");
        assert!(relay.contains("node_id = \"d2-relay\"") && relay.contains("prefix = \"/refract-lab/relay\""));
        let hybrid = all[1].config();
        assert!(hybrid.contains("admin = \"198.18.0.3:8180\"") && hybrid.contains("listen = \"198.18.0.100:8080\""));
        for n in all.iter().chain(&pg) {
            let cfg: toml::Value = toml::from_str(&n.config()).expect("valid TOML");
            assert!(cfg.get("cluster").is_some(), "{}", n.name());
        }
    }

    #[test]
    fn new_hosts_stay_in_the_lab_range() {
        for h in hosts() {
            assert!(h.addr.starts_with("198.18.0.") && h.ns().starts_with("rf-"), "{h:?}");
        }
    }
}
