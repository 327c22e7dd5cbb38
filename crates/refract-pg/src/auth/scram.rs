//! SCRAM-SHA-256 (RFC 5802, RFC 7677) as PostgreSQL uses it: the server side that checks a
//! client against a password or stored verifier, and the client side refract uses to log into
//! servers. Channel binding (`-PLUS`) is not offered, so clients send `n,,` or `y,,`.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::error::{Error, Side};

/// The mechanism name.
pub const MECHANISM: &str = "SCRAM-SHA-256";
/// PostgreSQL's default iteration count (`scram_iterations`).
pub const DEFAULT_ITERATIONS: u32 = 4096;

type HmacSha256 = Hmac<Sha256>;

fn hmac(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut mac = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(msg);
    mac.finalize().into_bytes().into()
}

fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

fn xor(a: &[u8; 32], b: &[u8; 32]) -> [u8; 32] {
    std::array::from_fn(|i| a[i] ^ b[i])
}

/// Compares without an early exit, so timing does not reveal how much of a proof was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// [`constant_time_eq`] on strings (md5 answers).
pub(crate) fn constant_time_eq_str(a: &str, b: &str) -> bool {
    constant_time_eq(a.as_bytes(), b.as_bytes())
}

fn salted_password(password: &str, salt: &[u8], iterations: u32) -> [u8; 32] {
    let mut out = [0u8; 32];
    pbkdf2::pbkdf2_hmac::<Sha256>(password.as_bytes(), salt, iterations, &mut out);
    out
}

/// A fresh nonce: 18 random bytes in base64, as libpq and PostgreSQL make them.
pub fn new_nonce() -> String {
    let mut raw = [0u8; 18];
    rand::thread_rng().fill_bytes(&mut raw);
    B64.encode(raw)
}

/// What a server stores instead of a password: `SCRAM-SHA-256$iter:salt$StoredKey:ServerKey`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramVerifier {
    /// PBKDF2 iteration count.
    pub iterations: u32,
    /// The salt.
    pub salt: Vec<u8>,
    /// `H(ClientKey)`.
    pub stored_key: [u8; 32],
    /// `HMAC(SaltedPassword, "Server Key")`.
    pub server_key: [u8; 32],
}

impl ScramVerifier {
    /// Derives a verifier from a plain password (expensive: `iterations` rounds of PBKDF2, so
    /// do it once when the configuration is loaded, not per login).
    pub fn from_password(password: &str, salt: &[u8], iterations: u32) -> Self {
        let salted = salted_password(password, salt, iterations);
        let client_key = hmac(&salted, b"Client Key");
        ScramVerifier {
            iterations,
            salt: salt.to_vec(),
            stored_key: sha256(&client_key),
            server_key: hmac(&salted, b"Server Key"),
        }
    }

    /// Like [`ScramVerifier::from_password`] with a random 16-byte salt and 4096 iterations.
    pub fn generate(password: &str) -> Self {
        let mut salt = [0u8; 16];
        rand::thread_rng().fill_bytes(&mut salt);
        Self::from_password(password, &salt, DEFAULT_ITERATIONS)
    }

    /// Parses PostgreSQL's text form (as in `pg_authid.rolpassword`).
    pub fn parse(s: &str) -> Result<Self, Error> {
        let bad = |why: &str| Error::BadVerifier(why.to_owned());
        let rest = s.strip_prefix("SCRAM-SHA-256$").ok_or_else(|| bad("missing SCRAM-SHA-256$ prefix"))?;
        let (params, keys) = rest.split_once('$').ok_or_else(|| bad("missing keys"))?;
        let (iter, salt) = params.split_once(':').ok_or_else(|| bad("missing salt"))?;
        let (stored, server) = keys.split_once(':').ok_or_else(|| bad("missing server key"))?;
        let key = |k: &str| -> Result<[u8; 32], Error> {
            B64.decode(k).ok().and_then(|v| v.try_into().ok()).ok_or_else(|| bad("key is not 32 bytes of base64"))
        };
        Ok(ScramVerifier {
            iterations: iter.parse().ok().filter(|i| *i > 0).ok_or_else(|| bad("bad iteration count"))?,
            salt: B64.decode(salt).map_err(|_| bad("salt is not base64"))?,
            stored_key: key(stored)?,
            server_key: key(server)?,
        })
    }
}

impl std::fmt::Display for ScramVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (salt, stored, server) = (B64.encode(&self.salt), B64.encode(self.stored_key), B64.encode(self.server_key));
        write!(f, "SCRAM-SHA-256${}:{salt}${stored}:{server}", self.iterations)
    }
}

/// Splits `k=v` attributes; values may contain `=` (base64) but not `,`.
fn attribute(part: Option<&str>, key: char, from: Side) -> Result<&str, Error> {
    part.and_then(|p| p.strip_prefix(key))
        .and_then(|p| p.strip_prefix('='))
        .ok_or_else(|| Error::AuthProtocol { from, reason: format!("expected attribute {key}") })
}

fn protocol(from: Side, reason: &str) -> Error {
    Error::AuthProtocol { from, reason: reason.to_owned() }
}

mod client;
mod server;

pub use client::ScramClient;
pub use server::ScramServer;

#[cfg(test)]
mod tests;
