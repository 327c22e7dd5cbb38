//! The log: every line goes into a bounded queue that one thread (`refract-log`) writes to
//! stderr, so that logging never waits on whoever reads stderr and never fails.
//!
//! A log call only appends to the queue. When the reader is slow the queue fills and new lines
//! are dropped; when it is gone (a closed pipe: `EPIPE`, SIGPIPE being ignored by Rust
//! programs) the writer's write fails and the line is dropped; when it never reads (a full
//! pipe) the writer thread waits in `write` and every other thread goes on, dropping lines once
//! the queue is full. Each dropped line is counted ([`dropped`]); when lines flow again the
//! writer logs how many were lost. Why: `tracing_subscriber` writing to stderr itself reports
//! a failed write with `eprintln!`, which panics on the same closed pipe (the thread that
//! logged dies), and on a full pipe whichever thread logs waits for the reader.

use std::collections::VecDeque;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Bytes of log lines the queue holds at most; past it new lines are dropped.
const CAPACITY: usize = 1 << 20;

/// The process's queue, written by the `refract-log` thread once [`init`] started it.
static QUEUE: Queue = Queue::new(CAPACITY);

/// Lines waiting for the writer thread.
pub struct Queue {
    state: Mutex<State>,
    /// Signalled when a line arrives.
    more: Condvar,
    /// Signalled when the writer has written everything queued.
    idle: Condvar,
    /// Lines dropped: queue full, or the write failed.
    dropped: AtomicU64,
    capacity: usize,
}

#[derive(Default)]
struct State {
    lines: VecDeque<Vec<u8>>,
    bytes: usize,
    /// The writer holds a line it has not finished writing.
    writing: bool,
}

impl Queue {
    /// An empty queue holding at most `capacity` bytes.
    pub const fn new(capacity: usize) -> Queue {
        let state = State { lines: VecDeque::new(), bytes: 0, writing: false };
        Queue {
            state: Mutex::new(state),
            more: Condvar::new(),
            idle: Condvar::new(),
            dropped: AtomicU64::new(0),
            capacity,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues one line, or drops it (counted) when the queue is full. Never waits on I/O.
    pub fn push(&self, line: &[u8]) {
        let mut s = self.lock();
        if s.bytes + line.len() > self.capacity {
            drop(s);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        s.bytes += line.len();
        s.lines.push_back(line.to_vec());
        drop(s);
        self.more.notify_one();
    }

    /// Lines dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Waits for the next line and marks the writer busy with it.
    fn next(&self) -> Vec<u8> {
        let mut s = self.lock();
        loop {
            if let Some(line) = s.lines.pop_front() {
                s.bytes -= line.len();
                s.writing = true;
                return line;
            }
            s.writing = false;
            self.idle.notify_all();
            s = self.more.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// The writer's loop: writes each line to `out` (a line whose write fails is dropped,
    /// counted), and after a loss, once a line got through, logs how many were lost.
    pub fn write_to(&self, mut out: impl Write) -> ! {
        let mut reported = 0;
        loop {
            let line = self.next();
            if out.write_all(&line).and_then(|()| out.flush()).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let dropped = self.dropped();
            if dropped > reported {
                tracing::warn!(
                    lines = dropped - reported,
                    total = dropped,
                    "log lines dropped: the log reader was slow or gone"
                );
                reported = dropped;
            }
        }
    }

    /// Waits until every queued line was written, for at most `bound`; whether it was.
    pub fn flush(&self, bound: Duration) -> bool {
        let deadline = Instant::now() + bound;
        let mut s = self.lock();
        while s.writing || !s.lines.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = self.idle.wait_timeout(s, left).unwrap_or_else(PoisonError::into_inner).0;
        }
        true
    }
}

/// One formatted event: `tracing_subscriber` writes each event with one `write_all`, which
/// here is one [`Queue::push`].
struct Line;

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        QUEUE.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Starts the writer thread and installs the process's `tracing` subscriber: level from
/// `RUST_LOG` (else `info`), colours only on a terminal. Call once, first thing in `main`.
pub fn init() -> std::io::Result<()> {
    std::thread::Builder::new().name("refract-log".into()).spawn(|| QUEUE.write_to(std::io::stderr()))?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| Line)
        .with_ansi(std::io::stderr().is_terminal())
        .log_internal_errors(false)
        .init();
    Ok(())
}

/// Queues `text` as a line of its own, outside `tracing` (a command's final error message).
pub fn line(text: &str) {
    QUEUE.push(format!("{text}\n").as_bytes());
}

/// Waits until the log is written out, for at most `bound` (a reader that takes nothing
/// cannot hold the process); whether it was.
pub fn flush(bound: Duration) -> bool {
    QUEUE.flush(bound)
}

/// Log lines dropped since the process started (`refract_log_lines_dropped_total`).
pub fn dropped() -> u64 {
    QUEUE.dropped()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::Arc;

    /// A writer that fails every write, like stderr on a pipe whose reader exited.
    struct Closed;

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A writer that never returns, like stderr on a full pipe nobody reads.
    struct Full;

    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            loop {
                std::thread::park();
            }
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn leaked(capacity: usize) -> &'static Queue {
        Box::leak(Box::new(Queue::new(capacity)))
    }

    #[test]
    fn lines_come_out_in_order_and_flush_waits_for_them() {
        let q = leaked(1024);
        let out = Shared::default();
        let w = out.clone();
        std::thread::spawn(move || q.write_to(w));
        q.push(b"one\n");
        q.push(b"two\n");
        assert!(q.flush(Duration::from_secs(5)));
        assert_eq!(out.0.lock().unwrap().as_slice(), b"one\ntwo\n");
        assert_eq!(q.dropped(), 0);
    }

    #[test]
    fn a_closed_reader_drops_lines_and_counts_them() {
        let q = leaked(1024);
        std::thread::spawn(move || q.write_to(Closed));
        for _ in 0..10 {
            q.push(b"line\n");
        }
        assert!(q.flush(Duration::from_secs(5)));
        assert_eq!(q.dropped(), 10);
    }

    #[test]
    fn a_reader_that_never_reads_blocks_only_the_writer() {
        let q = leaked(64);
        std::thread::spawn(move || q.write_to(Full));
        let started = Instant::now();
        for _ in 0..1000 {
            q.push(b"0123456789\n");
        }
        assert!(started.elapsed() < Duration::from_secs(1), "push never waits");
        assert!(q.dropped() >= 1000 - 7, "{} dropped", q.dropped());
        let started = Instant::now();
        assert!(!q.flush(Duration::from_millis(100)));
        assert!(started.elapsed() < Duration::from_secs(2), "flush is bounded");
    }
}
