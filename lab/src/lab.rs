//! The lab as a whole: `lab up/down/status` (with the HTTP cluster or the PostgreSQL one) and a
//! guard that brings the lab and its HTTP cluster up for a benchmark or the demo and takes down
//! exactly what it brought up.

use crate::cluster::layout::Layout;
use crate::cluster::{self, Running};
use crate::fabric::topology::{HOSTS, VIP};
use crate::fabric::{self, shaping};
use crate::pglab;
use crate::support::state;
use crate::support::units::Rate;
use anyhow::{bail, Context, Result};
use std::path::Path;

/// Which cluster `lab up --cluster` starts (`--db`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Db {
    /// Blob servers with their agents, refract (HTTP) and HAProxy.
    #[default]
    Http,
    /// A PostgreSQL primary and streaming replica, refract (PostgreSQL) and PgBouncer.
    Postgres,
}

/// `lab up`: build or repair the fabric, shape it, optionally start a cluster.
pub fn up(rate: Rate, cluster: Option<Db>, cc: &str) -> Result<()> {
    let exe = std::env::current_exe().context("locating the refract binary")?;
    up_with(rate, cluster, cc, &exe)
}

/// [`up`] with `refract_bin` as the dispatchers' binary (tests run this library, not refract).
/// One cluster runs at a time: starting one stops the other.
pub fn up_with(rate: Rate, cluster: Option<Db>, cc: &str, refract_bin: &Path) -> Result<()> {
    require_root()?;
    let rebuilt = fabric::up_with(rate, cc)?;
    eprintln!(
        "lab {}: {} hosts on one switch, {}, TCP congestion control {}",
        if rebuilt { "built" } else { "already up" },
        HOSTS.len(),
        shaping::describe(rate),
        crate::fabric::congestion::describe()
    );
    match cluster {
        None => return Ok(()),
        Some(Db::Http) => up_http(rebuilt, refract_bin)?,
        Some(Db::Postgres) => up_postgres(rebuilt, refract_bin)?,
    }
    eprintln!("logs and pid files: {}", state::dir().display());
    Ok(())
}

fn up_http(rebuilt: bool, refract_bin: &Path) -> Result<()> {
    let layout = Layout::lab()?;
    if !rebuilt && cluster::is_ready(&layout) {
        eprintln!("cluster already running");
        return Ok(());
    }
    pglab::stop();
    cluster::stop(&layout);
    // The daemons outlive this process; `lab down` stops them.
    cluster::start_with(&layout, refract_bin)?.detach();
    eprintln!("cluster running: {}", describe(&layout));
    Ok(())
}

fn up_postgres(rebuilt: bool, refract_bin: &Path) -> Result<()> {
    if !rebuilt && pglab::is_ready() {
        eprintln!("PostgreSQL cluster already running");
        return Ok(());
    }
    // `cluster::stop` kills whatever runs in the HTTP cluster's namespaces: the PostgreSQL
    // servers are stopped properly first (`pglab::start` begins with that).
    pglab::stop();
    cluster::stop(&Layout::lab()?);
    pglab::start(refract_bin)?;
    eprintln!("PostgreSQL cluster running:");
    for line in pglab::status_lines() {
        eprintln!("{line}");
    }
    Ok(())
}

/// `lab up --cluster --dispatchers N`: the hosts, router, etcd and dispatchers of
/// [`crate::multi`] on the running lab, the clients routed through the router.
pub fn up_dispatchers(n: usize, db: Db, rate: Rate, refract_bin: &Path) -> Result<()> {
    let kinds: &[crate::multi::Kind] = match db {
        Db::Http => &crate::multi::HTTP_KINDS,
        Db::Postgres => &crate::multi::PG_KINDS,
    };
    crate::multi::up_kinds(n, kinds, rate, refract_bin)?;
    let names: Vec<String> =
        crate::multi::nodes_of(n, kinds).iter().map(|d| format!("{} (admin {})", d.name(), d.admin())).collect();
    eprintln!(
        "{n} dispatcher host(s) behind {VIP} through rf-r (ECMP over {}): {}; etcd {}",
        crate::multi::next_hops().join(", "),
        names.join(", "),
        crate::multi::ETCD_URL
    );
    Ok(())
}

/// `lab down`: stop the cluster, remove every `rf-*` namespace.
pub fn down() -> Result<()> {
    require_root()?;
    pglab::stop();
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
    print!("{}", status_text()?);
    Ok(())
}

/// What `lab status` prints: the fabric, then each cluster's processes (running or stopped).
pub fn status_text() -> Result<String> {
    let namespaces = fabric::lab_namespaces()?;
    if namespaces.is_empty() {
        return Ok("lab: down\n".into());
    }
    let complete = fabric::is_complete();
    let rate = fabric::current_rate().map(|r| r.label()).unwrap_or_else(|| "?".into());
    let state = if complete { "up" } else { "PARTIAL" };
    let mut out = format!("lab: {state} (namespaces: {}), rate {rate}\n", namespaces.join(" "));
    let layout = Layout::lab()?;
    let ready = complete && cluster::is_ready(&layout);
    out += &format!("cluster: {}\n", if ready { "ready (every listener answers)" } else { "not ready" });
    for p in layout.all_procs() {
        let state = if cluster::is_running(&p.name) { "running" } else { "stopped" };
        out += &format!(
            "  {:<17} {:<6} {:<8} {}\n",
            p.name,
            p.ns.as_deref().unwrap_or("-"),
            state,
            what(&layout, &p.name)
        );
    }
    let ready = match pglab::any_running() {
        false => "not running",
        true if complete && pglab::is_ready() => "ready (every listener answers, the replica streams)",
        true => "not ready",
    };
    out += &format!("postgres cluster (`lab up --cluster --db postgres`): {ready}\n");
    out += &format!("  {:<17} {:<6} {:<8} {:<8} what\n", "process", "netns", "state", "pid");
    for line in pglab::status_lines() {
        out += &line;
        out.push('\n');
    }
    Ok(out)
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
        pglab::stop();
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

    /// Whether the HTTP cluster is the guard's own (it started it), not one it found running.
    pub fn owns_cluster(&self) -> bool {
        self.running.is_some()
    }

    /// Stop the HTTP cluster the guard started, keeping the fabric (the PostgreSQL cluster
    /// then takes its place: one cluster runs at a time); one it found running is left alone.
    pub fn stop_cluster(&mut self) {
        if let Some(running) = self.running.take() {
            drop(running);
            cluster::stop(&self.layout);
        }
    }
}

impl Drop for LabGuard {
    fn drop(&mut self) {
        self.stop_cluster();
        if self.built_fabric {
            if let Err(e) = fabric::down() {
                eprintln!("warning: tearing the lab down: {e:#}");
            }
        } else if let Some(rate) = self.restore_rate {
            let _ = fabric::shape(rate);
        }
    }
}
