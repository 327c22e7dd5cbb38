//! The client side of SCRAM-SHA-256: refract logging into a PostgreSQL server.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;

use super::{attribute, constant_time_eq, hmac, new_nonce, protocol, salted_password, sha256, xor};
use crate::error::{Error, Side};

/// Most PBKDF2 rounds refract agrees to compute for a server (a bound against a hostile one).
const MAX_ITERATIONS: u32 = 10_000_000;

/// One SCRAM-SHA-256 exchange, client side.
#[derive(Debug)]
pub struct ScramClient {
    password: String,
    client_nonce: String,
    /// Set once the server-first-message was answered: the signature to expect.
    expected_server_signature: Option<[u8; 32]>,
}

impl ScramClient {
    /// Starts an exchange with `password`.
    pub fn new(password: &str) -> Self {
        Self::with_nonce(password, new_nonce())
    }

    /// Like [`ScramClient::new`] with a fixed nonce (for tests).
    pub fn with_nonce(password: &str, client_nonce: String) -> Self {
        ScramClient { password: password.to_owned(), client_nonce, expected_server_signature: None }
    }

    /// The client-first-message for SASLInitialResponse. The user name is left empty as libpq
    /// does: PostgreSQL takes it from the startup message.
    pub fn client_first(&self) -> String {
        format!("n,,{}", self.client_first_bare())
    }

    fn client_first_bare(&self) -> String {
        format!("n=,r={}", self.client_nonce)
    }

    /// Like [`ScramClient::client_first`] with a user name in it (RFC test vectors use one).
    pub fn client_first_for(&self, user: &str) -> String {
        format!("n,,n={user},r={}", self.client_nonce)
    }

    /// Takes the server-first-message and returns the client-final-message.
    pub fn server_first(&mut self, msg: &[u8]) -> Result<String, Error> {
        self.server_first_with_bare(msg, &self.client_first_bare())
    }

    /// Like [`ScramClient::server_first`] after [`ScramClient::client_first_for`].
    pub fn server_first_for(&mut self, user: &str, msg: &[u8]) -> Result<String, Error> {
        self.server_first_with_bare(msg, &format!("n={user},r={}", self.client_nonce))
    }

    fn server_first_with_bare(&mut self, msg: &[u8], client_first_bare: &str) -> Result<String, Error> {
        let server_first = std::str::from_utf8(msg).map_err(|_| protocol(Side::Backend, "not UTF-8"))?;
        let mut parts = server_first.split(',');
        let nonce = attribute(parts.next(), 'r', Side::Backend)?;
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err(protocol(Side::Backend, "server nonce does not extend ours"));
        }
        let salt = B64
            .decode(attribute(parts.next(), 's', Side::Backend)?)
            .map_err(|_| protocol(Side::Backend, "salt is not base64"))?;
        let iterations: u32 = attribute(parts.next(), 'i', Side::Backend)?
            .parse()
            .ok()
            .filter(|i| (1..=MAX_ITERATIONS).contains(i))
            .ok_or_else(|| protocol(Side::Backend, "bad iteration count"))?;
        let salted = salted_password(&self.password, &salt, iterations);
        let client_key = hmac(&salted, b"Client Key");
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let signature = hmac(&sha256(&client_key), auth_message.as_bytes());
        let proof = xor(&client_key, &signature);
        self.expected_server_signature = Some(hmac(&hmac(&salted, b"Server Key"), auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", B64.encode(proof)))
    }

    /// Checks the server-final-message: the server must prove it knew the verifier too.
    pub fn server_final(&self, msg: &[u8]) -> Result<(), Error> {
        let expected =
            self.expected_server_signature.ok_or_else(|| protocol(Side::Backend, "unexpected server-final"))?;
        let msg = std::str::from_utf8(msg).map_err(|_| protocol(Side::Backend, "not UTF-8"))?;
        if let Some(e) = msg.strip_prefix("e=") {
            return Err(protocol(Side::Backend, &format!("server error: {e}")));
        }
        let v = attribute(msg.split(',').next(), 'v', Side::Backend)?;
        let got = B64.decode(v).map_err(|_| protocol(Side::Backend, "signature is not base64"))?;
        if !constant_time_eq(&got, &expected) {
            return Err(protocol(Side::Backend, "server signature does not match"));
        }
        Ok(())
    }
}
