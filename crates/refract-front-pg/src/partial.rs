//! Partial replicas (issue 24 item 5): a replica that holds some of the tables (PostgreSQL
//! logical replication subscribing to some of them) serves only the reads that name nothing
//! else; [`Shares`] spread one class of reads over the servers holding its tables in configured
//! proportions (e.g. the allocation a partial-replication LP computed).
//!
//! What a replica holds ([`Holds`]) is configured (`[[postgres.server]] tables`) or read by the
//! health loop from the replica ([`TABLES_PROBE`]): a server with a subscription in refract's
//! database holds the relations its subscriptions have synchronised (state `r`, ready), a
//! server with none (a streaming standby, whose catalog is the primary's) holds everything.
//! Relations are named as `refract_pg::classify::relation_name` names them.

use refract_pg::classify::relation_name;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a server holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holds {
    /// Every table (the primary, a streaming replica).
    All,
    /// Only these relations.
    Only(Arc<BTreeSet<String>>),
}

impl Holds {
    /// From a configured list.
    pub fn only(tables: &[String]) -> Holds {
        Holds::Only(Arc::new(tables.iter().cloned().collect()))
    }

    /// Whether a read naming `tables` can run here. A read that names no relation may still
    /// read any table through a function or view body refract cannot see: only a server that
    /// holds everything takes it.
    pub fn covers(&self, tables: &[String]) -> bool {
        match self {
            Holds::All => true,
            Holds::Only(held) => !tables.is_empty() && tables.iter().all(|t| held.contains(t)),
        }
    }

    /// The relations, for the admin view (`None`: all).
    pub fn list(&self) -> Option<Vec<String>> {
        match self {
            Holds::All => None,
            Holds::Only(held) => Some(held.iter().cloned().collect()),
        }
    }
}

/// The relations a replica's subscriptions synchronised, one row each, and a row of NULLs when
/// it has a subscription in this database at all (so that one whose tables are all still
/// copying holds nothing yet, not everything).
pub const TABLES_PROBE: &str = "SELECT n.nspname::text, c.relname::text FROM pg_subscription_rel r \
     JOIN pg_class c ON c.oid = r.srrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
     WHERE r.srsubstate = 'r' \
     UNION ALL SELECT NULL, NULL WHERE EXISTS (SELECT 1 FROM pg_subscription s \
     JOIN pg_database d ON d.oid = s.subdbid WHERE d.datname = current_database())";

/// What [`TABLES_PROBE`]'s rows say.
pub fn holds_from_rows(rows: &[Vec<Option<String>>]) -> Holds {
    let mut subscribed = false;
    let mut held = BTreeSet::new();
    for row in rows {
        match (row.first().and_then(Option::as_deref), row.get(1).and_then(Option::as_deref)) {
            (Some(schema), Some(name)) => drop(held.insert(relation_name(schema, name))),
            _ => subscribed = true,
        }
    }
    if subscribed {
        Holds::Only(Arc::new(held))
    } else {
        Holds::All
    }
}

/// The configured shares, by class.
#[derive(Debug, Default)]
pub struct Shares {
    classes: Vec<Share>,
}

/// One class's share.
#[derive(Debug)]
struct Share {
    /// The class: the relations, sorted (as `Classification::tables` lists them).
    tables: Vec<String>,
    weights: HashMap<String, f64>,
    /// Reads of the class so far: the next one's place in the sequence.
    turn: AtomicU64,
}

/// The golden ratio's fractional part: `frac(n × PHI)` spreads n = 0, 1, 2, … evenly over
/// [0, 1) (a low-discrepancy sequence), so any run of reads follows the weights closely,
/// without randomness and without a lock.
const PHI: f64 = 0.618_033_988_749_894_9;

impl Shares {
    /// From `[[postgres.share]]`.
    pub fn new(config: &[crate::config::PgShare]) -> Shares {
        let classes = config
            .iter()
            .map(|c| {
                let mut tables = c.tables.clone();
                tables.sort();
                tables.dedup();
                Share { tables, weights: c.servers.clone(), turn: AtomicU64::new(0) }
            })
            .collect();
        Shares { classes }
    }

    /// For a read naming `tables`: the index in `eligible` (the servers that may serve it,
    /// named by `name_of`) of the one its class's share gives it; `None` when no class is
    /// configured for these tables or no eligible server has a weight in it.
    pub fn pick<T>(&self, tables: &[String], eligible: &[T], name_of: impl Fn(&T) -> &str) -> Option<usize> {
        let share = self.classes.iter().find(|c| c.tables == tables)?;
        let weighted: Vec<(usize, f64)> =
            eligible.iter().enumerate().filter_map(|(i, s)| share.weights.get(name_of(s)).map(|w| (i, *w))).collect();
        let total: f64 = weighted.iter().map(|(_, w)| w).sum();
        if weighted.is_empty() || total <= 0.0 {
            return None;
        }
        let n = share.turn.fetch_add(1, Ordering::Relaxed);
        let mut at = (n as f64 * PHI).fract() * total;
        for (i, w) in &weighted {
            if at < *w {
                return Some(*i);
            }
            at -= w;
        }
        weighted.last().map(|(i, _)| *i)
    }

    /// Whether any class names server `name` (a share may send reads to the primary).
    pub fn names(&self, name: &str) -> bool {
        self.classes.iter().any(|c| c.weights.contains_key(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PgShare;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_partial_replica_covers_only_reads_of_its_tables() {
        let h = Holds::only(&names(&["a", "b"]));
        assert!(h.covers(&names(&["a"])) && h.covers(&names(&["a", "b"])));
        assert!(!h.covers(&names(&["a", "c"])));
        assert!(!h.covers(&[]), "a read naming no table may read anything through a function");
        assert!(Holds::All.covers(&[]) && Holds::All.covers(&names(&["z"])));
    }

    #[test]
    fn the_probe_rows_say_what_a_replica_holds() {
        let row = |s: Option<&str>, n: Option<&str>| vec![s.map(String::from), n.map(String::from)];
        assert_eq!(holds_from_rows(&[]), Holds::All, "no subscription: a streaming replica");
        let only = holds_from_rows(&[row(Some("public"), Some("a")), row(Some("s"), Some("b")), row(None, None)]);
        assert_eq!(only.list(), Some(names(&["a", "s.b"])));
        assert_eq!(holds_from_rows(&[row(None, None)]).list(), Some(vec![]), "still copying: holds nothing yet");
    }

    #[test]
    fn shares_follow_the_weights_closely() {
        let servers = HashMap::from([("p".to_string(), 0.2), ("r1".to_string(), 0.5), ("r2".to_string(), 0.3)]);
        let shares = Shares::new(&[PgShare { tables: names(&["b", "a"]), servers }]);
        let eligible = ["p", "r1", "r2", "other"];
        let mut count = [0usize; 4];
        for _ in 0..1000 {
            count[shares.pick(&names(&["a", "b"]), &eligible, |s| s).unwrap()] += 1;
        }
        for (i, want) in [200.0, 500.0, 300.0, 0.0].iter().enumerate() {
            assert!((count[i] as f64 - want).abs() <= 5.0, "{count:?}");
        }
        assert_eq!(shares.pick(&names(&["a"]), &eligible, |s| s), None, "another class");
        assert_eq!(shares.pick(&names(&["a", "b"]), &["other"], |s| s), None, "no weighted server eligible");
        // A weighted server that is not eligible: the others share its reads.
        let mut r = [0usize; 2];
        for _ in 0..1000 {
            r[shares.pick(&names(&["a", "b"]), &["r1", "r2"], |s| s).unwrap()] += 1;
        }
        assert!((r[0] as f64 - 625.0).abs() <= 5.0, "{r:?}");
    }
}
