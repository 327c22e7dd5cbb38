//! `refract bench overload`: measure the capacity, sweep offered load from well below to well
//! above it for every target, then the slow-replica and retrying-client scenarios; write
//! `docs/overload.md` (section `full` or `quick`) and its plots. Progress goes to stderr.

use crate::bench::loadgen::summary::{self, Summary};
use crate::bench::loadgen::{self, Spec};
use crate::bench::overload::args::OverloadOptions;
use crate::bench::overload::report;
use crate::bench::overload::results::{share, CapacityRun, OverloadResults, Point, ScenarioRun};
use crate::bench::overload::rig::Rig;
use crate::fabric::topology::{C1, C2};
use crate::fabric::{self, shaping};
use crate::lab;
use crate::report::environment::Environment;
use crate::support::interrupt;
use crate::support::units::Rate;
use anyhow::{bail, Result};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Run everything and write the report.
pub fn run(o: &OverloadOptions) -> Result<()> {
    interrupt::install();
    lab::require_root()?;
    let fabric = FabricGuard::ensure(o.rate)?;
    let links = fabric::current_rate().map(shaping::describe).unwrap_or_else(|| "unknown".into());
    let env = Environment::detect();
    let mut rig = Rig::new();
    let results = measure(&mut rig, o);
    drop(rig);
    drop(fabric);
    let results = results?;
    report::write(o, &env, &links, &results)
}

/// Capacity, sweep, slow replica, retries, with the rig's processes.
fn measure(rig: &mut Rig, o: &OverloadOptions) -> Result<OverloadResults> {
    let mut res = OverloadResults::default();
    let steps = 1 + o.targets.len() * (o.levels.len() + 2);
    let mut progress = Progress::new(steps, o);
    rig.start_blobs(o.capacity, None)?;
    res.capacity = capacity(rig, o)?;
    let cap = res.capacity.total();
    progress.step(&format!("capacity: {cap:.0} req/s ({})", per_backend(&res.capacity)));
    if cap < 1.0 {
        bail!("the blob servers answered nothing in the capacity run");
    }
    sweep(rig, o, cap, &mut res, &mut progress)?;
    let slow = Load {
        rate: cap * o.slow_level,
        timeout_ms: o.timeout_ms,
        retry: false,
        duration: o.slow_duration,
        slow: Some(o.slow_delay_ms),
    };
    for t in ok_targets(o, &res) {
        let r = scenario(rig, o, &t, cap, &slow)?;
        progress.step(&format!("slow replica, {t}: {}, b2 answered {:.0} %", describe(&r.summary), share(&r, "b2")));
        res.slow.push(r);
    }
    let retry = Load {
        rate: cap * o.retry_level,
        timeout_ms: o.retry_timeout_ms,
        retry: true,
        duration: o.duration,
        slow: None,
    };
    for t in ok_targets(o, &res) {
        let r = scenario(rig, o, &t, cap, &retry)?;
        progress.step(&format!("retrying clients, {t}: {}", describe(&r.summary)));
        res.retry.push(r);
    }
    rig.stop_target();
    Ok(res)
}

/// The sweep: each target at each load; a target that will not start is reported, not fatal.
fn sweep(rig: &mut Rig, o: &OverloadOptions, cap: f64, res: &mut OverloadResults, p: &mut Progress) -> Result<()> {
    for target in &o.targets {
        // Fresh blob servers for every target: nothing left queued by the one before.
        rig.stop_target();
        rig.start_blobs(o.capacity, None)?;
        let addr = match start(rig, o, target, cap) {
            Ok(a) => a,
            Err(e) => {
                interrupt::check()?;
                let reason = format!("{e:#}");
                p.skip(o.levels.len() + 2, &format!("{target}: FAILED to start: {}", first_line(&reason)));
                res.failed.push((target.clone(), reason));
                continue;
            }
        };
        for (i, &level) in o.levels.iter().enumerate() {
            let spec = spec(o, addr, cap * level, o.timeout_ms, false, o.duration, i as u64 + 1);
            let s = open_run(&spec)?.0;
            p.step(&format!("{target} {level}× ({:.0} req/s): {}", cap * level, describe(&s)));
            res.sweep.push(Point { target: target.clone(), level, rate: cap * level, summary: s });
            rig.drain(o.capacity.delay_ms)?;
        }
    }
    Ok(())
}

/// Start a target and warm it up at half the capacity.
fn start(rig: &mut Rig, o: &OverloadOptions, target: &str, cap: f64) -> Result<SocketAddr> {
    let addr: SocketAddr = rig.start_target(target, &o.settings)?.parse()?;
    if !o.warmup.is_zero() {
        open_run(&spec(o, addr, cap * 0.5, o.timeout_ms, false, o.warmup, 99))?;
    }
    Ok(addr)
}

/// Targets that started in the sweep.
fn ok_targets(o: &OverloadOptions, res: &OverloadResults) -> Vec<String> {
    o.targets.iter().filter(|t| !res.failed.iter().any(|(f, _)| f == *t)).cloned().collect()
}

/// The load of a scenario.
struct Load {
    rate: f64,
    timeout_ms: u64,
    retry: bool,
    duration: Duration,
    /// b2's delay, when it is the slow replica.
    slow: Option<u64>,
}

/// One scenario run of a target (blob servers and target started afresh, the target warmed up
/// at half the capacity).
fn scenario(rig: &mut Rig, o: &OverloadOptions, target: &str, cap: f64, load: &Load) -> Result<ScenarioRun> {
    rig.stop_target();
    rig.start_blobs(o.capacity, load.slow.map(|d| ("b2", d)))?;
    let addr = start(rig, o, target, cap)?;
    let spec = spec(o, addr, load.rate, load.timeout_ms, load.retry, load.duration, 42);
    let (summary, out) = open_run(&spec)?;
    let timeline = summary::timeline(&out.records, 1.0);
    let served = rig.reads();
    Ok(ScenarioRun { target: target.to_string(), rate: load.rate, summary, timeline, served })
}

fn spec(
    o: &OverloadOptions,
    target: SocketAddr,
    rate: f64,
    timeout_ms: u64,
    retry: bool,
    d: Duration,
    seed: u64,
) -> Spec {
    Spec { target, rate, duration: d, timeout_ms, max_conns: o.max_conns, bytes: o.bytes, seed, retry, closed: 0 }
}

/// One open-loop run from c1.
fn open_run(spec: &Spec) -> Result<(Summary, loadgen::Output)> {
    interrupt::check()?;
    let mut outs = loadgen::run_parallel(&[(Some(&C1.ns()), spec.clone())])?;
    let out = outs.pop().unwrap_or_default();
    Ok((Summary::of(&out.records, out.duration_s), out))
}

/// Closed loop straight to each blob server (c1 → b1, c2 → b2 at once), 4 workers per slot.
fn capacity(rig: &Rig, o: &OverloadOptions) -> Result<CapacityRun> {
    interrupt::check()?;
    let workers = o.capacity.concurrency.max(1) * 4;
    let (ns1, ns2) = (C1.ns(), C2.ns());
    let runs: Vec<(Option<&str>, Spec)> = rig
        .backends
        .iter()
        .zip([ns1.as_str(), ns2.as_str()])
        .map(|((_, addr), ns)| {
            let addr: SocketAddr = addr.parse()?;
            let mut s = spec(o, addr, 0.0, 5000, false, o.capacity_duration, 1);
            s.closed = workers;
            Ok((Some(ns), s))
        })
        .collect::<Result<_>>()?;
    let outs = loadgen::run_parallel(&runs)?;
    let per_backend = rig
        .backends
        .iter()
        .zip(outs)
        .map(|((name, _), out)| (name.clone(), Summary::of(&out.records, out.duration_s).goodput))
        .collect();
    Ok(CapacityRun { per_backend, workers, duration_s: o.capacity_duration.as_secs_f64() })
}

fn per_backend(c: &CapacityRun) -> String {
    c.per_backend.iter().map(|(n, r)| format!("{n} {r:.0}")).collect::<Vec<_>>().join(", ")
}

/// One progress note about a run.
pub fn describe(s: &Summary) -> String {
    let ms = |v: Option<f64>| v.map(|v| format!("{v:.1} ms")).unwrap_or_else(|| "–".into());
    let pct = |n: u64| if s.sent == 0 { 0.0 } else { 100.0 * n as f64 / s.sent as f64 };
    format!(
        "goodput {:.0}/s, p50 {}, p99 {}, refused {:.1} % (p99 {}), timeouts {:.1} %, errors {:.1} %",
        s.goodput,
        ms(s.p50_ms),
        ms(s.p99_ms),
        pct(s.refused),
        ms(s.refused_p99_ms),
        pct(s.timeouts),
        pct(s.errors)
    )
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

/// The fabric for the run: built if absent (and removed after), reshaped if asked (and the
/// old rate restored after). The lab's own cluster is never touched.
struct FabricGuard {
    built: bool,
    restore: Option<Rate>,
}

impl FabricGuard {
    fn ensure(rate: Option<Rate>) -> Result<Self> {
        if !fabric::is_complete() {
            let rate = rate.unwrap_or(Rate::BitsPerSec(1_000_000_000));
            eprintln!("bringing the lab's fabric up ({})…", shaping::describe(rate));
            fabric::up(rate)?;
            return Ok(FabricGuard { built: true, restore: None });
        }
        let previous = fabric::current_rate();
        let restore = match rate {
            Some(r) if previous != Some(r) => {
                fabric::shape(r)?;
                previous
            }
            _ => None,
        };
        Ok(FabricGuard { built: false, restore })
    }
}

impl Drop for FabricGuard {
    fn drop(&mut self) {
        if self.built {
            if let Err(e) = fabric::down() {
                eprintln!("warning: tearing the lab down: {e:#}");
            }
        } else if let Some(r) = self.restore {
            let _ = fabric::shape(r);
        }
    }
}

/// Progress lines with an ETA.
struct Progress {
    total: usize,
    done: usize,
    started: Instant,
    per_step: Duration,
}

impl Progress {
    fn new(total: usize, o: &OverloadOptions) -> Self {
        let per_step = o.duration + o.warmup / 2 + Duration::from_millis(800);
        let s = per_step * total as u32 + o.slow_duration * o.targets.len() as u32;
        eprintln!("overload: {total} steps, about {}s", s.as_secs());
        Progress { total, done: 0, started: Instant::now(), per_step }
    }

    fn step(&mut self, note: &str) {
        self.done += 1;
        let per = if self.done < 3 { self.per_step } else { self.started.elapsed() / self.done as u32 };
        let left = per * (self.total - self.done.min(self.total)) as u32;
        eprintln!("[{:>2}/{}] {note}  (ETA {}s)", self.done, self.total, left.as_secs());
    }

    fn skip(&mut self, n: usize, note: &str) {
        self.done += n.saturating_sub(1);
        self.step(note);
    }
}
