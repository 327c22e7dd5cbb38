//! [`ServerAuth`]: refract in the server's role, authenticating a client.

use bytes::{Bytes, BytesMut};
use rand::RngCore;

use super::{auth_body, decode_password, md5, SaslInitialResponse, ScramServer, ScramVerifier};
use crate::backend::{Authentication, BackendMessage};
use crate::error::{Error, Side};
use crate::frontend::FrontendMessage;

/// How clients of a user must authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMethod {
    /// No password.
    Trust,
    /// md5 challenge (weak; for old clients).
    Md5,
    /// SCRAM-SHA-256 (PostgreSQL's default since 14).
    ScramSha256,
}

/// What refract knows about a user's password, prepared once when the configuration is loaded
/// (deriving a SCRAM verifier from a plain password costs thousands of hash rounds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// Verifies SCRAM proofs.
    pub scram: Option<ScramVerifier>,
    /// `md5` + md5hex(password + user): verifies md5 answers.
    pub md5: Option<String>,
}

impl Credential {
    /// From a plain password: both methods work.
    pub fn from_password(user: &str, password: &str) -> Self {
        Credential { scram: Some(ScramVerifier::generate(password)), md5: Some(md5::stored_hash(user, password)) }
    }

    /// From configuration text: a SCRAM verifier (`SCRAM-SHA-256$...`), an md5 hash
    /// (`md5...`), or else a plain password.
    pub fn parse(user: &str, text: &str) -> Result<Self, Error> {
        if text.starts_with("SCRAM-SHA-256$") {
            Ok(Credential { scram: Some(ScramVerifier::parse(text)?), md5: None })
        } else if md5::is_stored_hash(text) {
            Ok(Credential { scram: None, md5: Some(text.to_owned()) })
        } else {
            Ok(Self::from_password(user, text))
        }
    }
}

/// What to do after a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerStep {
    /// Send these bytes, then feed the client's next message to [`ServerAuth::step`].
    Continue(Bytes),
    /// The client is authenticated: send these bytes (possibly empty), then the rest of the
    /// login (see [`crate::reply::login_complete`]).
    Authenticated(Bytes),
}

#[derive(Debug)]
enum State {
    Md5 { expected: Option<String> },
    ScramFirst(ScramServer),
    ScramFinal(ScramServer),
    Done,
}

/// One client authentication, server side. An unknown user (no credential) goes through the
/// same exchange and fails at the end, so the answer does not reveal which users exist.
#[derive(Debug)]
pub struct ServerAuth {
    user: String,
    state: State,
}

impl ServerAuth {
    /// Starts authenticating `user`; returns the state machine and the first step (the
    /// authentication request to send, or `Authenticated` for trust).
    pub fn start(user: &str, method: AuthMethod, credential: Option<&Credential>) -> (ServerAuth, ServerStep) {
        let (state, request) = match method {
            AuthMethod::Trust => return (Self::done(user), ServerStep::Authenticated(Bytes::new())),
            AuthMethod::Md5 => {
                let mut salt = [0u8; 4];
                rand::thread_rng().fill_bytes(&mut salt);
                let expected = credential.and_then(|c| c.md5.as_deref()).map(|h| md5::response_from_hash(h, salt));
                (State::Md5 { expected }, Authentication::Md5Password { salt })
            }
            AuthMethod::ScramSha256 => {
                let verifier = credential.and_then(|c| c.scram.clone()).unwrap_or_else(mock_verifier);
                let request = Authentication::Sasl { mechanisms: vec![super::scram::MECHANISM.to_owned()] };
                (State::ScramFirst(ScramServer::new(user, verifier)), request)
            }
        };
        let auth = ServerAuth { user: user.to_owned(), state };
        (auth, ServerStep::Continue(BackendMessage::Authentication(request).to_bytes()))
    }

    fn done(user: &str) -> ServerAuth {
        ServerAuth { user: user.to_owned(), state: State::Done }
    }

    /// Feeds the client's next message (a `p` message).
    pub fn step(&mut self, msg: &FrontendMessage) -> Result<ServerStep, Error> {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Md5 { expected } => self.check_md5(msg, expected),
            State::ScramFirst(scram) => self.scram_first(msg, scram),
            State::ScramFinal(scram) => self.scram_final(msg, scram),
            State::Done => Err(Error::AuthProtocol { from: Side::Client, reason: "authentication is over".into() }),
        }
    }

    fn failed(&self) -> Error {
        Error::AuthFailed { user: self.user.clone() }
    }

    fn check_md5(&self, msg: &FrontendMessage, expected: Option<String>) -> Result<ServerStep, Error> {
        let answer = decode_password(auth_body(msg, "PasswordMessage")?)?;
        match expected {
            Some(e) if super::scram::constant_time_eq_str(&e, &answer) => Ok(ServerStep::Authenticated(Bytes::new())),
            _ => Err(self.failed()),
        }
    }

    fn scram_first(&mut self, msg: &FrontendMessage, mut scram: ScramServer) -> Result<ServerStep, Error> {
        let initial = SaslInitialResponse::decode(auth_body(msg, "SASLInitialResponse")?)?;
        if initial.mechanism != super::scram::MECHANISM {
            return Err(Error::AuthProtocol {
                from: Side::Client,
                reason: format!("unsupported mechanism {}", initial.mechanism),
            });
        }
        let data = initial.data.unwrap_or_default();
        let server_first = scram.first(&data)?;
        self.state = State::ScramFinal(scram);
        Ok(ServerStep::Continue(sasl(Authentication::SaslContinue(Bytes::from(server_first)))))
    }

    fn scram_final(&mut self, msg: &FrontendMessage, mut scram: ScramServer) -> Result<ServerStep, Error> {
        let server_final = scram.finish(auth_body(msg, "SASLResponse")?)?;
        Ok(ServerStep::Authenticated(sasl(Authentication::SaslFinal(Bytes::from(server_final)))))
    }
}

fn sasl(a: Authentication) -> Bytes {
    let mut out = BytesMut::new();
    BackendMessage::Authentication(a).encode(&mut out);
    out.freeze()
}

/// A verifier nobody knows the password of, for users that do not exist.
fn mock_verifier() -> ScramVerifier {
    let mut key = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut key);
    ScramVerifier {
        iterations: super::scram::DEFAULT_ITERATIONS,
        salt: key[..16].to_vec(),
        stored_key: key,
        server_key: key,
    }
}
