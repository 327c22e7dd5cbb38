//! [`Cancels`]: refract's BackendKeyData per client, mapped to the server connection the
//! client is using right now, so a CancelRequest reaches the right server.
//!
//! The process ids refract gives are [`FIRST_PID`] and above: no process has such an id
//! (Linux caps `pid_max` at 2^22), so a client that passes its own to `pg_terminate_backend`
//! or `pg_cancel_backend` gets PostgreSQL's "not a PostgreSQL server process" warning rather
//! than ending an unrelated backend that happens to have that id.

use crate::server::ServerKey;
use rand::RngCore;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

type Slot = Arc<Mutex<Option<ServerKey>>>;

/// All clients' cancel keys.
#[derive(Debug, Default)]
pub struct Cancels {
    keys: Mutex<HashMap<i32, ([u8; 4], Slot)>>,
    /// Ids handed out so far (the next is `FIRST_PID` plus this, modulo `PIDS`).
    handed: AtomicU32,
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
        let pid = loop {
            let pid = FIRST_PID + (self.handed.fetch_add(1, Ordering::Relaxed) % PIDS) as i32;
            if !keys.contains_key(&pid) {
                break pid;
            }
        };
        keys.insert(pid, (secret, slot.clone()));
        drop(keys);
        CancelKey { pid, secret, slot, owner: self.clone() }
    }

    /// The server connection to cancel for a client's (pid, secret), if it is using one.
    pub fn lookup(&self, pid: i32, secret: &[u8]) -> Option<ServerKey> {
        let keys = self.lock();
        let (s, slot) = keys.get(&pid)?;
        if s.as_slice() != secret {
            return None;
        }
        let key = slot.lock().unwrap_or_else(PoisonError::into_inner).clone();
        key
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, ([u8; 4], Slot)>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl CancelKey {
    /// The client now runs on `key` (or on nothing).
    pub fn set(&self, key: Option<ServerKey>) {
        *self.slot.lock().unwrap_or_else(PoisonError::into_inner) = key;
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
