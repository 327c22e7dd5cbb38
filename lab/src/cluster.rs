//! Starting and stopping a cluster (blob servers, agents, the refract dispatchers, HAProxy) as
//! daemons: own process group (a Ctrl-C at the terminal does not reach them), logs and pid files
//! in the state directory, and a readiness wait that probes every listener (through the data
//! path where there is one).
//!
//! Inside: [`layout`] (where a cluster's processes live), [`dispatch_config`] and [`haproxy`]
//! (the dispatcher's config read, HAProxy's mirrored), [`http_client`] (the probes' client).

pub mod dispatch_config;
pub mod haproxy;
pub mod http_client;
pub mod layout;

use crate::fabric;
use crate::support::{interrupt, sh, state};
use anyhow::{bail, Context, Result};
use haproxy::HaproxySpec;
use http_client::Client;
use layout::{Layout, Proc};
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// How long the cluster may take to accept on every listener.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A running cluster's processes, as started by this process.
pub struct Running {
    children: Vec<(Proc, Child)>,
}

/// Write the configs and start every process, then wait until every listener answers.
pub fn start(layout: &Layout) -> Result<Running> {
    start_with(layout, &std::env::current_exe().context("locating the refract binary")?)
}

/// [`start`] with `refract_bin` as the binary of refract's processes (tests run this library,
/// not refract).
pub fn start_with(layout: &Layout, refract_bin: &std::path::Path) -> Result<Running> {
    write_configs(layout)?;
    // On any error below, dropping `running` stops what was already started.
    let mut running = Running { children: Vec::new() };
    for p in layout.procs() {
        let child = spawn(&p, refract_bin)?;
        running.children.push((p, child));
    }
    wait_ready(layout, &mut running)?;
    Ok(running)
}

/// Every config into the state directory (`NAME.toml`, `haproxy.cfg`), and the agents' control
/// key into the file the hand-over dispatchers name (`[handover] key_file`, owner-only).
fn write_configs(layout: &Layout) -> Result<()> {
    for d in &layout.dispatchers {
        state::write(&format!("{}.toml", d.name), &d.config_text)?;
    }
    for a in &layout.agents {
        state::write(&format!("{}.toml", a.name), &a.config_text)?;
    }
    state::write("haproxy.cfg", &haproxy_config(layout)?)?;
    let key = layout.agents.first().map(|a| a.key.as_str());
    let files = layout.dispatchers.iter().filter_map(|d| d.config.handover.as_ref()?.key_file.as_deref());
    for (file, key) in files.filter_map(|f| Some((f, key?))) {
        write_private(std::path::Path::new(file), key)?;
    }
    Ok(())
}

/// Write a file only its owner may read.
pub(crate) fn write_private(path: &std::path::Path, text: &str) -> Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    std::io::Write::write_all(&mut f, text.as_bytes()).with_context(|| format!("cannot write {}", path.display()))
}

/// The HAProxy config for a layout (its text goes into the benchmark report too).
pub fn haproxy_config(layout: &Layout) -> Result<String> {
    let bind = layout.haproxy.clone().unwrap_or_else(|| "127.0.0.1:8090".into());
    Ok(HaproxySpec::mirror(layout.config(), &bind)?.render())
}

/// Start one daemon, its output going to `NAME.log`, its pid to `NAME.pid`.
fn spawn(p: &Proc, refract_bin: &std::path::Path) -> Result<Child> {
    let program = if p.haproxy { haproxy::BINARY.to_string() } else { refract_bin.to_string_lossy().into_owned() };
    let args: Vec<&str> = p.args.iter().map(String::as_str).collect();
    let mut c = sh::cmd(p.ns.as_deref(), &program, &args);
    let log = File::create(state::path(&format!("{}.log", p.name)))?;
    c.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).env("RUST_LOG", "warn").process_group(0);
    let child = c.spawn().with_context(|| format!("cannot start `{}`", sh::show(&c)))?;
    state::write(&format!("{}.pid", p.name), &child.id().to_string())?;
    Ok(child)
}

/// A readiness probe.
#[derive(Debug, Clone)]
pub enum Probe {
    /// `GET http://ADDR/PATH` must answer 200.
    Http {
        /// What it checks, for the error message.
        what: String,
        /// `IP:PORT`.
        addr: String,
        /// The path.
        path: &'static str,
    },
    /// Something listens on `addr` in `ns` (the agents' control port speaks no HTTP).
    Listen {
        /// What it checks.
        what: String,
        /// The namespace.
        ns: String,
        /// `IP:PORT`.
        addr: String,
    },
}

impl Probe {
    fn what(&self) -> &str {
        match self {
            Probe::Http { what, .. } | Probe::Listen { what, .. } => what,
        }
    }

    /// Whether it passes right now.
    pub fn passes(&self, client: &Client) -> bool {
        match self {
            Probe::Http { addr, path, .. } => probe(client, addr, path),
            Probe::Listen { ns, addr, .. } => {
                let out = sh::run(sh::cmd(Some(ns), "ss", &["-ltnH", "src", addr])).unwrap_or_default();
                !out.trim().is_empty()
            }
        }
    }
}

/// The probes for one dispatcher: its client port through the data path, its admin port.
pub fn dispatcher_probes(d: &crate::cluster::layout::Dispatcher) -> Vec<Probe> {
    let mut v = vec![Probe::Http { what: d.name.to_string(), addr: d.addr().to_string(), path: "/blob?bytes=1" }];
    if let Some(admin) = &d.config.listen.admin {
        v.push(Probe::Http { what: format!("{} admin", d.name), addr: admin.clone(), path: "/metrics" });
    }
    v
}

/// The readiness probes of everything [`Layout::procs`] starts.
fn probes(layout: &Layout) -> Vec<Probe> {
    let mut v: Vec<Probe> = layout
        .backends
        .iter()
        .map(|(name, addr)| Probe::Http { what: format!("blob server {name}"), addr: addr.clone(), path: "/stats" })
        .collect();
    v.extend(layout.agents.iter().map(|a| Probe::Listen {
        what: a.name.clone(),
        ns: a.ns.clone(),
        addr: a.control.clone(),
    }));
    for d in layout.dispatchers.iter().filter(|d| layout.starts_with_cluster(d)) {
        v.extend(dispatcher_probes(d));
    }
    if let Some(h) = &layout.haproxy {
        v.push(Probe::Http { what: "haproxy".into(), addr: h.clone(), path: "/blob?bytes=1" });
    }
    v
}

/// Whether every listener of the layout answers right now.
pub fn is_ready(layout: &Layout) -> bool {
    let client = layout.client();
    probes(layout).iter().all(|p| p.passes(&client))
}

fn probe(client: &Client, addr: &str, path: &str) -> bool {
    client.get(addr, path).map(|r| r.status == 200).unwrap_or(false)
}

/// Poll the probes until all pass; fail early if a process dies.
fn wait_ready(layout: &Layout, running: &mut Running) -> Result<()> {
    wait_for(&layout.client(), running, probes(layout))
}

/// Poll `probes` until all pass; fail early if one of `running` dies.
pub fn wait_for(client: &Client, running: &mut Running, mut pending: Vec<Probe>) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    while !pending.is_empty() {
        interrupt::check()?;
        running.check_alive()?;
        pending.retain(|p| !p.passes(client));
        if Instant::now() > deadline {
            let names: Vec<&str> = pending.iter().map(Probe::what).collect();
            bail!("not answering after {READY_TIMEOUT:?}: {} (logs in {})", names.join(", "), state::dir().display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Start processes as daemons, as [`start`] does but without configs or readiness probes;
/// dropping the handle stops them (the overload bench starts its own rig this way).
pub fn spawn_all(procs: Vec<Proc>) -> Result<Running> {
    let exe = std::env::current_exe().context("locating the refract binary")?;
    let mut running = Running { children: Vec::new() };
    for p in procs {
        let child = spawn(&p, &exe)?;
        running.children.push((p, child));
    }
    Ok(running)
}

impl Running {
    /// Fail with the log's tail if a process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        for (p, child) in &mut self.children {
            if let Some(status) = child.try_wait()? {
                let log = format!("{}.log", p.name);
                bail!("{} exited ({status}); {log}:\n{}", p.name, state::log_tail(&log, 20));
            }
        }
        Ok(())
    }

    /// Let the processes outlive this handle (`lab up --cluster`; `lab down` stops them).
    pub fn detach(mut self) {
        self.children.clear();
    }
}

impl Drop for Running {
    /// Stop the processes this handle started and reap them.
    fn drop(&mut self) {
        sh::stop_pids(&self.children.iter().map(|(_, c)| c.id()).collect::<Vec<_>>());
        for (p, child) in &mut self.children {
            let _ = child.wait();
            let _ = std::fs::remove_file(state::path(&format!("{}.pid", p.name)));
        }
    }
}

/// Stop a cluster that may have been started by another process (`lab down`, `lab up`
/// repairing): by pid file for loopback, by killing everything in its namespaces for the lab.
pub fn stop(layout: &Layout) {
    let procs = layout.all_procs();
    let pids: Vec<u32> = procs.iter().filter_map(|p| pid_of(&p.name)).collect();
    sh::stop_pids(&pids);
    for p in &procs {
        if let Some(ns) = &p.ns {
            fabric::kill_all(ns);
        }
        let _ = std::fs::remove_file(state::path(&format!("{}.pid", p.name)));
    }
}

/// The pid recorded for a daemon, if that process still runs one of our programs.
pub fn pid_of(name: &str) -> Option<u32> {
    let pid: u32 = state::read(&format!("{name}.pid"))?.trim().parse().ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let cmdline = String::from_utf8_lossy(&cmdline);
    (sh::alive(pid) && (cmdline.contains("refract") || cmdline.contains("haproxy"))).then_some(pid)
}

/// Stop one daemon by its pid file (wherever it was started from); whether it was running.
pub fn stop_one(name: &str) -> bool {
    let pid = pid_of(name);
    sh::stop_pids(&pid.into_iter().collect::<Vec<_>>());
    let _ = std::fs::remove_file(state::path(&format!("{name}.pid")));
    pid.is_some()
}

/// Whether the daemon `name` runs (by its pid file).
pub fn is_running(name: &str) -> bool {
    pid_of(name).is_some()
}
