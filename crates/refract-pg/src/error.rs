//! The crate's error type: each error says whose fault it is and whether a retry may help.

pub use refract_vocab::Side;

/// PostgreSQL's word for `side` in messages: a backend is a `server`.
pub fn peer(side: Side) -> &'static str {
    match side {
        Side::Client => "client",
        Side::Backend => "server",
        Side::Internal => "internal",
    }
}

/// What can go wrong while framing, decoding or authenticating.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// A message's content does not match its type.
    #[error("malformed {} message: {reason}", peer(*from))]
    Malformed {
        /// Who sent it.
        from: Side,
        /// What is wrong.
        reason: String,
    },
    /// A message length that is negative or shorter than the length field itself.
    #[error("invalid {} message length {len}", peer(*from))]
    BadLength {
        /// Who sent it.
        from: Side,
        /// The length as sent.
        len: i64,
    },
    /// A message longer than the configured limit.
    #[error("{} message of {len} bytes exceeds the limit of {max} bytes", peer(*from))]
    TooLarge {
        /// Who sent it.
        from: Side,
        /// The length as sent.
        len: usize,
        /// The limit in force.
        max: usize,
    },
    /// A client failed authentication (wrong password, unknown user, bad proof).
    #[error("password authentication failed for user \"{user}\"")]
    AuthFailed {
        /// The user name the client gave.
        user: String,
    },
    /// An authentication exchange went off the rails (either peer).
    #[error("authentication exchange with {} failed: {reason}", peer(*from))]
    AuthProtocol {
        /// Who broke the exchange.
        from: Side,
        /// What went wrong.
        reason: String,
    },
    /// A server asked for an authentication method refract cannot do.
    #[error("server requested unsupported authentication: {0}")]
    UnsupportedAuth(String),
    /// A stored SCRAM or md5 verifier in the configuration is not valid.
    #[error("invalid password verifier: {0}")]
    BadVerifier(String),
}

impl Error {
    /// Whose fault the error is.
    pub fn side(&self) -> Side {
        match self {
            Error::Malformed { from, .. } | Error::BadLength { from, .. } | Error::TooLarge { from, .. } => *from,
            Error::AuthProtocol { from, .. } => *from,
            Error::AuthFailed { .. } => Side::Client,
            Error::UnsupportedAuth(_) => Side::Backend,
            Error::BadVerifier(_) => Side::Internal,
        }
    }

    /// Whether retrying the same thing (e.g. on another server) may succeed.
    ///
    /// Nothing at the wire level is: a broken stream cannot be resumed, and a wrong password
    /// stays wrong. The variants are listed so a new one has to decide.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Malformed { .. } | Error::BadLength { .. } | Error::TooLarge { .. } => false,
            Error::AuthFailed { .. } | Error::AuthProtocol { .. } => false,
            Error::UnsupportedAuth(_) | Error::BadVerifier(_) => false,
        }
    }

    /// A malformed-message error from `from`.
    pub(crate) fn malformed(from: Side, reason: impl Into<String>) -> Self {
        Error::Malformed { from, reason: reason.into() }
    }
}
