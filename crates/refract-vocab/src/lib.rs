//! The words every refract crate shares, whatever the protocol: where a request may go
//! ([`RouteClass`]) and whose fault a failure is ([`Side`]). The engine (`refract-core`) and
//! every front end speak them; this crate depends on nothing of refract's.

use serde::{Deserialize, Serialize};

/// Where a request (an HTTP request, a PostgreSQL statement) may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteClass {
    /// One replica (or the primary, if configured).
    Read,
    /// The primary.
    Write,
    /// Every backend; the client gets the primary's response.
    All,
    /// A stored procedure: the primary.
    Procedure,
}

impl RouteClass {
    /// All classes, for metrics.
    pub const ALL: [RouteClass; 4] = [RouteClass::Read, RouteClass::Write, RouteClass::All, RouteClass::Procedure];

    /// The lowercase name used in headers, config and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteClass::Read => "read",
            RouteClass::Write => "write",
            RouteClass::All => "all",
            RouteClass::Procedure => "procedure",
        }
    }
}

/// Whose fault an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client sent something wrong or went away.
    Client,
    /// A backend failed or misbehaved.
    Backend,
    /// refract itself (e.g. no backend available).
    Internal,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::value::{Error, StrDeserializer};
    use serde::de::IntoDeserializer;

    #[test]
    fn class_names_are_the_config_words() {
        for c in RouteClass::ALL {
            let word: StrDeserializer<Error> = c.as_str().into_deserializer();
            assert_eq!(RouteClass::deserialize(word).expect("a class name"), c);
        }
    }
}
