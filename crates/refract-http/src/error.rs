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
            _ => 400,
        }
    }
}
