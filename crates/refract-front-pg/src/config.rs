//! `[postgres]`: the listener, TLS, client users, servers, pooling, lag and health settings.

use refract_core::overload::Priority;
use refract_core::partial::{check_share, ShareSection};
use refract_pg::auth::{AuthMethod, Credential};
use refract_shard::partition::{Key, KeyType};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `[postgres]`, validated; the settings are reachable through `Deref`.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "PgSettings")]
pub struct PgConfig {
    settings: PgSettings,
    /// Client users with their prepared credentials (SCRAM verifiers are derived once here).
    users: Arc<HashMap<String, UserEntry>>,
    /// The TLS server configuration, when `tls_cert` and `tls_key` are set (loaded once here,
    /// so a bad file is a configuration error at start).
    tls: Option<Arc<rustls::ServerConfig>>,
}

/// What a client user may log in with.
#[derive(Debug, Clone)]
pub struct UserEntry {
    /// The method clients of this user must use.
    pub method: AuthMethod,
    /// The stored password or verifier.
    pub credential: Credential,
    /// How long this user's clients keep a server connection.
    pub pool_mode: PoolMode,
    /// Where this user's units of work wait in a server's admission queue.
    pub priority: Priority,
}

/// `[postgres]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgSettings {
    /// Client-facing PostgreSQL address.
    pub listen: SocketAddr,
    /// The one database clients may ask for (and refract logs into).
    #[serde(default = "default_database")]
    pub database: String,
    /// `transaction` (default) or `session`.
    #[serde(default)]
    pub pool_mode: PoolMode,
    /// Most server connections per server.
    #[serde(default = "default_pool_size")]
    pub pool_size: usize,
    /// Server connections kept open per healthy server.
    #[serde(default = "default_min_idle")]
    pub min_idle: usize,
    /// How long a query may wait for a free server connection.
    #[serde(default = "default_checkout_timeout_ms")]
    pub checkout_timeout_ms: u64,
    /// Connect and login timeout towards servers.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// A client must finish startup and authentication within this time, else it gets
    /// `FATAL 08P01` and is closed (a slot holder that never logs in is not kept).
    #[serde(default = "default_login_timeout_ms")]
    pub login_timeout_ms: u64,
    /// Health check and lag poll period.
    #[serde(default = "default_health_interval_ms")]
    pub health_interval_ms: u64,
    /// How often each server's cache statistics are read (on its health probe's connection, at
    /// most once a health interval); 0 = never (`server/cache.rs`).
    #[serde(default = "default_cache_stats_interval_ms")]
    pub cache_stats_interval_ms: u64,
    /// A replica further behind the primary than this many WAL bytes is skipped; 0 = no bound.
    #[serde(default = "default_max_lag_bytes")]
    pub max_lag_bytes: u64,
    /// A replica whose replay is behind by more than this (time since the last replayed
    /// commit, counted only while it has received WAL it has not replayed) is skipped; 0 = no bound.
    #[serde(default)]
    pub max_lag_ms: u64,
    /// After a session's write, its reads go to the primary until a replica has replayed it.
    #[serde(default = "default_true")]
    pub read_your_writes: bool,
    /// The user refract logs into the servers as.
    pub server_user: String,
    /// Its password (SCRAM, md5 or cleartext, as the server asks).
    #[serde(default)]
    pub server_password: Option<String>,
    /// Functions that make a SELECT a write; absent = refract-pg's default list.
    #[serde(default)]
    pub write_functions: Option<Vec<String>>,
    /// PEM certificate chain for TLS towards clients (with `tls_key`); absent = no TLS.
    #[serde(default)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    #[serde(default)]
    pub tls_key: Option<PathBuf>,
    /// Refuse clients that do not ask for TLS (`28000`).
    #[serde(default)]
    pub tls_required: bool,
    /// `[[postgres.user]]`: who may connect.
    #[serde(default, rename = "user")]
    pub users: Vec<PgUser>,
    /// `[[postgres.server]]`: the primary and the replicas.
    #[serde(default, rename = "server")]
    pub servers: Vec<PgServerConfig>,
    /// `[[postgres.share]]`: how the reads of one class are spread over the servers that hold
    /// its tables (partial replication, `docs/postgres.md`).
    #[serde(default, rename = "share")]
    pub shares: Vec<PgShare>,
    /// `[[postgres.affinity]]`: the column whose value is a table's affinity key (with
    /// `[balance] policy = "affinity"`, docs/routing.md); a table not listed has its primary
    /// key's, learned from the catalog.
    #[serde(default, rename = "affinity")]
    pub affinity: Vec<PgAffinity>,
    /// `[[postgres.shard]]`: a sharded cluster, instead of `[[postgres.server]]` (docs/sharding.md).
    #[serde(default, rename = "shard")]
    pub shards: Vec<PgShard>,
    /// Sharded: the file where refract records, durably, each two-phase commit's decision
    /// before its second phase (and resolves prepared transactions from at start). Without
    /// it a transaction stays on one shard.
    #[serde(default)]
    pub twophase_log: Option<PathBuf>,
    /// Set by the dispatcher with `[cluster]`: two-phase decisions are kept in etcd, shared
    /// by every dispatcher (`twophase_log` is then needed only for ids it recorded before).
    #[serde(skip)]
    pub shared_decisions: bool,
    /// `[[postgres.sharded_table]]`: the tables split over the shards; every other table is
    /// replicated (a full copy on every shard).
    #[serde(default, rename = "sharded_table")]
    pub sharded_tables: Vec<ShardedTable>,
}

/// `[[postgres.shard]]`: one shard, a primary with optional replicas.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgShard {
    /// Name in metrics, logs and `/pg/shards`.
    pub name: String,
    /// `[[postgres.shard.server]]`: as `[[postgres.server]]` (names unique over all shards).
    #[serde(rename = "server")]
    pub servers: Vec<PgServerConfig>,
}

/// `[[postgres.sharded_table]]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardedTable {
    /// The relation (`name`, or `schema.name` outside `public`).
    pub name: String,
    /// Its shard key column.
    pub key: String,
    /// How key values map to shards.
    #[serde(default)]
    pub method: ShardMethod,
    /// The key column's type as far as placement goes.
    #[serde(default, rename = "type")]
    pub key_type: ShardKeyType,
    /// `range`: the n-1 boundaries between n shards (shard i holds `bounds[i-1] <= key <
    /// bounds[i]`), as PostgreSQL's `FOR VALUES FROM ... TO ...`.
    #[serde(default)]
    pub bounds: Vec<toml::Value>,
    /// `list`: the key values each shard holds, one list per shard.
    #[serde(default)]
    pub lists: Vec<Vec<toml::Value>>,
}

/// `method` of a sharded table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShardMethod {
    /// PostgreSQL's hash partitioning: shard i holds `MODULUS n, REMAINDER i`.
    #[default]
    Hash,
    /// Ranges of key values (`bounds`).
    Range,
    /// Lists of key values (`lists`).
    List,
}

/// `type` of a shard key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShardKeyType {
    /// int2, int4 or int8 (PostgreSQL hashes them alike).
    #[default]
    Integer,
    /// text or varchar.
    Text,
    /// uuid.
    Uuid,
}

/// `[[postgres.share]]`: the reads that name exactly `tables` go to the servers named in
/// `servers` (among those available and holding the tables) in proportion to their weights.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgShare {
    /// The class: the set of relations a read names (`name`, or `schema.name` outside `public`).
    pub tables: Vec<String>,
    /// Server name → weight (> 0; e.g. an LP allocation's fractions).
    pub servers: HashMap<String, f64>,
}

/// `[[postgres.affinity]]`: reads of `table` restricted to one value of `column` (`=`, `IN`,
/// `= ANY`) have the key (table, value), which the affinity policy maps onto one replica.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgAffinity {
    /// The relation (`name`, or `schema.name` outside `public`).
    pub table: String,
    /// The key column.
    pub column: String,
    /// Integer keys go in ranges of this many consecutive values, so that rows stored
    /// together (inserted in key order) share one replica's cache; 1 keys by the value alone.
    #[serde(default = "default_affinity_bucket")]
    pub bucket: u64,
}

/// `[[postgres.user]]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgUser {
    /// User name.
    pub name: String,
    /// A plain password, a `SCRAM-SHA-256$…` verifier or an `md5…` hash; empty for trust.
    #[serde(default)]
    pub password: String,
    /// `scram-sha-256` (default), `md5` or `trust`.
    #[serde(default)]
    pub auth: AuthKind,
    /// This user's pool mode; absent = `[postgres] pool_mode`.
    #[serde(default)]
    pub pool_mode: Option<PoolMode>,
    /// This user's admission priority: `high`, `normal` (default) or `low` (`docs/overload.md`).
    #[serde(default)]
    pub priority: UserPriority,
}

/// A user's admission priority as written; the engine's [`Priority`] classes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UserPriority {
    /// Served first, shed last (an operator's or a payment service's user).
    High,
    /// The default.
    #[default]
    Normal,
    /// Shed first (reports, batch jobs).
    Low,
}

impl From<UserPriority> for Priority {
    fn from(p: UserPriority) -> Priority {
        match p {
            UserPriority::High => Priority::High,
            UserPriority::Normal => Priority::Normal,
            UserPriority::Low => Priority::Low,
        }
    }
}

/// A client authentication method.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuthKind {
    /// SCRAM-SHA-256.
    #[default]
    #[serde(rename = "scram-sha-256")]
    ScramSha256,
    /// md5.
    Md5,
    /// No password.
    Trust,
}

/// `[[postgres.server]]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgServerConfig {
    /// Name in metrics and logs.
    pub name: String,
    /// `host:port`.
    pub addr: SocketAddr,
    /// `primary` or `replica`.
    pub role: PgRole,
    /// The PostgreSQL listener of the agent in front of this server (its `postgres_listen`):
    /// with an agent named for the server in `[handover] agents`, server connections go
    /// through it so that large results can be handed over, and straight to `addr` whenever
    /// it does not answer (docs/handover.md, "PostgreSQL").
    #[serde(default)]
    pub through: Option<SocketAddr>,
    /// A replica that holds only these relations (a partial replica: `name`, or `schema.name`
    /// outside `public`); it serves only reads naming nothing else. Absent: read from the
    /// replica's subscriptions (`pg_subscription_rel`; a replica without subscriptions holds
    /// every table).
    #[serde(default)]
    pub tables: Option<Vec<String>>,
}

/// A server's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PgRole {
    /// Takes writes.
    Primary,
    /// A streaming hot standby: takes plain reads.
    Replica,
}

/// How long a client keeps a server connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolMode {
    /// For one transaction, or one statement outside a transaction; routed per statement.
    #[default]
    Transaction,
    /// For the whole client session, on the primary (no per-statement routing).
    Session,
}

impl PoolMode {
    /// The name used in the configuration and the admin views.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolMode::Transaction => "transaction",
            PoolMode::Session => "session",
        }
    }
}

/// `[[postgres.affinity]] bucket` when not set.
pub const DEFAULT_AFFINITY_BUCKET: u64 = 1024;

fn default_affinity_bucket() -> u64 {
    DEFAULT_AFFINITY_BUCKET
}

fn default_database() -> String {
    "postgres".into()
}
fn default_pool_size() -> usize {
    20
}
fn default_min_idle() -> usize {
    1
}
fn default_checkout_timeout_ms() -> u64 {
    5_000
}
fn default_connect_timeout_ms() -> u64 {
    3_000
}
fn default_login_timeout_ms() -> u64 {
    15_000
}
fn default_health_interval_ms() -> u64 {
    1_000
}
fn default_cache_stats_interval_ms() -> u64 {
    5_000
}
fn default_max_lag_bytes() -> u64 {
    16 * 1024 * 1024
}
fn default_true() -> bool {
    true
}

impl TryFrom<PgSettings> for PgConfig {
    type Error = String;

    fn try_from(s: PgSettings) -> Result<Self, String> {
        s.check()?;
        let mut users = HashMap::new();
        for u in &s.users {
            users.insert(u.name.clone(), user_entry(u, s.pool_mode)?);
        }
        let tls = match (&s.tls_cert, &s.tls_key) {
            (Some(cert), Some(key)) => Some(Arc::new(tls_config(cert, key)?)),
            (None, None) if s.tls_required => {
                return Err("[postgres] tls_required = true needs tls_cert and tls_key".into())
            }
            (None, None) => None,
            _ => return Err("[postgres] tls_cert and tls_key go together".into()),
        };
        Ok(PgConfig { settings: s, users: Arc::new(users), tls })
    }
}

/// Loads a PEM certificate chain and its key into a rustls server configuration (ring provider).
fn tls_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| format!("[postgres] tls_cert {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!("[postgres] tls_cert {}: no certificate in the file", cert.display()));
    }
    let key_der =
        PrivateKeyDer::from_pem_file(key).map_err(|e| format!("[postgres] tls_key {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("[postgres] TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| format!("[postgres] tls_cert {} / tls_key {}: {e}", cert.display(), key.display()))?;
    // PostgreSQL 17 clients offer ALPN "postgresql"; older ones offer none, which is fine too.
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(config)
}

fn user_entry(u: &PgUser, default_mode: PoolMode) -> Result<UserEntry, String> {
    let method = match u.auth {
        AuthKind::ScramSha256 => AuthMethod::ScramSha256,
        AuthKind::Md5 => AuthMethod::Md5,
        AuthKind::Trust => AuthMethod::Trust,
    };
    if method != AuthMethod::Trust && u.password.is_empty() {
        return Err(format!("[[postgres.user]] {}: a password is required unless auth = \"trust\"", u.name));
    }
    let credential = if u.password.is_empty() {
        Credential { scram: None, md5: None }
    } else {
        Credential::parse(&u.name, &u.password).map_err(|e| format!("[[postgres.user]] {}: {e}", u.name))?
    };
    let usable = match method {
        AuthMethod::ScramSha256 => credential.scram.is_some(),
        AuthMethod::Md5 => credential.md5.is_some(),
        AuthMethod::Trust => true,
    };
    if !usable {
        return Err(format!("[[postgres.user]] {}: the stored password cannot verify {:?}", u.name, u.auth));
    }
    let pool_mode = u.pool_mode.unwrap_or(default_mode);
    Ok(UserEntry { method, credential, pool_mode, priority: u.priority.into() })
}

impl PgSettings {
    fn check(&self) -> Result<(), String> {
        self.check_servers()?;
        for (i, u) in self.users.iter().enumerate() {
            if u.name.is_empty() || self.users[..i].iter().any(|o| o.name == u.name) {
                return Err(format!("[[postgres.user]] name {:?} is empty or used twice", u.name));
            }
        }
        for (i, a) in self.affinity.iter().enumerate() {
            if a.table.is_empty() || a.column.is_empty() || a.bucket == 0 {
                return Err(format!("[[postgres.affinity]] {:?}: table and column must be named, bucket ≥ 1", a.table));
            }
            if self.affinity[..i].iter().any(|o| o.table == a.table) {
                return Err(format!("[[postgres.affinity]] table {:?} is listed twice", a.table));
            }
        }
        let times = [
            ("checkout_timeout_ms", self.checkout_timeout_ms),
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("login_timeout_ms", self.login_timeout_ms),
            ("health_interval_ms", self.health_interval_ms),
        ];
        if let Some((key, _)) = times.iter().find(|(_, v)| *v == 0) {
            return Err(format!("[postgres] {key} must be > 0"));
        }
        if self.pool_size == 0 || self.min_idle > self.pool_size {
            return Err("[postgres] pool_size must be > 0 and ≥ min_idle".into());
        }
        if self.database.is_empty() || self.server_user.is_empty() {
            return Err("[postgres] database and server_user must not be empty".into());
        }
        self.shares.iter().try_for_each(|sh| self.check_share(sh))?;
        self.sharded_tables.iter().try_for_each(|t| self.check_sharded_table(t))
    }

    /// Every server of the cluster (of every shard).
    pub fn all_servers(&self) -> impl Iterator<Item = &PgServerConfig> {
        self.servers.iter().chain(self.shards.iter().flat_map(|s| &s.servers))
    }

    /// One primary (per shard), unique names, ports.
    fn check_servers(&self) -> Result<(), String> {
        let groups: Vec<(&str, &[PgServerConfig])> = if self.shards.is_empty() {
            vec![("[postgres]", &self.servers)]
        } else if !self.servers.is_empty() {
            return Err("[postgres]: give either [[postgres.server]] or [[postgres.shard]], not both".into());
        } else {
            self.shards.iter().map(|s| (s.name.as_str(), s.servers.as_slice())).collect()
        };
        for (i, sh) in self.shards.iter().enumerate() {
            if sh.name.is_empty() || self.shards[..i].iter().any(|o| o.name == sh.name) {
                return Err(format!("[[postgres.shard]] name {:?} is empty or used twice", sh.name));
            }
        }
        for (group, servers) in groups {
            let primaries = servers.iter().filter(|s| s.role == PgRole::Primary).count();
            if primaries != 1 {
                return Err(format!("{group} needs exactly one server with role = \"primary\" (found {primaries})"));
            }
        }
        let all: Vec<&PgServerConfig> = self.all_servers().collect();
        for (i, s) in all.iter().enumerate() {
            if s.name.is_empty() || all[..i].iter().any(|o| o.name == s.name) {
                return Err(format!("[[postgres.server]] name {:?} is empty or used twice", s.name));
            }
            if s.addr.port() == 0 {
                return Err(format!("[[postgres.server]] {} needs a port", s.name));
            }
            if s.role == PgRole::Primary && s.tables.is_some() {
                return Err(format!("[[postgres.server]] {}: the primary holds every table (no `tables`)", s.name));
            }
        }
        Ok(())
    }

    fn check_sharded_table(&self, t: &ShardedTable) -> Result<(), String> {
        let n = self.shards.len();
        let what = format!("[[postgres.sharded_table]] {}", t.name);
        if n == 0 {
            return Err(format!("{what}: sharded tables need [[postgres.shard]]"));
        }
        if t.name.is_empty() || t.key.is_empty() {
            return Err(format!("{what}: `name` and `key` must not be empty"));
        }
        if self.sharded_tables.iter().filter(|o| o.name == t.name).count() > 1 {
            return Err(format!("{what} is given twice"));
        }
        match t.method {
            ShardMethod::Hash if !t.bounds.is_empty() || !t.lists.is_empty() => {
                Err(format!("{what}: `bounds` and `lists` are for method = \"range\" / \"list\""))
            }
            ShardMethod::Range if t.bounds.len() + 1 != n || !t.lists.is_empty() => {
                Err(format!("{what}: method = \"range\" needs {} `bounds` for {n} shards", n - 1))
            }
            ShardMethod::List if t.lists.len() != n || !t.bounds.is_empty() => {
                Err(format!("{what}: method = \"list\" needs one list per shard ({n} `lists`)"))
            }
            _ => rule_keys(t).map(|_| ()),
        }
    }

    fn check_share(&self, sh: &PgShare) -> Result<(), String> {
        let section = ShareSection { name: "[[postgres.share]]", weights: "servers", member: "[[postgres.server]]" };
        let all: Vec<&[String]> = self.shares.iter().map(|o| o.tables.as_slice()).collect();
        check_share(section, &sh.tables, &sh.servers, |n| self.all_servers().any(|s| s.name == n), &all)
    }
}

impl PgConfig {
    /// The client user called `name`.
    pub fn user(&self, name: &str) -> Option<&UserEntry> {
        self.users.get(name)
    }

    /// The TLS configuration, if `tls_cert` and `tls_key` are set.
    pub fn tls(&self) -> Option<&Arc<rustls::ServerConfig>> {
        self.tls.as_ref()
    }

    /// The configuration of shard `i` alone: its servers as `[[postgres.server]]` (what a
    /// shard's pools, probes and balancing are built from).
    pub fn for_shard(&self, i: usize) -> PgConfig {
        let mut c = self.clone();
        let settings = &mut c.settings;
        settings.servers = settings.shards.get(i).map(|s| s.servers.clone()).unwrap_or_default();
        settings.shards = vec![];
        settings.sharded_tables = vec![];
        c
    }
}

impl PgConfig {
    /// Two-phase decisions are kept in etcd by several dispatchers (`[cluster]`).
    pub fn share_decisions(&mut self) {
        self.settings.shared_decisions = true;
    }
}

impl std::ops::Deref for PgConfig {
    type Target = PgSettings;

    fn deref(&self) -> &PgSettings {
        &self.settings
    }
}

/// The placement type of a configured key type (int2, int4 and int8 hash alike).
pub(crate) fn key_type(t: ShardKeyType) -> KeyType {
    match t {
        ShardKeyType::Integer => KeyType::Int8,
        ShardKeyType::Text => KeyType::Text,
        ShardKeyType::Uuid => KeyType::Uuid,
    }
}

/// A sharded table's `bounds` and `lists` read as keys of its type.
pub(crate) fn rule_keys(t: &ShardedTable) -> Result<(Vec<Key>, Vec<Vec<Key>>), String> {
    let ty = key_type(t.key_type);
    let read = |v: &toml::Value| {
        let text = match v {
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::String(s) => s.clone(),
            other => return Err(format!("[[postgres.sharded_table]] {}: {other} is not a key value", t.name)),
        };
        ty.parse_text(text.as_bytes()).map_err(|e| format!("[[postgres.sharded_table]] {}: {e}", t.name))
    };
    let bounds = t.bounds.iter().map(read).collect::<Result<Vec<_>, _>>()?;
    if bounds.windows(2).any(|w| compare(&w[0], &w[1]) != Ordering::Less) {
        return Err(format!("[[postgres.sharded_table]] {}: `bounds` must increase", t.name));
    }
    let lists = t.lists.iter().map(|l| l.iter().map(read).collect()).collect::<Result<Vec<_>, _>>()?;
    Ok((bounds, lists))
}

/// Orders two keys of one type (integers by value, text and uuid by bytes).
pub(crate) fn compare(a: &Key, b: &Key) -> Ordering {
    let int = |k: &Key| match k {
        Key::Int2(v) => Some(i64::from(*v)),
        Key::Int4(v) => Some(i64::from(*v)),
        Key::Int8(v) => Some(*v),
        _ => None,
    };
    match (a, b) {
        (Key::Text(x), Key::Text(y)) => x.cmp(y),
        (Key::Uuid(x), Key::Uuid(y)) => x.cmp(y),
        _ => int(a).cmp(&int(b)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &str) -> Result<PgConfig, String> {
        let text = format!(
            "listen = \"127.0.0.1:6432\"\nserver_user = \"u\"\n{extra}\n\
             [[server]]\nname = \"p\"\naddr = \"127.0.0.1:5433\"\nrole = \"primary\"\n"
        );
        toml::from_str::<PgConfig>(&text).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_validation() {
        let c = parse("").map_err(|e| e.to_string());
        let c = c.as_ref().map(|c| (c.pool_mode, c.pool_size, c.read_your_writes, c.login_timeout_ms));
        assert_eq!(c, Ok((PoolMode::Transaction, 20, true, 15_000)));
        assert!(parse("login_timeout_ms = 0").is_err());
        assert!(parse("login_timeout_ms = 250").is_ok_and(|c| c.login_timeout_ms == 250));
        assert!(parse("pool_size = 0").is_err());
        assert!(parse("bogus = 1").is_err());
        assert!(parse("[[user]]\nname = \"a\"\n").is_err(), "password required for scram");
        assert!(parse("[[user]]\nname = \"a\"\nauth = \"trust\"\n").is_ok());
        assert!(parse("[[user]]\nname = \"a\"\npassword = \"p\"\nauth = \"scram-sha-256\"\n").is_ok());
        let md5 = parse("[[user]]\nname = \"a\"\npassword = \"md5aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"\n");
        assert!(md5.is_err(), "an md5 hash cannot verify SCRAM");
    }

    #[test]
    fn per_user_pool_mode_overrides_the_default() {
        let c = parse("pool_mode = \"transaction\"\n[[user]]\nname = \"s\"\nauth = \"trust\"\npool_mode = \"session\"\n[[user]]\nname = \"t\"\nauth = \"trust\"\n").unwrap();
        assert_eq!(c.user("s").map(|u| u.pool_mode), Some(PoolMode::Session));
        assert_eq!(c.user("t").map(|u| u.pool_mode), Some(PoolMode::Transaction));
        assert!(parse("[[user]]\nname = \"s\"\nauth = \"trust\"\npool_mode = \"statement\"\n").is_err());
    }

    #[test]
    fn tls_files_are_checked_at_start() {
        let missing = parse("tls_cert = \"/nonexistent/cert.pem\"\ntls_key = \"/nonexistent/key.pem\"").unwrap_err();
        assert!(missing.contains("/nonexistent/cert.pem"), "{missing}");
        let dir = std::env::temp_dir().join(format!("refract-tls-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_pem = dir.join("empty.pem");
        std::fs::write(&not_pem, "not a certificate\n").unwrap();
        let empty = parse(&format!("tls_cert = {:?}\ntls_key = {:?}", not_pem, not_pem)).unwrap_err();
        assert!(empty.contains("empty.pem"), "{empty}");
        assert!(parse("tls_cert = \"/x.pem\"").unwrap_err().contains("go together"));
        assert!(parse("tls_required = true").unwrap_err().contains("tls_required"));
        assert!(parse("max_lag_ms = 500").is_ok_and(|c| c.max_lag_ms == 500));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
