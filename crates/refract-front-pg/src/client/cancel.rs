//! [`Cancels`]: refract's BackendKeyData per client, mapped to the server connection the
//! client is using right now, so a CancelRequest reaches the right server.
//!
//! The process ids refract gives are [`FIRST_PID`] and above: no process has such an id
//! (Linux caps `pid_max` at 2^22), so a client that passes its own to `pg_terminate_backend`
//! or `pg_cancel_backend` gets PostgreSQL's "not a PostgreSQL server process" warning rather
//! than ending an unrelated backend that happens to have that id.
//!
//! Several dispatchers behind one address: each gives ids from its own slot of the range
//! ([`Cancels::join`], 2^22 ids a slot), so an id says which dispatcher handed it out; a
//! CancelRequest for an id this dispatcher did not hand out goes to the [`CancelRelay`],
//! which passes it to the peers of that slot.

use crate::server::ServerKey;
use rand::RngCore;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

type Slot = Arc<SlotState>;

/// What a client's statement is doing, as far as a cancel is concerned.
#[derive(Debug, Default)]
struct SlotState {
    /// The server connection it runs on, if any.
    server: Mutex<Option<ServerKey>>,
    /// Wakes a statement that waits for a server connection ([`CancelKey::unless_cancelled`]).
    wait: tokio::sync::Notify,
}

impl SlotState {
    fn server(&self) -> std::sync::MutexGuard<'_, Option<ServerKey>> {
        self.server.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Passes a CancelRequest this dispatcher cannot resolve to the dispatcher that handed out its
/// id (several dispatchers, `[cluster]`); fire and forget, as PostgreSQL answers none.
pub trait CancelRelay: Send + Sync {
    /// Forwards the request for (`pid`, `secret`).
    fn relay(&self, pid: i32, secret: [u8; 4]);
}

/// All clients' cancel keys.
#[derive(Default)]
pub struct Cancels {
    keys: Mutex<HashMap<i32, ([u8; 4], Slot)>>,
    /// Ids handed out so far (the next is `FIRST_PID` plus this, modulo `PIDS`).
    handed: AtomicU32,
    /// With several dispatchers: this one's slot of the id range and where unknown ids go.
    cluster: std::sync::OnceLock<(u32, Arc<dyn CancelRelay>)>,
}

impl std::fmt::Debug for Cancels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cancels").field("slot", &self.cluster.get().map(|c| c.0)).finish_non_exhaustive()
    }
}

/// Ids in one dispatcher's slot.
const SLOT_IDS: u32 = 1 << 22;

/// How many slots the id range holds (from `FIRST_PID` to `i32::MAX`).
pub const SLOTS: u32 = PIDS / SLOT_IDS;

/// The slot an id handed out by a dispatcher in a cluster is in.
pub fn slot_of(pid: i32) -> Option<u32> {
    (pid >= FIRST_PID).then(|| (pid - FIRST_PID) as u32 / SLOT_IDS)
}

/// The lowest process id refract gives a client: 2^22, one above Linux's largest `pid_max`.
pub const FIRST_PID: i32 = 1 << 22;

/// How many ids there are from `FIRST_PID` to `i32::MAX` (BackendKeyData's pid is a positive
/// int32 for every client library).
const PIDS: u32 = (i32::MAX - FIRST_PID) as u32 + 1;

/// One client's key; unregistered on drop.
#[derive(Debug)]
pub struct CancelKey {
    /// The pid refract told the client.
    pub pid: i32,
    /// The secret refract told the client.
    pub secret: [u8; 4],
    slot: Slot,
    owner: Arc<Cancels>,
}

impl Cancels {
    /// A new client key, with an id no connected client has (after 2^31 - 2^22 logins the
    /// ids start again from `FIRST_PID`, skipping those still in use).
    pub fn register(self: &Arc<Self>) -> CancelKey {
        let mut secret = [0u8; 4];
        rand::thread_rng().fill_bytes(&mut secret);
        let slot: Slot = Arc::default();
        let mut keys = self.lock();
        let (base, span) = match self.cluster.get() {
            Some((slot, _)) => (FIRST_PID + (slot * SLOT_IDS) as i32, SLOT_IDS),
            None => (FIRST_PID, PIDS),
        };
        let pid = loop {
            let pid = base + (self.handed.fetch_add(1, Ordering::Relaxed) % span) as i32;
            if !keys.contains_key(&pid) {
                break pid;
            }
        };
        keys.insert(pid, (secret, slot.clone()));
        drop(keys);
        CancelKey { pid, secret, slot, owner: self.clone() }
    }

    /// The server connection to cancel for a client's (pid, secret), if it is using one. A
    /// statement still waiting for a server connection is cancelled here: its wait ends with
    /// `57014`, as the statement would on PostgreSQL ([`CancelKey::unless_cancelled`]).
    pub fn lookup(&self, pid: i32, secret: &[u8]) -> Option<ServerKey> {
        let keys = self.lock();
        let (s, slot) = keys.get(&pid)?;
        if s.as_slice() != secret {
            return None;
        }
        let key = slot.server().clone();
        if key.is_none() {
            slot.wait.notify_waiters();
        }
        key
    }

    /// From now on ids come from `slot` (below [`SLOTS`]) and requests for ids this dispatcher
    /// did not hand out go to `relay`. Once; `false` if already joined.
    pub fn join(&self, slot: u32, relay: Arc<dyn CancelRelay>) -> bool {
        self.cluster.set((slot % SLOTS, relay)).is_ok()
    }

    /// A CancelRequest from a client: sent on to the server connection its session is using,
    /// or, for an id this dispatcher did not hand out, to the dispatcher that did. `None`:
    /// nothing to do here (the session is idle, the secret is wrong, or it was relayed).
    pub fn route(&self, pid: i32, secret: &[u8]) -> Option<ServerKey> {
        if !self.lock().contains_key(&pid) {
            if let (Some((_, relay)), Ok(secret)) = (self.cluster.get(), <[u8; 4]>::try_from(secret)) {
                relay.relay(pid, secret);
            }
            return None;
        }
        self.lookup(pid, secret)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, ([u8; 4], Slot)>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl CancelKey {
    /// The client now runs on `key` (or on nothing).
    pub fn set(&self, key: Option<ServerKey>) {
        *self.slot.server() = key;
    }

    /// What a wait for a server connection needs to end at this client's cancel.
    pub fn waiter(&self) -> CancelWaiter {
        CancelWaiter { slot: self.slot.clone() }
    }
}

/// Ends a client's wait for a server connection when the client cancels ([`CancelKey::waiter`]).
#[derive(Debug, Clone)]
pub struct CancelWaiter {
    slot: Slot,
}

impl CancelWaiter {
    /// `wait`'s output, or `None` if the client cancelled (a CancelRequest with its key, here or
    /// forwarded by another dispatcher) while it ran.
    pub async fn unless_cancelled<F: std::future::Future>(&self, wait: F) -> Option<F::Output> {
        let cancelled = self.slot.wait.notified();
        tokio::pin!(cancelled);
        cancelled.as_mut().enable(); // a cancel from now on ends it
        tokio::select! {
            out = wait => Some(out),
            () = cancelled => None,
        }
    }
}

impl Drop for CancelKey {
    fn drop(&mut self) {
        self.owner.lock().remove(&self.pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_above_every_process_id_and_unique_among_clients() {
        let cancels = Arc::new(Cancels::default());
        let (a, b) = (cancels.register(), cancels.register());
        assert_eq!((a.pid, b.pid), (FIRST_PID, FIRST_PID + 1));
        // At the end of the range the ids start again, past those still in use.
        cancels.handed.store(PIDS - 1, Ordering::Relaxed);
        let last = cancels.register();
        assert_eq!(last.pid, i32::MAX);
        let next = cancels.register();
        assert_eq!(next.pid, FIRST_PID + 2, "{FIRST_PID} and the next are a's and b's");
        drop(a);
        cancels.handed.store(PIDS, Ordering::Relaxed);
        assert_eq!(cancels.register().pid, FIRST_PID, "free again once a left");
    }

    struct Relayed(Mutex<Vec<(i32, [u8; 4])>>);

    impl CancelRelay for Relayed {
        fn relay(&self, pid: i32, secret: [u8; 4]) {
            self.0.lock().unwrap().push((pid, secret));
        }
    }

    #[test]
    fn in_a_cluster_ids_come_from_the_slot_and_unknown_ones_are_relayed() {
        let cancels = Arc::new(Cancels::default());
        let relayed = Arc::new(Relayed(Mutex::default()));
        assert!(cancels.join(3, relayed.clone()));
        let key = cancels.register();
        assert_eq!((key.pid, slot_of(key.pid)), (FIRST_PID + 3 * (1 << 22), Some(3)));
        assert_eq!(cancels.route(key.pid, &key.secret), None, "idle: nothing to cancel, nothing relayed");
        assert_eq!(cancels.route(key.pid + 1, b"abcd"), None);
        assert_eq!(*relayed.0.lock().unwrap(), [(key.pid + 1, *b"abcd")]);
        assert_eq!(slot_of(i32::MAX), Some(SLOTS - 1));
        assert_eq!(slot_of(7), None);
    }

    #[tokio::test]
    async fn a_cancel_ends_a_wait_for_a_server_connection() {
        let cancels = Arc::new(Cancels::default());
        let key = cancels.register();
        let waiter = key.waiter();
        let (pid, secret) = (key.pid, key.secret);
        let c = cancels.clone();
        let cancel = async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            assert_eq!(c.lookup(pid, b"nope"), None);
            assert_eq!(c.lookup(pid, &secret), None, "no server yet");
        };
        let forever = std::future::pending::<()>();
        let (out, ()) = tokio::join!(waiter.unless_cancelled(forever), cancel);
        assert_eq!(out, None, "cancelled");
        // A cancel that came before a wait does not end it.
        assert_eq!(waiter.unless_cancelled(async { 7 }).await, Some(7));
    }

    #[test]
    fn a_key_finds_the_connection_only_with_its_secret() {
        let cancels = Arc::new(Cancels::default());
        let key = cancels.register();
        let server =
            ServerKey { addr: ([127, 0, 0, 1], 5432).into(), pid: 42, secret: bytes::Bytes::from_static(b"abcd") };
        key.set(Some(server.clone()));
        assert_eq!(cancels.lookup(key.pid, &key.secret), Some(server));
        assert_eq!(cancels.lookup(key.pid, b"nope"), None);
        let (pid, secret) = (key.pid, key.secret);
        drop(key);
        assert_eq!(cancels.lookup(pid, &secret), None, "gone with its client");
    }
}
