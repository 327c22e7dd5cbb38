//! refract's test kit, for the integration tests and the lab only (a dev-dependency
//! everywhere but in `refract-lab`, which is behind `refract`'s `lab` feature): real
//! PostgreSQL servers in a temporary directory and the one builder the tests start a cluster
//! with, `cluster().primary().replica().agent(..).dispatcher(cfg).run()`.
//!
//! # Layout
//! - [`pg`]: a PostgreSQL primary, streaming replicas and servers of their own ([`PgCluster`]),
//!   the installation's programs ([`tool`]), the login every server has ([`USER`]), refract's
//!   `[postgres]` section in front of them ([`postgres_section`]).
//! - [`cluster`]: the builder ([`cluster()`]): which servers, which HTTP backends, which agents
//!   in front of which, which dispatcher config; what starts a backend, an agent or a
//!   dispatcher is the test's kit ([`Start`]).
//! - [`etcd`]: a real etcd server ([`Etcd`]) that can be stopped and started again.
//! - `port`: free loopback ports, never the same one twice in a process ([`free_port`]).

pub mod cluster;
pub mod etcd;
pub mod pg;
mod port;

pub use cluster::{cluster, Cluster, ClusterBuilder, Listening, NoBackend, Rig, ServersOnly, Start};
pub use etcd::Etcd;
pub use pg::{postgres_section, tool, PgCluster, PgServer, DATABASE, PASSWORD, USER};
pub use port::{free_port, try_free_port};
