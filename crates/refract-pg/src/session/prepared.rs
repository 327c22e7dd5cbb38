//! [`PreparedRegistry`]: a client's named prepared statements, protocol-level (Parse) and
//! SQL-level (PREPARE), so they can be prepared again on any server connection.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::frontend::FrontendMessage;

/// How the client prepared a statement.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Origin {
    /// A Parse message: the query and its declared parameter types.
    Protocol {
        /// The SQL text.
        query: String,
        /// Parameter type OIDs (0 = let the server infer).
        param_types: Vec<u32>,
    },
    /// A `PREPARE name AS ...` statement, replayed as is.
    Sql {
        /// The PREPARE statement's text.
        text: String,
    },
}

/// One prepared statement of a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedStatement {
    /// The client's name for it.
    pub name: String,
    /// What to send to prepare it.
    pub origin: Origin,
    /// Its query is a plain read (so Bind/Execute of it may go to a replica).
    pub read: bool,
    /// The schema epoch it was prepared in ([`PreparedRegistry::follow_epoch`]): DDL since
    /// makes a statement of the same text another statement, as on a connection of its own.
    pub epoch: u64,
}

impl PreparedStatement {
    /// Whether it is a SQL-level (`PREPARE`) statement.
    pub fn is_sql(&self) -> bool {
        matches!(self.origin, Origin::Sql { .. })
    }

    /// A server-side name derived from what gives the statement its meaning: the query, its
    /// declared parameter types and the `search_path` in force where it is prepared
    /// (`search_path`: that SET statement, `None` for the default). So clients whose
    /// statements share a name but not a meaning never collide on a shared server connection,
    /// and identical ones share (while no DDL ran between their Parses: `epoch`); a statement is
    /// only ever used under the `search_path` it was
    /// prepared with, which schema-per-tenant applications rely on (one prepared under
    /// another path would be re-planned, or fail with `0A000 cached plan must not change
    /// result type`).
    pub fn global_name(&self, search_path: Option<&str>) -> String {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.origin.hash(&mut h);
        search_path.hash(&mut h);
        self.epoch.hash(&mut h);
        format!("refract_{:016x}", h.finish())
    }

    /// The message that prepares it on a server under `server_name`: a Parse, or a Query for
    /// SQL PREPARE (whose name is fixed by its text).
    pub fn prepare_message(&self, server_name: &str) -> Bytes {
        let msg = match &self.origin {
            Origin::Protocol { query, param_types } => FrontendMessage::Parse {
                name: server_name.to_owned(),
                query: query.clone(),
                param_types: param_types.clone(),
            },
            Origin::Sql { text } => FrontendMessage::Query(text.clone()),
        };
        let mut out = BytesMut::new();
        msg.encode(&mut out);
        out.freeze()
    }
}

/// The named statements a client prepared and has not closed.
#[derive(Debug, Clone, Default)]
pub struct PreparedRegistry {
    statements: HashMap<String, Arc<PreparedStatement>>,
    /// The schema epoch new statements are prepared in (none: always 0).
    epoch: Option<Arc<AtomicU64>>,
    /// How many of `statements` are SQL-level (asked before every simple query).
    sql: usize,
}

impl PreparedRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a Parse (the unnamed statement `""` included: it lives until the next Parse).
    pub fn parse(&mut self, name: &str, query: &str, param_types: &[u32], read: bool) -> Arc<PreparedStatement> {
        let origin = Origin::Protocol { query: query.to_owned(), param_types: param_types.to_vec() };
        self.insert(name, origin, read)
    }

    /// Records a SQL `PREPARE`.
    pub fn sql_prepare(&mut self, name: &str, text: &str, read: bool) -> Arc<PreparedStatement> {
        self.insert(name, Origin::Sql { text: text.to_owned() }, read)
    }

    /// Statements prepared from now on take their epoch from `epoch`, which whoever runs DDL
    /// advances: a server-side statement prepared before a schema change is never used for a
    /// client's Parse after it (PostgreSQL plans the client's statement against the new
    /// schema; a statement prepared before would fail with `0A000 cached plan must not change
    /// result type` or a stale type's `XX000`).
    pub fn follow_epoch(&mut self, epoch: Arc<AtomicU64>) {
        self.epoch = Some(epoch);
    }

    fn insert(&mut self, name: &str, origin: Origin, read: bool) -> Arc<PreparedStatement> {
        let epoch = self.epoch.as_ref().map_or(0, |e| e.load(Ordering::Acquire));
        let s = Arc::new(PreparedStatement { name: name.to_owned(), origin, read, epoch });
        self.put(s.clone());
        s
    }

    /// Puts back a statement as it was (e.g. the unnamed one a skipped Parse would have replaced).
    pub fn restore(&mut self, statement: Arc<PreparedStatement>) {
        self.put(statement);
    }

    fn put(&mut self, statement: Arc<PreparedStatement>) {
        self.sql += usize::from(statement.is_sql());
        if let Some(old) = self.statements.insert(statement.name.clone(), statement) {
            self.sql -= usize::from(old.is_sql());
        }
    }

    /// A Close of a statement or `DEALLOCATE name`.
    pub fn close(&mut self, name: &str) -> Option<Arc<PreparedStatement>> {
        let old = self.statements.remove(name);
        self.sql -= old.as_ref().map_or(0, |s| usize::from(s.is_sql()));
        old
    }

    /// `DEALLOCATE ALL` or `DISCARD ALL`.
    pub fn clear(&mut self) {
        self.statements.clear();
        self.sql = 0;
    }

    /// The statement called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<PreparedStatement>> {
        self.statements.get(name)
    }

    /// The names of the SQL-level (`PREPARE`) statements, sorted.
    pub fn sql_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.statements.values().filter(|s| s.is_sql()).map(|s| s.name.clone()).collect();
        names.sort();
        names
    }

    /// Whether any statement is SQL-level (`PREPARE`).
    pub fn has_sql(&self) -> bool {
        self.sql > 0
    }

    /// How many statements are registered.
    pub fn len(&self) -> usize {
        self.statements.len()
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.statements.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::Limits;

    #[test]
    fn registers_and_closes() {
        let mut r = PreparedRegistry::new();
        r.parse("s1", "SELECT $1", &[23], true);
        r.sql_prepare("p", "PREPARE p AS SELECT 1", true);
        assert_eq!(r.len(), 2);
        assert!(r.get("s1").unwrap().read);
        r.parse("s1", "INSERT INTO t VALUES ($1)", &[], false);
        assert!(!r.get("s1").unwrap().read, "replaced");
        assert!(r.close("s1").is_some());
        assert!(r.close("s1").is_none());
        assert!(r.has_sql());
        r.sql_prepare("p", "PREPARE p AS SELECT 2", true);
        assert!(r.close("p").is_some());
        assert!(!r.has_sql(), "counted once, replaced or not");
        r.sql_prepare("p", "PREPARE p AS SELECT 1", true);
        r.clear();
        assert!(r.is_empty());
        assert!(!r.has_sql());
    }

    #[test]
    fn prepares_again_elsewhere() {
        let mut r = PreparedRegistry::new();
        let s = r.parse("s1", "SELECT $1", &[23], true);
        let bytes = s.prepare_message(&s.global_name(None));
        let (msg, _) = FrontendMessage::parse(&bytes, &Limits::default()).unwrap().unwrap();
        assert_eq!(
            msg,
            FrontendMessage::Parse { name: s.global_name(None), query: "SELECT $1".into(), param_types: vec![23] }
        );
        let p = r.sql_prepare("p", "PREPARE p AS SELECT 1", true);
        assert_eq!(&p.prepare_message("ignored")[..], b"Q\0\0\0\x1aPREPARE p AS SELECT 1\0");
    }

    #[test]
    fn global_names_follow_content() {
        let mut a = PreparedRegistry::new();
        let mut b = PreparedRegistry::new();
        let x = a.parse("s1", "SELECT 1", &[], true);
        let y = b.parse("other", "SELECT 1", &[], true);
        let z = b.parse("s1", "SELECT 2", &[], true);
        assert_eq!(x.global_name(None), y.global_name(None));
        assert_ne!(x.global_name(None), z.global_name(None));
        assert!(x.global_name(None).starts_with("refract_"));
        let path = Some("SET search_path = tenant_1");
        assert_ne!(x.global_name(None), x.global_name(path), "the search_path is part of it");
        assert_eq!(x.global_name(path), y.global_name(path));
        let typed = b.parse("t", "SELECT 1", &[23], true);
        assert_ne!(typed.global_name(None), x.global_name(None), "so are the parameter types");
    }
}
