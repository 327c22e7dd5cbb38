//! [`PgError`]: what can fail in the PostgreSQL front end, and whose fault it is.

use refract_pg::{ErrorFields, Side};
use std::io;

/// An error of the PostgreSQL front end.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// A socket failed.
    #[error("{} i/o: {source}", refract_pg::peer(*side))]
    Io {
        /// Whose socket.
        side: Side,
        /// The cause.
        source: io::Error,
    },
    /// The peer closed the connection.
    #[error("{} closed the connection", refract_pg::peer(*.0))]
    Closed(Side),
    /// A message could not be framed or decoded, or authentication broke.
    #[error("{0}")]
    Protocol(#[from] refract_pg::Error),
    /// The server answered with an error.
    #[error("server error {}: {}", .0.code().unwrap_or("?"), .0.message().unwrap_or(""))]
    Server(ErrorFields),
    /// The server refused the session's SETs on the connection bound for a statement, which
    /// was not sent: its error is the client's answer.
    #[error("the server refused this session's settings: {}", .0.message().unwrap_or(""))]
    Settings(ErrorFields),
    /// The client cancelled the statement while it waited for a server connection.
    #[error("canceling statement due to user request")]
    Cancelled,
    /// Connecting, logging in or waiting for a connection took too long.
    #[error("timed out: {0}")]
    Timeout(&'static str),
    /// No server can take the statement.
    #[error("{0}")]
    Unavailable(String),
    /// Admission control refused the statement (`admit.rs`): answered with `sqlstate`.
    #[error("{message}")]
    Refused {
        /// `53300` (overloaded) or `57014` (its deadline passed).
        sqlstate: &'static str,
        /// What the client is told.
        message: String,
    },
}

impl PgError {
    /// An i/o error on `side`'s socket.
    pub fn io(side: Side, source: io::Error) -> Self {
        PgError::Io { side, source }
    }

    /// Whose fault it is.
    pub fn side(&self) -> Side {
        match self {
            PgError::Io { side, .. } | PgError::Closed(side) => *side,
            PgError::Protocol(e) => e.side(),
            PgError::Server(_) | PgError::Settings(_) | PgError::Timeout(_) => Side::Backend,
            PgError::Unavailable(_) | PgError::Refused { .. } | PgError::Cancelled => Side::Internal,
        }
    }

    /// Whether trying again (e.g. on another server) may help.
    pub fn is_retryable(&self) -> bool {
        match self {
            PgError::Io { side, .. } | PgError::Closed(side) => *side == Side::Backend,
            PgError::Timeout(_) | PgError::Unavailable(_) | PgError::Refused { .. } => true,
            PgError::Protocol(_) | PgError::Server(_) | PgError::Settings(_) | PgError::Cancelled => false,
        }
    }
}
