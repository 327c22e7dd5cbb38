//! The lab as a whole: `lab up/down/status` and a guard that brings the lab and its cluster up
//! for a benchmark or the demo and takes down exactly what it brought up.

use crate::cluster::layout::Layout;
use crate::cluster::{self, Running};
use crate::fabric::topology::{HOSTS, VIP};
use crate::fabric::{self, shaping};
use crate::support::state;
use crate::support::units::Rate;
use anyhow::{bail, Result};

/// `lab up`: build or repair the fabric, shape it, optionally start the cluster.
pub fn up(rate: Rate, with_cluster: bool, cc: &str) -> Result<()> {
    require_root()?;
    let rebuilt = fabric::up_with(rate, cc)?;
    eprintln!(
        "lab {}: {} hosts on one switch, {}, TCP congestion control {}",
        if rebuilt { "built" } else { "already up" },
        HOSTS.len(),
        shaping::describe(rate),
        crate::fabric::congestion::describe()
    );
    if with_cluster {
        let layout = Layout::lab()?;
        if !rebuilt && cluster::is_ready(&layout) {
            eprintln!("cluster already running");
        } else {
            cluster::stop(&layout);
            // The daemons outlive this process; `lab down` stops them.
            cluster::start(&layout)?.detach();
            eprintln!("cluster running: {}", describe(&layout));
        }
        eprintln!("logs and pid files: {}", state::dir().display());
    }
    Ok(())
}

/// `lab down`: stop the cluster, remove every `rf-*` namespace.
pub fn down() -> Result<()> {
    require_root()?;
    cluster::stop(&Layout::lab()?);
    fabric::down()?;
    let left = fabric::lab_namespaces()?;
    if !left.is_empty() {
        bail!("namespaces left over: {}", left.join(", "));
    }
    eprintln!("lab removed");
    Ok(())
}

/// `lab status`: what is up.
pub fn status() -> Result<()> {
    let namespaces = fabric::lab_namespaces()?;
    if namespaces.is_empty() {
        println!("lab: down");
        return Ok(());
    }
    let complete = fabric::is_complete();
    let rate = fabric::current_rate().map(|r| r.label()).unwrap_or_else(|| "?".into());
    println!("lab: {} (namespaces: {}), rate {rate}", if complete { "up" } else { "PARTIAL" }, namespaces.join(" "));
    let layout = Layout::lab()?;
    let ready = complete && cluster::is_ready(&layout);
    println!("cluster: {}", if ready { "ready (every listener answers)" } else { "not ready" });
    for p in layout.all_procs() {
        let state = if cluster::is_running(&p.name) { "running" } else { "stopped" };
        println!("  {:<17} {:<6} {:<8} {}", p.name, p.ns.as_deref().unwrap_or("-"), state, what(&layout, &p.name));
    }
    Ok(())
}

/// What a process of the lab's cluster serves, for `lab status`.
fn what(layout: &Layout, name: &str) -> String {
    if let Some(d) = layout.dispatchers.iter().find(|d| d.name == name) {
        let admin = d.config.listen.admin.as_deref().unwrap_or("-");
        let standby = if layout.starts_with_cluster(d) { "" } else { "; started by `refract bench` for its target" };
        return format!("{} (target `{}`, {}, admin {admin}{standby})", d.addr(), d.target, d.source);
    }
    if let Some(a) = layout.agents.iter().find(|a| a.name == name) {
        return format!("control {}", a.control);
    }
    if name == "haproxy" {
        return layout.haproxy.clone().unwrap_or_default();
    }
    layout.backends.iter().find(|(n, _)| n == name).map(|(_, a)| format!("blob server {a}")).unwrap_or_default()
}

fn describe(layout: &Layout) -> String {
    let backends: Vec<String> = layout.backends.iter().map(|(n, a)| format!("{n} {a}")).collect();
    let agents: Vec<String> = layout.agents.iter().map(|a| format!("{} {}", a.name, a.control)).collect();
    let dispatchers = layout.dispatchers.iter().filter(|d| layout.starts_with_cluster(d));
    let dispatchers: Vec<String> = dispatchers.map(|d| format!("{} {}", d.name, d.addr())).collect();
    format!(
        "{}; {}; {} (VIP {VIP}); haproxy {}",
        backends.join(", "),
        agents.join(", "),
        dispatchers.join(", "),
        layout.haproxy.as_deref().unwrap_or("-")
    )
}

/// Fail early with a clear message when not root.
pub fn require_root() -> Result<()> {
    if !crate::support::sh::is_root() {
        bail!("the lab needs root (network namespaces, veth, tc); run with sudo");
    }
    Ok(())
}

/// The lab with its cluster, for one benchmark or demo; dropping it undoes what it did.
pub struct LabGuard {
    /// The cluster's layout.
    pub layout: Layout,
    built_fabric: bool,
    running: Option<Running>,
    restore_rate: Option<Rate>,
}

impl LabGuard {
    /// Bring the lab and its cluster up as needed, shaped at `rate`.
    pub fn ensure(rate: Rate) -> Result<Self> {
        require_root()?;
        let layout = Layout::lab()?;
        let had_fabric = fabric::is_complete();
        let had_cluster = had_fabric && cluster::is_ready(&layout);
        let previous = fabric::current_rate();
        let restore_rate = previous.filter(|p| had_fabric && *p != rate);
        let mut guard = LabGuard { layout, built_fabric: !had_fabric, running: None, restore_rate };
        if had_cluster {
            fabric::shape(rate)?;
            eprintln!("using the running lab ({})", shaping::describe(rate));
            return Ok(guard);
        }
        eprintln!("bringing the lab up ({})…", shaping::describe(rate));
        fabric::up(rate)?;
        cluster::stop(&guard.layout);
        guard.running = Some(cluster::start(&guard.layout)?);
        Ok(guard)
    }
}

impl LabGuard {
    /// Whether dropping the guard will take anything down (it brought something up).
    pub fn owns_anything(&self) -> bool {
        self.built_fabric || self.running.is_some()
    }
}

impl Drop for LabGuard {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            drop(running);
            cluster::stop(&self.layout);
        }
        if self.built_fabric {
            if let Err(e) = fabric::down() {
                eprintln!("warning: tearing the lab down: {e:#}");
            }
        } else if let Some(rate) = self.restore_rate {
            let _ = fabric::shape(rate);
        }
    }
}
