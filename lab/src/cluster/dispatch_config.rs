//! The parts of a dispatcher config (`examples/*.toml`) the harness needs: listeners, backends,
//! which of them serve reads, the worker count. Lenient on purpose: the dispatcher owns the
//! format and validates it; we only read what a peer (HAProxy) must mirror.

use anyhow::{Context, Result};
use serde::Deserialize;

/// A dispatcher config, as far as the harness cares.
#[derive(Debug, Clone, Deserialize)]
pub struct DispatchConfig {
    /// `[http]`.
    #[serde(default)]
    pub http: Http,
    /// `[listen]`.
    #[serde(default)]
    pub listen: Listen,
    /// `[balance]`.
    #[serde(default)]
    pub balance: Balance,
    /// `[[backend]]`.
    #[serde(rename = "backend", default)]
    pub backends: Vec<Backend>,
    /// `[handover]`, if any.
    #[serde(default)]
    pub handover: Option<Handover>,
}

/// `[handover]`: what the harness needs to run a hand-over dispatcher beside its agents.
#[derive(Debug, Clone, Deserialize)]
pub struct Handover {
    /// `off`, `hybrid` or `always`.
    #[serde(default)]
    pub mode: String,
    /// The interface whose ingress steers handed-over flows, if any.
    pub interface: Option<String>,
    /// Where the control key shared with the agents is read from.
    pub key_file: Option<String>,
}

/// `[http]`: the HTTP front end.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Http {
    /// Client-facing `IP:PORT`.
    pub listen: Option<String>,
}

/// `[listen]`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Listen {
    /// Client-facing `IP:PORT`, the deprecated spelling of `[http] listen`.
    pub http: Option<String>,
    /// Admin `IP:PORT`.
    pub admin: Option<String>,
    /// Tokio worker threads; 0 or absent means one per core.
    pub workers: Option<usize>,
}

/// `[balance]`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Balance {
    /// Whether the primary serves reads too.
    #[serde(default)]
    pub read_from_primary: bool,
}

/// `[[backend]]`.
#[derive(Debug, Clone, Deserialize)]
pub struct Backend {
    /// Name, e.g. `b1`.
    pub name: String,
    /// `IP:PORT`.
    pub addr: String,
    /// `primary` or `replica`.
    pub role: String,
}

impl DispatchConfig {
    /// Parse TOML text.
    pub fn parse(text: &str) -> Result<Self> {
        let c: DispatchConfig = toml::from_str(text).context("parsing the dispatcher config")?;
        anyhow::ensure!(
            c.http.listen.is_some() || c.listen.http.is_some(),
            "the dispatcher config has no [http] listen"
        );
        Ok(c)
    }

    /// The client-facing `IP:PORT`: `[http] listen` (or its old spelling, `[listen] http`).
    pub fn http_addr(&self) -> &str {
        self.http.listen.as_deref().or(self.listen.http.as_deref()).unwrap_or_default()
    }

    /// The primary (writes go there).
    pub fn primary(&self) -> Option<&Backend> {
        self.backends.iter().find(|b| b.role == "primary")
    }

    /// The backends that serve reads, as the dispatcher balances them.
    pub fn readers(&self) -> Vec<&Backend> {
        let replicas: Vec<&Backend> = self.backends.iter().filter(|b| b.role != "primary").collect();
        if self.balance.read_from_primary || replicas.is_empty() {
            self.backends.iter().collect()
        } else {
            replicas
        }
    }

    /// Whether it hands connections over (`[handover]` with a mode other than `off`).
    pub fn hands_over(&self) -> bool {
        self.handover.as_ref().is_some_and(|h| !h.mode.is_empty() && h.mode != "off")
    }

    /// Whether it steers flows from an interface's ingress (one such dispatcher per interface).
    pub fn steers(&self) -> bool {
        self.hands_over() && self.handover.as_ref().is_some_and(|h| h.interface.is_some())
    }

    /// The dispatcher's worker threads (the peer gets as many).
    pub fn worker_threads(&self) -> usize {
        match self.listen.workers {
            Some(n) if n > 0 => n,
            _ => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relay_example_parses() {
        let c = DispatchConfig::parse(crate::cluster::layout::RELAY_TOML).expect("relay.toml");
        assert_eq!(c.http_addr(), "198.18.0.100:8081");
        assert_eq!(c.primary().map(|b| b.name.as_str()), Some("b1"));
        assert_eq!(c.readers().len(), 2, "read_from_primary = true: both serve reads");
        assert_eq!(c.worker_threads(), 2);
        assert!(!c.hands_over() && !c.steers());
    }

    #[test]
    fn hand_over_examples_parse() {
        let h = DispatchConfig::parse(crate::cluster::layout::HYBRID_TOML).expect("hybrid.toml");
        assert_eq!(h.http_addr(), "198.18.0.100:8080");
        assert!(h.steers());
        let a = DispatchConfig::parse(crate::cluster::layout::HANDOVER_TOML).expect("handover.toml");
        assert_eq!(a.handover.as_ref().map(|h| h.mode.as_str()), Some("always"));
        assert_eq!(a.http_addr(), "198.18.0.100:8082");
        assert_eq!(h.handover.and_then(|h| h.key_file), a.handover.and_then(|h| h.key_file));
    }

    #[test]
    fn replicas_only_without_read_from_primary() {
        let c = DispatchConfig::parse(
            r#"
            [listen]
            http = "127.0.0.1:8080"
            [[backend]]
            name = "b1"
            addr = "127.0.0.1:9001"
            role = "primary"
            [[backend]]
            name = "b2"
            addr = "127.0.0.1:9002"
            role = "replica"
            "#,
        )
        .expect("parse");
        let names: Vec<&str> = c.readers().iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, vec!["b2"]);
    }
}
