//! The startup phase of a client connection: SSLRequest (TLS with rustls when a certificate is
//! configured, else `N`), CancelRequest (forwarded), StartupMessage, authentication against
//! `[[postgres.user]]`, and the greeting.

use super::cancel::CancelKey;
use super::greeting;
use super::startup::{options, Refusal};
use super::wire::Wire;
use crate::error::PgError;
use crate::Shared;
use bytes::{Bytes, BytesMut};
use refract_pg::auth::{AuthMethod, ServerAuth, ServerStep};
use refract_pg::notice::sqlstate;
use refract_pg::startup::{CANCEL_REQUEST_CODE, GSSENC_REQUEST_CODE, PROTOCOL_3_0, SSL_REQUEST_CODE};
use refract_pg::{reply, BackendMessage, FrontendMessage, Limits, Startup, StartupPacket};
use std::time::Duration;

/// A logged-in client.
#[derive(Debug)]
pub struct LoggedIn {
    /// The startup message.
    pub startup: Startup,
    /// The cancel key given to the client.
    pub key: CancelKey,
}

/// Runs the startup phase; `None` if the connection ended (error already sent, or a cancel).
pub async fn login(shared: &Shared, wire: &mut Wire) -> Option<LoggedIn> {
    let limit = Duration::from_millis(shared.cfg.login_timeout_ms);
    match tokio::time::timeout(limit, login_inner(shared, wire)).await {
        Ok(Ok(done)) => done,
        Ok(Err((code, message))) => {
            let _ = wire.send(&reply::fatal(code, &message)).await;
            None
        }
        Err(_) => {
            let _ = wire.send(&reply::fatal(sqlstate::PROTOCOL_VIOLATION, "login timed out")).await;
            None
        }
    }
}

async fn login_inner(shared: &Shared, wire: &mut Wire) -> Result<Option<LoggedIn>, Refusal> {
    let Some(startup) = read_startup(shared, wire).await? else { return Ok(None) };
    let user = startup.user().ok_or((sqlstate::INVALID_AUTHORIZATION, "no user name in the startup message".into()))?;
    if shared.cfg.tls_required && !wire.is_tls() {
        let message = "refract: TLS is required for every connection (connect with sslmode=require)";
        return Err((sqlstate::INVALID_AUTHORIZATION, message.into()));
    }
    let database = startup.database().unwrap_or_default();
    if database != shared.cfg.database {
        return Err((sqlstate::INVALID_CATALOG_NAME, format!("database \"{database}\" does not exist")));
    }
    options(&startup).map_err(|e| (e.code, e.message))?;
    negotiate(wire, &startup).await?;
    authenticate(shared, wire, user).await?;
    let params = greeting::greeting(shared, &startup).await?;
    let key = shared.cancels.register();
    wire.send(&reply::login_complete(&params, key.pid, key.secret)).await.map_err(refusal)?;
    Ok(Some(LoggedIn { startup, key }))
}

fn refusal(e: PgError) -> Refusal {
    (sqlstate::PROTOCOL_VIOLATION, e.to_string())
}

/// Reads startup packets until a StartupMessage; answers an SSLRequest with `S` and a TLS
/// handshake when TLS is configured (else `N`), and GSSENCRequest with `N`.
async fn read_startup(shared: &Shared, wire: &mut Wire) -> Result<Option<Startup>, Refusal> {
    loop {
        let packet = loop {
            let parsed = StartupPacket::parse(wire.buffered(), &Limits::default()).map_err(|e| {
                unsupported_version(wire.buffered()).unwrap_or((sqlstate::PROTOCOL_VIOLATION, e.to_string()))
            })?;
            if let Some((p, n)) = parsed {
                let _ = wire.buffered().split_to(n);
                break p;
            }
            if wire.fill().await.is_err() {
                return Ok(None); // Gone before a whole packet: nobody to answer.
            }
        };
        match packet {
            StartupPacket::SslRequest if wire.is_tls() => {
                return Err((sqlstate::PROTOCOL_VIOLATION, "SSLRequest on an encrypted connection".into()));
            }
            StartupPacket::SslRequest if shared.tls.is_some() => {
                wire.send(b"S").await.map_err(refusal)?;
                if let Some(acceptor) = &shared.tls {
                    wire.accept_tls(acceptor).await.map_err(refusal)?;
                }
            }
            StartupPacket::SslRequest | StartupPacket::GssEncRequest => {
                wire.send(reply::REFUSE_ENCRYPTION).await.map_err(refusal)?
            }
            StartupPacket::Cancel(c) => {
                let timeout = Duration::from_millis(shared.cfg.connect_timeout_ms);
                shared.cancels.cancel(c.pid, &c.secret, timeout).await;
                return Ok(None);
            }
            StartupPacket::Startup(s) => return Ok(Some(s)),
        }
    }
}

/// A StartupMessage for a major version after 3 gets PostgreSQL's refusal (ProcessStartupPacket)
/// rather than a generic protocol violation.
fn unsupported_version(buf: &[u8]) -> Option<Refusal> {
    let code = i32::from_be_bytes(buf.get(4..8)?.try_into().ok()?);
    let (major, minor) = (code >> 16, code & 0xffff);
    (major > 3 && code != SSL_REQUEST_CODE && code != GSSENC_REQUEST_CODE && code != CANCEL_REQUEST_CODE).then(|| {
        let message = format!("unsupported frontend protocol {major}.{minor}: server supports 3.0 to 3.0");
        (sqlstate::FEATURE_NOT_SUPPORTED, message)
    })
}

/// Protocol 3.x with x > 0, or `_pq_.` options: say we speak 3.0 without them.
async fn negotiate(wire: &mut Wire, startup: &Startup) -> Result<(), Refusal> {
    match negotiation(startup) {
        Some(msg) => wire.send(&msg.to_bytes()).await.map_err(refusal),
        None => Ok(()),
    }
}

/// PostgreSQL's answer to a StartupMessage asking for a newer minor version than it speaks or
/// for `_pq_.` options (ProcessStartupPacket): NegotiateProtocolVersion with the newest version
/// it speaks, whole (3.0 = 196608; libpq 18 reads a bare `0` as a downgrade to before 3.0 and
/// gives up), and the options it did not recognise, in the client's order.
fn negotiation(startup: &Startup) -> Option<BackendMessage> {
    let options: Vec<String> =
        startup.params.iter().filter(|(k, _)| k.starts_with("_pq_.")).map(|(k, _)| k.clone()).collect();
    if startup.protocol <= PROTOCOL_3_0 && options.is_empty() {
        return None;
    }
    Some(BackendMessage::NegotiateProtocolVersion { version: PROTOCOL_3_0, options })
}

async fn authenticate(shared: &Shared, wire: &mut Wire, user: &str) -> Result<(), Refusal> {
    let entry = shared.cfg.user(user);
    let method = entry.map_or(AuthMethod::ScramSha256, |e| e.method);
    let (mut auth, mut step) = ServerAuth::start(user, method, entry.map(|e| &e.credential));
    loop {
        match step {
            ServerStep::Authenticated(bytes) => {
                return wire.send(&bytes).await.map_err(refusal);
            }
            ServerStep::Continue(bytes) => {
                wire.send(&bytes).await.map_err(refusal)?;
                let (tag, frame) = wire.recv().await.map_err(refusal)?;
                let msg = FrontendMessage::decode(tag, &frame[5..]).map_err(|e| refusal(e.into()))?;
                step = auth.step(&msg).map_err(|e| match e {
                    refract_pg::Error::AuthFailed { .. } => (sqlstate::INVALID_PASSWORD, e.to_string()),
                    e => (sqlstate::PROTOCOL_VIOLATION, e.to_string()),
                })?;
            }
        }
    }
}

/// A malformed message after login: say so and close.
pub fn protocol_error(message: &str) -> Bytes {
    let mut out = BytesMut::new();
    out.extend_from_slice(&reply::fatal(sqlstate::PROTOCOL_VIOLATION, message));
    out.freeze()
}
