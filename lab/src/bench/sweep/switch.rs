//! `Switch`: runs, of the lab's dispatchers that steer (hybrid, handover), the one a target
//! needs, and tallies the hand-over figures of every hand-over dispatcher over a run.
//!
//! Why one at a time: a run measures one target, and both steer from rf-d's eth0 ingress. Their
//! programs could share the interface (each passes a flow it has no entry for on to the next
//! filter), but the hand-over figures read from `/metrics` must be the measured target's only. A
//! dispatcher attaches its program on its first hand-over and never detaches it, so before
//! starting one the Switch removes the filters its predecessor left.

use crate::bench::sweep::handover_stats::HandoverStats;
use crate::cluster::http_client::Client;
use crate::cluster::layout::{Dispatcher, Layout};
use crate::cluster::{self, Running};
use crate::support::sh;
use anyhow::{Context, Result};
use std::collections::BTreeMap;

/// The steering dispatchers of one run, and their hand-over figures.
pub struct Switch {
    client: Client,
    /// Dispatchers this Switch started (stopped and reaped here, or detached at the end).
    started: Vec<(String, Running)>,
    /// Per target: the scrape its running process started the run with.
    baseline: BTreeMap<String, HandoverStats>,
    /// Per target: hand-over figures over the run, summed over its processes.
    totals: BTreeMap<String, HandoverStats>,
}

impl Switch {
    /// Note what the hand-over dispatchers that already run have counted so far.
    pub fn new(layout: &Layout) -> Self {
        let mut s =
            Switch { client: layout.client(), started: Vec::new(), baseline: BTreeMap::new(), totals: BTreeMap::new() };
        for d in hand_over(layout).filter(|d| cluster::is_running(d.name)) {
            if let Some(scrape) = s.scrape(d) {
                s.baseline.insert(d.target.to_string(), scrape);
            }
        }
        s
    }

    /// Make sure the dispatcher serving `target` runs, stopping the steering one it replaces
    /// (a no-op for any other target).
    pub fn activate(&mut self, layout: &Layout, target: &str) -> Result<()> {
        let Some(d) = layout.dispatcher(target).filter(|d| d.config.steers()) else {
            return Ok(());
        };
        if cluster::is_running(d.name) {
            return Ok(());
        }
        for other in layout.dispatchers.iter().filter(|o| o.config.steers() && o.name != d.name) {
            self.retire(other);
        }
        clear_filters(layout, d)?;
        let mut running = cluster::spawn_all(vec![layout.proc_of(d)])?;
        cluster::wait_for(&self.client, &mut running, cluster::dispatcher_probes(d))
            .with_context(|| format!("starting {} for target {target}", d.name))?;
        // The readiness probe went through it: count from here.
        let scrape = self.scrape(d).unwrap_or_default();
        self.baseline.insert(d.target.to_string(), scrape);
        self.started.push((d.name.to_string(), running));
        Ok(())
    }

    /// Tally a dispatcher and stop it, if it runs.
    fn retire(&mut self, d: &Dispatcher) {
        if !cluster::is_running(d.name) {
            return;
        }
        self.tally(d);
        match self.started.iter().position(|(n, _)| n == d.name) {
            // Dropping the handle stops and reaps it.
            Some(i) => drop(self.started.remove(i)),
            None => {
                cluster::stop_one(d.name);
            }
        }
    }

    /// Add what `d` counted since its baseline to the totals.
    fn tally(&mut self, d: &Dispatcher) {
        let Some(now) = self.scrape(d) else {
            eprintln!("warning: no /metrics from {}: its hand-over figures are missing", d.name);
            return;
        };
        let base = self.baseline.remove(d.target).unwrap_or_default();
        self.totals.entry(d.target.to_string()).or_default().add(&now.since(&base));
    }

    fn scrape(&self, d: &Dispatcher) -> Option<HandoverStats> {
        let admin = d.config.listen.admin.as_deref()?;
        let r = self.client.get(admin, "/metrics").ok().filter(|r| r.status == 200)?;
        Some(HandoverStats::parse(&r.body))
    }

    /// Put the cluster back as it starts (the first steering dispatcher running), tally every
    /// hand-over dispatcher, and leave the processes running; the figures per target.
    pub fn finish(mut self, layout: &Layout) -> Result<BTreeMap<String, HandoverStats>> {
        if let Some(first) = layout.dispatchers.iter().find(|d| d.config.steers()) {
            self.activate(layout, first.target)?;
        }
        for d in hand_over(layout).filter(|d| cluster::is_running(d.name)) {
            self.tally(d);
        }
        for (_, running) in self.started.drain(..) {
            running.detach();
        }
        Ok(std::mem::take(&mut self.totals))
    }
}

/// The dispatchers that hand connections over.
fn hand_over(layout: &Layout) -> impl Iterator<Item = &Dispatcher> {
    layout.dispatchers.iter().filter(|d| d.config.hands_over())
}

/// Remove the tc ingress filters left on `d`'s steering interface (lab only).
fn clear_filters(layout: &Layout, d: &Dispatcher) -> Result<()> {
    let (Some(ns), Some(iface)) = (layout.proc_of(d).ns, d.config.handover.as_ref().and_then(|h| h.interface.clone()))
    else {
        return Ok(());
    };
    let shown = sh::run(sh::cmd(Some(&ns), "tc", &["filter", "show", "dev", &iface, "ingress"]))?;
    if !shown.trim().is_empty() {
        sh::run(sh::cmd(Some(&ns), "tc", &["filter", "del", "dev", &iface, "ingress"]))?;
    }
    Ok(())
}
