//! The words every refract crate shares, whatever the protocol: where a request may go
//! ([`RouteClass`]), whose fault a failure is ([`Side`]), which front end a member serves
//! ([`FrontKind`], [`MemberName`]). The engine (`refract-core`) and
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

/// The front end a member (an HTTP backend, a PostgreSQL server) belongs to: the admin API's
/// `"front"` field (`"http"`, `"postgres"`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FrontKind {
    /// An HTTP backend.
    #[default]
    Http,
    /// A PostgreSQL server.
    Postgres,
}

impl FrontKind {
    /// The lowercase name the admin API and metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            FrontKind::Http => "http",
            FrontKind::Postgres => "postgres",
        }
    }

    /// The `front` label of a member's series in the metric families both front ends share
    /// (`refract_backend_*`, `refract_requests`, the hand-over's): `front="postgres"` on a
    /// PostgreSQL server's, none on an HTTP backend's. A name may be both an HTTP backend's and a
    /// server's (the configuration files allow it), and the label keeps their series apart.
    pub fn label(self) -> Option<&'static str> {
        match self {
            FrontKind::Http => None,
            FrontKind::Postgres => Some("postgres"),
        }
    }
}

/// A member as metrics name it: its plain name and its front end. A bare name (`&str`) is an
/// HTTP backend's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemberName<'a> {
    /// Its plain name.
    pub name: &'a str,
    /// Its front end.
    pub front: FrontKind,
}

impl<'a> MemberName<'a> {
    /// PostgreSQL server `name`.
    pub fn postgres(name: &'a str) -> Self {
        MemberName { name, front: FrontKind::Postgres }
    }
}

impl<'a> From<&'a str> for MemberName<'a> {
    fn from(name: &'a str) -> Self {
        MemberName { name, front: FrontKind::Http }
    }
}

impl<'a> From<&'a String> for MemberName<'a> {
    fn from(name: &'a String) -> Self {
        MemberName::from(name.as_str())
    }
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
