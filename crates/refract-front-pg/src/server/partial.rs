//! Partial replicas (issue 24 item 5), the PostgreSQL part: a replica that holds some of the
//! tables (PostgreSQL logical replication subscribing to some of them) serves only the reads
//! that name nothing else. [`Holds`] and [`Shares`] are the engine's (`refract_core::partial`,
//! shared with the HTTP front end's Hyrise-R plans); what is PostgreSQL's is here.
//!
//! What a replica holds ([`Holds`]) is configured (`[[postgres.server]] tables`) or read by the
//! health loop from the replica ([`TABLES_PROBE`]): a server with a subscription in refract's
//! database holds the relations its subscriptions have synchronised (state `r`, ready), a
//! server with none (a streaming standby, whose catalog is the primary's) holds everything.
//! Relations are named as `refract_pg::classify::relation_name` names them.

pub use refract_core::partial::{Holds, Shares};
use refract_pg::classify::relation_name;
use std::collections::BTreeSet;
use std::sync::Arc;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_probe_rows_say_what_a_replica_holds() {
        let row = |s: Option<&str>, n: Option<&str>| vec![s.map(String::from), n.map(String::from)];
        assert_eq!(holds_from_rows(&[]), Holds::All, "no subscription: a streaming replica");
        let only = holds_from_rows(&[row(Some("public"), Some("a")), row(Some("s"), Some("b")), row(None, None)]);
        assert_eq!(only.list(), Some(names(&["a", "s.b"])));
        assert_eq!(holds_from_rows(&[row(None, None)]).list(), Some(vec![]), "still copying: holds nothing yet");
    }
}
