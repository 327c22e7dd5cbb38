//! The front ends' own sections of the configuration (`[postgres]`, `[[route]]`,
//! `[handover]`, ...): the dispatcher parses and checks them, the engine carries them with the
//! rest of a configuration generation (so a reload swaps them together) without reading them,
//! and each front end finds its own by type.

use std::any::Any;
use std::sync::Arc;

/// Values of distinct types, each found by its type.
#[derive(Clone, Default)]
pub struct Sections(Vec<Arc<dyn Any + Send + Sync>>);

impl Sections {
    /// Adds `value`, replacing one of the same type.
    pub fn insert<T: Any + Send + Sync>(&mut self, value: T) {
        self.0.retain(|v| !v.is::<T>());
        self.0.push(Arc::new(value));
    }

    /// Removes the value of type `T`, if there is one.
    pub fn remove<T: Any>(&mut self) {
        self.0.retain(|v| !v.is::<T>());
    }

    /// The value of type `T`, if there is one.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.0.iter().find_map(|v| v.downcast_ref::<T>())
    }
}

impl std::fmt::Debug for Sections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sections({})", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_value_is_found_by_its_type_and_replaced_by_one_of_the_same() {
        let mut s = Sections::default();
        assert_eq!(s.get::<u32>(), None);
        s.insert(7u32);
        s.insert(String::from("pg"));
        s.insert(9u32);
        assert_eq!(s.get::<u32>(), Some(&9));
        assert_eq!(s.get::<String>().map(String::as_str), Some("pg"));
        assert_eq!(s.get::<u64>(), None);
        s.remove::<u32>();
        assert_eq!((s.get::<u32>(), s.get::<String>().is_some()), (None, true));
    }
}
