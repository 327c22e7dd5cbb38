//! Mutual HMAC-SHA256 challenge–response with a shared key, and the replay cache of nonces.
//!
//! Connector C, acceptor A, both with key K:
//! 1. C → A `Hello{nc}`. A refuses an `nc` it has seen before (replay) or that equals its own.
//! 2. A → C `Challenge{na, pa}`, `pa = HMAC(K, "refract-control acceptor" | nc | na)`.
//! 3. C checks `pa` (constant time), refuses `na == nc` (reflection), sends
//!    `Proof{pc}`, `pc = HMAC(K, "refract-control connector" | na | nc)`; A checks `pc`.
//!
//! The labels keep one side's proof from being replayed as the other's; fresh nonces on both
//! sides keep a recorded handshake from being replayed. Nonces come from `getrandom`.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{Error, Result};
use crate::msg::NONCE_LEN;

type HmacSha256 = Hmac<Sha256>;

/// A nonce or a proof.
pub type Nonce = [u8; NONCE_LEN];

const ACCEPTOR: &[u8] = b"refract-control acceptor";
const CONNECTOR: &[u8] = b"refract-control connector";

/// The shared key of a control channel. Its `Debug` form never shows the key.
#[derive(Clone)]
pub struct ControlKey(Vec<u8>);

impl std::fmt::Debug for ControlKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ControlKey({} bytes, redacted)", self.0.len())
    }
}

impl ControlKey {
    /// Shortest key accepted, in bytes.
    pub const MIN_LEN: usize = 16;

    /// A key of at least [`ControlKey::MIN_LEN`] bytes.
    pub fn try_new(key: impl Into<Vec<u8>>) -> Result<Self> {
        let key = key.into();
        if key.len() < Self::MIN_LEN {
            return Err(Error::Codec("control key shorter than 16 bytes"));
        }
        Ok(ControlKey(key))
    }

    fn mac(&self, label: &[u8], first: &Nonce, second: &Nonce) -> HmacSha256 {
        let mut m = <HmacSha256 as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        m.update(label);
        m.update(first);
        m.update(second);
        m
    }

    fn proof(&self, label: &[u8], first: &Nonce, second: &Nonce) -> Nonce {
        self.mac(label, first, second).finalize().into_bytes().into()
    }

    /// Constant-time check of a proof.
    fn verify(&self, label: &[u8], first: &Nonce, second: &Nonce, proof: &Nonce) -> Result<()> {
        self.mac(label, first, second).verify_slice(proof).map_err(|_| Error::Auth)
    }

    /// The acceptor's proof for step 2.
    pub(crate) fn acceptor_proof(&self, nc: &Nonce, na: &Nonce) -> Nonce {
        self.proof(ACCEPTOR, nc, na)
    }

    /// The connector checks the acceptor's proof.
    pub(crate) fn verify_acceptor(&self, nc: &Nonce, na: &Nonce, proof: &Nonce) -> Result<()> {
        self.verify(ACCEPTOR, nc, na, proof)
    }

    /// The connector's proof for step 3.
    pub(crate) fn connector_proof(&self, na: &Nonce, nc: &Nonce) -> Nonce {
        self.proof(CONNECTOR, na, nc)
    }

    /// The acceptor checks the connector's proof.
    pub(crate) fn verify_connector(&self, na: &Nonce, nc: &Nonce, proof: &Nonce) -> Result<()> {
        self.verify(CONNECTOR, na, nc, proof)
    }
}

/// A fresh random nonce.
pub(crate) fn nonce() -> Result<Nonce> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::getrandom(&mut n).map_err(|e| Error::Io(std::io::Error::other(e.to_string())))?;
    Ok(n)
}

/// The nonces an acceptor has seen (the most recent `capacity`), shared by all its connections.
#[derive(Debug)]
pub struct NonceCache {
    inner: Mutex<Seen>,
    capacity: usize,
}

#[derive(Debug, Default)]
struct Seen {
    set: HashSet<Nonce>,
    order: VecDeque<Nonce>,
}

impl NonceCache {
    /// Remembers up to `capacity` nonces (at least one).
    pub fn new(capacity: usize) -> Self {
        NonceCache { inner: Mutex::new(Seen::default()), capacity: capacity.max(1) }
    }

    /// Records `n`; false if it was already there (a replay).
    pub fn insert(&self, n: Nonce) -> bool {
        // A poisoned lock only means another thread panicked mid-insert; the set is still usable.
        let mut seen = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if !seen.set.insert(n) {
            return false;
        }
        seen.order.push_back(n);
        if seen.order.len() > self.capacity {
            if let Some(old) = seen.order.pop_front() {
                seen.set.remove(&old);
            }
        }
        true
    }
}

impl Default for NonceCache {
    /// Room for 65536 nonces (2 MiB).
    fn default() -> Self {
        NonceCache::new(1 << 16)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn proofs_check_and_differ_by_role() {
        let k = ControlKey::try_new(*b"0123456789abcdef").unwrap();
        let (nc, na) = (nonce().unwrap(), nonce().unwrap());
        assert_ne!(nc, na);
        let pa = k.acceptor_proof(&nc, &na);
        assert!(k.verify_acceptor(&nc, &na, &pa).is_ok());
        assert!(k.verify_connector(&nc, &na, &pa).is_err(), "an acceptor proof is no connector proof");
        assert!(k.verify_acceptor(&na, &nc, &pa).is_err(), "nonces swapped");
        let other = ControlKey::try_new(*b"0123456789abcdeF").unwrap();
        assert!(other.verify_acceptor(&nc, &na, &pa).is_err(), "wrong key");
        assert!(ControlKey::try_new(*b"short").is_err());
        assert!(!format!("{k:?}").contains("0123"));
    }

    #[test]
    fn the_cache_refuses_replays_and_forgets_the_oldest() {
        let c = NonceCache::new(2);
        let n = |b| [b; NONCE_LEN];
        assert!(c.insert(n(1)));
        assert!(!c.insert(n(1)));
        assert!(c.insert(n(2)));
        assert!(c.insert(n(3))); // evicts 1
        assert!(c.insert(n(1)));
        assert!(!c.insert(n(3)));
    }
}
