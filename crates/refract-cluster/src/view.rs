//! What a dispatcher knows of its cluster: its peers, the shared entries, and whether it is in
//! touch with etcd. Pure: the etcd session builds it from a full read and folds the watch's
//! events into it; readers take snapshots.

use crate::keys::{Key, Keys};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The link to etcd, as last seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// Not in touch yet since start.
    Connecting,
    /// Registered, the view read and watched.
    Up,
    /// Lost; the view is the last one read, kept and served.
    Down {
        /// Since when.
        since: Instant,
        /// Why, as etcd or the connection said.
        error: String,
    },
}

/// One registered dispatcher: its node id and what it published about itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Peer {
    /// Its `[cluster] node_id`.
    pub node_id: String,
    /// What it published (addresses, start time), as JSON.
    pub info: serde_json::Value,
}

/// A dispatcher's view of its cluster.
#[derive(Debug, Clone)]
pub struct View {
    /// The link to etcd.
    pub link: Link,
    /// Registered dispatchers by node id (this one included while registered).
    pub peers: BTreeMap<String, Peer>,
    /// Shared entries by name (`members/b1`, ...), values as written.
    pub shared: BTreeMap<String, String>,
    /// The etcd revision the view reflects (0 before the first read).
    pub revision: i64,
}

/// An event of the watch, already decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum Change<'a> {
    /// A key was written.
    Put {
        /// Its full name.
        key: &'a str,
        /// Its value.
        value: &'a [u8],
    },
    /// A key was deleted (or its lease lapsed).
    Delete {
        /// Its full name.
        key: &'a str,
    },
}

impl View {
    /// Before the first contact with etcd.
    pub fn new() -> View {
        View { link: Link::Connecting, peers: BTreeMap::new(), shared: BTreeMap::new(), revision: 0 }
    }

    /// The whole view replaced from a full read at `revision`; the link is up.
    pub fn reload<'a>(&mut self, keys: &Keys, kvs: impl IntoIterator<Item = (&'a str, &'a [u8])>, revision: i64) {
        self.peers.clear();
        self.shared.clear();
        for (key, value) in kvs {
            self.fold(keys, Change::Put { key, value });
        }
        self.revision = revision;
        self.link = Link::Up;
    }

    /// One watch event folded in; returns whether the shared entries changed.
    pub fn fold(&mut self, keys: &Keys, change: Change<'_>) -> bool {
        let (key, value) = match change {
            Change::Put { key, value } => (key, Some(value)),
            Change::Delete { key } => (key, None),
        };
        match (keys.parse(key), value) {
            (Some(Key::Node(id)), Some(v)) => {
                let info = serde_json::from_slice(v).unwrap_or(serde_json::Value::Null);
                self.peers.insert(id.to_owned(), Peer { node_id: id.to_owned(), info });
                false
            }
            (Some(Key::Node(id)), None) => {
                self.peers.remove(id);
                false
            }
            (Some(Key::Shared(name)), Some(v)) => {
                let v = String::from_utf8_lossy(v).into_owned();
                self.shared.insert(name.to_owned(), v.clone()) != Some(v)
            }
            (Some(Key::Shared(name)), None) => self.shared.remove(name).is_some(),
            (None, _) => false,
        }
    }

    /// Marks the link lost (the first loss's time kept).
    pub fn lose(&mut self, error: String) {
        if !matches!(self.link, Link::Down { .. }) {
            self.link = Link::Down { since: Instant::now(), error };
        }
    }

    /// Whether etcd is in touch.
    pub fn is_up(&self) -> bool {
        self.link == Link::Up
    }

    /// How long the link has been down, if it is.
    pub fn down_for(&self) -> Option<Duration> {
        match &self.link {
            Link::Down { since, .. } => Some(since.elapsed()),
            _ => None,
        }
    }

    /// The shared entries whose names start with `prefix` (`members/`), the prefix stripped.
    pub fn entries<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        self.shared.range(prefix.to_owned()..).map_while(move |(k, v)| Some((k.strip_prefix(prefix)?, v.as_str())))
    }
}

impl Default for View {
    fn default() -> Self {
        View::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_puts_and_deletes() {
        let keys = Keys::new("/r");
        let mut v = View::new();
        v.reload(&keys, [("/r/nodes/d1", &b"{\"admin\":\"x\"}"[..]), ("/r/shared/members/a", b"1")], 7);
        assert!(v.is_up());
        assert_eq!(v.revision, 7);
        assert_eq!(v.peers["d1"].info["admin"], "x");
        assert!(!v.fold(&keys, Change::Put { key: "/r/shared/members/a", value: b"1" }), "same value");
        assert!(v.fold(&keys, Change::Put { key: "/r/shared/members/b", value: b"2" }));
        assert!(v.fold(&keys, Change::Put { key: "/r/shared/reload", value: b"3" }));
        let members: Vec<_> = v.entries("members/").collect();
        assert_eq!(members, [("a", "1"), ("b", "2")]);
        assert!(v.fold(&keys, Change::Delete { key: "/r/shared/members/a" }));
        assert!(!v.fold(&keys, Change::Delete { key: "/r/nodes/d1" }));
        assert!(v.peers.is_empty());
        v.lose("gone".into());
        assert!(!v.is_up() && v.down_for().is_some());
        assert_eq!(v.shared.len(), 2, "the last state is kept when the link is lost");
    }
}
