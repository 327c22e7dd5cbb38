//! The configuration in force, swapped whole by a reload while every reader keeps writing
//! `ctx.cfg.timeouts.request_ms`: [`LiveConfig`] dereferences to the current generation (the
//! front ends' sections, and what they derive from them, come with it). A generation is never freed (each reload keeps the replaced one, a few
//! kilobytes, in memory) because sessions may hold references into it across awaits; the
//! current one is cached per thread, so the hot path reads one shared, rarely written atomic.

use crate::config::Config;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

/// One validated configuration.
pub struct Generation {
    /// The configuration.
    pub cfg: Config,
}

/// Ids unique across every [`Live`] in the process, so a thread's cache never confuses two.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The generation this thread last read, and its id.
    static SEEN: Cell<(u64, Option<&'static Generation>)> = const { Cell::new((0, None)) };
}

/// The current generation, replaced whole.
pub struct Live {
    id: AtomicU64,
    current: RwLock<&'static Generation>,
}

impl Live {
    /// Starts with `cfg`.
    pub fn new(cfg: Config) -> Arc<Live> {
        let generation = Box::leak(Box::new(Generation::of(cfg)));
        Arc::new(Live { id: AtomicU64::new(NEXT_ID.fetch_add(1, Ordering::Relaxed)), current: RwLock::new(generation) })
    }

    /// The generation in force.
    pub fn get(&self) -> &'static Generation {
        let id = self.id.load(Ordering::Acquire);
        SEEN.with(|seen| match seen.get() {
            (s, Some(g)) if s == id => g,
            _ => {
                let g = *self.current.read().unwrap_or_else(PoisonError::into_inner);
                seen.set((id, Some(g)));
                g
            }
        })
    }

    /// Puts `cfg` in force: requests that start from now on see it.
    pub fn replace(&self, cfg: Config) {
        let generation = Box::leak(Box::new(Generation::of(cfg)));
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = generation;
        // After the write: a reader that sees the new id reads the new generation.
        self.id.store(NEXT_ID.fetch_add(1, Ordering::Relaxed), Ordering::Release);
    }
}

impl Generation {
    fn of(cfg: Config) -> Self {
        Generation { cfg }
    }
}

/// `ctx.cfg`: the configuration in force.
pub struct LiveConfig(pub(crate) Arc<Live>);

impl std::ops::Deref for LiveConfig {
    type Target = Config;
    fn deref(&self) -> &Config {
        &self.0.get().cfg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str =
        "[listen]\nhttp = \"127.0.0.1:1\"\n[[backend]]\nname = \"a\"\naddr = \"127.0.0.1:2\"\nrole = \"primary\"\n";

    #[test]
    fn readers_see_the_replacement_and_two_lives_never_mix() {
        let (a, b) = (Live::new(Config::parse(TEXT).unwrap()), Live::new(Config::parse(TEXT).unwrap()));
        let (ca, cb) = (LiveConfig(a.clone()), LiveConfig(b.clone()));
        assert_eq!(ca.timeouts.request_ms, 30_000);
        let mut next = Config::parse(TEXT).unwrap();
        next.timeouts.request_ms = 5;
        a.replace(next);
        assert_eq!(ca.timeouts.request_ms, 5, "the cached generation is dropped");
        assert_eq!(cb.timeouts.request_ms, 30_000, "the other Live is untouched");
        let t = std::thread::spawn(move || ca.timeouts.request_ms).join().unwrap();
        assert_eq!(t, 5);
    }
}
