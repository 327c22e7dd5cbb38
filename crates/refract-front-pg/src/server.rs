//! [`ServerConn`]: one logged-in connection to a PostgreSQL server, with what refract has put
//! on it (prepared statements, the SET state of the last client).
//!
//! # Layout
//! - this file: [`ServerConn`], one server connection.
//! - `servers`: the servers of a cluster (or shard), health, lag, the choice of one.
//! - `pool`: connections per server; `sizes`: which kinds of statement answer small.
//! - `probes`: health checks and lag polls; `partial`: the tables a partial replica holds;
//!   `cache`: what each server's buffer cache does (sampled by the health loop).
//! - `views`: the servers' admin views (`/pg/pools`, `/pg/servers`, `/backends`) and gauges.
//! - `metrics`: the front end's metric families (`refract_pg_*`, [`metrics::PgMetrics`]).

pub(crate) mod cache;
pub(crate) mod metrics;
pub(crate) mod partial;
pub(crate) mod pool;
pub(crate) mod probes;
pub(crate) mod servers;
pub(crate) mod sizes;
pub(crate) mod views;

use super::error::PgError;
use crate::client::wire::Wire;
use bytes::{Bytes, BytesMut};
use refract_pg::auth::{ClientAuth, ClientStep};
use refract_pg::hybrid::HybridRequest;
use refract_pg::session::{ParamTracker, PreparedStatement};
use refract_pg::startup::{CancelRequest, PROTOCOL_3_0};
use refract_pg::{BackendMessage, FrontendMessage, Side, Startup, StartupPacket};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

/// How refract logs into servers.
#[derive(Debug, Clone)]
pub struct Login {
    /// User name.
    pub user: String,
    /// Password, if the server asks for one.
    pub password: Option<String>,
    /// Database.
    pub database: String,
    /// Connect plus login time limit.
    pub timeout: Duration,
    /// The server is reached through its agent at this address (`through`, with an agent in
    /// `[handover] agents`): results of at least `threshold` bytes are offered for hand-over
    /// (`refract_pg::hybrid`).
    pub hybrid: Option<Through>,
}

/// A server's agent, as its connections reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Through {
    /// The agent's PostgreSQL listener.
    pub agent: SocketAddr,
    /// Smallest result offered for hand-over, in bytes.
    pub threshold: u64,
}

/// What a CancelRequest for this connection must carry, and where it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerKey {
    /// The server's address.
    pub addr: SocketAddr,
    /// Its process id.
    pub pid: i32,
    /// Its secret.
    pub secret: Bytes,
}

/// A logged-in server connection.
#[derive(Debug)]
pub struct ServerConn {
    /// The socket.
    pub wire: Wire,
    /// The cancel key.
    pub key: ServerKey,
    /// ParameterStatus values sent at login.
    pub params: Vec<(String, String)>,
    /// Protocol-level statements prepared here (refract's global names).
    pub prepared: HashSet<String>,
    /// Statements prepared here under a client's own name (SQL PREPARE, or a Parse that SQL
    /// EXECUTE needed): name → the client statement's identity
    /// ([`refract_pg::session::PreparedStatement::global_name`]).
    pub sql_prepared: std::collections::HashMap<String, String>,
    /// The client statement this connection's unnamed statement is (`None`: none, or not one
    /// refract knows); compared by identity, so a client never binds another's.
    pub unnamed: Option<Arc<PreparedStatement>>,
    /// The session parameters clients put on this connection, as (name, SET statement) in
    /// the order applied, relative to the server's defaults (`Some(vec![])`: the defaults);
    /// `None`: unknown (an untracked change), so the next client starts with `RESET ALL`.
    pub applied: Option<Vec<(String, String)>>,
    /// Something went wrong mid-conversation: never reuse.
    pub broken: bool,
    /// The server sent a FATAL (or PANIC) on it: the server itself is ending the connection.
    pub ended_by_server: bool,
    /// The shard whose event loop the socket is registered with (its pool's idle list).
    pub home: usize,
    /// The id the server's agent gave this connection (through an agent only).
    pub hybrid_id: Option<u64>,
    /// The epochs of this connection's hand-overs.
    pub epochs: refract_handover::EpochTracker,
}

impl ServerConn {
    /// Connects and logs in.
    pub async fn connect(addr: SocketAddr, login: &Login) -> Result<ServerConn, PgError> {
        match tokio::time::timeout(login.timeout, Self::connect_inner(addr, login)).await {
            Ok(r) => r,
            Err(_) => Err(PgError::Timeout("server connect and login")),
        }
    }

    async fn connect_inner(addr: SocketAddr, login: &Login) -> Result<ServerConn, PgError> {
        // Through the agent when it answers; else straight to the server (relayed only).
        let through = match login.hybrid {
            Some(t) => match TcpStream::connect(t.agent).await {
                Ok(s) => Some((s, t.threshold)),
                Err(e) => {
                    tracing::debug!(agent = %t.agent, server = %addr, "agent unreachable ({e}); connecting directly");
                    None
                }
            },
            None => None,
        };
        let (stream, hybrid) = match through {
            Some((s, threshold)) => (s, Some(threshold)),
            None => (TcpStream::connect(addr).await.map_err(|e| PgError::io(Side::Backend, e))?, None),
        };
        let _ = stream.set_nodelay(true);
        let mut wire = Wire::new(stream, Side::Backend);
        // No settings of refract's own (not even `application_name`): a RESET on behalf of a
        // client must go back to the server's defaults, as the client's own connection would.
        let params = vec![("user".to_owned(), login.user.clone()), ("database".to_owned(), login.database.clone())];
        let mut out = BytesMut::new();
        if let Some(threshold) = hybrid {
            HybridRequest { threshold }.encode(&mut out);
        }
        StartupPacket::Startup(Startup { protocol: PROTOCOL_3_0, params }).encode(&mut out);
        wire.send(&out).await?;
        let hybrid_id = match hybrid {
            Some(_) => Some(accepted(&mut wire).await?),
            None => None,
        };
        let mut conn = ServerConn {
            wire,
            key: ServerKey { addr, pid: 0, secret: Bytes::new() },
            params: vec![],
            prepared: HashSet::new(),
            sql_prepared: Default::default(),
            unnamed: None,
            applied: Some(vec![]),
            broken: false,
            ended_by_server: false,
            home: refract_core::worker::current(),
            hybrid_id,
            epochs: refract_handover::EpochTracker::new(),
        };
        conn.login(login).await?;
        Ok(conn)
    }

    async fn login(&mut self, login: &Login) -> Result<(), PgError> {
        let mut auth = ClientAuth::new(&login.user, login.password.as_deref());
        loop {
            match self.recv_msg().await? {
                BackendMessage::Authentication(a) => {
                    if let ClientStep::Send(bytes) = auth.step(&a)? {
                        self.wire.send(&bytes).await?;
                    }
                }
                BackendMessage::ParameterStatus { name, value } => self.params.push((name, value)),
                BackendMessage::BackendKeyData { pid, secret } => {
                    self.key.pid = pid;
                    self.key.secret = secret;
                }
                BackendMessage::ReadyForQuery(_) => return Ok(()),
                BackendMessage::ErrorResponse(e) => return Err(PgError::Server(e)),
                _ => {}
            }
        }
    }

    /// The next message, decoded.
    pub async fn recv_msg(&mut self) -> Result<BackendMessage, PgError> {
        let (tag, frame) = self.wire.recv().await?;
        Ok(BackendMessage::decode(tag, &frame[5..])?)
    }

    /// Runs refract's own simple query and returns the rows (text columns, decoded losslessly,
    /// `refract_pg::text`); a server error is `PgError::Server` once the server is ready again.
    pub async fn query(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, PgError> {
        let mut out = BytesMut::new();
        FrontendMessage::Query(sql.to_owned()).encode(&mut out);
        self.unnamed = None; // a simple query drops the unnamed statement
        self.wire.send(&out).await?;
        let mut rows = vec![];
        let mut error = None;
        loop {
            match self.recv_msg().await? {
                BackendMessage::DataRow(cols) => {
                    rows.push(cols.into_iter().map(|c| c.map(|b| refract_pg::text::decode(&b))).collect())
                }
                BackendMessage::ErrorResponse(e) => error = Some(e),
                BackendMessage::ReadyForQuery(_) => break,
                _ => {}
            }
        }
        match error {
            Some(e) => Err(PgError::Server(e)),
            None => Ok(rows),
        }
    }

    /// What to send so that this connection carries exactly `want` (name, SET statement):
    /// `None` when it already does; otherwise only the SETs that differ, or a reset to the defaults (the session's identity
    /// included: [`refract_pg::session::BACK_TO_DEFAULTS`]) and
    /// all of `want` when a parameter must go back to its default or the state is unknown.
    pub fn params_sql(&self, want: &ParamTracker) -> Option<String> {
        let mut sql = String::new();
        let mut push = |text: &str| {
            if !sql.is_empty() {
                sql.push_str("; ");
            }
            sql.push_str(text);
        };
        let applied =
            self.applied.as_deref().filter(|have| have.iter().all(|(n, _)| want.params().any(|(w, _)| w == n)));
        match applied {
            Some(have) => {
                for (name, text) in want.params() {
                    if !have.iter().any(|(n, t)| n == name && t == text) {
                        push(text);
                    }
                }
            }
            None => {
                push(refract_pg::session::BACK_TO_DEFAULTS);
                want.params().for_each(|(_, text)| push(text));
            }
        }
        (!sql.is_empty()).then_some(sql)
    }

    /// Runs `sql` and returns the first column of the first row.
    pub async fn query_one(&mut self, sql: &str) -> Result<Option<String>, PgError> {
        let rows = self.query(sql).await?;
        Ok(rows.into_iter().next().and_then(|r| r.into_iter().next()).flatten())
    }
}

/// Sends a CancelRequest for `key` on a fresh connection (PostgreSQL answers nothing).
pub async fn cancel(key: &ServerKey, timeout: Duration) -> Result<(), PgError> {
    let send = async {
        let stream = TcpStream::connect(key.addr).await.map_err(|e| PgError::io(Side::Backend, e))?;
        let mut wire = Wire::new(stream, Side::Backend);
        let mut out = BytesMut::new();
        StartupPacket::Cancel(CancelRequest { pid: key.pid, secret: key.secret.clone() }).encode(&mut out);
        wire.send(&out).await?;
        // Wait for the server to close, so the cancel has been read before we return.
        let _ = wire.fill().await;
        Ok(())
    };
    tokio::time::timeout(timeout, send).await.map_err(|_| PgError::Timeout("cancel request"))?
}

/// Parses an LSN (`16/B374D848`) into a byte position.
pub fn parse_lsn(s: &str) -> Option<u64> {
    let (hi, lo) = s.split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

/// The agent's answer to the hybrid request sent ahead of the startup message: the
/// connection's id.
async fn accepted(wire: &mut Wire) -> Result<u64, PgError> {
    while wire.buffered().len() < 9 {
        wire.fill().await?;
    }
    let answer = wire.buffered().split_to(9);
    let b: [u8; 9] = answer[..].try_into().map_err(|_| PgError::Timeout("agent answer"))?;
    Ok(refract_pg::hybrid::parse_accepted(&b)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsn() {
        assert_eq!(parse_lsn("0/3000060"), Some(0x3000060));
        assert_eq!(parse_lsn("16/B374D848"), Some((0x16 << 32) | 0xB374D848));
        assert_eq!(parse_lsn("nope"), None);
    }
}
