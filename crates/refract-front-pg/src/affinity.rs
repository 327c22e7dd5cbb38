//! Cache affinity (`[balance] policy = "affinity"`, docs/routing.md): the key a read is routed
//! by, so that the reads of one part of the data go to one replica and its memory holds that
//! part.
//!
//! A read restricted to one value of a table's affinity column (`col = 42`, `col = $1`,
//! `col IN (...)`, `col = ANY($1)`: the first value) has the key (table, value): the column
//! configured in `[[postgres.affinity]]`, else the table's single-column primary key, learned
//! from the primary's catalog ([`learn`]). Integer values go in ranges of `bucket` consecutive
//! values, so rows stored together share a replica. A read without such a value has its
//! tables as its key; a read of no table has none (today's policy serves it).
//!
//! Values are compared as PostgreSQL's text form, whichever way they came: a literal, a text
//! parameter, or a binary one (2-, 4- and 8-byte integers and 16-byte UUIDs are turned into
//! their text; other binary values key by their bytes).

use crate::config::{PgAffinity, DEFAULT_AFFINITY_BUCKET};
use crate::server::servers::Servers;
use crate::server::ServerConn;
use refract_core::membership::ring::key_hash;
use refract_pg::frontend::Bind;
use refract_shard::keyparam;
use refract_shard::shardkey::{self, KeySet, KeyValue, Schema};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often the primary keys are read from the catalog again.
const LEARN_EVERY: Duration = Duration::from_secs(30);

/// Statement texts whose key source is remembered, at most (then forgotten all at once).
const REMEMBERED: usize = 4096;

/// The primary's single-column primary keys, as (relation name, column).
const PRIMARY_KEYS: &str = "SELECT c.relname, a.attname FROM pg_index i \
    JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
    JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
    WHERE i.indisprimary AND i.indnkeyatts = 1 \
    AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'";

/// A table's affinity column and its integer range.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Column {
    name: String,
    bucket: u64,
}

/// Where a statement's key value comes from (per statement text, before any Bind).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    /// A value of `table`'s column: a literal, a parameter, or an array parameter's first element.
    Value { table: String, value: KeyValue, array: bool },
    /// No value: the tables are the key.
    Tables,
}

/// The affinity columns, configured and learned, and what statements say about them.
#[derive(Debug, Default)]
pub struct Affinity {
    configured: HashMap<String, Column>,
    learned: RwLock<HashMap<String, String>>,
    sources: Mutex<HashMap<String, Source>>,
}

/// The lookup the key walk (`refract_shard::shardkey`) asks: a table's affinity column.
struct Columns<'a> {
    configured: &'a HashMap<String, Column>,
    learned: &'a HashMap<String, String>,
}

impl Schema for Columns<'_> {
    fn key_of(&self, table: &str) -> Option<&str> {
        self.configured.get(table).map(|c| c.name.as_str()).or_else(|| self.learned.get(table).map(String::as_str))
    }
}

impl Affinity {
    /// The columns of `[[postgres.affinity]]` (a table is matched by its name without schema).
    pub fn new(configured: &[PgAffinity]) -> Affinity {
        let configured = configured
            .iter()
            .map(|a| {
                let name = a.table.rsplit('.').next().unwrap_or(&a.table).to_owned();
                (name, Column { name: a.column.clone(), bucket: a.bucket })
            })
            .collect();
        Affinity { configured, ..Affinity::default() }
    }

    /// Replaces the learned primary keys (relation → column); statements are looked at anew.
    pub fn learn(&self, keys: HashMap<String, String>) {
        let mut learned = self.learned.write().unwrap_or_else(PoisonError::into_inner);
        if *learned != keys {
            *learned = keys;
            self.sources().clear();
        }
    }

    /// The key of a simple-query read `sql` naming `tables` (`None`: no table, or several
    /// statements).
    pub fn of_query(&self, sql: &str, tables: &[String]) -> Option<u64> {
        self.key(sql, tables, None)
    }

    /// The key of a read binding `bind` to the statement `sql`.
    pub fn of_bind(&self, sql: &str, bind: &Bind, tables: &[String]) -> Option<u64> {
        self.key(sql, tables, Some(bind))
    }

    fn key(&self, sql: &str, tables: &[String], bind: Option<&Bind>) -> Option<u64> {
        if tables.is_empty() {
            return None;
        }
        let by_tables = || {
            let mut names: Vec<&[u8]> = tables.iter().map(|t| t.as_bytes()).collect();
            names.sort();
            key_hash(&names)
        };
        let Source::Value { table, value, array } = self.source(sql)? else { return Some(by_tables()) };
        let bucket = self.bucket(&table);
        match text_of(&value, array, bind) {
            Some(text) => Some(key_hash(&[table.as_bytes(), &bucketed(text, bucket)])),
            None => Some(by_tables()),
        }
    }

    fn bucket(&self, table: &str) -> u64 {
        self.configured.get(table).map_or(DEFAULT_AFFINITY_BUCKET, |c| c.bucket)
    }

    /// What `sql` says about its key (remembered per text); `None`: not one statement.
    fn source(&self, sql: &str) -> Option<Source> {
        if let Some(s) = self.sources().get(sql) {
            return Some(s.clone());
        }
        let learned = self.learned.read().unwrap_or_else(PoisonError::into_inner);
        let columns = Columns { configured: &self.configured, learned: &learned };
        let sets = shardkey::key_sets(sql, &columns).ok()?;
        drop(learned);
        let [refs] = sets.as_slice() else { return None };
        let source = refs.iter().find_map(value_of).unwrap_or(Source::Tables);
        let mut sources = self.sources();
        if sources.len() >= REMEMBERED {
            sources.clear();
        }
        sources.insert(sql.to_owned(), source.clone());
        Some(source)
    }

    fn sources(&self) -> std::sync::MutexGuard<'_, HashMap<String, Source>> {
        self.sources.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A table's key value where the statement restricts it to one (or the first of several).
fn value_of(t: &shardkey::TableKeys) -> Option<Source> {
    let table = t.table.clone();
    match &t.keys {
        KeySet::OneOf(values) => values.first().map(|v| Source::Value { table, value: v.clone(), array: false }),
        KeySet::AnyOf(n) => Some(Source::Value { table, value: KeyValue::Param(*n), array: true }),
        KeySet::Every | KeySet::Rows(_) => None,
    }
}

/// The text form of `value` (from `bind` when it is a parameter); `None` when it is NULL or
/// cannot be read.
fn text_of(value: &KeyValue, array: bool, bind: Option<&Bind>) -> Option<Vec<u8>> {
    let n = match value {
        KeyValue::Literal(text) => return Some(text.as_bytes().to_vec()),
        KeyValue::Null => return None,
        KeyValue::Param(n) => *n,
    };
    let bind = bind?;
    let raw = bind.params.get(n.checked_sub(1)?)?.as_deref()?;
    let binary = match bind.param_formats.as_slice() {
        [] => false,
        [one] => *one == 1,
        all => all.get(n - 1).is_some_and(|f| *f == 1),
    };
    let first = if !array {
        raw.to_vec()
    } else if binary {
        keyparam::binary_array(raw)?.into_iter().next()??
    } else {
        keyparam::text_array(raw)?.into_iter().next()??
    };
    Some(if binary { binary_text(&first) } else { first })
}

/// PostgreSQL's text form of a binary integer or UUID; other values as they are.
fn binary_text(raw: &[u8]) -> Vec<u8> {
    let int = match raw.len() {
        2 => <[u8; 2]>::try_from(raw).ok().map(|b| i64::from(i16::from_be_bytes(b))),
        4 => <[u8; 4]>::try_from(raw).ok().map(|b| i64::from(i32::from_be_bytes(b))),
        8 => <[u8; 8]>::try_from(raw).ok().map(i64::from_be_bytes),
        _ => None,
    };
    if let Some(i) = int {
        return i.to_string().into_bytes();
    }
    if raw.len() != 16 {
        return raw.to_vec();
    }
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let parts = [&hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..]];
    parts.join("-").into_bytes()
}

/// An integer value's range of `bucket` values (its number), any other value as it is.
fn bucketed(text: Vec<u8>, bucket: u64) -> Vec<u8> {
    let int = std::str::from_utf8(&text).ok().and_then(|t| t.trim().parse::<i64>().ok());
    match int {
        Some(i) if bucket > 1 => i.div_euclid(bucket as i64).to_string().into_bytes(),
        Some(i) => i.to_string().into_bytes(),
        None => text,
    }
}

/// Reads the primary's single-column primary keys into `affinity` now and every
/// [`LEARN_EVERY`] until `stop`; a failed read keeps what was learned.
pub async fn learn(affinity: Arc<Affinity>, servers: Arc<Servers>, stop: CancellationToken) {
    let mut conn: Option<ServerConn> = None;
    loop {
        if let Some(keys) = primary_keys(&servers, &mut conn).await {
            affinity.learn(keys);
        }
        tokio::select! {
            _ = tokio::time::sleep(LEARN_EVERY) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// One read of the catalog on the primary (`conn` kept between reads, dropped on failure);
/// a name that two schemas use with different keys is left out.
async fn primary_keys(servers: &Servers, conn: &mut Option<ServerConn>) -> Option<HashMap<String, String>> {
    let primary = servers.primary()?;
    if conn.is_none() {
        *conn = ServerConn::connect(primary.addr(), &primary.login).await.ok();
    }
    let rows = tokio::time::timeout(primary.login.timeout, conn.as_mut()?.query(PRIMARY_KEYS)).await;
    let Ok(Ok(rows)) = rows else {
        *conn = None;
        return None;
    };
    let mut keys: HashMap<String, Option<String>> = HashMap::new();
    for row in rows {
        if let [Some(table), Some(column)] = row.as_slice() {
            let seen = keys.entry(table.clone()).or_insert_with(|| Some(column.clone()));
            if seen.as_deref() != Some(column.as_str()) {
                *seen = None;
            }
        }
    }
    Some(keys.into_iter().filter_map(|(t, c)| Some((t, c?))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn configured() -> Affinity {
        Affinity::new(&[PgAffinity { table: "public.orders".into(), column: "customer_id".into(), bucket: 1 }])
    }

    fn bind(formats: Vec<i16>, params: Vec<Option<&'static [u8]>>) -> Bind {
        Bind {
            portal: String::new(),
            statement: String::new(),
            param_formats: formats,
            params: params.into_iter().map(|p| p.map(Bytes::from_static)).collect(),
            result_formats: vec![],
        }
    }

    fn tables(names: &[&str]) -> Vec<String> {
        names.iter().map(|t| t.to_string()).collect()
    }

    #[test]
    fn a_value_keys_the_same_way_as_literal_text_or_binary_parameter() {
        let a = configured();
        let orders = tables(&["orders"]);
        let literal = a.of_query("SELECT * FROM orders WHERE customer_id = 42", &orders);
        let quoted = a.of_query("SELECT * FROM orders WHERE customer_id = '42'", &orders);
        let sql = "SELECT * FROM orders WHERE customer_id = $1";
        let text = a.of_bind(sql, &bind(vec![], vec![Some(b"42")]), &orders);
        let binary = a.of_bind(sql, &bind(vec![1], vec![Some(&[0, 0, 0, 0, 0, 0, 0, 42])]), &orders);
        let int4 = a.of_bind(sql, &bind(vec![1], vec![Some(&[0, 0, 0, 42])]), &orders);
        assert!(literal.is_some());
        assert_eq!([quoted, text, binary, int4], [literal; 4]);
        let other = a.of_query("SELECT * FROM orders WHERE customer_id = 43", &orders);
        assert_ne!(other, literal, "another value, another key");
    }

    #[test]
    fn in_lists_and_arrays_key_by_their_first_value() {
        let a = configured();
        let orders = tables(&["orders"]);
        let one = a.of_query("SELECT * FROM orders WHERE customer_id = 7", &orders);
        assert_eq!(a.of_query("SELECT * FROM orders WHERE customer_id IN (7, 9)", &orders), one);
        let any = "SELECT * FROM orders WHERE customer_id = ANY($1)";
        assert_eq!(a.of_bind(any, &bind(vec![], vec![Some(b"{7,9}")]), &orders), one);
    }

    #[test]
    fn integer_keys_share_a_key_within_their_bucket() {
        let a = Affinity::new(&[PgAffinity { table: "t".into(), column: "id".into(), bucket: 100 }]);
        let t = tables(&["t"]);
        let key = |id: i64| a.of_query(&format!("SELECT * FROM t WHERE id = {id}"), &t);
        assert_eq!(key(100), key(199));
        assert_ne!(key(199), key(200));
        assert_eq!(key(-1), key(-100), "ranges below zero too");
    }

    #[test]
    fn without_a_value_the_tables_are_the_key_and_no_table_is_no_key() {
        let a = configured();
        let scan = a.of_query("SELECT count(*) FROM orders", &tables(&["orders"]));
        assert!(scan.is_some());
        assert_eq!(a.of_query("SELECT count(*) FROM orders WHERE total > 3", &tables(&["orders"])), scan);
        assert_ne!(a.of_query("SELECT * FROM items", &tables(&["items"])), scan);
        assert_eq!(a.of_query("SELECT 1", &[]), None);
        // A NULL parameter says nothing about where the row lives: the table's key.
        let sql = "SELECT * FROM orders WHERE customer_id = $1";
        assert_eq!(a.of_bind(sql, &bind(vec![], vec![None]), &tables(&["orders"])), scan);
    }

    #[test]
    fn learned_primary_keys_key_tables_not_configured() {
        let a = configured();
        let items = tables(&["items"]);
        let sql = "SELECT * FROM items WHERE id = 5";
        assert_eq!(a.of_query(sql, &items), a.of_query("SELECT * FROM items", &items), "not known yet");
        a.learn(HashMap::from([("items".to_owned(), "id".to_owned())]));
        let keyed = a.of_query(sql, &items);
        assert_ne!(keyed, a.of_query("SELECT * FROM items", &items));
        assert_eq!(keyed, a.of_query("SELECT * FROM items WHERE id = 6", &items), "one bucket of 1024");
    }

    #[test]
    fn binary_uuids_read_as_their_text() {
        let raw = [0xa0, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38, 0x0a, 0x11];
        assert_eq!(binary_text(&raw), b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11");
        assert_eq!(binary_text(b"abc"), b"abc");
    }
}
