//! [`Lru`]: a table of what refract learned per kind of statement (a fingerprint), bounded:
//! when full, the kind used least recently makes room. Clients choose the statements, so an
//! unbounded table would grow with every literal a driver inlines.

use std::collections::HashMap;

/// Kinds of statement, at most `capacity`.
#[derive(Debug)]
pub(crate) struct Lru<V> {
    kinds: HashMap<u64, (V, u64)>,
    tick: u64,
    capacity: usize,
}

impl<V> Lru<V> {
    /// An empty table of at most `capacity` kinds.
    pub(crate) fn new(capacity: usize) -> Lru<V> {
        Lru { kinds: HashMap::new(), tick: 0, capacity: capacity.max(1) }
    }

    /// Kind `key`'s entry, marked used; `None` if the table does not hold it.
    pub(crate) fn get_mut(&mut self, key: u64) -> Option<&mut V> {
        self.tick += 1;
        let tick = self.tick;
        self.kinds.get_mut(&key).map(|(v, used)| {
            *used = tick;
            v
        })
    }

    /// Keeps `value` for kind `key` (a new kind: the least recent one goes when full).
    pub(crate) fn insert(&mut self, key: u64, value: V) {
        self.tick += 1;
        if !self.kinds.contains_key(&key) {
            self.make_room();
        }
        self.kinds.insert(key, (value, self.tick));
    }

    /// How many kinds are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.kinds.len()
    }

    /// When full, forgets the kind used least recently (a scan: only when a new kind comes to a
    /// full table).
    fn make_room(&mut self) {
        if self.kinds.len() < self.capacity {
            return;
        }
        if let Some(oldest) = self.kinds.iter().min_by_key(|(_, (_, used))| *used).map(|(key, _)| *key) {
            self.kinds.remove(&oldest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_bounded_and_forgets_the_kind_used_least_recently() {
        let mut t = Lru::new(4);
        for key in 0..4 {
            t.insert(key, key);
        }
        assert!(t.get_mut(0).is_some()); // kind 0 is in use: kind 1 is now the least recent
        t.insert(9, 9);
        assert_eq!(t.len(), 4);
        assert_eq!(t.get_mut(0).copied(), Some(0), "the kind in use was kept");
        assert_eq!(t.get_mut(1), None, "the least recent one was forgotten");
        for key in 10..100 {
            t.insert(key, key);
            assert!(t.len() <= 4);
        }
    }
}
