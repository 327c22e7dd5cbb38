//! The codec's error type: every variant is the peer's fault and maps to an HTTP status.

/// What went wrong while framing or classifying a message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The head is not valid HTTP/1.x.
    #[error("malformed message head: {0}")]
    Malformed(String),
    /// The head is larger than the configured limit.
    #[error("message head larger than {0} bytes")]
    HeadTooLarge(usize),
    /// A Content-Length that is not a number, or conflicting framing headers.
    #[error("bad body framing: {0}")]
    BadFraming(&'static str),
    /// The chunked encoding of a body is broken.
    #[error("bad chunked encoding: {0}")]
    BadChunk(&'static str),
    /// A transfer coding other than `chunked` (RFC 9112 §6.1: 501, not implemented).
    #[error("transfer coding {0:?} is not implemented (only chunked is)")]
    UnsupportedCoding(String),
    /// An Expect header with an expectation other than `100-continue` (RFC 9110 §10.1.1: 417).
    #[error("expectation {0:?} cannot be met (only 100-continue can)")]
    UnsupportedExpectation(String),
    /// No Host, several, or one that is not a `host[:port]` (RFC 9112 §3.2).
    #[error("bad Host: {0}")]
    BadHost(&'static str),
    /// A request target that is not origin form (nor absolute form refract can turn into it).
    #[error("bad request target: {0}")]
    BadTarget(&'static str),
    /// A header value refract interprets is invalid (e.g. `x-refract-route`).
    #[error("bad header {name}: {reason}")]
    BadHeader {
        /// The header's name.
        name: &'static str,
        /// Why it was refused.
        reason: String,
    },
}

impl Error {
    /// The HTTP status a client gets for this error.
    pub fn status(&self) -> u16 {
        match self {
            Error::HeadTooLarge(_) => 431,
            Error::UnsupportedCoding(_) => 501,
            Error::UnsupportedExpectation(_) => 417,
            _ => 400,
        }
    }
}
