//! [`Clients`]: the connected PostgreSQL clients and what each is doing: `GET /pg/clients`
//! ([`Clients::view`]) and the client gauges of `/metrics` ([`Clients::publish_metrics`]).

use crate::config::PoolMode;
use crate::server::metrics::PgMetrics;
use crate::server::servers::Server;
use crate::session::held::Pins;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Every logged-in client.
#[derive(Debug, Default)]
pub struct Clients {
    map: Mutex<BTreeMap<u64, Arc<ClientInfo>>>,
}

/// What a client is doing, as the admin views show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ClientState {
    /// Waiting for the client's next message, no transaction open.
    Idle = 0,
    /// A statement or batch is running.
    Active = 1,
    /// Between statements of an open transaction.
    InTransaction = 2,
    /// Between statements of a failed transaction (awaiting ROLLBACK).
    FailedTransaction = 3,
}

impl ClientState {
    /// The name in `/pg/clients` and the `refract_pg_clients{state}` gauge.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientState::Idle => "idle",
            ClientState::Active => "active",
            ClientState::InTransaction => "in-transaction",
            ClientState::FailedTransaction => "in-failed-transaction",
        }
    }

    /// Every state, in gauge order.
    pub const ALL: [ClientState; 4] =
        [ClientState::Idle, ClientState::Active, ClientState::InTransaction, ClientState::FailedTransaction];

    fn from_u8(v: u8) -> ClientState {
        ClientState::ALL.get(usize::from(v)).copied().unwrap_or(ClientState::Idle)
    }
}

/// One client: fixed facts from its login, and two atomics the session updates.
#[derive(Debug)]
pub struct ClientInfo {
    /// refract's id for the session.
    pub id: u64,
    /// The user it logged in as.
    pub user: String,
    /// The database it asked for.
    pub database: String,
    /// Its address.
    pub remote: Option<SocketAddr>,
    /// Its pool mode.
    pub pool_mode: PoolMode,
    /// Whether it connected over TLS.
    pub tls: bool,
    /// The event loop serving it (`refract_core::worker::current()` at login).
    pub shard: usize,
    state: AtomicU8,
    /// Index + 1 in `Servers::list` of the server connection it holds; 0 = none.
    bound: AtomicUsize,
    /// Why it is pinned to its server connection (`crate::session::held::Pins` bits); 0 = not pinned.
    pinned: AtomicU8,
}

impl ClientInfo {
    /// A client that has just logged in (idle, no server).
    pub fn new(
        id: u64,
        user: &str,
        database: &str,
        remote: Option<SocketAddr>,
        pool_mode: PoolMode,
        tls: bool,
    ) -> Self {
        ClientInfo {
            id,
            user: user.to_owned(),
            database: database.to_owned(),
            remote,
            pool_mode,
            tls,
            shard: refract_core::worker::current(),
            state: AtomicU8::new(ClientState::Idle as u8),
            bound: AtomicUsize::new(0),
            pinned: AtomicU8::new(0),
        }
    }

    /// Records what the session is doing.
    pub fn set_state(&self, state: ClientState) {
        self.state.store(state as u8, Ordering::Relaxed);
    }

    /// What the session is doing.
    pub fn state(&self) -> ClientState {
        ClientState::from_u8(self.state.load(Ordering::Relaxed))
    }

    /// Records the server (its index in `Servers::list`) whose connection the session holds.
    pub fn set_bound(&self, server: Option<usize>) {
        self.bound.store(server.map_or(0, |i| i + 1), Ordering::Relaxed);
    }

    /// Records why the session is pinned to its server connection (0: it is not).
    pub fn set_pinned(&self, bits: u8) {
        self.pinned.store(bits, Ordering::Relaxed);
    }

    /// Why the session is pinned (`crate::session::held::Pins` bits).
    pub fn pinned(&self) -> u8 {
        self.pinned.load(Ordering::Relaxed)
    }

    /// The index of the server whose connection the session holds.
    pub fn bound(&self) -> Option<usize> {
        self.bound.load(Ordering::Relaxed).checked_sub(1)
    }
}

/// A client's entry in [`Clients`]; removed on drop.
#[derive(Debug)]
pub struct Registration {
    /// The entry.
    pub info: Arc<ClientInfo>,
    owner: Arc<Clients>,
}

impl Clients {
    /// Adds a client until the returned registration is dropped.
    pub fn register(self: &Arc<Self>, info: ClientInfo) -> Registration {
        let info = Arc::new(info);
        self.lock().insert(info.id, info.clone());
        Registration { info, owner: self.clone() }
    }

    /// Every client, by id.
    pub fn snapshot(&self) -> Vec<Arc<ClientInfo>> {
        self.lock().values().cloned().collect()
    }

    /// `GET /pg/clients`: every logged-in client and the server connection it holds, named
    /// from `servers` (every server of the cluster, of every shard).
    pub(crate) fn view(&self, servers: &[Arc<Server>]) -> Value {
        let clients: Vec<Value> = self
            .snapshot()
            .iter()
            .map(|c| {
                let bound = c.bound().and_then(|i| servers.iter().find(|s| s.index == i).map(|s| s.name.clone()));
                json!({
                    "id": c.id,
                    "user": c.user,
                    "database": c.database,
                    "remote": c.remote.map(|a| a.to_string()),
                    "pool_mode": c.pool_mode.as_str(),
                    "state": c.state().as_str(),
                    "server": bound,
                    "pinned": Pins(c.pinned()).names(),
                    "tls": c.tls,
                    "shard": c.shard,
                })
            })
            .collect();
        json!(clients)
    }

    /// Refreshes the client gauges (by state, pinned; called when `/metrics` is scraped).
    pub(crate) fn publish_metrics(&self, pg_metrics: &PgMetrics) {
        let mut counts = [0usize; ClientState::ALL.len()];
        for c in self.snapshot() {
            counts[c.state() as usize] += 1;
        }
        for (state, n) in ClientState::ALL.iter().zip(counts) {
            pg_metrics.set_clients(state.as_str(), n);
        }
        let pinned = self.snapshot().iter().filter(|c| c.pinned() != 0).count();
        pg_metrics.set_pinned_clients(pinned);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<ClientInfo>>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.owner.lock().remove(&self.info.id);
    }
}
