//! The one builder an integration test starts its cluster with:
//! `cluster().primary().replica().agent("replica").dispatcher(cfg).run()`, or for HTTP
//! `cluster().backends(2).agent("b2").dispatcher(cfg).with(kit).run()`. The test says what
//! differs (which PostgreSQL servers, how many HTTP backends, which have an agent in front, the
//! dispatcher's config); what starts a backend, an agent or a dispatcher is the test's kit, a
//! [`Start`] (the `refract` binary, or the library in the test's own process), given with
//! [`ClusterBuilder::with`].

use crate::pg::{PgCluster, PgServer};
use std::net::SocketAddr;

/// What listens at an address: a PostgreSQL server, a kit's backend (an agent can be put in
/// front of either).
pub trait Listening {
    /// Where it listens.
    fn addr(&self) -> SocketAddr;
}

impl Listening for PgServer {
    fn addr(&self) -> SocketAddr {
        PgServer::addr(self)
    }
}

impl Listening for SocketAddr {
    fn addr(&self) -> SocketAddr {
        *self
    }
}

/// The backend of a kit that starts none.
#[derive(Debug)]
pub enum NoBackend {}

impl Listening for NoBackend {
    fn addr(&self) -> SocketAddr {
        match *self {}
    }
}

/// How a test kit starts what the cluster has besides its PostgreSQL servers.
pub trait Start {
    /// A running HTTP backend, stopped when dropped ([`NoBackend`] for a kit without).
    type Backend: Listening;
    /// A running agent, stopped when dropped.
    type Agent;
    /// A running dispatcher, stopped when dropped.
    type Dispatcher;

    /// Starts the HTTP backend `name` (`b1`, `b2`, ... unless named) with `args` (e.g.
    /// `--delay-ms 300`). The default: this kit starts none.
    fn backend(&self, name: &str, args: &[String]) -> Self::Backend {
        panic!("backend {name} ({args:?}) needs a test kit that starts backends (ClusterBuilder::with)");
    }

    /// Starts an agent in front of `target`, the server or backend named `name` (`primary`,
    /// `replica`, `replica2`, `standalone`, `b1`, ...).
    fn agent(&self, name: &str, target: SocketAddr) -> Self::Agent;

    /// Starts a dispatcher with `config` in front of what `rig` has started.
    fn dispatcher(&self, config: &str, rig: Rig<'_, Self>) -> Self::Dispatcher;
}

/// What runs when the dispatcher starts, in the order it was asked for.
#[derive(Debug)]
pub struct Rig<'a, S: Start + ?Sized> {
    /// The PostgreSQL servers, when any were asked for.
    pub pg: Option<&'a PgCluster>,
    /// The HTTP backends, by name.
    pub backends: &'a [(String, S::Backend)],
    /// The agents, with the names of the servers or backends they front.
    pub agents: &'a [(String, S::Agent)],
}

impl<S: Start + ?Sized> Rig<'_, S> {
    /// The PostgreSQL servers (panics when none were asked for).
    pub fn pg(&self) -> &PgCluster {
        self.pg.expect("a cluster built with .primary()")
    }
}

/// PostgreSQL servers only: no backend, no agent, no dispatcher.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServersOnly;

impl Start for ServersOnly {
    type Backend = NoBackend;
    type Agent = ();
    type Dispatcher = ();

    fn agent(&self, name: &str, _: SocketAddr) {
        panic!("an agent in front of {name} needs a test kit (ClusterBuilder::with)");
    }

    fn dispatcher(&self, _: &str, _: Rig<'_, Self>) {
        panic!("a dispatcher needs a test kit (ClusterBuilder::with)");
    }
}

/// What to start; [`ClusterBuilder::run`] starts it.
#[derive(Debug)]
#[must_use]
pub struct ClusterBuilder<S = ServersOnly> {
    pg: bool,
    replicas: usize,
    standalone: Vec<String>,
    backends: Vec<(String, Vec<String>)>,
    agents: Vec<String>,
    config: Option<String>,
    kit: S,
}

/// A cluster with nothing asked for yet.
pub fn cluster() -> ClusterBuilder {
    ClusterBuilder {
        pg: false,
        replicas: 0,
        standalone: vec![],
        backends: vec![],
        agents: vec![],
        config: None,
        kit: ServersOnly,
    }
}

impl<S: Start> ClusterBuilder<S> {
    /// A PostgreSQL primary (asking for a replica or a standalone server asks for it too).
    pub fn primary(mut self) -> Self {
        self.pg = true;
        self
    }

    /// One more streaming replica (`replica`, then `replica2`, ...).
    pub fn replica(self) -> Self {
        self.replicas(1)
    }

    /// `n` more streaming replicas.
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas += n;
        self.primary()
    }

    /// One more server of its own (not replicating; e.g. a shard or a logical replica) with
    /// `conf` appended to its `postgresql.conf`.
    pub fn standalone(mut self, conf: &str) -> Self {
        self.standalone.push(conf.to_owned());
        self.primary()
    }

    /// `n` more HTTP backends, named `b1`, `b2`, ... by their place among the backends.
    pub fn backends(mut self, n: usize) -> Self {
        for _ in 0..n {
            let name = format!("b{}", self.backends.len() + 1);
            self.backends.push((name, vec![]));
        }
        self
    }

    /// One more HTTP backend, named `name`, started with `args` (what they mean is the kit's).
    pub fn backend(mut self, name: &str, args: &[&str]) -> Self {
        self.backends.push((name.to_owned(), args.iter().map(|a| (*a).to_owned()).collect()));
        self
    }

    /// An agent in front of the server or backend named `name` (`primary`, `replica`,
    /// `replica2`, ..., `standalone`, `standalone2`, ..., `b1`, ...).
    pub fn agent(mut self, name: &str) -> Self {
        self.agents.push(name.to_owned());
        self
    }

    /// A dispatcher with `config` (what the kit makes of it is the kit's).
    pub fn dispatcher(mut self, config: &str) -> Self {
        self.config = Some(config.to_owned());
        self
    }

    /// The same cluster, started by `kit`.
    pub fn with<T: Start>(self, kit: T) -> ClusterBuilder<T> {
        let ClusterBuilder { pg, replicas, standalone, backends, agents, config, .. } = self;
        ClusterBuilder { pg, replicas, standalone, backends, agents, config, kit }
    }

    /// Starts the servers and the backends, then the agents, then the dispatcher; panics with
    /// the reason when one cannot start.
    pub fn run(self) -> Cluster<S> {
        let pg = self.pg.then(|| {
            let mut pg = PgCluster::start_with_replicas(self.replicas).expect("PostgreSQL test cluster");
            for conf in &self.standalone {
                pg.add_standalone_with(conf).expect("a standalone PostgreSQL server");
            }
            pg
        });
        let backends: Vec<(String, S::Backend)> =
            self.backends.iter().map(|(name, args)| (name.clone(), self.kit.backend(name, args))).collect();
        let target = |name: &str| match backends.iter().find(|(n, _)| n == name) {
            Some((_, b)) => b.addr(),
            None => server(pg.as_ref().unwrap_or_else(|| panic!("no backend named {name}")), name).addr(),
        };
        let agents: Vec<(String, S::Agent)> =
            self.agents.iter().map(|name| (name.clone(), self.kit.agent(name, target(name)))).collect();
        let rig = Rig { pg: pg.as_ref(), backends: &backends, agents: &agents };
        let dispatcher = self.config.map(|cfg| self.kit.dispatcher(&cfg, rig));
        Cluster { dispatcher, agents, backends, pg }
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

/// A running cluster; dropped in order: the dispatcher, the agents, the backends, then the
/// servers.
#[derive(Debug)]
pub struct Cluster<S: Start = ServersOnly> {
    /// The dispatcher, when one was asked for.
    pub dispatcher: Option<S::Dispatcher>,
    /// The agents, with the names of the servers or backends they front.
    pub agents: Vec<(String, S::Agent)>,
    /// The HTTP backends, by name.
    pub backends: Vec<(String, S::Backend)>,
    /// The PostgreSQL servers, when any were asked for.
    pub pg: Option<PgCluster>,
}

impl<S: Start> Cluster<S> {
    /// The dispatcher (panics when none was asked for).
    pub fn dispatcher(&self) -> &S::Dispatcher {
        self.dispatcher.as_ref().expect("a cluster built with .dispatcher(cfg)")
    }

    /// The PostgreSQL servers (panics when none were asked for).
    pub fn pg(&self) -> &PgCluster {
        self.pg.as_ref().expect("a cluster built with .primary()")
    }

    /// The `N` backends, in the order asked for, and the dispatcher, for a test that holds
    /// (kills, drops) them one by one; panics when the cluster has anything else (servers,
    /// agents) or other than `N` backends.
    pub fn split<const N: usize>(self) -> ([S::Backend; N], S::Dispatcher) {
        assert!(self.pg.is_none() && self.agents.is_empty(), "split: a cluster of backends and a dispatcher only");
        let dispatcher = self.dispatcher.expect("a cluster built with .dispatcher(cfg)");
        let backends: Vec<S::Backend> = self.backends.into_iter().map(|(_, b)| b).collect();
        let n = backends.len();
        let backends = backends.try_into().unwrap_or_else(|_| panic!("split::<{N}> of {n} backends"));
        (backends, dispatcher)
    }
}
