//! The server side of SCRAM-SHA-256: refract checking a client's proof.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;

use super::{attribute, constant_time_eq, hmac, new_nonce, protocol, sha256, xor, ScramVerifier};
use crate::error::{Error, Side};

/// Where the exchange is.
#[derive(Debug)]
enum State {
    /// Waiting for client-first-message.
    First,
    /// Sent server-first-message; waiting for client-final-message.
    Final {
        /// `c=` must carry this header back.
        gs2_header: String,
        /// The combined nonce.
        nonce: String,
        /// `client-first-bare,server-first`, the start of AuthMessage.
        auth_prefix: String,
    },
    /// Finished (either way): no more messages are accepted.
    Done,
}

/// One SCRAM-SHA-256 exchange, server side.
#[derive(Debug)]
pub struct ScramServer {
    verifier: ScramVerifier,
    server_nonce: String,
    user: String,
    state: State,
}

impl ScramServer {
    /// Starts an exchange for `user` (named in error messages) against `verifier`.
    pub fn new(user: &str, verifier: ScramVerifier) -> Self {
        Self::with_nonce(user, verifier, new_nonce())
    }

    /// Like [`ScramServer::new`] with a fixed server nonce (for tests).
    pub fn with_nonce(user: &str, verifier: ScramVerifier, server_nonce: String) -> Self {
        ScramServer { verifier, server_nonce, user: user.to_owned(), state: State::First }
    }

    /// Takes the client-first-message (the data of SASLInitialResponse) and returns the
    /// server-first-message to send in AuthenticationSASLContinue.
    pub fn first(&mut self, client_first: &[u8]) -> Result<String, Error> {
        if !matches!(self.state, State::First) {
            return Err(protocol(Side::Client, "unexpected client-first-message"));
        }
        self.state = State::Done;
        let msg = std::str::from_utf8(client_first).map_err(|_| protocol(Side::Client, "not UTF-8"))?;
        let (gs2_header, bare) = split_gs2(msg)?;
        let mut parts = bare.split(',');
        attribute(parts.next(), 'n', Side::Client)?; // PostgreSQL ignores it: the user is from startup.
        let client_nonce = attribute(parts.next(), 'r', Side::Client)?;
        if client_nonce.is_empty() {
            return Err(protocol(Side::Client, "empty nonce"));
        }
        let nonce = format!("{client_nonce}{}", self.server_nonce);
        let v = &self.verifier;
        let server_first = format!("r={nonce},s={},i={}", B64.encode(&v.salt), v.iterations);
        let auth_prefix = format!("{bare},{server_first}");
        self.state = State::Final { gs2_header: gs2_header.to_owned(), nonce, auth_prefix };
        Ok(server_first)
    }

    /// Takes the client-final-message (the data of SASLResponse), checks the proof and returns
    /// the server-final-message for AuthenticationSASLFinal. A wrong proof is
    /// [`Error::AuthFailed`].
    pub fn finish(&mut self, client_final: &[u8]) -> Result<String, Error> {
        let State::Final { gs2_header, nonce, auth_prefix } = std::mem::replace(&mut self.state, State::Done) else {
            return Err(protocol(Side::Client, "unexpected client-final-message"));
        };
        let msg = std::str::from_utf8(client_final).map_err(|_| protocol(Side::Client, "not UTF-8"))?;
        let (without_proof, proof) = msg.rsplit_once(",p=").ok_or_else(|| protocol(Side::Client, "missing proof"))?;
        let mut parts = without_proof.split(',');
        let binding = attribute(parts.next(), 'c', Side::Client)?;
        if B64.decode(binding).ok().as_deref() != Some(gs2_header.as_bytes()) {
            return Err(protocol(Side::Client, "channel binding does not match"));
        }
        if attribute(parts.next(), 'r', Side::Client)? != nonce {
            return Err(protocol(Side::Client, "nonce does not match"));
        }
        let proof: [u8; 32] = B64.decode(proof).ok().and_then(|p| p.try_into().ok()).ok_or_else(|| self.failed())?;
        let auth_message = format!("{auth_prefix},{without_proof}");
        let signature = hmac(&self.verifier.stored_key, auth_message.as_bytes());
        if !constant_time_eq(&sha256(&xor(&proof, &signature)), &self.verifier.stored_key) {
            return Err(self.failed());
        }
        let server_signature = hmac(&self.verifier.server_key, auth_message.as_bytes());
        Ok(format!("v={}", B64.encode(server_signature)))
    }

    fn failed(&self) -> Error {
        Error::AuthFailed { user: self.user.clone() }
    }
}

/// Splits `gs2-header` (`n,,` / `y,,` with an optional `a=authzid`) from client-first-bare.
fn split_gs2(msg: &str) -> Result<(&str, &str), Error> {
    let flag_end = msg.find(',').ok_or_else(|| protocol(Side::Client, "missing gs2 header"))?;
    match &msg[..flag_end] {
        "n" | "y" => {}
        f if f.starts_with("p=") => return Err(protocol(Side::Client, "channel binding is not supported")),
        _ => return Err(protocol(Side::Client, "bad gs2 channel binding flag")),
    }
    let authzid_end = msg[flag_end + 1..].find(',').ok_or_else(|| protocol(Side::Client, "bad gs2 header"))?;
    let header_len = flag_end + 1 + authzid_end + 1;
    Ok((&msg[..header_len], &msg[header_len..]))
}
