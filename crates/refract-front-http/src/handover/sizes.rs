//! Learned result sizes (hybrid; the variant "D decides up front from a learned size" of
//! docs/handover.md, "Hand-off D → A"). Forwarding a read through the agent costs a hop on every
//! request, which a small result does not repay: a read whose last result was smaller than the
//! threshold goes straight to its backend, as in relay mode; one never seen, or last seen large,
//! goes through the agent, which hands the connection over if it is large. Both paths report the
//! size they saw, so a result that grows moves to the agent after one relay, and one that shrinks
//! back after one trip through the agent.
//!
//! A read is keyed by its request line and body (the headers vary between clients and
//! requests). The table is bounded; when full it starts over (each read then goes through the
//! agent once more).

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{LazyLock, Mutex, PoisonError};

/// Reads remembered at most.
const CAPACITY: usize = 1 << 16;

/// What a read whose result the agent asked to move is remembered as.
pub(super) const LARGE: u64 = u64::MAX;

static SIZES: LazyLock<Mutex<HashMap<u64, u64>>> = LazyLock::new(Mutex::default);

/// What one read's trip through the agent showed.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// Bytes relayed from the agent's `Response` frames.
    pub relayed: AtomicU64,
    /// The agent asked for the connection.
    pub large: AtomicBool,
}

impl Seen {
    /// Remembers it for `key` (nothing if the agent neither answered nor asked).
    pub(super) fn learn(&self, key: u64) {
        match (self.large.load(Relaxed), self.relayed.load(Relaxed)) {
            (true, _) => learn(key, LARGE),
            (false, 0) => {}
            (false, n) => learn(key, n),
        }
    }
}

/// The key of a read: its request line (up to the first CRLF of `head`) and its body.
pub(super) fn key(head: &[u8], body: &[u8]) -> u64 {
    let line = head.windows(2).position(|w| w == b"\r\n").map_or(head, |end| &head[..end]);
    BuildHasherDefault::<DefaultHasher>::default().hash_one((line, body))
}

/// The size of this read's last result, if known.
pub(super) fn get(key: u64) -> Option<u64> {
    SIZES.lock().unwrap_or_else(PoisonError::into_inner).get(&key).copied()
}

/// Remembers the size of this read's result.
pub(super) fn learn(key: u64, bytes: u64) {
    let mut map = SIZES.lock().unwrap_or_else(PoisonError::into_inner);
    if map.len() >= CAPACITY && !map.contains_key(&key) {
        map.clear();
    }
    map.insert(key, bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_the_request_line_and_the_body() {
        let a = key(b"GET /blob?bytes=1 HTTP/1.1\r\nhost: a\r\n\r\n", b"");
        assert_eq!(a, key(b"GET /blob?bytes=1 HTTP/1.1\r\nhost: b\r\nuser-agent: x\r\n\r\n", b""));
        assert_ne!(a, key(b"GET /blob?bytes=2 HTTP/1.1\r\nhost: a\r\n\r\n", b""));
        let q = b"POST /query HTTP/1.1\r\ncontent-length: 3\r\n\r\n";
        assert_ne!(key(q, b"a=1"), key(q, b"a=2"));
    }

    #[test]
    fn learns_and_relearns() {
        let k = key(b"GET /sizes-test HTTP/1.1\r\n\r\n", b"");
        assert_eq!(get(k), None);
        learn(k, 10);
        assert_eq!(get(k), Some(10));
        learn(k, LARGE);
        assert_eq!(get(k), Some(LARGE));
    }
}
