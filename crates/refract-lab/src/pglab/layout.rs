//! Where the PostgreSQL lab's pieces live: the servers on b1 and b2, the two refract
//! dispatchers on the VIP, PgBouncer on the dispatcher host; their names, ports and files.

use crate::fabric::topology::{Host, B1, B2, DISPATCHER, VIP};
use crate::support::state;
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::PathBuf;

/// The port every PostgreSQL server listens on (its host's own address).
pub const PG_PORT: u16 = 5432;
/// PgBouncer's port, on the dispatcher host's own address.
pub const PGBOUNCER_PORT: u16 = 6434;
/// The lab's primary (rf-b1) and streaming replica (rf-b2).
pub const SERVERS: [Server; 2] = [Server { host: B1, primary: true }, Server { host: B2, primary: false }];
/// The hybrid dispatcher: `examples/lab/pg-hybrid.toml`, embedded so the lab works anywhere.
pub const PG_HYBRID_TOML: &str = include_str!("../../../../examples/lab/pg-hybrid.toml");
/// The relay-only dispatcher: `examples/lab/pg-relay.toml`.
pub const PG_RELAY_TOML: &str = include_str!("../../../../examples/lab/pg-relay.toml");
/// Process, log and pid-file name of PgBouncer.
pub const PGBOUNCER: &str = "pgbouncer";

/// One PostgreSQL server of the lab.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Server {
    /// The backend host it runs on.
    pub host: Host,
    /// The primary (else a streaming replica of it).
    pub primary: bool,
}

impl Server {
    /// Process and log name: `pg-b1`.
    pub fn name(&self) -> String {
        format!("pg-{}", self.host.name)
    }

    /// Where it listens: its host's own address, port 5432.
    pub fn listen_addr(&self) -> String {
        format!("{}:{PG_PORT}", self.host.addr)
    }

    /// Its directory (data directory and Unix socket), owned by the server's user.
    pub fn dir(&self) -> PathBuf {
        pg_dir().join(self.host.name)
    }

    /// Its data directory.
    pub fn data(&self) -> PathBuf {
        self.dir().join("data")
    }

    /// `primary` or `replica`, as `[[postgres.server]] role` spells it.
    pub fn role(&self) -> &'static str {
        if self.primary {
            "primary"
        } else {
            "replica"
        }
    }
}

/// The address refract uses for a server of the lab (`[[postgres.server]] addr` in
/// examples/lab/pg-*.toml, which a test holds to this function).
///
/// Today that is the server itself. The PostgreSQL agent (issue 23: `refract agent` fronting
/// the server on its host, to hand large results over) goes here: once it exists, refract
/// reaches each server through the agent on the server's host, this returns the agent's
/// address, and the two configs change with it. PgBouncer and `direct` keep using
/// [`Server::listen_addr`].
pub fn refract_server_addr(server: &Server) -> String {
    server.listen_addr()
}

/// Everything of the PostgreSQL lab that is deleted on `lab down`: `STATE/pg`.
pub fn pg_dir() -> PathBuf {
    state::path("pg")
}

/// PgBouncer's listener: the dispatcher host's own address (198.18.0.2), in rf-d.
pub fn pgbouncer_addr() -> String {
    format!("{}:{PGBOUNCER_PORT}", DISPATCHER.addr)
}

/// One refract dispatcher of the PostgreSQL lab.
#[derive(Debug, Clone)]
pub struct PgDispatcher {
    /// Process, log and pid-file name; its config is written to `STATE/NAME.toml`.
    pub name: &'static str,
    /// Where the config comes from, for status and reports.
    pub source: &'static str,
    /// The config text.
    pub text: &'static str,
    /// What the harness reads of it.
    pub config: PgDispatchConfig,
}

impl PgDispatcher {
    fn new(name: &'static str, source: &'static str, text: &'static str) -> Result<Self> {
        let config: PgDispatchConfig = toml::from_str(text).with_context(|| format!("parsing {source}"))?;
        Ok(PgDispatcher { name, source, text, config })
    }

    /// Its PostgreSQL listener, `IP:PORT`.
    pub fn addr(&self) -> &str {
        &self.config.postgres.listen
    }
}

/// The parts of a PostgreSQL dispatcher config the harness needs (lenient: the dispatcher
/// owns the format and validates it).
#[derive(Debug, Clone, Deserialize)]
pub struct PgDispatchConfig {
    /// `[listen]`.
    pub listen: PgListen,
    /// `[postgres]`.
    pub postgres: PgSection,
}

/// `[listen]`.
#[derive(Debug, Clone, Deserialize)]
pub struct PgListen {
    /// The admin listener.
    pub admin: Option<String>,
}

/// `[postgres]`.
#[derive(Debug, Clone, Deserialize)]
pub struct PgSection {
    /// Client-facing `IP:PORT`.
    pub listen: String,
    /// Server connections per server.
    pub pool_size: usize,
    /// `[[postgres.server]]`.
    #[serde(rename = "server")]
    pub servers: Vec<PgServerEntry>,
}

/// `[[postgres.server]]`.
#[derive(Debug, Clone, Deserialize)]
pub struct PgServerEntry {
    /// `b1`, `b2`.
    pub name: String,
    /// `IP:PORT`.
    pub addr: String,
    /// `primary` or `replica`.
    pub role: String,
}

/// The hybrid dispatcher (VIP:6432) and the relay-only one (VIP:6433), both in rf-d, both
/// checked to reach the servers at [`refract_server_addr`].
pub fn dispatchers() -> Result<Vec<PgDispatcher>> {
    let v = vec![
        PgDispatcher::new("refract-pg-hybrid", "examples/lab/pg-hybrid.toml", PG_HYBRID_TOML)?,
        PgDispatcher::new("refract-pg-relay", "examples/lab/pg-relay.toml", PG_RELAY_TOML)?,
    ];
    for d in &v {
        check_servers(d)?;
    }
    Ok(v)
}

/// A dispatcher's `[[postgres.server]]` entries are the lab's servers, as refract reaches them.
fn check_servers(d: &PgDispatcher) -> Result<()> {
    let got: Vec<(&str, &str, &str)> =
        d.config.postgres.servers.iter().map(|s| (s.name.as_str(), s.addr.as_str(), s.role.as_str())).collect();
    let want: Vec<(String, String, &str)> =
        SERVERS.iter().map(|s| (s.host.name.to_string(), refract_server_addr(s), s.role())).collect();
    let want: Vec<(&str, &str, &str)> = want.iter().map(|(n, a, r)| (n.as_str(), a.as_str(), *r)).collect();
    if got != want {
        bail!(
            "{}: [[postgres.server]] is {got:?}, the lab has {want:?} (pglab::layout::refract_server_addr)",
            d.source
        );
    }
    Ok(())
}

/// The service address clients use for a dispatcher port: `VIP:PORT`.
pub fn vip(port: u16) -> String {
    format!("{VIP}:{port}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dispatchers_listen_where_the_lab_says_and_reach_the_servers_through_one_function() {
        let d = dispatchers().expect("both configs match the lab");
        let addrs: Vec<(&str, &str)> = d.iter().map(|d| (d.name, d.addr())).collect();
        assert_eq!(addrs, [("refract-pg-hybrid", vip(6432).as_str()), ("refract-pg-relay", vip(6433).as_str())]);
        assert_eq!(pgbouncer_addr(), "198.18.0.2:6434");
        assert_eq!(SERVERS.map(|s| s.listen_addr()), ["198.18.0.21:5432", "198.18.0.22:5432"]);
        let mut broken = d[0].clone();
        broken.config.postgres.servers[1].addr = "198.18.0.22:6000".into();
        let e = check_servers(&broken).expect_err("a config that drifted from the function");
        assert!(e.to_string().contains("refract_server_addr"), "{e}");
    }

    /// A config as a table without the keys that set its ports and its header comment.
    fn without_ports(text: &str) -> toml::Table {
        let mut t: toml::Table = toml::from_str(text).expect("toml");
        for (section, key) in [("listen", "http"), ("listen", "admin"), ("postgres", "listen")] {
            t.get_mut(section).and_then(|s| s.as_table_mut()).expect("section").remove(key);
        }
        t
    }

    #[test]
    fn hybrid_and_relay_differ_only_in_their_ports_until_the_postgres_hand_over_exists() {
        assert_eq!(without_ports(PG_HYBRID_TOML), without_ports(PG_RELAY_TOML), "pg-hybrid.toml drifted");
        let t: toml::Table = toml::from_str(PG_HYBRID_TOML).expect("toml");
        assert_eq!(t["balance"]["read_from_primary"].as_bool(), Some(true), "both servers serve reads");
    }
}
