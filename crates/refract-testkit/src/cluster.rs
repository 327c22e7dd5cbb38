//! The one builder an integration test starts its cluster with:
//! `cluster().primary().replica().agent("replica").dispatcher(cfg).run()`. The test says what
//! differs (how many servers, which have an agent in front, the dispatcher's config); what
//! starts an agent or a dispatcher is the test's kit, a [`Start`] (the `refract` binary, or the
//! library in the test's own process), given with [`ClusterBuilder::with`].

use crate::pg::{PgCluster, PgServer};

/// How a test kit starts what runs in front of the PostgreSQL servers.
pub trait Start {
    /// A running agent, stopped when dropped.
    type Agent;
    /// A running dispatcher, stopped when dropped.
    type Dispatcher;

    /// Starts an agent in front of `server` (named `name`: `primary`, `replica`, `replica2`,
    /// `standalone`, ...).
    fn agent(&self, name: &str, server: &PgServer) -> Self::Agent;

    /// Starts a dispatcher with `config` in front of `pg` and `agents` (in the order they were
    /// asked for, with their servers' names).
    fn dispatcher(&self, config: &str, pg: &PgCluster, agents: &[(String, Self::Agent)]) -> Self::Dispatcher;
}

/// PostgreSQL servers only: no agent, no dispatcher.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServersOnly;

impl Start for ServersOnly {
    type Agent = ();
    type Dispatcher = ();

    fn agent(&self, name: &str, _: &PgServer) {
        panic!("an agent in front of {name} needs a test kit (ClusterBuilder::with)");
    }

    fn dispatcher(&self, _: &str, _: &PgCluster, _: &[(String, ())]) {
        panic!("a dispatcher needs a test kit (ClusterBuilder::with)");
    }
}

/// What to start; [`ClusterBuilder::run`] starts it.
#[derive(Debug)]
#[must_use]
pub struct ClusterBuilder<S = ServersOnly> {
    replicas: usize,
    standalone: Vec<String>,
    agents: Vec<String>,
    config: Option<String>,
    kit: S,
}

/// A cluster with nothing asked for yet (a primary is always there).
pub fn cluster() -> ClusterBuilder {
    ClusterBuilder { replicas: 0, standalone: vec![], agents: vec![], config: None, kit: ServersOnly }
}

impl<S: Start> ClusterBuilder<S> {
    /// The primary (every cluster has one; this reads as the design's sentence).
    pub fn primary(self) -> Self {
        self
    }

    /// One more streaming replica (`replica`, then `replica2`, ...).
    pub fn replica(self) -> Self {
        self.replicas(1)
    }

    /// `n` more streaming replicas.
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas += n;
        self
    }

    /// One more server of its own (not replicating; e.g. a shard or a logical replica) with
    /// `conf` appended to its `postgresql.conf`.
    pub fn standalone(mut self, conf: &str) -> Self {
        self.standalone.push(conf.to_owned());
        self
    }

    /// An agent in front of the server named `server` (`primary`, `replica`, `replica2`, ...,
    /// `standalone`, `standalone2`, ...).
    pub fn agent(mut self, server: &str) -> Self {
        self.agents.push(server.to_owned());
        self
    }

    /// A dispatcher with `config` (what the kit makes of it is the kit's).
    pub fn dispatcher(mut self, config: &str) -> Self {
        self.config = Some(config.to_owned());
        self
    }

    /// The same cluster, started by `kit`.
    pub fn with<T: Start>(self, kit: T) -> ClusterBuilder<T> {
        let ClusterBuilder { replicas, standalone, agents, config, .. } = self;
        ClusterBuilder { replicas, standalone, agents, config, kit }
    }

    /// Starts the servers, then the agents, then the dispatcher; panics with the reason when
    /// one cannot start.
    pub fn run(self) -> Cluster<S> {
        let mut pg = PgCluster::start_with_replicas(self.replicas).expect("PostgreSQL test cluster");
        for conf in &self.standalone {
            pg.add_standalone_with(conf).expect("a standalone PostgreSQL server");
        }
        let agents: Vec<(String, S::Agent)> =
            self.agents.iter().map(|name| (name.clone(), self.kit.agent(name, server(&pg, name)))).collect();
        let dispatcher = self.config.map(|cfg| self.kit.dispatcher(&cfg, &pg, &agents));
        Cluster { dispatcher, agents, pg }
    }
}

/// The server named `name` in `pg`.
pub fn server<'a>(pg: &'a PgCluster, name: &str) -> &'a PgServer {
    let nth = |prefix: &str| -> Option<usize> {
        let rest = name.strip_prefix(prefix)?;
        if rest.is_empty() {
            Some(0)
        } else {
            rest.parse::<usize>().ok().map(|n| n - 1)
        }
    };
    if name == "primary" {
        &pg.primary
    } else if let Some(i) = nth("replica") {
        &pg.replicas[i]
    } else if let Some(i) = nth("standalone") {
        &pg.standalone[i]
    } else {
        panic!("no server named {name}")
    }
}

/// A running cluster; dropped in order: the dispatcher, the agents, then the servers.
#[derive(Debug)]
pub struct Cluster<S: Start = ServersOnly> {
    /// The dispatcher, when one was asked for.
    pub dispatcher: Option<S::Dispatcher>,
    /// The agents, with the names of the servers they front.
    pub agents: Vec<(String, S::Agent)>,
    /// The PostgreSQL servers.
    pub pg: PgCluster,
}

impl<S: Start> Cluster<S> {
    /// The dispatcher (panics when none was asked for).
    pub fn dispatcher(&self) -> &S::Dispatcher {
        self.dispatcher.as_ref().expect("a cluster built with .dispatcher(cfg)")
    }
}
