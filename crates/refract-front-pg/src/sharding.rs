//! A sharded cluster (`[[postgres.shard]]`, `[[postgres.sharded_table]]`, docs/sharding.md):
//! which shard holds a key ([`Sharding::place`]: PostgreSQL's own hash partitioning, or
//! ranges, or lists), where each statement goes (`route`), and how a statement that needs
//! several shards runs there (`fanout`: scatter-gather reads, writes over several shards);
//! `session` wires it into the client session; `view`: `GET /pg/shards`.
//!
//! # Layout
//! - this file: [`Sharding`], the rules (which shard holds a key), and `view`.
//! - `route` (and `route/copy`): where one statement goes; pure, no I/O.
//! - `session`: a simple Query in a sharded session; `batch`: where an extended batch runs;
//!   `transaction`: a transaction's BEGIN, its moves between shards, its end on each.
//! - `fanout`: a statement on several shards outside a transaction; `txread`: a read over
//!   several shards inside one; `copy`: COPY over several shards.
//! - `several` (and `several/execute`): a batch no one shard can run, answered by refract.
//! - `tx`: what a transaction begins where (the held BEGIN, one transition function).
//! - `overrides`: `SET refract.shard` and the shard comment; `twophase`: two-phase commit and
//!   the decision log's recovery.

mod batch;
mod copy;
mod fanout;
mod overrides;
mod route;
mod session;
mod several;
mod transaction;
mod twophase;
pub(crate) mod tx;
mod txread;

pub(crate) use batch::Placed;
pub(crate) use twophase::recover;
pub use twophase::SharedDecisions;

use crate::config::{compare, key_type, rule_keys, PgConfig, ShardMethod};
use crate::server::metrics::PgMetrics;
use crate::server::servers::Servers;
use refract_core::metrics::Metrics;
use refract_shard::partition::{self, Key, KeyType};
use refract_shard::shardkey::{Schema, TableKeys};
use serde_json::{json, Value};
use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};

/// A statement shape's key restrictions (`route::by_shape`).
type Template = Arc<Vec<TableKeys>>;

/// Most statement shapes whose routing is cached.
const TEMPLATES: usize = 4096;

/// A yes/no fact about the servers, learned once (`None` until then).
#[derive(Debug, Default)]
pub(crate) struct Learned(AtomicU8);

impl Learned {
    pub(crate) fn get(&self) -> Option<bool> {
        match self.0.load(Relaxed) {
            1 => Some(true),
            2 => Some(false),
            _ => None,
        }
    }

    pub(crate) fn set(&self, yes: bool) {
        self.0.store(if yes { 1 } else { 2 }, Relaxed);
    }
}

/// One sharded table's placement rule.
#[derive(Debug)]
struct Rule {
    name: String,
    key: String,
    method: ShardMethod,
    ty: KeyType,
    /// `range`: the boundaries; `list`: each shard's values.
    bounds: Vec<Key>,
    lists: Vec<Vec<Key>>,
}

/// What one shard has been sent (for `/pg/shards` and the metrics).
#[derive(Debug, Default)]
pub(crate) struct ShardStats {
    /// Statements run on it (alone or as part of a fan-out).
    pub statements: AtomicU64,
    /// Rows of INSERT ... VALUES refract placed on it by their key.
    pub rows: AtomicU64,
}

/// The sharding rules and counters.
pub(crate) struct Sharding {
    /// Shard names, in shard order.
    pub names: Vec<String>,
    rules: Vec<Rule>,
    pub stats: Vec<ShardStats>,
    /// Statements answered from several shards.
    pub scatters: AtomicU64,
    /// Statements refused because they cannot be answered exactly over several shards.
    pub refused: AtomicU64,
    /// The turn of reads that any shard answers (replicated tables only).
    turn: AtomicUsize,
    /// Whether the shards compare text under the C collation (asked at the first scatter).
    pub(crate) c_collation: Learned,
    /// Each sharded table's key column position, read from a shard's catalog when an INSERT
    /// without a column list needs it.
    positions: Mutex<HashMap<String, usize>>,
    metrics: Arc<PgMetrics>,
    /// Each statement shape's key restrictions (`route::by_shape`), or `None`: not routed by
    /// shape. Bounded: emptied when full.
    templates: Mutex<HashMap<(String, bool), Option<Template>>>,
    /// The two-phase decision log (`[postgres] twophase_log`), or why there is none.
    pub(crate) log: Result<Arc<twophase::DecisionLog>, String>,
    /// Per shard: whether its primary accepts PREPARE TRANSACTION (`max_prepared_transactions
    /// > 0`), asked the first time a transaction or write needs it.
    pub(crate) prepared_ok: Vec<Learned>,
}

impl Schema for Sharding {
    fn key_of(&self, table: &str) -> Option<&str> {
        self.rule(table).map(|r| r.key.as_str())
    }

    fn key_position(&self, table: &str) -> Option<usize> {
        lock(&self.positions).get(table).copied()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Sharding {
    /// The rules of `cfg` (checked when it was parsed: see [`rule_keys`]).
    pub(crate) fn new(cfg: &PgConfig, metrics: &Arc<Metrics>) -> Sharding {
        let rules = cfg
            .sharded_tables
            .iter()
            .map(|t| {
                let (bounds, lists) = rule_keys(t).unwrap_or_default();
                let ty = key_type(t.key_type);
                Rule { name: t.name.clone(), key: t.key.clone(), method: t.method, ty, bounds, lists }
            })
            .collect();
        Sharding {
            names: cfg.shards.iter().map(|s| s.name.clone()).collect(),
            rules,
            stats: cfg.shards.iter().map(|_| ShardStats::default()).collect(),
            scatters: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            turn: AtomicUsize::new(0),
            c_collation: Learned::default(),
            positions: Mutex::default(),
            metrics: PgMetrics::of(metrics),
            log: open_log(cfg),
            templates: Mutex::default(),
            prepared_ok: cfg.shards.iter().map(|_| Learned::default()).collect(),
        }
    }

    /// The sharded tables among `tables` whose key position is not known yet.
    pub(crate) fn unknown_positions<'a>(&self, tables: &'a [String]) -> Vec<&'a String> {
        let known = lock(&self.positions);
        tables.iter().filter(|t| self.rule(t).is_some() && !known.contains_key(*t)).collect()
    }

    /// Learns that `table`'s key is its column number `position` (0-based).
    pub(crate) fn set_position(&self, table: &str, position: usize) {
        lock(&self.positions).insert(table.to_owned(), position);
    }

    /// The cached template of shape `text` (computed by `make` the first time).
    pub(crate) fn template(
        &self,
        text: &str,
        read: bool,
        make: impl FnOnce() -> Option<Vec<TableKeys>>,
    ) -> Option<Template> {
        let key = (text.to_owned(), read);
        if let Some(t) = lock(&self.templates).get(&key) {
            return t.clone();
        }
        let t = make().map(Arc::new);
        let mut cache = lock(&self.templates);
        if cache.len() >= TEMPLATES {
            cache.clear();
        }
        cache.insert(key, t.clone());
        t
    }

    /// The sharded tables' names.
    pub(crate) fn table_names(&self) -> Vec<String> {
        self.rules.iter().map(|r| r.name.clone()).collect()
    }

    /// Forgets the key positions (a DDL statement ran: a table may have changed).
    pub(crate) fn forget_positions(&self) {
        lock(&self.positions).clear();
    }

    /// How many shards.
    pub(crate) fn count(&self) -> usize {
        self.names.len()
    }

    fn rule(&self, table: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.name == table)
    }

    /// The key column type of sharded `table`.
    pub(crate) fn key_type(&self, table: &str) -> Option<KeyType> {
        self.rule(table).map(|r| r.ty)
    }

    /// The shard that holds the rows of sharded `table` whose key is `key`.
    pub(crate) fn place(&self, table: &str, key: &Key) -> Result<usize, String> {
        let r = self.rule(table).ok_or_else(|| format!("{table} is not sharded"))?;
        let n = self.count();
        match r.method {
            ShardMethod::Hash => Ok(partition::remainder(std::slice::from_ref(key), n as u64) as usize),
            ShardMethod::Range => {
                if *key == Key::Null {
                    return Err(format!("a NULL {}.{} has no shard (range)", r.name, r.key));
                }
                Ok(r.bounds.iter().take_while(|b| compare(key, b) != Ordering::Less).count())
            }
            ShardMethod::List => r
                .lists
                .iter()
                .position(|l| l.contains(key))
                .ok_or_else(|| format!("no shard holds {}.{} = {}", r.name, r.key, show(key))),
        }
    }

    /// Whether sharded `tables` are placed by the same rule (a join on their keys is then
    /// answered by each shard for its own rows).
    pub(crate) fn placed_alike(&self, tables: &[String]) -> bool {
        let rules: Vec<&Rule> = tables.iter().filter_map(|t| self.rule(t)).collect();
        rules.len() == tables.len()
            && rules.windows(2).all(|w| {
                let (a, b) = (w[0], w[1]);
                a.method == b.method && a.ty == b.ty && a.bounds == b.bounds && a.lists == b.lists
            })
    }

    /// A shard for a read of replicated tables only, in turn.
    pub(crate) fn any_shard(&self) -> usize {
        self.turn.fetch_add(1, Relaxed) % self.count().max(1)
    }

    /// Counts a statement sent to `shards`.
    pub(crate) fn count_statement(&self, shards: &[usize]) {
        for &i in shards {
            if let Some(s) = self.stats.get(i) {
                s.statements.fetch_add(1, Relaxed);
                self.metrics.shard_statement(&self.names[i]);
            }
        }
        if shards.len() > 1 {
            self.scatters.fetch_add(1, Relaxed);
            self.metrics.scatter();
        }
    }

    /// Counts `n` rows placed on shard `i` by their key.
    pub(crate) fn count_rows(&self, i: usize, n: u64) {
        if let Some(s) = self.stats.get(i) {
            s.rows.fetch_add(n, Relaxed);
            self.metrics.shard_rows(&self.names[i], n);
        }
    }

    /// Counts a statement refused as not answerable exactly over several shards.
    pub(crate) fn count_refused(&self) {
        self.refused.fetch_add(1, Relaxed);
        self.metrics.shard_refused();
    }

    /// What `/pg/shards` says about table rules and shard `i`'s key range.
    fn holds(&self, i: usize) -> Vec<Value> {
        let n = self.count();
        self.rules
            .iter()
            .map(|r| match r.method {
                ShardMethod::Hash => json!({"table": r.name, "key": r.key, "hash": {"modulus": n, "remainder": i}}),
                ShardMethod::Range => {
                    let from = i.checked_sub(1).and_then(|j| r.bounds.get(j)).map(show);
                    json!({"table": r.name, "key": r.key, "range": {"from": from, "to": r.bounds.get(i).map(show)}})
                }
                ShardMethod::List => {
                    let values: Vec<String> = r.lists.get(i).into_iter().flatten().map(show).collect();
                    json!({"table": r.name, "key": r.key, "list": values})
                }
            })
            .collect()
    }
}

/// The decision log of `cfg`, or why there is none.
fn open_log(cfg: &PgConfig) -> Result<Arc<twophase::DecisionLog>, String> {
    if cfg.twophase_log.is_none() && cfg.shared_decisions {
        return Ok(Arc::new(twophase::DecisionLog::shared_only()));
    }
    let path = cfg.twophase_log.as_ref().ok_or("no [postgres] twophase_log is configured")?;
    twophase::DecisionLog::open(path).map(Arc::new).map_err(|e| {
        let why = format!("the two-phase log {} cannot be opened: {e}", path.display());
        tracing::error!("{why}");
        why
    })
}

/// `GET /pg/shards`: each shard's servers, the key values it holds, what it was sent.
pub(crate) fn view(sh: &Sharding, servers: &[Arc<Servers>]) -> Value {
    let shards: Vec<Value> = sh
        .names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let servers = servers.get(i).map(|s| s.list()).unwrap_or_default();
            let servers: Vec<Value> = servers
                .iter()
                .map(|s| json!({"name": s.name, "address": s.addr().to_string(), "role": format!("{:?}", s.role).to_lowercase(), "healthy": s.is_up()}))
                .collect();
            let stats = &sh.stats[i];
            json!({
                "name": name,
                "index": i,
                "servers": servers,
                "holds": sh.holds(i),
                "statements": stats.statements.load(Relaxed),
                "rows_routed": stats.rows.load(Relaxed),
            })
        })
        .collect();
    let tables: Vec<Value> = sh
        .rules
        .iter()
        .map(|r| json!({"name": r.name, "key": r.key, "method": format!("{:?}", r.method).to_lowercase()}))
        .collect();
    json!({
        "sharded": true,
        "shards": shards,
        "tables": tables,
        "scatters": sh.scatters.load(Relaxed),
        "refused": sh.refused.load(Relaxed),
    })
}

/// A key as text (for messages and `/pg/shards`).
fn show(k: &Key) -> String {
    match k {
        Key::Null => "NULL".into(),
        Key::Int2(v) => v.to_string(),
        Key::Int4(v) => v.to_string(),
        Key::Int8(v) => v.to_string(),
        Key::Text(b) => String::from_utf8_lossy(b).into_owned(),
        Key::Uuid(b) => b.iter().map(|x| format!("{x:02x}")).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sharding(tables: &str, shards: usize) -> Sharding {
        let mut text = "listen = \"127.0.0.1:6432\"\nserver_user = \"u\"\n".to_owned();
        text.push_str(tables);
        for i in 0..shards {
            text.push_str(&format!(
                "[[shard]]\nname = \"s{i}\"\n[[shard.server]]\nname = \"p{i}\"\naddr = \"127.0.0.1:{}\"\nrole = \"primary\"\n",
                5441 + i
            ));
        }
        let cfg: PgConfig = toml::from_str(&text).expect("config");
        Sharding::new(&cfg, &Arc::default())
    }

    #[test]
    fn hash_range_and_list_place_keys() {
        let s = sharding(
            "[[sharded_table]]\nname = \"h\"\nkey = \"id\"\n\
             [[sharded_table]]\nname = \"r\"\nkey = \"id\"\nmethod = \"range\"\nbounds = [100, 200]\n\
             [[sharded_table]]\nname = \"l\"\nkey = \"c\"\nmethod = \"list\"\ntype = \"text\"\nlists = [[\"a\"], [\"b\", \"c\"], [\"d\"]]\n",
            3,
        );
        // PostgreSQL: satisfies_hash_partition(...) for int4 1 under modulus 3 is remainder 2
        // (checked against a server in tests/pg_sharded.rs); here: the same function as partition.rs.
        let k = |v: i64| Key::Int8(v);
        assert_eq!(s.place("h", &k(7)), Ok(partition::remainder(&[Key::Int4(7)], 3) as usize));
        assert_eq!(
            (s.place("r", &k(-5)), s.place("r", &k(100)), s.place("r", &k(199)), s.place("r", &k(200))),
            (Ok(0), Ok(1), Ok(1), Ok(2))
        );
        assert!(s.place("r", &Key::Null).is_err());
        assert_eq!(s.place("l", &Key::Text(b"c".to_vec())), Ok(1));
        assert!(s.place("l", &Key::Text(b"z".to_vec())).unwrap_err().contains("no shard holds l.c = z"));
        assert!(s.placed_alike(&["h".into(), "h".into()]));
        assert!(!s.placed_alike(&["h".into(), "r".into()]));
        assert_eq!(s.key_of("r"), Some("id"));
        assert_eq!(s.key_of("other"), None);
    }

    #[test]
    fn bad_sharding_configs_are_refused_with_a_reason() {
        let base = "listen = \"127.0.0.1:6432\"\nserver_user = \"u\"\n";
        let shard = |i: usize| {
            format!("[[shard]]\nname = \"s{i}\"\n[[shard.server]]\nname = \"p{i}\"\naddr = \"127.0.0.1:{}\"\nrole = \"primary\"\n", 5441 + i)
        };
        let parse = |extra: &str| toml::from_str::<PgConfig>(&format!("{base}{extra}")).map_err(|e| e.to_string());
        let two = format!("{}{}", shard(0), shard(1));
        assert!(parse(&two).is_ok());
        let both = format!("{two}[[server]]\nname = \"x\"\naddr = \"127.0.0.1:1\"\nrole = \"primary\"\n");
        assert!(parse(&both).unwrap_err().contains("not both"));
        let range =
            format!("[[sharded_table]]\nname = \"t\"\nkey = \"id\"\nmethod = \"range\"\nbounds = [1, 2]\n{two}");
        assert!(parse(&range).unwrap_err().contains("needs 1 `bounds`"));
        let down =
            format!("[[sharded_table]]\nname = \"t\"\nkey = \"id\"\nmethod = \"range\"\nbounds = [\"x\"]\n{two}");
        assert!(parse(&down).unwrap_err().contains("invalid input"));
        let lone = "[[sharded_table]]\nname = \"t\"\nkey = \"id\"\n[[server]]\nname = \"x\"\naddr = \"127.0.0.1:1\"\nrole = \"primary\"\n";
        assert!(parse(lone).unwrap_err().contains("need [[postgres.shard]]"));
        let dup = format!("{}{}", shard(0), shard(0));
        assert!(parse(&dup).is_err());
    }
}
