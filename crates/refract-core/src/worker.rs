//! Workers: with the per-core runtime every worker thread runs its own event loop, and a
//! socket is registered with exactly one loop, so pooled backend connections are kept per
//! worker. Threads outside any worker (tests, the work-stealing runtime) count as worker 0.

use std::cell::Cell;
use std::sync::OnceLock;

static COUNT: OnceLock<usize> = OnceLock::new();

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// Sets the number of workers (once, before any backend is created).
pub fn set_count(n: usize) {
    let _ = COUNT.set(n.max(1));
}

/// The number of workers (1 unless set).
pub fn count() -> usize {
    COUNT.get().copied().unwrap_or(1)
}

/// Marks the current thread as worker `i`.
pub fn enter(i: usize) {
    CURRENT.with(|c| c.set(i));
}

/// The current thread's worker.
pub fn current() -> usize {
    CURRENT.with(Cell::get)
}
