//! [`ClientAuth`]: refract in the client's role, logging into a PostgreSQL server.

use bytes::{Bytes, BytesMut};

use super::{md5, password_message, SaslInitialResponse, ScramClient};
use crate::backend::Authentication;
use crate::error::{Error, Side};
use crate::frontend::FrontendMessage;

/// What to do after a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientStep {
    /// Send these bytes to the server, then feed its next Authentication message.
    Send(Bytes),
    /// Nothing to send; feed the server's next Authentication message.
    Wait,
    /// AuthenticationOk: the server accepted us (ParameterStatus etc. follow).
    Authenticated,
}

/// One login into a server with a user name and (optional) password.
#[derive(Debug)]
pub struct ClientAuth {
    user: String,
    password: Option<String>,
    scram: Option<ScramClient>,
    scram_verified: bool,
}

impl ClientAuth {
    /// A login as `user`; servers that ask for a password fail the login if it is `None`.
    pub fn new(user: &str, password: Option<&str>) -> Self {
        ClientAuth { user: user.to_owned(), password: password.map(str::to_owned), scram: None, scram_verified: false }
    }

    /// Feeds the server's next Authentication message.
    pub fn step(&mut self, auth: &Authentication) -> Result<ClientStep, Error> {
        match auth {
            Authentication::Ok => self.ok(),
            Authentication::CleartextPassword => Ok(send(password_message(self.password()?))),
            Authentication::Md5Password { salt } => {
                Ok(send(password_message(&md5::response(&self.user, self.password()?, *salt))))
            }
            Authentication::Sasl { mechanisms } => self.sasl_start(mechanisms),
            Authentication::SaslContinue(data) => self.sasl_continue(data),
            Authentication::SaslFinal(data) => self.sasl_final(data),
            Authentication::Other { code, .. } => Err(Error::UnsupportedAuth(format!("method {code}"))),
        }
    }

    fn ok(&self) -> Result<ClientStep, Error> {
        if self.scram.is_some() && !self.scram_verified {
            return Err(protocol("AuthenticationOk before SCRAM finished: the server did not prove itself"));
        }
        Ok(ClientStep::Authenticated)
    }

    fn password(&self) -> Result<&str, Error> {
        self.password
            .as_deref()
            .ok_or_else(|| Error::UnsupportedAuth("server wants a password; none configured".into()))
    }

    fn sasl_start(&mut self, mechanisms: &[String]) -> Result<ClientStep, Error> {
        if !mechanisms.iter().any(|m| m == super::scram::MECHANISM) || self.scram.is_some() {
            return Err(Error::UnsupportedAuth(format!("SASL mechanisms {mechanisms:?}")));
        }
        let scram = ScramClient::new(self.password()?);
        let initial = SaslInitialResponse {
            mechanism: super::scram::MECHANISM.to_owned(),
            data: Some(Bytes::from(scram.client_first())),
        };
        self.scram = Some(scram);
        Ok(send(initial.to_message()))
    }

    fn sasl_continue(&mut self, data: &[u8]) -> Result<ClientStep, Error> {
        let scram = self.scram.as_mut().ok_or_else(|| protocol("SASLContinue without SASL"))?;
        let client_final = scram.server_first(data)?;
        Ok(send(FrontendMessage::AuthResponse(Bytes::from(client_final))))
    }

    fn sasl_final(&mut self, data: &[u8]) -> Result<ClientStep, Error> {
        let scram = self.scram.as_ref().ok_or_else(|| protocol("SASLFinal without SASL"))?;
        scram.server_final(data)?;
        self.scram_verified = true;
        Ok(ClientStep::Wait)
    }
}

fn send(msg: FrontendMessage) -> ClientStep {
    let mut out = BytesMut::new();
    msg.encode(&mut out);
    ClientStep::Send(out.freeze())
}

fn protocol(reason: &str) -> Error {
    Error::AuthProtocol { from: Side::Backend, reason: reason.to_owned() }
}
