//! The agent's error type: each error says whose fault it is and whether a retry may help; and
//! the I/O errors that end serving an adopted connection (backend gone or slow, client stalled).

use std::path::Path;
use std::time::Duration;

/// One thing wrong with the host, and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// What is wrong.
    pub what: String,
    /// The command or change that fixes it.
    pub fix: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}\n    fix: {}", self.what, self.fix)
    }
}

/// What stops the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration file is unreadable or wrong.
    #[error("config {origin}: {msg}")]
    Config {
        /// The file (or key) at fault.
        origin: String,
        /// What is wrong, with the line when the parser knows it.
        msg: String,
    },
    /// The host is not set up for direct server return; the agent refuses to start.
    #[error("this host is not ready for `refract agent`:\n{}", list(.0))]
    Host(Vec<Problem>),
    /// Hand-over machinery (guard, control channel) failed.
    #[error(transparent)]
    Handover(#[from] refract_handover::Error),
    /// Socket I/O (binding the control listener).
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

fn list(problems: &[Problem]) -> String {
    problems.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n")
}

/// Whose fault an error is: `Internal` for this host, its configuration and setup included;
/// `Backend` for the dispatcher on the other end of a control channel (the peer, as in
/// `refract_handover::Side`).
pub use refract_vocab::Side;

impl Error {
    pub(crate) fn config(origin: &Path, msg: impl std::fmt::Display) -> Self {
        Error::Config { origin: origin.display().to_string(), msg: msg.to_string() }
    }

    /// Whose fault it is.
    pub fn side(&self) -> Side {
        match self {
            Error::Handover(e) if e.side() == Side::Backend => Side::Backend,
            Error::Config { .. } | Error::Host(_) | Error::Handover(_) | Error::Io(_) => Side::Internal,
        }
    }

    /// Whether trying again may help without changing anything (never for setup problems).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Handover(e) => e.is_retryable(),
            Error::Io(_) => true,
            Error::Config { .. } | Error::Host(_) => false,
        }
    }
}

/// The backend closed before the response was complete.
pub(crate) fn eof() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "backend closed before the response was complete")
}

/// The client took nothing for `stall`.
pub(crate) fn stalled(stall: Duration) -> std::io::Error {
    let msg = format!("the client took no byte for {} ms (write_stall_ms)", stall.as_millis());
    std::io::Error::new(std::io::ErrorKind::TimedOut, msg)
}

/// The backend sent nothing within its bound.
pub(crate) fn timed_out() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "backend response timed out")
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
