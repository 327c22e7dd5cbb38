//! [`Member`]: what the engine needs of a front end's member (an HTTP backend, a PostgreSQL
//! server) to keep it in a [`Membership`](super::Membership) and choose it: its name, its role,
//! its address, the tables it holds, and its engine part ([`Backend`]: health, drain, ejection,
//! admission, latency, counters).

use crate::backend::Backend;
use crate::config::Role;
use std::net::SocketAddr;

/// A member of the engine's membership.
pub trait Member: Send + Sync + 'static {
    /// Its name, unique in its membership (the admin API names it so).
    fn name(&self) -> &str;

    /// Its engine part; its `name` is the member's metric label.
    fn backend(&self) -> &Backend;

    /// Primary or replica.
    fn role(&self) -> Role {
        self.backend().role
    }

    /// Its address, unique in its membership.
    fn addr(&self) -> SocketAddr {
        self.backend().addr
    }

    /// Whether it holds every one of `tables` (empty, tables unknown: only one holding all).
    fn covers(&self, tables: &[String]) -> bool {
        self.backend().holds.covers(tables)
    }

    /// It left the membership: it takes no new request, those in flight finish.
    fn retire(&self) {
        self.backend().retire()
    }
}

impl Member for Backend {
    fn name(&self) -> &str {
        &self.name
    }

    fn backend(&self) -> &Backend {
        self
    }
}
