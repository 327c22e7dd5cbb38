//! Partial replicas, for every front end (issue 24 item 5): a replica that holds some of the
//! tables serves only the reads that name nothing else ([`Holds`]); [`Shares`] spread one class
//! of reads over the members holding its tables in configured proportions (e.g. the allocation
//! a partial-replication LP computed). The front ends say what a read names (PostgreSQL: the
//! relations of the parse tree; HTTP: the tables a Hyrise-R plan's operators name) and what a
//! member holds (configured, or read from a PostgreSQL replica's subscriptions).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a member holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holds {
    /// Every table (a primary, a full replica).
    All,
    /// Only these tables.
    Only(Arc<BTreeSet<String>>),
}

impl Holds {
    /// From a configured list.
    pub fn only(tables: &[String]) -> Holds {
        Holds::Only(Arc::new(tables.iter().cloned().collect()))
    }

    /// From an optional configured list (`None`: everything).
    pub fn from_config(tables: Option<&[String]>) -> Holds {
        tables.map_or(Holds::All, Holds::only)
    }

    /// Whether a read naming `tables` can run here. A read that names no table may still
    /// read any table through something refract cannot see into (a function, a view, an
    /// operator it does not know): only a member that holds everything takes it.
    pub fn covers(&self, tables: &[String]) -> bool {
        match self {
            Holds::All => true,
            Holds::Only(held) => !tables.is_empty() && tables.iter().all(|t| held.contains(t)),
        }
    }

    /// The tables, for the admin views (`None`: all).
    pub fn list(&self) -> Option<Vec<String>> {
        match self {
            Holds::All => None,
            Holds::Only(held) => Some(held.iter().cloned().collect()),
        }
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
    /// The class: the tables, sorted (as the front ends list a read's tables).
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
    /// From the configured classes: each a set of tables and member name → weight.
    pub fn new<'a>(classes: impl IntoIterator<Item = (&'a [String], &'a HashMap<String, f64>)>) -> Shares {
        let classes = classes
            .into_iter()
            .map(|(tables, weights)| {
                let mut tables = tables.to_vec();
                tables.sort();
                tables.dedup();
                Share { tables, weights: weights.clone(), turn: AtomicU64::new(0) }
            })
            .collect();
        Shares { classes }
    }

    /// For a read naming `tables` (sorted): the index in `eligible` (the members that may
    /// serve it, named by `name_of`) of the one its class's share gives it; `None` when no
    /// class is configured for these tables or no eligible member has a weight in it.
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

    /// Whether any class names member `name` (a share may send reads to the primary).
    pub fn names(&self, name: &str) -> bool {
        self.classes.iter().any(|c| c.weights.contains_key(name))
    }

    /// Whether no class is configured.
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }
}

/// How a front end's configuration spells a share, for error messages.
#[derive(Debug, Clone, Copy)]
pub struct ShareSection {
    /// The section (`[[postgres.share]]`).
    pub name: &'static str,
    /// The key of the weights (`servers`).
    pub weights: &'static str,
    /// The section its members are defined in (`[[postgres.server]]`).
    pub member: &'static str,
}

/// Checks one configured share: tables and weights given, every member `known`, every weight
/// > 0, and no other share (`all`, which includes this one) for the same set of tables.
pub fn check_share(
    section: ShareSection,
    tables: &[String],
    weights: &HashMap<String, f64>,
    known: impl Fn(&str) -> bool,
    all: &[&[String]],
) -> Result<(), String> {
    let (name, class) = (section.name, tables.join(", "));
    if tables.is_empty() || weights.is_empty() {
        return Err(format!("{name} needs `tables` and `{}`", section.weights));
    }
    if let Some(m) = weights.keys().find(|n| !known(n)) {
        return Err(format!("{name} for {class}: no {} {m:?}", section.member));
    }
    if let Some(m) = weights.iter().find(|(_, w)| !(w.is_finite() && **w > 0.0)).map(|(n, _)| n) {
        return Err(format!("{name} for {class}: the weight of {m} must be > 0"));
    }
    if all.iter().filter(|o| same_tables(o, tables)).count() > 1 {
        return Err(format!("{name} for {class} is given twice"));
    }
    Ok(())
}

/// Whether two lists name the same tables (as sets).
fn same_tables(a: &[String], b: &[String]) -> bool {
    a.iter().all(|t| b.contains(t)) && b.iter().all(|t| a.contains(t))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(Holds::from_config(None), Holds::All);
        assert_eq!(Holds::from_config(Some(&names(&["b", "a"]))).list(), Some(names(&["a", "b"])));
    }

    #[test]
    fn shares_follow_the_weights_closely() {
        let servers = HashMap::from([("p".to_string(), 0.2), ("r1".to_string(), 0.5), ("r2".to_string(), 0.3)]);
        let class = names(&["b", "a"]);
        let shares = Shares::new([(class.as_slice(), &servers)]);
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
        assert!(shares.names("p") && !shares.names("other") && !shares.is_empty());
    }

    #[test]
    fn a_share_is_checked() {
        let sec = ShareSection { name: "[[share]]", weights: "backends", member: "[[backend]]" };
        let w = HashMap::from([("r1".to_string(), 1.0)]);
        let known = |n: &str| n == "r1";
        let t = names(&["a", "b"]);
        assert_eq!(check_share(sec, &t, &w, known, &[&t]), Ok(()));
        let e = check_share(sec, &[], &w, known, &[]).unwrap_err();
        assert_eq!(e, "[[share]] needs `tables` and `backends`");
        let e = check_share(sec, &t, &w, |_| false, &[&t]).unwrap_err();
        assert_eq!(e, "[[share]] for a, b: no [[backend]] \"r1\"");
        let zero = HashMap::from([("r1".to_string(), 0.0)]);
        let e = check_share(sec, &t, &zero, known, &[&t]).unwrap_err();
        assert_eq!(e, "[[share]] for a, b: the weight of r1 must be > 0");
        let again = names(&["b", "a"]);
        let e = check_share(sec, &t, &w, known, &[&t, &again]).unwrap_err();
        assert_eq!(e, "[[share]] for a, b is given twice");
    }
}
