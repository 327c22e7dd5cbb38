//! [`Cancels`]: refract's BackendKeyData per client, mapped to the server connection the
//! client is using right now, so a CancelRequest reaches the right server.

use super::server::ServerKey;
use rand::RngCore;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

type Slot = Arc<Mutex<Option<ServerKey>>>;

/// All clients' cancel keys.
#[derive(Debug, Default)]
pub struct Cancels {
    keys: Mutex<HashMap<i32, ([u8; 4], Slot)>>,
    next_pid: AtomicI32,
}

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
    /// A new client key.
    pub fn register(self: &Arc<Self>) -> CancelKey {
        let pid = self.next_pid.fetch_add(1, Ordering::Relaxed).wrapping_add(1) & 0x7fff_ffff;
        let mut secret = [0u8; 4];
        rand::thread_rng().fill_bytes(&mut secret);
        let slot: Slot = Arc::default();
        self.lock().insert(pid, (secret, slot.clone()));
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
