//! The HTTP front end's error type: each error says whose fault it was, whether a retry may
//! help, and the HTTP status its client gets.

use refract_core::backend::ConnectError;
pub use refract_vocab::Side;
use std::io;

/// What can go wrong while serving a request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The client's request is not valid HTTP.
    #[error("bad request: {0}")]
    Request(#[from] refract_http::Error),
    /// A buffered body exceeded the limit.
    #[error("request body larger than {0} bytes cannot be buffered")]
    BodyTooLarge(usize),
    /// Reading from or writing to the client failed.
    #[error("client i/o: {0}")]
    ClientIo(io::Error),
    /// The client sent part of a request, then nothing for too long (`[timeouts] head_ms`
    /// or `body_ms`).
    #[error("the client sent no more of its request {what} for {ms} ms")]
    ClientTimeout {
        /// `head` or `body`.
        what: &'static str,
        /// The timeout that passed.
        ms: u64,
    },
    /// The client took no byte of its response for too long (`[timeouts] write_stall_ms`, or
    /// `contended_stall_ms` while another request waited for its backend and the rest of the
    /// response was too large to spill).
    #[error("the client read nothing of its response for {ms} ms{}", if *contended { " while other requests waited for its backend" } else { "" })]
    ClientStalled {
        /// The timeout that passed.
        ms: u64,
        /// Whether others waited for the backend (`contended_stall_ms`).
        contended: bool,
    },
    /// No backend can take this request.
    #[error("no backend available for {0} requests")]
    NoBackend(&'static str),
    /// Connecting to a backend failed.
    #[error("backend {backend}: connect failed: {source}")]
    Connect {
        /// The backend's name.
        backend: String,
        /// The cause.
        source: io::Error,
    },
    /// Connecting to a backend took too long.
    #[error("backend {backend}: connect timed out")]
    ConnectTimeout {
        /// The backend's name.
        backend: String,
    },
    /// The backend did not answer in time.
    #[error("backend {backend}: no response in time")]
    ResponseTimeout {
        /// The backend's name.
        backend: String,
    },
    /// The request's own deadline (`x-refract-timeout-ms`) passed while the backend worked on
    /// it. Not the backend's fault: it says nothing about its health or capacity.
    #[error("backend {backend}: the request's deadline passed before the response")]
    DeadlineExceeded {
        /// The backend's name.
        backend: String,
    },
    /// The backend's connection failed or closed before the response was complete.
    #[error("backend {backend}: {source}")]
    BackendIo {
        /// The backend's name.
        backend: String,
        /// The cause.
        source: io::Error,
    },
    /// The backend sent something that is not valid HTTP.
    #[error("backend {backend}: bad response: {source}")]
    BackendProtocol {
        /// The backend's name.
        backend: String,
        /// The cause.
        source: refract_http::Error,
    },
    /// The client closed its connection while its request was being served.
    #[error("client went away")]
    ClientGone,
    /// The backend's admission control refused the request.
    #[error("backend {backend} overloaded: {reason}")]
    Overloaded {
        /// The backend's name.
        backend: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The user's token bucket is empty.
    #[error("user {0} is over its request rate")]
    RateLimited(String),
    /// A backend of a fan-out answered with an error status.
    #[error("backend {backend}: answered {status}")]
    BackendStatus {
        /// The backend's name.
        backend: String,
        /// The status it sent.
        status: u16,
    },
}

impl From<ConnectError> for Error {
    fn from(e: ConnectError) -> Self {
        match e {
            ConnectError::Failed { backend, source } => Error::Connect { backend, source },
            ConnectError::TimedOut { backend } => Error::ConnectTimeout { backend },
        }
    }
}

impl Error {
    /// Whose fault it is.
    pub fn side(&self) -> Side {
        match self {
            Error::Request(_) | Error::BodyTooLarge(_) | Error::ClientIo(_) | Error::ClientGone => Side::Client,
            Error::ClientTimeout { .. } | Error::ClientStalled { .. } => Side::Client,
            Error::NoBackend(_) | Error::Overloaded { .. } => Side::Internal,
            Error::RateLimited(_) | Error::DeadlineExceeded { .. } => Side::Client,
            _ => Side::Backend,
        }
    }

    /// Whether another backend might succeed where this one failed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Connect { .. }
                | Error::ConnectTimeout { .. }
                | Error::BackendIo { .. }
                | Error::ResponseTimeout { .. }
        )
    }

    /// Whether the backend should be marked down at once.
    pub fn marks_down(&self) -> bool {
        matches!(self, Error::Connect { .. } | Error::ConnectTimeout { .. })
    }

    /// The backend involved, if any.
    pub fn backend(&self) -> Option<&str> {
        match self {
            Error::Connect { backend, .. }
            | Error::ConnectTimeout { backend }
            | Error::ResponseTimeout { backend }
            | Error::DeadlineExceeded { backend }
            | Error::BackendIo { backend, .. }
            | Error::BackendProtocol { backend, .. }
            | Error::Overloaded { backend, .. }
            | Error::BackendStatus { backend, .. } => Some(backend),
            _ => None,
        }
    }

    /// The HTTP status the client gets when nothing was sent to it yet.
    pub fn status(&self) -> u16 {
        match self {
            Error::Request(e) => e.status(),
            Error::BodyTooLarge(_) => 413,
            Error::ClientIo(_) | Error::ClientGone | Error::ClientStalled { .. } => 400,
            Error::ClientTimeout { .. } => 408,
            Error::NoBackend(_) | Error::Overloaded { .. } => 503,
            Error::RateLimited(_) => 429,
            Error::ConnectTimeout { .. } | Error::ResponseTimeout { .. } | Error::DeadlineExceeded { .. } => 504,
            _ => 502,
        }
    }

    /// A short label for the errors-by-kind metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Request(refract_http::Error::HeadTooLarge(_)) => "head_too_large",
            Error::Request(_) => "bad_request",
            Error::BodyTooLarge(_) => "body_too_large",
            Error::ClientIo(_) => "client_io",
            Error::ClientGone => "client_gone",
            Error::ClientTimeout { .. } => "client_timeout",
            Error::ClientStalled { .. } => "client_stalled",
            Error::Overloaded { .. } => "overloaded",
            Error::RateLimited(_) => "rate_limited",
            Error::NoBackend(_) => "no_backend",
            Error::Connect { .. } => "connect",
            Error::ConnectTimeout { .. } => "connect_timeout",
            Error::ResponseTimeout { .. } => "response_timeout",
            Error::DeadlineExceeded { .. } => "deadline_exceeded",
            Error::BackendIo { .. } => "backend_io",
            Error::BackendProtocol { .. } => "backend_protocol",
            Error::BackendStatus { .. } => "backend_status",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_sides() {
        let t = Error::ConnectTimeout { backend: "b1".into() };
        assert_eq!((t.status(), t.side(), t.is_retryable(), t.marks_down()), (504, Side::Backend, true, true));
        let p = Error::BackendProtocol { backend: "b1".into(), source: refract_http::Error::BadChunk("x") };
        assert_eq!((p.status(), p.is_retryable()), (502, false));
        assert_eq!(Error::NoBackend("read").status(), 503);
        assert_eq!(Error::Request(refract_http::Error::HeadTooLarge(1)).status(), 431);
        assert_eq!(t.backend(), Some("b1"));
        let d = Error::DeadlineExceeded { backend: "b1".into() };
        assert_eq!((d.status(), d.side(), d.is_retryable(), d.marks_down()), (504, Side::Client, false, false));
        let slow = Error::ClientTimeout { what: "body", ms: 1000 };
        assert_eq!(
            (slow.status(), slow.side(), slow.is_retryable(), slow.kind()),
            (408, Side::Client, false, "client_timeout")
        );
        let stalled = Error::ClientStalled { ms: 1000, contended: false };
        assert_eq!((stalled.side(), stalled.is_retryable(), stalled.marks_down()), (Side::Client, false, false));
    }
}
