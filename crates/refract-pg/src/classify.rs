//! Statement classification with PostgreSQL's own parser (`pg_query`): is a query a plain read
//! a replica may serve, and which statements change session state the pooler must track.
//!
//! Results are cached by query text, because parsing costs tens of microseconds and the same
//! texts come back (prepared statements, ORMs, pgbench). Texts that differ only in their
//! literals (`... WHERE id = 42`, `... WHERE id = 43`) share a second cache keyed by their
//! *shape* (see `shape`) when they are plain reads or writes.

mod analyze;
mod cache;
mod hint;
mod shape;

pub use shape::parameterized;
mod state;

use std::sync::{Arc, Mutex, PoisonError};

use cache::Cache;

/// Where a query may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// A plain read: any server, a replica preferably.
    Read,
    /// Anything else: the primary.
    Write,
}

/// An explicit routing wish: a `/* refract: route=... */` comment or `SET refract.route`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteHint {
    /// Always the primary.
    Primary,
    /// A replica, even if the parser thinks otherwise (the replica refuses writes itself).
    Replica,
    /// Let the classifier decide.
    Auto,
}

impl RouteHint {
    /// Parses `primary`, `replica` or `auto` (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "primary" => Some(RouteHint::Primary),
            "replica" => Some(RouteHint::Replica),
            "auto" => Some(RouteHint::Auto),
            _ => None,
        }
    }
}

/// What one statement is, as far as routing and session state are concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Statement {
    /// A plain read (SELECT without locking, writing CTEs or write functions; SHOW; EXPLAIN of one).
    Read,
    /// Anything that is not a read and not listed below.
    Write,
    /// `BEGIN` / `START TRANSACTION`.
    Begin {
        /// `READ ONLY` was given (such a transaction may run on a replica).
        read_only: bool,
    },
    /// `COMMIT` / `END`.
    Commit,
    /// `ROLLBACK` / `ABORT`.
    Rollback,
    /// `SAVEPOINT`, `RELEASE`, `ROLLBACK TO`: stay within the transaction.
    Savepoint,
    /// `SET [LOCAL|SESSION] name ...` (also `SET TIME ZONE`, `SET ROLE`, ...).
    Set {
        /// Lower-case parameter name (`transaction` for `SET TRANSACTION`).
        name: String,
        /// Lasts only until the end of the transaction (`SET LOCAL`, `SET TRANSACTION`).
        local: bool,
        /// The statement's text, to replay it on another server connection.
        text: String,
    },
    /// `RESET name`, or `RESET ALL` (`name` is `None`).
    Reset {
        /// The parameter, lower case.
        name: Option<String>,
    },
    /// `DISCARD ALL|PLANS|SEQUENCES|TEMP`.
    Discard {
        /// `DISCARD ALL`, which also drops prepared statements and resets parameters.
        all: bool,
    },
    /// SQL-level `PREPARE name AS ...`.
    Prepare {
        /// Statement name.
        name: String,
        /// The whole PREPARE statement's text, to re-run it on another server connection.
        text: String,
        /// The prepared query is a plain read, so its EXECUTEs may go to a replica.
        read: bool,
    },
    /// SQL-level `EXECUTE name`.
    Execute {
        /// Statement name.
        name: String,
    },
    /// `DEALLOCATE name`, or `DEALLOCATE ALL` (`None`).
    Deallocate {
        /// Statement name.
        name: Option<String>,
    },
    /// `SET refract.route = primary|replica|auto` (or `RESET refract.route`): for refract,
    /// not the server.
    RouteSetting(RouteHint),
    /// `LISTEN channel`.
    Listen {
        /// The channel, as the parser folded it.
        channel: String,
    },
    /// `UNLISTEN channel`, or `UNLISTEN *` (`None`).
    Unlisten {
        /// The channel.
        channel: Option<String>,
    },
}

impl Statement {
    /// Whether the statement needs the primary on its own (session statements do not).
    fn is_write(&self) -> bool {
        match self {
            Statement::Read | Statement::Execute { .. } | Statement::RouteSetting(_) => false,
            Statement::Begin { read_only } => !read_only,
            _ => true,
        }
    }
}

/// The outcome of classifying one query text (which may hold several statements).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classification {
    /// Write if any statement is, else Read.
    pub route: Route,
    /// Each statement, in order.
    pub statements: Vec<Statement>,
    /// A `/* refract: route=... */` comment in the text.
    pub hint: Option<RouteHint>,
    /// The parser's complaint, if it could not parse the text (the route is then Write, so the
    /// primary reports the error to the client).
    pub parse_error: Option<String>,
    /// Some statement may leave session state on its server connection (a temp object, a
    /// session advisory lock, `set_config(..., false)`, a `WITH HOLD` cursor, LISTEN, `DO`,
    /// `CALL`): the session layer checks what is left and pins the client to the connection.
    pub stateful: bool,
    /// Some statement calls `set_config(..., false)` (or with a third argument other than the
    /// keyword `true`): settings refract cannot track nor always see (custom `a.b` ones).
    pub set_config: bool,
    /// SQL-level prepared statements run inside other statements (`CREATE TABLE ... AS
    /// EXECUTE q`, `EXPLAIN EXECUTE q`): like an `EXECUTE`'s, their names must be this
    /// client's on the server connection (or none there).
    pub nested_executes: Vec<String>,
    /// Some statement is DDL (or `DO`): statements prepared before it are not reused for
    /// Parses after it.
    pub changes_schema: bool,
    /// The relations the text names ([`relation_name`]; sorted, once each): a read goes only to
    /// a server that holds all of them (partial replicas). Empty when it names none or did not
    /// parse.
    pub tables: Vec<String>,
}

/// How refract names a relation: `name`, or `schema.name` outside `public` (an unqualified name
/// is taken to be in `public`, the default `search_path`). Identifiers as the parser folded
/// them (unquoted ones lower-cased), so a server's own catalog names compare equal.
pub fn relation_name(schema: &str, name: &str) -> String {
    match schema {
        "" | "public" => name.to_owned(),
        s => format!("{s}.{name}"),
    }
}

/// Whether `sql` carries `/* refract: explain */`: the client asks where refract would send
/// it and why, instead of running it.
pub fn wants_explain(sql: &str) -> bool {
    hint::explain(sql)
}

/// The value of a `/* refract: shard=N */` comment in `sql` (outside string literals), if
/// any: the client asks for the statement to run on that shard only (a sharded cluster; the
/// front end resolves N as a shard's name or index).
pub fn shard_hint(sql: &str) -> Option<String> {
    hint::shard(sql)
}

impl Classification {
    /// Where to send the query: a hint in the text wins over the session's `refract.route`,
    /// which wins over the classification.
    pub fn target(&self, session: RouteHint) -> Route {
        match self.hint.filter(|h| *h != RouteHint::Auto).unwrap_or(session) {
            RouteHint::Primary => Route::Write,
            RouteHint::Replica => Route::Read,
            RouteHint::Auto => self.route,
        }
    }

    /// Whether the text reads `pg_prepared_statements`, the server process's prepared
    /// statements (a pooler must show the client its own there).
    pub fn reads_prepared_statements(&self) -> bool {
        self.tables.iter().any(|t| matches!(t.as_str(), "pg_prepared_statements" | "pg_catalog.pg_prepared_statements"))
    }

    /// `EXECUTE name` is routed by what was prepared; the session layer resolves it.
    pub fn executes(&self) -> impl Iterator<Item = &str> {
        self.statements.iter().filter_map(|s| match s {
            Statement::Execute { name } => Some(name.as_str()),
            _ => None,
        })
    }
}

/// Functions that write or need the primary's session even inside a SELECT. A trailing `*`
/// matches any suffix; names match case-insensitively, without schema.
pub const DEFAULT_WRITE_FUNCTIONS: &[&str] = &[
    "nextval",
    "setval",
    "currval",
    "lastval",
    "pg_advisory_*",
    "pg_try_advisory_*",
    "txid_current",
    "pg_current_xact_id",
    "pg_notify",
    "set_config",
    "pg_create_restore_point",
    "pg_switch_wal",
    "pg_terminate_backend",
    "pg_cancel_backend",
    "lo_*",
    "dblink_exec",
    "pg_logical_emit_message",
    "pg_create_*_replication_slot",
    "pg_drop_replication_slot",
    "pg_replication_origin_*",
];

/// Classifier settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassifierConfig {
    /// Functions that make a SELECT a write (see [`DEFAULT_WRITE_FUNCTIONS`]).
    pub write_functions: Vec<String>,
    /// Most query texts remembered.
    pub cache_capacity: usize,
    /// Longer texts are classified but not cached (bounds the cache's memory).
    pub max_cached_len: usize,
}

impl Default for ClassifierConfig {
    fn default() -> Self {
        ClassifierConfig {
            write_functions: DEFAULT_WRITE_FUNCTIONS.iter().map(|s| s.to_string()).collect(),
            cache_capacity: 10_000,
            max_cached_len: 8 * 1024,
        }
    }
}

/// Classifies query texts; shared by all sessions (the caches are behind a mutex).
#[derive(Debug)]
pub struct Classifier {
    write_functions: Vec<String>,
    max_cached_len: usize,
    cache: Mutex<Caches>,
}

/// By exact text, and by shape (literals replaced) for plain reads and writes.
#[derive(Debug)]
struct Caches {
    exact: Cache,
    shapes: Cache,
}

impl Classifier {
    /// A classifier with `config`.
    pub fn new(config: ClassifierConfig) -> Self {
        let write_functions = config.write_functions.iter().map(|f| f.to_ascii_lowercase()).collect();
        Classifier {
            write_functions,
            max_cached_len: config.max_cached_len,
            cache: Mutex::new(Caches {
                exact: Cache::new(config.cache_capacity),
                shapes: Cache::new(config.cache_capacity),
            }),
        }
    }

    /// Classifies `sql` (one or more statements), from a cache when it (or a text of the same
    /// shape) was seen before.
    pub fn classify(&self, sql: &str) -> Arc<Classification> {
        if sql.len() > self.max_cached_len {
            return Arc::new(self.classify_uncached(sql));
        }
        if let Some(hit) = self.lock().exact.get(sql) {
            return hit;
        }
        let shape = shape::of(sql);
        if let Some(hit) = shape.as_deref().and_then(|s| self.lock().shapes.get(s)) {
            return hit;
        }
        let c = Arc::new(self.classify_uncached(sql));
        let mut caches = self.lock();
        match shape {
            Some(s) if shareable(&c) => caches.shapes.insert(&s, c.clone()),
            _ => caches.exact.insert(sql, c.clone()),
        }
        c
    }

    /// Classifies without the cache.
    pub fn classify_uncached(&self, sql: &str) -> Classification {
        let hint = hint::find(sql);
        match analyze::statements(sql, &self.write_functions) {
            Ok((statements, effects, tables)) => {
                let write = statements.iter().any(Statement::is_write);
                Classification {
                    route: if write { Route::Write } else { Route::Read },
                    statements,
                    hint,
                    parse_error: None,
                    stateful: effects.stateful,
                    set_config: effects.set_config,
                    nested_executes: effects.nested_executes,
                    changes_schema: effects.changes_schema,
                    tables,
                }
            }
            Err(e) => match hint::unquoted_route_setting(sql) {
                Some(h) => Classification {
                    route: Route::Read,
                    statements: vec![Statement::RouteSetting(h)],
                    hint,
                    parse_error: None,
                    stateful: false,
                    set_config: false,
                    nested_executes: vec![],
                    changes_schema: false,
                    tables: vec![],
                },
                None => Classification {
                    route: Route::Write,
                    statements: vec![],
                    hint,
                    parse_error: Some(e),
                    stateful: false,
                    set_config: false,
                    nested_executes: vec![],
                    changes_schema: false,
                    tables: vec![],
                },
            },
        }
    }

    /// How many texts and shapes are cached.
    pub fn cached(&self) -> usize {
        let caches = self.lock();
        caches.exact.len() + caches.shapes.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Caches> {
        // A panic while holding the lock cannot leave the cache inconsistent enough to matter.
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A statement's *fingerprint*: a hash of its shape (literals replaced, so `… WHERE id = 42`
/// and `… = 43` are one kind of statement), or of its text when it has no shape. The PostgreSQL
/// front end keeps a no-load time per fingerprint for its adaptive limit: statements of one
/// kind cost about the same, statements of different kinds do not. Stable within a process.
pub fn fingerprint(sql: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    match shape::of(sql) {
        Some(s) => s.hash(&mut h),
        None => sql.hash(&mut h),
    }
    h.finish()
}

/// Whether a classification holds for every text of its shape: only plain reads and writes
/// parsed without error and without a hint (other statements carry their text or constants).
fn shareable(c: &Classification) -> bool {
    c.parse_error.is_none()
        && c.hint.is_none()
        && c.nested_executes.is_empty()
        && !c.statements.is_empty()
        && c.statements.iter().all(|s| matches!(s, Statement::Read | Statement::Write))
}

impl Default for Classifier {
    fn default() -> Self {
        Self::new(ClassifierConfig::default())
    }
}

#[cfg(test)]
mod tests;
