//! The fabric: namespaces, veth links, the bridge and tbf shaping (`lab up` / `lab down`).
//!
//! Inside: [`topology`] (hosts, namespaces, addresses), [`shaping`] (tbf for a rate),
//! [`congestion`] (TCP congestion control in the namespaces).

pub mod congestion;
pub mod shaping;
pub mod topology;

use crate::support::sh::{self, cmd};
use crate::support::state;
use crate::support::units::Rate;
use anyhow::{Context, Result};
use shaping::Tbf;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};
use topology::{Host, AGENT_HOSTS, BRIDGE, HOSTS, HOST_IF, NS_PREFIX, PREFIX, SWITCH_NS, VIP};

/// State file holding the rate the links are shaped at.
const RATE_FILE: &str = "rate";

/// Build the fabric, or repair it: a complete fabric is kept (only its shaping is re-applied),
/// anything partial is torn down and rebuilt. Returns whether it was rebuilt. The TCP
/// congestion control is the one asked for by `$REFRACT_LAB_CC`, else `cubic` (see
/// [`congestion`]).
pub fn up(rate: Rate) -> Result<bool> {
    up_with(rate, &congestion::requested(None))
}

/// [`up`] with TCP congestion control `cc` in every namespace (allowed on the host for the
/// lab's lifetime if needed; the host's default if the kernel lacks it).
pub fn up_with(rate: Rate, cc: &str) -> Result<bool> {
    let rebuilt = !is_complete();
    if rebuilt {
        down()?;
        build().context("building the lab")?;
    }
    pin_congestion_control(cc)?;
    shape(rate)?;
    // The clients reach the VIP on the dispatcher host unless `lab up --dispatchers` says
    // otherwise (`crate::multi`).
    crate::multi::clients_direct();
    Ok(rebuilt)
}

/// Sets the congestion control in every host namespace (the sockets opened afterwards use it).
fn pin_congestion_control(wanted: &str) -> Result<()> {
    let cc = congestion::prepare(wanted)?;
    for h in HOSTS {
        congestion::pin(&h.ns(), &cc)?;
    }
    Ok(())
}

/// Remove every `rf-*` namespace, killing the processes in it first.
pub fn down() -> Result<()> {
    let namespaces = lab_namespaces()?;
    for ns in &namespaces {
        kill_all(ns);
    }
    for ns in &namespaces {
        sh::ip(&["netns", "del", ns]).with_context(|| format!("removing {ns}"))?;
    }
    let _ = std::fs::remove_file(state::path(RATE_FILE));
    congestion::restore()
}

/// Every existing namespace whose name starts with `rf-`.
pub fn lab_namespaces() -> Result<Vec<String>> {
    let out = sh::ip(&["netns", "list"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(NS_PREFIX))
        .map(str::to_string)
        .collect())
}

/// Kill every process in a namespace: TERM, up to 2 s of grace, then KILL.
pub fn kill_all(ns: &str) {
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut sig = "TERM";
    loop {
        let pids = pids(ns);
        if pids.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            sig = "KILL";
        }
        for pid in &pids {
            sh::signal(*pid, sig);
        }
        if sig == "KILL" && pids.iter().all(|p| !sh::alive(*p)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Live processes in a namespace.
fn pids(ns: &str) -> Vec<u32> {
    let out = sh::ip(&["netns", "pids", ns]).unwrap_or_default();
    out.split_whitespace().filter_map(|p| p.parse().ok()).filter(|p| sh::alive(*p)).collect()
}

/// Whether every namespace, link, address and bridge port is in place.
pub fn is_complete() -> bool {
    let Ok(existing) = lab_namespaces() else {
        return false;
    };
    if !topology::all_namespaces().iter().all(|n| existing.contains(n)) {
        return false;
    }
    let ports = ns_ip(SWITCH_NS, &["-o", "link", "show", "master", BRIDGE]).unwrap_or_default();
    HOSTS.iter().all(|h| host_complete(h, &ports))
}

/// One host: its link is up, carries its addresses, and its port is on the bridge.
fn host_complete(h: &Host, bridge_ports: &str) -> bool {
    let on_bridge = bridge_ports.contains(&format!(" {}@", h.port()));
    let addrs = ns_ip(&h.ns(), &["-o", "-4", "addr", "show", "dev", HOST_IF, "up"]);
    let addrs = addrs.unwrap_or_default();
    let agent_ready = !AGENT_HOSTS.contains(h) || {
        let lo = ns_ip(&h.ns(), &["-o", "-4", "addr", "show", "dev", "lo"]).unwrap_or_default();
        lo.contains(&format!(" {VIP}/32 "))
    };
    on_bridge && agent_ready && h.addrs().iter().all(|a| addrs.contains(&format!(" {a}/{PREFIX} ")))
}

/// `ip -n NS ARGS…`.
pub(crate) fn ns_ip(ns: &str, args: &[&str]) -> Result<String> {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    sh::ip(&all)
}

/// Create everything from nothing.
fn build() -> Result<()> {
    for ns in topology::all_namespaces() {
        sh::ip(&["netns", "add", &ns])?;
        ns_ip(&ns, &["link", "set", "lo", "up"])?;
        quiet_ipv6(&ns);
    }
    ns_ip(SWITCH_NS, &["link", "add", "name", BRIDGE, "type", "bridge"])?;
    ns_ip(SWITCH_NS, &["link", "set", BRIDGE, "up"])?;
    for h in HOSTS {
        link(&h).with_context(|| format!("linking {}", h.ns()))?;
    }
    for h in AGENT_HOSTS {
        prepare_agent_host(&h).with_context(|| format!("preparing {} for its agent", h.ns()))?;
    }
    Ok(())
}

/// What `refract agent` checks on a backend host (LVS-DR): the VIP on `lo`, so the agent can
/// rebuild handed-over sockets on it, and no ARP for it (`arp_ignore = 1`, `arp_announce = 2`
/// on `all` and the NIC), so the switch keeps sending the VIP's traffic to the dispatcher.
pub(crate) fn prepare_agent_host(h: &Host) -> Result<()> {
    let ns = h.ns();
    ns_ip(&ns, &["addr", "add", &format!("{VIP}/32"), "dev", "lo"])?;
    let mut keys = Vec::new();
    for iface in ["all", HOST_IF] {
        keys.push(format!("net.ipv4.conf.{iface}.arp_ignore=1"));
        keys.push(format!("net.ipv4.conf.{iface}.arp_announce=2"));
    }
    sysctl(&ns, &keys.iter().map(String::as_str).collect::<Vec<_>>())
}

/// `sysctl -q -w KEY=VALUE…` in namespace `ns`.
pub(crate) fn sysctl(ns: &str, keys: &[&str]) -> Result<()> {
    let mut args = vec!["-q", "-w"];
    args.extend_from_slice(keys);
    sh::run(cmd(Some(ns), "sysctl", &args)).map(drop)
}

/// Turn IPv6 off in a namespace (best effort): the lab is IPv4 only, and router and multicast
/// listener chatter would otherwise cross the shaped links during measurements.
pub(crate) fn quiet_ipv6(ns: &str) {
    let keys = ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"];
    let mut args = vec!["-q", "-w"];
    args.extend_from_slice(&keys);
    let _ = sh::ok(cmd(Some(ns), "sysctl", &args));
}

/// One host's veth: `eth0` in the host, `p-NAME` on the bridge.
pub(crate) fn link(h: &Host) -> Result<()> {
    let (ns, port) = (h.ns(), h.port());
    ns_ip(SWITCH_NS, &["link", "add", "name", &port, "type", "veth", "peer", "name", HOST_IF, "netns", &ns])?;
    ns_ip(SWITCH_NS, &["link", "set", &port, "master", BRIDGE, "up"])?;
    for a in h.addrs() {
        ns_ip(&ns, &["addr", "add", &format!("{a}/{PREFIX}"), "dev", HOST_IF])?;
    }
    ns_ip(&ns, &["link", "set", HOST_IF, "up"])?;
    Ok(())
}

/// Apply the rate to both ends of every link (`tc qdisc replace`, so it is idempotent).
pub fn shape(rate: Rate) -> Result<()> {
    for h in HOSTS {
        set_qdisc(&h.ns(), HOST_IF, rate)?;
        set_qdisc(SWITCH_NS, &h.port(), rate)?;
    }
    state::write(RATE_FILE, &rate.label())?;
    Ok(())
}

/// The rate the links were last shaped at, if the lab is up.
pub fn current_rate() -> Option<Rate> {
    state::read(RATE_FILE).and_then(|s| Rate::parse(&s).ok())
}

/// Set (or, for no rate, remove) the root qdisc of one interface.
pub(crate) fn set_qdisc(ns: &str, dev: &str, rate: Rate) -> Result<()> {
    match Tbf::for_rate(rate) {
        Some(tbf) => {
            let mut args = vec!["qdisc", "replace", "dev", dev, "root"];
            let tbf_args = tbf.tc_args();
            args.extend(tbf_args.iter().map(String::as_str));
            sh::run(cmd(Some(ns), "tc", &args)).map(drop)
        }
        None => {
            // Deleting a qdisc that is not there fails; that is the state we want anyway.
            let _ = sh::ok(cmd(Some(ns), "tc", &["qdisc", "del", "dev", dev, "root"]));
            Ok(())
        }
    }
}

/// Run a command in a host (`lab exec`), with inherited stdio; returns its exit code.
pub fn exec(host: &str, argv: &[String]) -> Result<i32> {
    let h = topology::host(host).with_context(|| {
        let names: Vec<&str> = HOSTS.iter().map(|h| h.name).collect();
        format!("unknown host {host:?} (one of {})", names.join(", "))
    })?;
    let (program, args) = argv.split_first().context("no command given")?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut c = cmd(Some(&h.ns()), program, &args);
    let status = c.status().with_context(|| format!("cannot run `{}`", sh::show(&c)))?;
    // A command killed by a signal exits like a shell reports it: 128 + the signal number.
    Ok(status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}
