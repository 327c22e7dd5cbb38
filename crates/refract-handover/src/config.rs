//! `[handover]`: the dispatcher's section for the connection hand-over, shared by the front
//! ends (HTTP backends and PostgreSQL servers name their agents here; docs/config.md).

use serde::Deserialize;
use std::net::SocketAddr;

/// `[handover]`: hand a client connection to the agent in front of a backend, which answers
/// the client directly and hands the connection back (docs/handover.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandoverConfig {
    /// `off`, `hybrid` (hand over when a result is at least `threshold` bytes) or `always`.
    #[serde(default)]
    pub mode: HandoverMode,
    /// Smallest result, in bytes, that hybrid mode hands over (HTTP backends).
    #[serde(default = "default_threshold")]
    pub threshold: u64,
    /// Smallest PostgreSQL result, in bytes, that hybrid mode hands over: the agent cuts before
    /// the row that brings a result to it.
    #[serde(default = "default_postgres_threshold")]
    pub postgres_threshold: u64,
    /// The agent in front of each backend, by backend name: `"unix:/path"` (same host, the
    /// socket moves by SCM_RIGHTS) or `"IP:port"` (its control listener, cross host).
    #[serde(default)]
    pub agents: std::collections::BTreeMap<String, AgentAddr>,
    /// File holding the control key shared with the agents (needed for `IP:port` agents).
    #[serde(default)]
    pub key_file: Option<std::path::PathBuf>,
    /// The client-facing interface whose ingress FREEZEs and STEERs handed-over flows
    /// (`IP:port` agents on other hosts); absent = no steering (agents in this kernel only).
    #[serde(default)]
    pub interface: Option<String>,
    /// Flows the steering map holds (a full map means: relay instead).
    #[serde(default = "default_map_capacity")]
    pub map_capacity: u32,
    /// How long the agent waits for the client's next request before handing the connection
    /// back, in milliseconds (0: hand back at once when nothing is buffered; at most
    /// [`MAX_IDLE_MS`]). Each request that does arrive is routed by the dispatcher (`Next`).
    #[serde(default = "default_idle_ms")]
    pub idle_ms: u32,
}

/// Longest `[handover] idle_ms`: while the agent waits, the session waits for its hand-back
/// (it sees neither the client's idle timeout nor a drain), so the wait stays short.
pub const MAX_IDLE_MS: u32 = 1000;

fn default_map_capacity() -> u32 {
    65_536
}

fn default_idle_ms() -> u32 {
    20
}

/// The measured crossover (docs/benchmarks.md, `bench paper` at 1 Gbit/s): handing over lost to
/// relaying at 4 KiB (0.5×) and won at 32 KiB (2×).
fn default_threshold() -> u64 {
    32 << 10
}

/// The measured crossover for PostgreSQL (docs/benchmarks.md, `bench pg-large` at 1 Gbit/s,
/// 2026-11-25): handed over, a one-row 64 KiB result ran at 0.04× relay and a 1 MiB one at
/// 0.67× (10–25 ms more per result; where that time goes is not analysed yet); from 16 MiB
/// on it won (1.92×).
fn default_postgres_threshold() -> u64 {
    2 << 20
}

/// When the dispatcher hands a connection over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HandoverMode {
    /// Never: every result is relayed.
    #[default]
    Off,
    /// When the agent finds the result large (at least `threshold` bytes).
    Hybrid,
    /// Every read whose backend has an agent.
    Always,
}

/// Where an agent listens.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum AgentAddr {
    /// Same host: a Unix socket path.
    Unix(std::path::PathBuf),
    /// Another host: its control listener.
    Tcp(SocketAddr),
}

impl TryFrom<String> for AgentAddr {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        match s.strip_prefix("unix:") {
            Some("") => Err("agent address \"unix:\" needs a path".into()),
            Some(path) => Ok(AgentAddr::Unix(path.into())),
            None => s
                .parse()
                .map(AgentAddr::Tcp)
                .map_err(|_| format!("agent address {s:?}: want \"unix:/path\" or \"IP:port\"")),
        }
    }
}

impl HandoverConfig {
    /// Checks the section against the backends it may name (`names`: HTTP backends and
    /// PostgreSQL servers); errors name `at`, the section's line.
    pub fn validate(&self, names: &[&str], at: usize) -> Result<(), String> {
        if self.threshold == 0 || self.postgres_threshold == 0 || self.map_capacity == 0 {
            return Err(format!("line {at}: [handover] threshold, postgres_threshold and map_capacity must be > 0"));
        }
        if self.idle_ms > MAX_IDLE_MS {
            return Err(format!("line {at}: [handover] idle_ms must be at most {MAX_IDLE_MS}"));
        }
        if self.mode != HandoverMode::Off && self.agents.is_empty() {
            return Err(format!("line {at}: [handover] mode {:?} needs at least one agent", self.mode));
        }
        if let Some(name) = self.agents.keys().find(|n| !names.contains(&n.as_str())) {
            return Err(format!("line {at}: [handover.agents] {name:?} is not a backend nor a PostgreSQL server"));
        }
        let tcp = self.agents.values().any(|a| matches!(a, AgentAddr::Tcp(_)));
        if tcp && self.key_file.is_none() {
            return Err(format!("line {at}: [handover] agents at IP:port need key_file"));
        }
        Ok(())
    }
}
