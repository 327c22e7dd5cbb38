//! [`Pool`]: one server's idle connections, at most `pool_size` in use; [`Guard`] is a checkout.
//!
//! With the per-core runtime each shard's event loop has its own sockets, so idle connections
//! are kept per shard (by the shard the socket is registered with): a checkout takes one of its
//! own shard's, opens a new one while the pool has room, and only when it has none takes
//! another shard's and registers it here (it then stays here).
//!
//! A server with an agent has connections of two kinds ([`Path`]): through the agent (a large
//! result may be handed over) and straight to the server (the statements known to answer small,
//! `sizes.rs`). A checkout takes an idle connection of the kind it wants, opens one while the
//! pool has room, and otherwise takes one of the other kind, which it replaces by a new one of
//! its own kind while the pool's swap budget lasts (`pool_size` at once, then one a second):
//! a workload whose mix changes gets the connections it needs within a second or so, and one
//! whose mix is steady does not reconnect on every statement.

use super::sizes::Path;
use super::{Login, ServerConn};
use crate::error::PgError;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Connections of the other kind replaced per second once the first `pool_size` are spent.
const SWAPS_PER_SECOND: f64 = 1.0;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A server's connection pool.
#[derive(Debug)]
pub struct Pool {
    addr: SocketAddr,
    login: Arc<Login>,
    /// How direct connections log in, when `login` goes through an agent.
    direct: Option<Arc<Login>>,
    /// Replacements of an idle connection of the other kind left (a token bucket).
    swaps: Mutex<Swaps>,
    /// Idle connections by home shard.
    idle: Vec<Mutex<Vec<ServerConn>>>,
    slots: Arc<Semaphore>,
    size: usize,
    checkout_timeout: Duration,
    /// Checkouts waiting for a free slot right now.
    waiting: AtomicUsize,
}

/// A server connection checked out of its pool; [`Guard::release`] returns it, dropping
/// discards it (a connection left mid-transaction must not be reused).
#[derive(Debug)]
pub struct Guard {
    conn: Option<ServerConn>,
    pool: Arc<Pool>,
    _slot: OwnedSemaphorePermit,
}

impl Pool {
    /// An empty pool.
    pub fn new(addr: SocketAddr, login: Arc<Login>, size: usize, checkout_timeout: Duration) -> Arc<Pool> {
        let slots = Arc::new(Semaphore::new(size));
        let waiting = AtomicUsize::new(0);
        let idle = (0..refract_core::worker::count()).map(|_| Mutex::new(vec![])).collect();
        let direct = login.hybrid.map(|_| Arc::new(Login { hybrid: None, ..(*login).clone() }));
        let swaps = Mutex::new(Swaps { tokens: size as f64, at: Instant::now() });
        Arc::new(Pool { addr, login, direct, swaps, idle, slots, size, checkout_timeout, waiting })
    }

    /// The idle connections registered with `shard`'s event loop.
    fn idle(&self, shard: usize) -> std::sync::MutexGuard<'_, Vec<ServerConn>> {
        let list = &self.idle[shard.min(self.idle.len() - 1)];
        list.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One idle connection of kind `want` for this shard: its own, else (when the pool has no
    /// room for a new one) another shard's, moved here, else one of the other kind, unless it
    /// is replaced ([`Pool::may_swap`]). `None`: open a new one of kind `want`.
    fn take_idle(&self, want: Path) -> Option<ServerConn> {
        let here = refract_core::worker::current();
        if let Some(c) = pop_kind(&mut self.idle(here), Some(want)) {
            return Some(c);
        }
        // `in_use` counts this checkout, which holds no connection yet.
        if self.in_use() + self.idle_count() <= self.size {
            return None;
        }
        if let Some(c) = self.take_from_other_shard(here, Some(want)) {
            return Some(c);
        }
        let other = pop_kind(&mut self.idle(here), None).or_else(|| self.take_from_other_shard(here, None))?;
        if self.may_swap() {
            tracing::debug!(server = %self.addr, ?want, "replacing an idle connection of the other kind");
            return None; // `other` closes here; a new one of kind `want` takes its place
        }
        Some(other)
    }

    /// Another shard's idle connection (of kind `want`, or any), registered with this one.
    fn take_from_other_shard(&self, here: usize, want: Option<Path>) -> Option<ServerConn> {
        let mut conn = (0..self.idle.len()).filter(|&i| i != here).find_map(|i| pop_kind(&mut self.idle(i), want))?;
        match conn.wire.rehome() {
            Ok(()) => {
                conn.home = here;
                Some(conn)
            }
            Err(e) => {
                tracing::debug!(server = %self.addr, "could not move an idle connection to this shard: {e}");
                None
            }
        }
    }

    /// Whether an idle connection of the other kind may be replaced now (spends the budget).
    fn may_swap(&self) -> bool {
        let mut s = self.swaps.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let earned = now.duration_since(s.at).as_secs_f64() * SWAPS_PER_SECOND;
        s.tokens = (s.tokens + earned).min(self.size as f64);
        s.at = now;
        if s.tokens < 1.0 {
            return false;
        }
        s.tokens -= 1.0;
        true
    }

    /// The kind of connection a statement that wants `path` gets: without an agent, direct.
    fn kind(&self, path: Path) -> Path {
        if self.direct.is_some() {
            path
        } else {
            Path::Direct
        }
    }

    /// How a new connection of kind `path` logs in.
    fn login_for(&self, path: Path) -> &Login {
        match (&self.direct, path) {
            (Some(direct), Path::Direct) => direct,
            _ => &self.login,
        }
    }

    /// An idle connection, or a new one, of kind `path` if it can (see the module's text);
    /// waits for a free slot at most `checkout_timeout`.
    pub async fn get(self: &Arc<Self>, path: Path) -> Result<Guard, PgError> {
        let want = self.kind(path);
        let slot = match self.slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => self.wait_for_slot().await?,
        };
        let conn = loop {
            match self.take_idle(want) {
                // An idle connection whose peer went away (the server restarted, its agent
                // died) is dropped here, before a statement is lost on it.
                Some(mut c) if !c.wire.open_and_quiet() => {
                    tracing::debug!(server = %self.addr, "dropping an idle connection the other end closed");
                    c.broken = true;
                }
                Some(c) => break c,
                None => break ServerConn::connect(self.addr, self.login_for(want)).await?,
            }
        };
        Ok(Guard { conn: Some(conn), pool: self.clone(), _slot: slot })
    }

    /// Waits (counted in `waiting`) at most `checkout_timeout` for a slot.
    async fn wait_for_slot(&self) -> Result<OwnedSemaphorePermit, PgError> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let _waiting = Waiting(&self.waiting); // decrements even if the checkout is cancelled
        tokio::time::timeout(self.checkout_timeout, self.slots.clone().acquire_owned())
            .await
            .map_err(|_| PgError::Timeout("waiting for a free server connection"))?
            .map_err(|_| PgError::Unavailable("pool closed".into()))
    }

    /// Opens connections (on this shard) until `n` are idle (or one fails).
    pub async fn fill_to(self: &Arc<Self>, n: usize) -> Result<(), PgError> {
        while self.idle_count() < n && self.in_use() + self.idle_count() < self.size {
            let conn = ServerConn::connect(self.addr, &self.login).await?;
            self.idle(conn.home).push(conn);
        }
        Ok(())
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How connections log in.
    pub fn login(&self) -> &Login {
        &self.login
    }

    /// Drops every idle connection (the server went down; they are dead).
    pub fn clear(&self) {
        for shard in 0..self.idle.len() {
            self.idle(shard).clear();
        }
    }

    /// Connections checked out.
    pub fn in_use(&self) -> usize {
        self.size - self.slots.available_permits()
    }

    /// Idle connections.
    pub fn idle_count(&self) -> usize {
        (0..self.idle.len()).map(|shard| self.idle(shard).len()).sum()
    }

    /// Checkouts waiting for a free connection.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Most connections (`pool_size`).
    pub fn size(&self) -> usize {
        self.size
    }
}

/// The pool's budget for replacing idle connections of the other kind.
#[derive(Debug)]
struct Swaps {
    tokens: f64,
    at: Instant,
}

/// The most recently idled connection of kind `want` (any kind: `None`) in `list`.
fn pop_kind(list: &mut Vec<ServerConn>, want: Option<Path>) -> Option<ServerConn> {
    let i = list.iter().rposition(|c| want.is_none_or(|w| c.path() == w))?;
    Some(list.remove(i))
}

/// Counts one waiting checkout while alive.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Guard {
    /// Returns a healthy connection to the pool.
    pub fn release(mut self) {
        if let Some(mut conn) = self.conn.take() {
            if !conn.broken && conn.wire_is_clean() {
                self.pool.idle(conn.home).push(conn);
            }
        }
    }
}

impl ServerConn {
    /// Its kind: through the server's agent or straight to the server.
    pub fn path(&self) -> Path {
        if self.hybrid_id.is_some() {
            Path::Agent
        } else {
            Path::Direct
        }
    }

    /// Nothing unread is buffered (a reused connection must start a fresh conversation).
    fn wire_is_clean(&mut self) -> bool {
        self.wire.buffered().is_empty()
    }
}

impl std::ops::Deref for Guard {
    type Target = ServerConn;

    fn deref(&self) -> &ServerConn {
        // Invariant: `conn` is only taken by `release`, which consumes the guard.
        self.conn.as_ref().unwrap_or_else(|| unreachable!("guard without connection"))
    }
}

impl std::ops::DerefMut for Guard {
    fn deref_mut(&mut self) -> &mut ServerConn {
        self.conn.as_mut().unwrap_or_else(|| unreachable!("guard without connection"))
    }
}
