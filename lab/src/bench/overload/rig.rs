//! `Rig`: the overload benchmark's own processes in the lab, on ports of their own so that the
//! lab's cluster (and anyone's runs against it) is left alone: blob servers with a real capacity
//! on :9100 in rf-b1/rf-b2, and one target at a time in rf-d — refract with overload control
//! (`refract`), refract with `[overload] enabled = false` (`refract-off`), or HAProxy with
//! `maxconn` per server and a queue (`haproxy`).

use crate::cluster::dispatch_config::DispatchConfig;
use crate::cluster::haproxy;
use crate::cluster::http_client::Client;
use crate::cluster::layout::{Proc, RELAY_TOML};
use crate::cluster::{self, Running};
use crate::fabric::topology::{B1, B2, C1, DISPATCHER, VIP};
use crate::support::{interrupt, sh, state};
use anyhow::{bail, Context, Result};
use std::fmt::Write;
use std::time::{Duration, Instant};

/// The rig's blob servers listen here (the lab's own use 9000).
pub const BLOB_PORT: u16 = 9100;
/// refract (either config) listens on the VIP here; its admin port is one above.
pub const REFRACT_PORT: u16 = 8280;
/// HAProxy listens on the dispatcher host's address here.
pub const HAPROXY_PORT: u16 = 8290;
/// The targets, in report order.
pub const TARGETS: [&str; 3] = ["refract", "refract-off", "haproxy"];

/// How long a process may take to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// The capacity given to every blob server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// `--delay-ms`.
    pub delay_ms: u64,
    /// `--concurrency`.
    pub concurrency: usize,
}

/// Settings of the targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetSettings {
    /// HAProxy's `timeout queue`, ms.
    pub haproxy_queue_ms: u64,
    /// Overrides `[balance] policy` of both refract configs.
    pub policy: Option<String>,
}

/// The running rig.
pub struct Rig {
    /// Blob servers `(name, IP:PORT)`.
    pub backends: Vec<(String, String)>,
    blobs: Option<Running>,
    target: Option<(String, Running)>,
    probe: Client,
    /// The blob servers' concurrency as last started (HAProxy's per-server `maxconn`).
    concurrency: usize,
}

impl Rig {
    /// A rig with nothing started yet.
    pub fn new() -> Self {
        let backends = [B1, B2].iter().map(|h| (h.name.to_string(), format!("{}:{BLOB_PORT}", h.addr))).collect();
        Rig { backends, blobs: None, target: None, probe: Client::Curl(C1.ns()), concurrency: 8 }
    }

    /// (Re)start the blob servers; `slow` names one that gets `slow_delay_ms` instead.
    pub fn start_blobs(&mut self, cap: Capacity, slow: Option<(&str, u64)>) -> Result<()> {
        self.blobs = None;
        self.concurrency = cap.concurrency;
        let procs = self
            .backends
            .iter()
            .map(|(name, addr)| {
                let delay = slow.filter(|(s, _)| s == name).map(|(_, d)| d).unwrap_or(cap.delay_ms);
                let args = [
                    "blob-server",
                    "--listen",
                    addr,
                    "--name",
                    name,
                    "--delay-ms",
                    &delay.to_string(),
                    "--concurrency",
                    &cap.concurrency.to_string(),
                ];
                Proc { name: format!("ov-{name}"), ns: Some(ns_of(addr)), args: strings(&args), haproxy: false }
            })
            .collect();
        let mut running = cluster::spawn_all(procs)?;
        let probes: Vec<(String, &str)> = self.backends.iter().map(|(_, a)| (a.clone(), "/stats")).collect();
        wait_ready(&self.probe, &mut running, &probes)?;
        self.blobs = Some(running);
        Ok(())
    }

    /// Start `target` (stopping the previous one); its address on success.
    pub fn start_target(&mut self, target: &str, settings: &TargetSettings) -> Result<String> {
        self.target = None;
        let (proc, addr) = self.target_proc(target, settings)?;
        let mut running = cluster::spawn_all(vec![proc])?;
        wait_ready(&self.probe, &mut running, &[(addr.clone(), "/blob?bytes=1")])?;
        self.target = Some((target.to_string(), running));
        Ok(addr)
    }

    /// Stop the target, if any.
    pub fn stop_target(&mut self) {
        self.target = None;
    }

    fn target_proc(&self, target: &str, settings: &TargetSettings) -> Result<(Proc, String)> {
        let d = Some(DISPATCHER.ns());
        let name = format!("ov-{target}");
        match target {
            "refract" | "refract-off" => {
                let text = refract_config(&self.backends, target == "refract-off", settings.policy.as_deref())?;
                let path = state::write(&format!("{name}.toml"), &text)?;
                let args = strings(&["dispatch", "--config", &path.to_string_lossy()]);
                Ok((Proc { name, ns: d, args, haproxy: false }, format!("{VIP}:{REFRACT_PORT}")))
            }
            "haproxy" => {
                let bind = format!("{}:{HAPROXY_PORT}", DISPATCHER.addr);
                let cfg = haproxy_config(&bind, &self.backends, settings.haproxy_queue_ms, self.concurrency);
                let path = state::write(&format!("{name}.cfg"), &cfg)?;
                let args = strings(&["-db", "-f", &path.to_string_lossy()]);
                Ok((Proc { name, ns: d, args, haproxy: true }, bind))
            }
            _ => bail!("unknown target {target:?} ({})", TARGETS.join(", ")),
        }
    }

    /// Wait until every blob server answers one request in under `delay + 30 ms` (its queue
    /// has drained after an overloaded run), for at most 10 s.
    pub fn drain(&self, delay_ms: u64) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let limit = (delay_ms + 30) as f64 / 1000.0;
        for (name, addr) in &self.backends {
            loop {
                interrupt::check()?;
                // A probe that times out (a long queue) counts as not drained yet.
                if probe_seconds(addr).is_ok_and(|s| s < limit) {
                    break;
                }
                if Instant::now() > deadline {
                    eprintln!("warning: {name} still has a queue after 10 s; going on");
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// Reads each blob server has served since it started (`GET /stats`).
    pub fn reads(&self) -> Vec<(String, u64)> {
        let read = |addr: &str| -> Option<u64> {
            let body = self.probe.get(addr, "/stats").ok()?.body;
            serde_json::from_str::<serde_json::Value>(&body).ok()?["reads"].as_u64()
        };
        self.backends.iter().map(|(n, a)| (n.clone(), read(a).unwrap_or(0))).collect()
    }
}

impl Default for Rig {
    fn default() -> Self {
        Self::new()
    }
}

/// One request to a blob server from c1, timed by curl.
fn probe_seconds(addr: &str) -> Result<f64> {
    let url = format!("http://{addr}/blob?bytes=1");
    let args = ["-s", "-o", "/dev/null", "--max-time", "5", "-w", "%{time_total}", &url];
    let out = sh::run(sh::cmd(Some(&C1.ns()), "curl", &args))?;
    out.trim().parse().with_context(|| format!("curl timing {out:?}"))
}

/// Poll until every `(address, path)` answers 200; fail early (with the log) if a process dies.
fn wait_ready(client: &Client, running: &mut Running, probes: &[(String, &str)]) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut pending: Vec<&(String, &str)> = probes.iter().collect();
    while !pending.is_empty() {
        interrupt::check()?;
        running.check_alive()?;
        pending.retain(|(addr, path)| !client.get(addr, path).map(|r| r.status == 200).unwrap_or(false));
        if Instant::now() > deadline {
            bail!("not answering after {READY_TIMEOUT:?} (logs in {})", state::dir().display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// The lab's relay config (`examples/lab/relay.toml`) moved to the rig's ports and blob
/// servers (with relay.toml's shipped default: no busy polling); with `off`, `[overload] enabled = false`; `policy` overrides `[balance] policy`.
pub fn refract_config(backends: &[(String, String)], off: bool, policy: Option<&str>) -> Result<String> {
    let mut t: toml::Table = toml::from_str(RELAY_TOML).context("parsing relay.toml")?;
    let http = t.get_mut("http").and_then(|v| v.as_table_mut()).context("relay.toml has no [http]")?;
    http.insert("listen".into(), format!("{VIP}:{REFRACT_PORT}").into());
    let listen = t.get_mut("listen").and_then(|v| v.as_table_mut()).context("relay.toml has no [listen]")?;
    listen.insert("admin".into(), format!("{}:{}", DISPATCHER.addr, REFRACT_PORT + 1).into());
    if let Some(bs) = t.get_mut("backend").and_then(|v| v.as_array_mut()) {
        for b in bs.iter_mut().filter_map(|b| b.as_table_mut()) {
            let name = b.get("name").and_then(|n| n.as_str()).unwrap_or_default().to_string();
            if let Some((_, addr)) = backends.iter().find(|(n, _)| *n == name) {
                b.insert("addr".into(), addr.clone().into());
            }
        }
    }
    if let Some(p) = policy {
        let balance = t.entry("balance").or_insert_with(|| toml::Table::new().into());
        if let Some(b) = balance.as_table_mut() {
            b.insert("policy".into(), p.into());
        }
    }
    if off {
        let mut o = toml::Table::new();
        o.insert("enabled".into(), false.into());
        t.insert("overload".into(), o.into());
    }
    let head = format!(
        "# Generated by `refract bench overload` from examples/lab/relay.toml: overload control {}.\n",
        if off { "off" } else { "as by default" }
    );
    Ok(head + &toml::to_string(&t)?)
}

/// HAProxy as an operator would set it up against overload today: per-server `maxconn` equal
/// to the backend's concurrency, the rest waiting in HAProxy's queue for up to `queue_ms`
/// (then 503).
pub fn haproxy_config(bind: &str, backends: &[(String, String)], queue_ms: u64, maxconn: usize) -> String {
    let threads = DispatchConfig::parse(RELAY_TOML).map(|c| c.worker_threads()).unwrap_or(2);
    let mut s = format!(
        "# Generated by `refract bench overload` (lab/src/bench/overload/rig.rs).\n\
         global\n    nbthread {threads}\n    maxconn 4000\n\n\
         defaults\n    mode http\n    option http-keep-alive\n    http-reuse always\n    \
         timeout connect 1s\n    timeout client 30s\n    timeout server 30s\n    \
         timeout http-keep-alive 30s\n    timeout queue {queue_ms}ms\n\n\
         frontend fe\n    bind {bind}\n    maxconn 4000\n    default_backend reads\n\n\
         backend reads\n    balance roundrobin\n"
    );
    for (name, addr) in backends {
        let _ = writeln!(s, "    server {name} {addr} maxconn {maxconn}");
    }
    s
}

fn ns_of(addr: &str) -> String {
    if addr.starts_with(B2.addr) {
        B2.ns()
    } else {
        B1.ns()
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Whether HAProxy is installed (the `haproxy` target needs it).
pub fn have_haproxy() -> bool {
    sh::have(haproxy::BINARY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refract_configs_derive_from_relay_toml() {
        let rig = Rig::new();
        let on = refract_config(&rig.backends, false, None).expect("on");
        let c = DispatchConfig::parse(&on).expect("parse on");
        assert_eq!(c.http_addr(), "198.18.0.100:8280");
        assert_eq!(c.listen.admin.as_deref(), Some("198.18.0.2:8281"));
        let addrs: Vec<&str> = c.backends.iter().map(|b| b.addr.as_str()).collect();
        assert_eq!(addrs, vec!["198.18.0.21:9100", "198.18.0.22:9100"]);
        assert!(!on.contains("[overload]"));
        assert!(!on.contains("busy_poll_us"), "no busy polling in the rig");
        let off = refract_config(&rig.backends, true, Some("least-outstanding")).expect("off");
        let t: toml::Table = toml::from_str(&off).expect("toml");
        assert_eq!(t["overload"]["enabled"].as_bool(), Some(false));
        assert_eq!(t["balance"]["policy"].as_str(), Some("least-outstanding"));
        assert_eq!(t["timeouts"]["request_ms"].as_integer(), Some(30000));
    }

    #[test]
    fn haproxy_queue_config() {
        let rig = Rig::new();
        let cfg = haproxy_config("198.18.0.2:8290", &rig.backends, 250, 8);
        assert!(cfg.contains("timeout queue 250ms\n"), "{cfg}");
        assert!(cfg.contains("server b2 198.18.0.22:9100 maxconn 8\n"), "{cfg}");
        assert!(cfg.lines().all(|l| !l.ends_with(' ')));
        if have_haproxy() {
            let path = std::env::temp_dir().join("rf-ov-haproxy-check.cfg");
            std::fs::write(&path, &cfg).expect("write");
            let out = std::process::Command::new(haproxy::BINARY).args(["-c", "-f"]).arg(&path).output().expect("run");
            let _ = std::fs::remove_file(&path);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
    }
}
