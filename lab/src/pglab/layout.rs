//! Where the PostgreSQL lab's pieces live: the servers on b1 and b2 with an agent in front of
//! each, the two refract dispatchers on the VIP, PgBouncer on the dispatcher host; their names,
//! ports and files.

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
pub const PG_HYBRID_TOML: &str = include_str!("../../../examples/lab/pg-hybrid.toml");
/// The relay-only dispatcher: `examples/lab/pg-relay.toml`.
pub const PG_RELAY_TOML: &str = include_str!("../../../examples/lab/pg-relay.toml");
/// Process, log and pid-file name of PgBouncer.
pub const PGBOUNCER: &str = "pgbouncer";
/// The agents in front of the servers: `examples/lab/agent-pg-b1.toml`, `agent-pg-b2.toml`,
/// in [`SERVERS`] order.
pub const PG_AGENT_TOMLS: [&str; 2] =
    [include_str!("../../../examples/lab/agent-pg-b1.toml"), include_str!("../../../examples/lab/agent-pg-b2.toml")];
/// The port each agent takes refract's server connections on (`postgres_listen`), on its
/// host's own address.
pub const AGENT_PG_PORT: u16 = 6543;
/// Each agent's control port (the HTTP lab's agents use it too; one cluster runs at a time).
pub const AGENT_CONTROL_PORT: u16 = 9200;

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

    /// The agent in front of it: process, log and pid-file name, `pg-agent-b1`.
    pub fn agent_name(&self) -> String {
        format!("pg-agent-{}", self.host.name)
    }

    /// The agent's control listener (`[handover] agents` in pg-hybrid.toml).
    pub fn agent_control(&self) -> String {
        format!("{}:{AGENT_CONTROL_PORT}", self.host.addr)
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

/// The address refract names a server of the lab by (`[[postgres.server]] addr` in
/// examples/lab/pg-*.toml, which a test holds to this function): the server itself. The relay
/// reaches it there, as PgBouncer and `direct` do.
pub fn refract_server_addr(server: &Server) -> String {
    server.listen_addr()
}

/// Where the hybrid dispatcher reaches a server: the agent on the server's host
/// (`[[postgres.server]] through` in pg-hybrid.toml, the agent's `postgres_listen`), which
/// proxies its server connections and writes large results straight to the client.
pub fn agent_addr(server: &Server) -> String {
    format!("{}:{AGENT_PG_PORT}", server.host.addr)
}

/// One agent's config, as the lab runs it.
#[derive(Debug, Clone, Deserialize)]
pub struct PgAgentConfig {
    /// The server it fronts.
    pub backend: String,
    /// refract's way in.
    pub postgres_listen: String,
    /// The control listener.
    pub control: String,
    /// The shared control key (inline in the lab).
    pub key: String,
}

/// The agents' configs, in [`SERVERS`] order, checked against the lab's addresses.
pub fn agents() -> Result<Vec<PgAgentConfig>> {
    let mut v = Vec::new();
    for (s, text) in SERVERS.iter().zip(PG_AGENT_TOMLS) {
        let source = format!("examples/lab/agent-pg-{}.toml", s.host.name);
        let a: PgAgentConfig = toml::from_str(text).with_context(|| format!("parsing {source}"))?;
        let got = (a.backend.as_str(), a.postgres_listen.as_str(), a.control.as_str());
        let want = (s.listen_addr(), agent_addr(s), s.agent_control());
        if got != (want.0.as_str(), want.1.as_str(), want.2.as_str()) {
            bail!("{source}: backend, postgres_listen, control are {got:?}, the lab has {want:?}");
        }
        v.push(a);
    }
    Ok(v)
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
    /// `[handover]` (the hybrid one).
    pub handover: Option<PgHandover>,
}

/// `[handover]`: what the harness reads of it.
#[derive(Debug, Clone, Deserialize)]
pub struct PgHandover {
    /// The file the lab writes the agents' key into.
    pub key_file: Option<String>,
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
    /// The agent it is reached through, if any.
    pub through: Option<String>,
    /// `primary` or `replica`.
    pub role: String,
}

/// The hybrid dispatcher (VIP:6432, through the agents) and the relay-only one (VIP:6433,
/// straight), both in rf-d, both checked to name the servers at [`refract_server_addr`].
pub fn dispatchers() -> Result<Vec<PgDispatcher>> {
    let v = vec![
        PgDispatcher::new("refract-pg-hybrid", "examples/lab/pg-hybrid.toml", PG_HYBRID_TOML)?,
        PgDispatcher::new("refract-pg-relay", "examples/lab/pg-relay.toml", PG_RELAY_TOML)?,
    ];
    check_servers(&v[0], true)?;
    check_servers(&v[1], false)?;
    Ok(v)
}

/// A dispatcher's `[[postgres.server]]` entries are the lab's servers, reached through their
/// agents (`through` = [`agent_addr`]) or straight.
fn check_servers(d: &PgDispatcher, through_agents: bool) -> Result<()> {
    type Row = (String, String, Option<String>, String);
    let got: Vec<Row> = d
        .config
        .postgres
        .servers
        .iter()
        .map(|s| (s.name.clone(), s.addr.clone(), s.through.clone(), s.role.clone()))
        .collect();
    let want: Vec<Row> = SERVERS
        .iter()
        .map(|s| {
            let through = through_agents.then(|| agent_addr(s));
            (s.host.name.to_string(), refract_server_addr(s), through, s.role().to_string())
        })
        .collect();
    if got != want {
        bail!(
            "{}: [[postgres.server]] is {got:?}, the lab has {want:?} (pglab::layout::refract_server_addr, agent_addr)",
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
        let e = check_servers(&broken, true).expect_err("a config that drifted from the function");
        assert!(e.to_string().contains("refract_server_addr"), "{e}");
        let e = check_servers(&d[1], true).expect_err("the relay reaches the servers straight");
        assert!(e.to_string().contains("agent_addr"), "{e}");
    }

    #[test]
    fn the_agents_front_the_servers_where_the_hybrid_dispatcher_reaches_them() {
        let agents = agents().expect("both agent configs match the lab");
        let hybrid: toml::Table = toml::from_str(PG_HYBRID_TOML).expect("toml");
        let named = hybrid["handover"]["agents"].as_table().expect("[handover] agents");
        for (s, a) in SERVERS.iter().zip(&agents) {
            assert_eq!(named[s.host.name].as_str(), Some(a.control.as_str()), "{}", s.agent_name());
        }
        assert_eq!(
            agents.iter().map(|a| a.postgres_listen.as_str()).collect::<Vec<_>>(),
            ["198.18.0.21:6543", "198.18.0.22:6543"]
        );
        assert!(agents.iter().all(|a| a.key == agents[0].key && a.key.len() >= 16));
        assert_eq!(hybrid["handover"]["mode"].as_str(), Some("hybrid"));
    }

    /// A config as a table without the keys that set its ports, its agents (`through`) and
    /// its `[handover]`.
    fn without_ports(text: &str) -> toml::Table {
        let mut t: toml::Table = toml::from_str(text).expect("toml");
        for (section, key) in [("http", "listen"), ("listen", "admin"), ("postgres", "listen")] {
            t.get_mut(section).and_then(|s| s.as_table_mut()).expect("section").remove(key);
        }
        t.remove("handover");
        let servers = t["postgres"]["server"].as_array().expect("servers").clone();
        let servers: Vec<toml::Value> = servers
            .into_iter()
            .map(|mut s| {
                s.as_table_mut().expect("server").remove("through");
                s
            })
            .collect();
        t["postgres"].as_table_mut().expect("postgres").insert("server".into(), servers.into());
        t
    }

    #[test]
    fn hybrid_and_relay_differ_only_in_their_ports_and_the_hand_over() {
        assert_eq!(without_ports(PG_HYBRID_TOML), without_ports(PG_RELAY_TOML), "pg-hybrid.toml drifted");
        let t: toml::Table = toml::from_str(PG_HYBRID_TOML).expect("toml");
        assert_eq!(t["balance"]["read_from_primary"].as_bool(), Some(true), "both servers serve reads");
    }
}
