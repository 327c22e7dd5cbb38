//! Busy polling (`[listen] busy_poll_us`): an event loop that read something within the last
//! `window` keeps polling its sockets instead of sleeping in `epoll_wait`.
//!
//! Why: a relay answers each message within tens of microseconds, and every time its loop has
//! gone to sleep in between, the peer whose bytes arrive pays for waking it (an
//! inter-processor interrupt) and the loop pays a context switch; on a virtual machine both are
//! exits to the hypervisor, and an idle virtual CPU must be woken from halt. Polling through
//! the short gaps between the messages of a busy connection avoids all three.
//!
//! The cost:
//! - the poller gives its CPU away at every turn (`sched_yield`), so the other threads on that
//!   CPU still run, but a polling thread stays runnable and takes its share of a CPU that
//!   has other work: where the CPUs are saturated, polling costs throughput (pgbench through
//!   the pooler on the 2-core lab machine, where PostgreSQL, pgbench and the pooler share the
//!   CPUs: 8 % and 32 % fewer transactions in two runs). It pays where the dispatcher's CPUs
//!   idle between messages, as on a dispatcher host of its own. Hence off by default.
//!   (Stopping whenever a `sched_yield` ran another thread was tried: pgbench was still 16 %
//!   down in one of three runs, and it took most of the gain away from the HTTP relay, whose
//!   CPUs are shared with the lab's clients.)
//! - with no read for `window`, the poller stops and the loop sleeps as usual: an idle proxy
//!   polls nothing.
//!
//! Each per-core event loop runs one poller task ([`run`]) on its current-thread runtime.
//! While the poller yields, tokio's scheduler checks the loop's sockets with a zero timeout
//! and runs whatever became ready. The session code calls [`note`] after each read.

use prometheus_client::metrics::counter::Counter;
use std::cell::{Cell, RefCell};
use std::sync::atomic::AtomicU64;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// A long polling period is added to the counter in steps of this much, so that `/metrics`
/// shows it while it lasts.
const COUNT_EVERY: Duration = Duration::from_millis(1);

thread_local! {
    /// Reads on this thread's event loop (wrapping counter).
    static ACTIVITY: Cell<u64> = const { Cell::new(0) };
    /// The poller's waker while it sleeps.
    static PARKED: RefCell<Option<Waker>> = const { RefCell::new(None) };
}

/// Records that this thread's event loop just read something, and wakes its poller if it had
/// stopped. A thread-local increment when the poller is running or busy polling is off.
#[inline]
pub fn note() {
    ACTIVITY.with(|a| a.set(a.get().wrapping_add(1)));
    if let Some(w) = PARKED.with(|p| p.borrow_mut().take()) {
        w.wake();
    }
}

fn activity() -> u64 {
    ACTIVITY.with(Cell::get)
}

/// Whether this thread's poller is stopped (waiting for the next read).
pub fn parked() -> bool {
    PARKED.with(|p| p.borrow().is_some())
}

/// The poller of one event loop: polls while there was a read within `window`, then waits
/// for the next read. Adds its polling time to `spent`.
/// Runs until its runtime stops.
pub async fn run(window: Duration, spent: Counter<f64, AtomicU64>) {
    let mut seen = activity();
    loop {
        // Stopped: wait for the next read.
        std::future::poll_fn(|cx| {
            if activity() != seen {
                Poll::Ready(())
            } else {
                PARKED.with(|p| *p.borrow_mut() = Some(cx.waker().clone()));
                Poll::Pending
            }
        })
        .await;
        let mut last = Instant::now();
        let mut counted = last;
        loop {
            let t = Instant::now();
            let now = activity();
            if now != seen {
                seen = now;
                last = t;
            } else if t - last >= window {
                break;
            }
            if t - counted >= COUNT_EVERY {
                spent.inc_by((t - counted).as_secs_f64());
                counted = t;
            }
            std::thread::yield_now();
            // Lets the scheduler check the sockets (with a zero timeout) and run what is ready.
            tokio::task::yield_now().await;
        }
        seen = activity();
        spent.inc_by(counted.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    #[test]
    fn the_poller_stops_after_the_window_and_a_read_restarts_it() {
        runtime().block_on(async {
            let spent = Counter::<f64, AtomicU64>::default();
            let poller = tokio::spawn(run(Duration::from_millis(20), spent.clone()));
            tokio::task::yield_now().await;
            assert!(parked(), "with no read yet the poller waits");
            note();
            assert!(!parked(), "a read wakes it");
            // It polls for the window, then stops (the sleep below lets the loop park).
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(parked(), "no read for longer than the window: the poller stopped");
            let polled = spent.get();
            assert!(polled > 0.0, "the polling time is counted");
            note();
            assert!(!parked());
            poller.abort();
        });
    }

    #[test]
    fn an_idle_loop_with_busy_polling_uses_no_cpu() {
        // CPU time of this thread over 300 ms of an idle loop with a poller: the poller must
        // not spin without reads. (A spinning poller would use about the whole 300 ms.)
        fn thread_cpu() -> Duration {
            // The first field of schedstat: nanoseconds this thread ran on a CPU.
            let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
            Duration::from_nanos(s.split_whitespace().next().unwrap().parse().unwrap())
        }
        runtime().block_on(async {
            let poller = tokio::spawn(run(Duration::from_millis(5), Counter::default()));
            note();
            tokio::time::sleep(Duration::from_millis(50)).await;
            let before = thread_cpu();
            tokio::time::sleep(Duration::from_millis(300)).await;
            let used = thread_cpu() - before;
            assert!(used < Duration::from_millis(60), "idle loop used {used:?} of CPU in 300 ms");
            poller.abort();
        });
    }
}
