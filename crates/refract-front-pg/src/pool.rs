//! [`Pool`]: one server's idle connections, at most `pool_size` in use; [`Guard`] is a checkout.
//!
//! With the per-core runtime each shard's event loop has its own sockets, so idle connections
//! are kept per shard (by the shard the socket is registered with): a checkout takes one of its
//! own shard's, opens a new one while the pool has room, and only when it has none takes
//! another shard's and registers it here (it then stays here).

use super::error::PgError;
use super::server::{Login, ServerConn};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A server's connection pool.
#[derive(Debug)]
pub struct Pool {
    addr: SocketAddr,
    login: Arc<Login>,
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
        let idle = (0..refract_core::shard::count()).map(|_| Mutex::new(vec![])).collect();
        Arc::new(Pool { addr, login, idle, slots, size, checkout_timeout, waiting })
    }

    /// The idle connections registered with `shard`'s event loop.
    fn idle(&self, shard: usize) -> std::sync::MutexGuard<'_, Vec<ServerConn>> {
        let list = &self.idle[shard.min(self.idle.len() - 1)];
        list.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One idle connection for this shard: its own, else (when the pool has no room for a new
    /// one) another shard's, moved here. `None`: open a new one.
    fn take_idle(&self) -> Option<ServerConn> {
        let here = refract_core::shard::current();
        if let Some(c) = self.idle(here).pop() {
            return Some(c);
        }
        // `in_use` counts this checkout, which holds no connection yet.
        if self.in_use() + self.idle_count() <= self.size {
            return None;
        }
        let mut conn = (0..self.idle.len()).filter(|&i| i != here).find_map(|i| self.idle(i).pop())?;
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

    /// An idle connection, or a new one; waits for a free slot at most `checkout_timeout`.
    pub async fn get(self: &Arc<Self>) -> Result<Guard, PgError> {
        let slot = match self.slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => self.wait_for_slot().await?,
        };
        let conn = loop {
            match self.take_idle() {
                // An idle connection whose peer went away (the server restarted, its agent
                // died) is dropped here, before a statement is lost on it.
                Some(mut c) if !c.wire.open_and_quiet() => {
                    tracing::debug!(server = %self.addr, "dropping an idle connection the other end closed");
                    c.broken = true;
                }
                Some(c) => break c,
                None => break ServerConn::connect(self.addr, &self.login).await?,
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
