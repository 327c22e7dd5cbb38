//! A bounded map from query text to classification, evicting the oldest entry first.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::Classification;

/// FIFO eviction keeps it simple and O(1); hot texts are re-inserted after eviction at the
/// cost of one parse.
#[derive(Debug)]
pub(super) struct Cache {
    map: HashMap<Arc<str>, Arc<Classification>>,
    order: VecDeque<Arc<str>>,
    capacity: usize,
}

impl Cache {
    pub(super) fn new(capacity: usize) -> Self {
        Cache { map: HashMap::new(), order: VecDeque::new(), capacity }
    }

    pub(super) fn get(&self, sql: &str) -> Option<Arc<Classification>> {
        self.map.get(sql).cloned()
    }

    pub(super) fn insert(&mut self, sql: &str, c: Arc<Classification>) {
        if self.capacity == 0 || self.map.contains_key(sql) {
            return;
        }
        while self.map.len() >= self.capacity {
            match self.order.pop_front() {
                Some(old) => self.map.remove(&old),
                None => break,
            };
        }
        let key: Arc<str> = Arc::from(sql);
        self.order.push_back(key.clone());
        self.map.insert(key, c);
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }
}
