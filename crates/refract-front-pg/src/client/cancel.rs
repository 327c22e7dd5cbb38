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
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

type Slot = Arc<SlotState>;

/// What a client's statement is doing, as far as a cancel is concerned.
#[derive(Debug, Default)]
struct SlotState {
    /// The server connection it runs on, if any.
    server: Mutex<Option<ServerKey>>,
    /// Wakes a statement that waits for a server connection ([`CancelKey::unless_cancelled`]).
    wait: tokio::sync::Notify,
    /// Requests the client made so far: a simple Query, a FunctionCall, a batch up to its
    /// Sync or Flush ([`CancelKey::started`]).
    started: AtomicU64,
    /// Whether the last one has not had its ReadyForQuery yet.
    running: AtomicBool,
    /// The request (its number in `started`) a cancel came for while it had no server
    /// connection: it does not go on to one ([`CancelWaiter::unless_cancelled`]).
    cancelled: AtomicU64,
}

impl SlotState {
    fn server(&self) -> std::sync::MutexGuard<'_, Option<ServerKey>> {
        self.server.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The number of the request running now, if one is.
    fn request(&self) -> Option<u64> {
        self.running.load(Ordering::SeqCst).then(|| self.started.load(Ordering::SeqCst))
    }

    /// Whether a cancel came for the request running now before it had a server connection.
    fn cancelled(&self) -> bool {
        self.request().is_some_and(|n| self.cancelled.load(Ordering::SeqCst) == n)
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

/// How long after a cancel a statement that still runs gets it again ([`Cancels::deliver`]).
pub const RESEND_AFTER: Duration = Duration::from_millis(200);

/// How many times at most.
pub const RESENDS: u32 = 4;

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

    /// Delivers a client's CancelRequest for (`pid`, `secret`): to the server connection its
    /// request runs on (a CancelRequest on a new connection, `timeout` to connect), or, while
    /// the request has none (it waits for one, or is on its way to one), it ends there with
    /// 57014 ([`CancelWaiter`]). A cancel can overtake the statement it is for on the server
    /// connection too (the statement still on its way to the server, which ignores a cancel
    /// while it waits for a command): while that same request still runs on that connection,
    /// the cancel is sent again every [`RESEND_AFTER`], [`RESENDS`] times at most, in the
    /// background. Not once the client has had the request's ReadyForQuery: a later request
    /// is not its target.
    pub async fn deliver(&self, pid: i32, secret: &[u8], timeout: Duration) {
        let Some((slot, request)) = self.running(pid, secret) else { return };
        let server = slot.server().clone();
        let server = match (server, request) {
            (Some(server), _) => server,
            (None, None) => return, // idle: nothing to cancel, as PostgreSQL finds
            (None, Some(n)) => {
                slot.cancelled.store(n, Ordering::SeqCst);
                slot.wait.notify_waiters();
                // It may have got its connection in between: the cancel goes there too.
                let Some(server) = slot.server().clone() else { return };
                server
            }
        };
        if let Err(e) = crate::server::cancel(&server, timeout).await {
            tracing::debug!(error = %e, "cancel request not delivered");
            return;
        }
        let Some(request) = request else { return };
        // In the background: the client's cancel connection closes now, as PostgreSQL's does.
        tokio::spawn(async move {
            for _ in 0..RESENDS {
                tokio::time::sleep(RESEND_AFTER).await;
                let same = slot.request() == Some(request) && slot.server().as_ref() == Some(&server);
                if !same || crate::server::cancel(&server, timeout).await.is_err() {
                    return;
                }
            }
        });
    }

    /// A client's slot and the number of its statement running now (`None`: wrong key).
    fn running(&self, pid: i32, secret: &[u8]) -> Option<(Slot, Option<u64>)> {
        let keys = self.lock();
        let (s, slot) = keys.get(&pid)?;
        if s.as_slice() != secret {
            return None;
        }
        Some((slot.clone(), slot.request()))
    }

    /// From now on ids come from `slot` (below [`SLOTS`]) and requests for ids this dispatcher
    /// did not hand out go to `relay`. Once; `false` if already joined.
    pub fn join(&self, slot: u32, relay: Arc<dyn CancelRelay>) -> bool {
        self.cluster.set((slot % SLOTS, relay)).is_ok()
    }

    /// A CancelRequest from a client: delivered ([`Cancels::deliver`]) if this dispatcher
    /// handed out its id, else passed to the dispatcher that did (several dispatchers).
    pub async fn cancel(&self, pid: i32, secret: &[u8], timeout: Duration) {
        if !self.lock().contains_key(&pid) {
            if let (Some((_, relay)), Ok(secret)) = (self.cluster.get(), <[u8; 4]>::try_from(secret)) {
                relay.relay(pid, secret);
            }
            return;
        }
        self.deliver(pid, secret, timeout).await;
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

    /// The client made a request that runs until its ReadyForQuery: a simple Query, a
    /// FunctionCall, a batch of extended-protocol messages up to its Sync or Flush.
    pub fn started(&self) {
        self.slot.started.fetch_add(1, Ordering::SeqCst);
        self.slot.running.store(true, Ordering::SeqCst);
    }

    /// Its ReadyForQuery went to the client: no request of the client's runs.
    pub fn finished(&self) {
        self.slot.running.store(false, Ordering::SeqCst);
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
    /// `wait`'s output, or `None` if the client cancelled its request (a CancelRequest with its
    /// key, here or forwarded by another dispatcher) before or while it ran.
    pub async fn unless_cancelled<F: std::future::Future>(&self, wait: F) -> Option<F::Output> {
        tokio::pin!(wait);
        loop {
            let cancelled = self.slot.wait.notified();
            tokio::pin!(cancelled);
            cancelled.as_mut().enable(); // a cancel from now on ends it
            if self.slot.cancelled() {
                return None; // one came before
            }
            tokio::select! {
                biased;
                () = cancelled => {} // for this request, or one that has ended (checked above)
                out = &mut wait => return Some(out),
            }
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

    #[tokio::test]
    async fn in_a_cluster_ids_come_from_the_slot_and_unknown_ones_are_relayed() {
        let cancels = Arc::new(Cancels::default());
        let relayed = Arc::new(Relayed(Mutex::default()));
        assert!(cancels.join(3, relayed.clone()));
        let key = cancels.register();
        assert_eq!((key.pid, slot_of(key.pid)), (FIRST_PID + 3 * (1 << 22), Some(3)));
        let timeout = Duration::from_secs(1);
        cancels.cancel(key.pid, &key.secret, timeout).await; // idle: nothing to cancel, nothing relayed
        cancels.cancel(key.pid + 1, b"abcd", timeout).await;
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
        let timeout = Duration::from_secs(1);
        // Idle: a cancel has nothing to end, and the next request's wait is not ended by it.
        cancels.cancel(pid, &secret, timeout).await;
        key.started();
        assert_eq!(waiter.unless_cancelled(async { 7 }).await, Some(7));
        let c = cancels.clone();
        let cancel = async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            c.cancel(pid, b"nope", timeout).await;
            c.cancel(pid, &secret, timeout).await; // no server yet: ends the wait
        };
        let forever = std::future::pending::<()>();
        let (out, ()) = tokio::join!(waiter.unless_cancelled(forever), cancel);
        assert_eq!(out, None, "cancelled");
    }

    #[tokio::test]
    async fn a_cancel_before_the_wait_ends_its_request_and_no_later_one() {
        let cancels = Arc::new(Cancels::default());
        let key = cancels.register();
        let waiter = key.waiter();
        let timeout = Duration::from_secs(1);
        key.started();
        // The request is on its way to a server connection when its cancel comes.
        cancels.cancel(key.pid, &key.secret, timeout).await;
        assert_eq!(waiter.unless_cancelled(async { 7 }).await, None, "it does not go on");
        key.finished();
        key.started();
        assert_eq!(waiter.unless_cancelled(async { 8 }).await, Some(8), "the next request runs");
    }

    /// The server connection a cancel for (`pid`, `secret`) would reach.
    fn server_of(c: &Cancels, pid: i32, secret: &[u8]) -> Option<ServerKey> {
        c.running(pid, secret).and_then(|(slot, _)| slot.server().clone())
    }

    #[test]
    fn a_key_finds_the_connection_only_with_its_secret() {
        let cancels = Arc::new(Cancels::default());
        let key = cancels.register();
        let server =
            ServerKey { addr: ([127, 0, 0, 1], 5432).into(), pid: 42, secret: bytes::Bytes::from_static(b"abcd") };
        key.set(Some(server.clone()));
        assert_eq!(server_of(&cancels, key.pid, &key.secret), Some(server));
        assert_eq!(server_of(&cancels, key.pid, b"nope"), None);
        let (pid, secret) = (key.pid, key.secret);
        drop(key);
        assert_eq!(server_of(&cancels, pid, &secret), None, "gone with its client");
    }

    #[test]
    fn only_the_statement_running_when_the_cancel_came_is_resent_to() {
        let cancels = Arc::new(Cancels::default());
        let key = cancels.register();
        assert_eq!(cancels.running(key.pid, &key.secret).map(|(_, n)| n), Some(None), "idle");
        key.started();
        let (_, first) = cancels.running(key.pid, &key.secret).expect("known");
        assert_eq!(first, Some(1));
        key.finished();
        key.started();
        let (_, second) = cancels.running(key.pid, &key.secret).expect("known");
        assert_ne!(first, second, "a later statement is another one");
    }

    /// A server that counts the CancelRequests it is sent (reads each, then closes).
    async fn counting_server() -> (ServerKey, Arc<AtomicU32>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let count = Arc::new(AtomicU32::new(0));
        let seen = count.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let mut request = [0u8; 16];
                if tokio::io::AsyncReadExt::read_exact(&mut s, &mut request).await.is_ok() {
                    seen.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        (ServerKey { addr, pid: 42, secret: bytes::Bytes::from_static(b"abcd") }, count)
    }

    #[tokio::test]
    async fn a_cancel_is_sent_again_while_its_request_runs_and_not_after() {
        let (server, count) = counting_server().await;
        let cancels = Arc::new(Cancels::default());
        let key = cancels.register();
        let timeout = Duration::from_secs(1);
        // The request has its connection, and its statement may not have reached the server yet.
        key.set(Some(server));
        key.started();
        cancels.cancel(key.pid, &key.secret, timeout).await;
        assert_eq!(count.load(Ordering::SeqCst), 1, "sent at once");
        tokio::time::sleep(RESEND_AFTER * 2 + RESEND_AFTER / 2).await;
        key.finished();
        tokio::time::sleep(RESEND_AFTER / 4).await; // one on its way when it finished lands
        let resent = count.load(Ordering::SeqCst);
        assert!(resent >= 2, "sent again while the request runs: {resent}");
        tokio::time::sleep(RESEND_AFTER * 2).await;
        assert_eq!(count.load(Ordering::SeqCst), resent, "not after its ReadyForQuery");
        // Idle on its connection (session mode): one cancel, as PostgreSQL gets, and no more.
        cancels.cancel(key.pid, &key.secret, timeout).await;
        tokio::time::sleep(RESEND_AFTER * 2).await;
        assert_eq!(count.load(Ordering::SeqCst), resent + 1);
    }
}
