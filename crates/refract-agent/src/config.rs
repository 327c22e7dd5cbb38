//! `AgentConfig`: the agent's TOML configuration (see `examples/lab/agent-b1.toml`).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use refract_handover::control::{ChannelOptions, ControlKey};
use serde::Deserialize;

use crate::error::{Error, Result};

/// Everything the agent needs to know; every key is documented in the example file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The local backend this agent fronts (the blob server now, a database later).
    pub backend: SocketAddr,
    /// Reach that same backend over this Unix socket instead of TCP (it is on this host; a
    /// database's socket file, or the blob server's `--unix`). `backend` stays its identity:
    /// the address the dispatcher names it by.
    #[serde(default)]
    pub backend_socket: Option<PathBuf>,
    /// Let the backend write large results into the client's socket itself: the agent passes
    /// it the socket over `backend_socket` (`refract_http::defer`; the blob server supports
    /// it). A backend that does not answer with a deferred head is served as without it.
    #[serde(default)]
    pub pass_socket: bool,
    /// The backend is a PostgreSQL server, and refract's server connections reach it through
    /// this address (docs/handover.md, "PostgreSQL"): the agent proxies them and writes large
    /// results straight to the client. Absent: the backend speaks HTTP (the blob server).
    #[serde(default)]
    pub postgres_listen: Option<SocketAddr>,
    /// Where the agent listens for dispatcher control connections (cross-host hand-over).
    #[serde(default)]
    pub control: Option<SocketAddr>,
    /// The service address (VIP) the dispatcher owns; on this host it sits on `lo`.
    #[serde(default)]
    pub vip: Option<Ipv4Addr>,
    /// The NIC that faces the dispatcher: the guard goes on its ingress.
    #[serde(default)]
    pub interface: Option<String>,
    /// Unix socket for a dispatcher on this same host (hand-over by SCM_RIGHTS, no TCP_REPAIR).
    #[serde(default)]
    pub local: Option<PathBuf>,
    /// Uids besides the agent's own allowed on `local` (checked by SO_PEERCRED on accept).
    #[serde(default)]
    pub allowed_uids: Vec<u32>,
    /// Group (gid) given access to the `local` socket file (mode 0660 instead of 0600).
    #[serde(default)]
    pub local_gid: Option<u32>,
    /// Bound on each backend read while serving an adopted connection (connecting: at most 1 s),
    /// in milliseconds.
    #[serde(default = "default_backend_timeout_ms")]
    pub backend_timeout_ms: u64,
    /// Bound on a write to an adopted client making no progress (a client that stopped
    /// reading), in milliseconds: past it the connection ends at the agent (`Closed`).
    #[serde(default = "default_write_stall_ms")]
    pub write_stall_ms: u64,
    /// The shared control key (at least 16 bytes), the same in the dispatcher's config.
    #[serde(default)]
    pub key: Option<String>,
    /// Or a file holding the key (trailing newline ignored); exactly one of `key`, `key_file`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Flows the guard's tombstone map can hold.
    #[serde(default = "default_map_capacity")]
    pub map_capacity: u32,
    /// Heartbeat interval on the control channel, in milliseconds.
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// A dispatcher silent for this long is declared dead, in milliseconds.
    #[serde(default = "default_dead_after_ms")]
    pub dead_after_ms: u64,
}

fn default_map_capacity() -> u32 {
    4096
}

fn default_backend_timeout_ms() -> u64 {
    30_000
}

fn default_write_stall_ms() -> u64 {
    30_000
}

fn default_heartbeat_ms() -> u64 {
    1000
}

fn default_dead_after_ms() -> u64 {
    3000
}

impl AgentConfig {
    /// Parses TOML (errors carry the line) and validates.
    pub fn parse(text: &str, origin: &Path) -> Result<Self> {
        let cfg: AgentConfig = toml::from_str(text).map_err(|e| Error::config(origin, e))?;
        cfg.validate(origin)
    }

    /// Reads, parses and validates a file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::config(path, e))?;
        Self::parse(&text, path)
    }

    /// Checks what serde cannot.
    pub fn validate(self, origin: &Path) -> Result<Self> {
        let bad = |msg: &str| Err(Error::config(origin, msg));
        if self.key.is_some() == self.key_file.is_some() {
            return bad("set exactly one of `key` and `key_file`");
        }
        if self.map_capacity == 0 {
            return bad("`map_capacity` must be at least 1");
        }
        if self.heartbeat_ms == 0 || self.dead_after_ms <= self.heartbeat_ms {
            return bad("`dead_after_ms` must be longer than `heartbeat_ms` (> 0)");
        }
        let remote = [self.control.is_some(), self.vip.is_some(), self.interface.is_some()];
        if remote.iter().any(|&x| x) && !remote.iter().all(|&x| x) {
            return bad("set all of `control`, `vip` and `interface` (cross-host hand-over) or none");
        }
        if !remote[0] && self.local.is_none() {
            return bad("set `local` (same host) or `control`, `vip` and `interface` (cross host)");
        }
        if self.interface.as_deref() == Some("") {
            return bad("`interface` must name the NIC that faces the dispatcher");
        }
        if self.backend_timeout_ms == 0 {
            return bad("`backend_timeout_ms` must be > 0");
        }
        if self.write_stall_ms == 0 {
            return bad("`write_stall_ms` must be > 0");
        }
        if self.backend_socket.as_deref().is_some_and(|p| !p.is_absolute()) {
            return bad("`backend_socket` must be an absolute path (the backend's Unix socket)");
        }
        if self.pass_socket && self.backend_socket.is_none() {
            return bad("`pass_socket` needs `backend_socket`: a socket is passed over a Unix socket only");
        }
        if let Some(k) = &self.key {
            ControlKey::try_new(k.as_bytes()).map_err(|e| Error::config(origin, e))?;
        }
        Ok(self)
    }

    /// The control key, read from `key_file` if that is where it is.
    pub fn control_key(&self) -> Result<ControlKey> {
        let bytes = match (&self.key, &self.key_file) {
            (Some(k), _) => k.as_bytes().to_vec(),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|e| Error::config(path, e))?;
                text.trim_end_matches(['\n', '\r']).as_bytes().to_vec()
            }
            (None, None) => return Err(Error::config(Path::new("key"), "no control key configured")),
        };
        ControlKey::try_new(bytes).map_err(|e| Error::config(Path::new("key"), e))
    }

    /// Bound on connecting to the backend and on each of its reads.
    pub fn backend_timeout(&self) -> Duration {
        Duration::from_millis(self.backend_timeout_ms)
    }

    /// Bound on a write to an adopted client making no progress.
    pub fn write_stall(&self) -> Duration {
        Duration::from_millis(self.write_stall_ms)
    }

    /// Heartbeat and dead-peer timing for the control channel.
    pub fn channel_options(&self) -> ChannelOptions {
        ChannelOptions {
            heartbeat: Duration::from_millis(self.heartbeat_ms),
            dead_after: Duration::from_millis(self.dead_after_ms),
            ..ChannelOptions::default()
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const OK: &str = r#"
        backend = "127.0.0.1:9000"
        control = "127.0.0.1:9100"
        vip = "198.18.2.100"
        interface = "eth0"
        key = "0123456789abcdef"
    "#;

    fn parse(text: &str) -> Result<AgentConfig> {
        AgentConfig::parse(text, Path::new("test.toml"))
    }

    #[test]
    fn defaults_and_options() {
        let c = parse(OK).unwrap();
        assert_eq!((c.map_capacity, c.heartbeat_ms, c.dead_after_ms), (4096, 1000, 3000));
        assert_eq!(c.channel_options().dead_after, Duration::from_secs(3));
        assert_eq!(c.write_stall(), Duration::from_secs(30));
        assert_eq!(parse(&format!("{OK}\nwrite_stall_ms = 500")).unwrap().write_stall(), Duration::from_millis(500));
        assert!(c.control_key().is_ok());
    }

    #[test]
    fn mistakes_are_refused_with_where() {
        let e = parse(&format!("{OK}\nvipp = 1")).unwrap_err().to_string();
        assert!(e.contains("test.toml") && e.contains("vipp") && e.contains("line 8"), "{e}");
        let e = parse(&OK.replace("0123456789abcdef", "short")).unwrap_err().to_string();
        assert!(e.contains("16 bytes"), "{e}");
        let e = parse(&format!("{OK}\nkey_file = \"/k\"")).unwrap_err().to_string();
        assert!(e.contains("exactly one"), "{e}");
        let e = parse(&format!("{OK}\nheartbeat_ms = 5000")).unwrap_err().to_string();
        assert!(e.contains("dead_after_ms"), "{e}");
        assert!(parse(&format!("{OK}\nmap_capacity = 0")).is_err());
        let e = parse(&format!("{OK}\nwrite_stall_ms = 0")).unwrap_err().to_string();
        assert!(e.contains("write_stall_ms"), "{e}");
        let e = parse(&OK.replace("vip = \"198.18.2.100\"", "")).unwrap_err().to_string();
        assert!(e.contains("all of"), "{e}");
    }

    #[test]
    fn same_host_only() {
        let text = "backend = \"127.0.0.1:9000\"\nlocal = \"/run/refract-agent.sock\"\nkey = \"0123456789abcdef\"\n";
        let c = parse(text).unwrap();
        assert!(c.control.is_none() && c.local.is_some());
        assert!(c.allowed_uids.is_empty() && c.local_gid.is_none());
        let c = parse(&format!("{text}allowed_uids = [1001, 1002]\nlocal_gid = 110\n")).unwrap();
        assert_eq!((c.allowed_uids, c.local_gid), (vec![1001, 1002], Some(110)));
        let e = parse("backend = \"127.0.0.1:9000\"\nkey = \"0123456789abcdef\"\n").unwrap_err().to_string();
        assert!(e.contains("`local`"), "{e}");
    }

    #[test]
    fn the_backend_over_a_unix_socket() {
        assert_eq!(parse(OK).unwrap().backend_socket, None);
        let c = parse(&format!("{OK}\nbackend_socket = \"/run/blob.sock\"")).unwrap();
        assert_eq!(c.backend_socket.as_deref(), Some(Path::new("/run/blob.sock")));
        let e = parse(&format!("{OK}\nbackend_socket = \"blob.sock\"")).unwrap_err().to_string();
        assert!(e.contains("absolute"), "{e}");
    }

    #[test]
    fn passing_the_socket_needs_the_backend_on_a_unix_socket() {
        assert!(!parse(OK).unwrap().pass_socket);
        let c = parse(&format!("{OK}\nbackend_socket = \"/run/blob.sock\"\npass_socket = true")).unwrap();
        assert!(c.pass_socket);
        let e = parse(&format!("{OK}\npass_socket = true")).unwrap_err().to_string();
        assert!(e.contains("needs `backend_socket`"), "{e}");
    }
}
