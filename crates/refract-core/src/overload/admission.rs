//! Per-backend admission: at most `limit` requests in flight (the adaptive limit under the
//! configured cap); the rest wait in a bounded queue, highest priority first. The queue is
//! managed CoDel-style: while its oldest waiter has stayed below `target` within the last
//! `interval`, it is served first-in first-out; once waiting has stayed above `target` for a
//! whole `interval`, the backend is overloaded and the queue turns last-in first-out (fresh
//! requests still meet their deadlines) and waiters older than twice the target are shed.
//!
//! Refusals are decided when a request arrives wherever possible, so that they are fast: a
//! request whose expected wait (queue ahead ÷ limit × recent latency) exceeds `max_wait`
//! (normal mode) or half the `target` (overload mode: LIFO needs only a waiter or two ready
//! for the next free slot, and a short queue keeps displaced waiters young), or that could
//! not finish before its deadline,
//! is refused at once. In overload mode a newcomer instead displaces the oldest waiter of no
//! higher priority, lowest first (newest first); with a short queue and many arrivals, that waiter has not
//! waited long either. A waiter whose deadline leaves less than one recent latency when its
//! turn comes is refused rather than started (its work would be thrown away).

use super::limit::{AdaptiveLimit, LimitConfig};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Request priority; under pressure the lowest is shed first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Priority {
    /// Served first, shed last.
    High = 0,
    /// The default.
    Normal = 1,
    /// Shed first.
    Low = 2,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The wait queue is full of requests at least as important.
    QueueFull,
    /// Shed by queue management (waited too long under overload, or pushed out by a
    /// more important request).
    Shed,
    /// The request could not start (or finish) before its deadline.
    Deadline,
    /// Its expected wait in the queue is longer than waiting is allowed to take.
    WaitTooLong,
}

/// How a request that held a permit ended, for the limit to learn from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Completed: its latency is a sample.
    Success,
    /// Timed out or answered "overloaded": the limit backs off.
    Overloaded,
    /// Says nothing about the backend's capacity (e.g. the client went away).
    Ignore,
}

/// Admission settings.
#[derive(Debug, Clone)]
pub struct AdmissionConfig {
    /// Whether limits apply at all (in-flight is counted either way).
    pub enabled: bool,
    /// The adaptive limit.
    pub limit: LimitConfig,
    /// Waiters beyond this are refused.
    pub max_queue: usize,
    /// CoDel target sojourn time.
    pub target: Duration,
    /// CoDel interval.
    pub interval: Duration,
    /// Outside overload, a request expected to wait longer than this is refused at once.
    pub max_wait: Duration,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            enabled: true,
            limit: LimitConfig::default(),
            max_queue: 1024,
            target: Duration::from_millis(5),
            interval: Duration::from_millis(100),
            max_wait: Duration::from_millis(10),
        }
    }
}

/// Where a waiter learns whether it got a slot.
type Grant = oneshot::Receiver<Result<(), Refusal>>;

#[derive(Debug)]
struct Waiter {
    id: u64,
    since: Instant,
    deadline: Option<Instant>,
    tx: oneshot::Sender<Result<(), Refusal>>,
}

#[derive(Debug)]
struct State {
    inflight: usize,
    limiter: AdaptiveLimit,
    queues: [VecDeque<Waiter>; 3],
    next_id: u64,
    /// Last time the queue was empty or its oldest waiter was under target.
    last_good: Instant,
    /// Last time its oldest waiter was over target.
    last_bad: Instant,
    overloaded: bool,
    shed: u64,
}

impl State {
    fn queued(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    fn oldest(&self) -> Option<Instant> {
        self.queues.iter().filter_map(|q| q.front().map(|w| w.since)).min()
    }

    fn remove(&mut self, id: u64) -> bool {
        for q in &mut self.queues {
            if let Some(pos) = q.iter().position(|w| w.id == id) {
                q.remove(pos);
                return true;
            }
        }
        false
    }
}

/// One backend's admission control.
#[derive(Debug)]
pub struct Admission {
    cfg: AdmissionConfig,
    state: Mutex<State>,
}

/// A granted slot; give it back with [`Permit::finish`] (dropping it counts as `Ignore`).
#[derive(Debug)]
pub struct Permit {
    adm: Arc<Admission>,
    started: Instant,
    finished: bool,
}

impl Permit {
    /// Returns the slot and teaches the limit.
    pub fn finish(mut self, outcome: Outcome) {
        self.finished = true;
        self.adm.release(Some((outcome, self.started.elapsed())));
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.finished {
            self.adm.release(None);
        }
    }
}

/// A snapshot for admin and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionView {
    /// Current concurrency limit.
    pub limit: usize,
    /// Requests holding a permit.
    pub inflight: usize,
    /// Requests waiting.
    pub queued: usize,
    /// Whether the queue is in overload (LIFO, shedding) mode.
    pub overloaded: bool,
    /// Waiters shed so far.
    pub shed: u64,
}

impl Admission {
    /// Admission with `cfg`.
    pub fn new(cfg: AdmissionConfig) -> Arc<Self> {
        let state = State {
            inflight: 0,
            limiter: AdaptiveLimit::new(cfg.limit.clone()),
            queues: Default::default(),
            next_id: 0,
            last_good: Instant::now(),
            last_bad: Instant::now(),
            overloaded: false,
            shed: 0,
        };
        Arc::new(Admission { cfg, state: Mutex::new(state) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current state.
    pub fn view(&self) -> AdmissionView {
        let s = self.lock();
        AdmissionView {
            limit: s.limiter.limit(),
            inflight: s.inflight,
            queued: s.queued(),
            overloaded: s.overloaded,
            shed: s.shed,
        }
    }

    fn permit(self: &Arc<Self>) -> Permit {
        Permit { adm: self.clone(), started: Instant::now(), finished: false }
    }

    /// Waits for a slot, at most until `deadline`.
    pub async fn acquire(self: &Arc<Self>, prio: Priority, deadline: Option<Instant>) -> Result<Permit, Refusal> {
        let (id, mut rx) = match self.enqueue(prio, deadline)? {
            None => return Ok(self.permit()),
            Some(w) => w,
        };
        let granted = match deadline {
            Some(d) => tokio::select! {
                r = &mut rx => Some(r),
                _ = tokio::time::sleep_until(d) => None,
            },
            None => Some((&mut rx).await),
        };
        match granted {
            Some(Ok(Ok(()))) => Ok(self.permit()),
            Some(Ok(Err(r))) => Err(r),
            Some(Err(_)) => Err(Refusal::Shed),
            None => self.give_up(id, rx),
        }
    }

    /// Either a slot now (`None`), or a place in the queue.
    fn enqueue(&self, prio: Priority, deadline: Option<Instant>) -> Result<Option<(u64, Grant)>, Refusal> {
        let mut s = self.lock();
        let now = Instant::now();
        if !self.cfg.enabled || (s.inflight < s.limiter.limit() && s.queued() == 0) {
            s.inflight += 1;
            return Ok(None);
        }
        self.manage(&mut s, now);
        let wait = self.expected_wait(&s);
        if let Some(d) = deadline {
            if d <= now || now + wait + latency(&s) > d {
                return Err(Refusal::Deadline);
            }
        }
        // Refuse now rather than shed later, so refusals stay fast. In overload, prefer the
        // newcomer: it displaces the oldest waiter of no higher priority.
        if s.overloaded && wait > self.cfg.target / 2 {
            // Demand beyond what the queue may hold is itself the sign of overload: with
            // newcomers displacing the oldest, no waiter grows old enough to say so, and
            // overload mode would end (and the queue refill) while the overload lasts.
            s.last_bad = now;
            s.shed += 1;
            if !displace_oldest(&mut s, prio) {
                return Err(Refusal::Shed);
            }
        } else if !s.overloaded && wait > self.cfg.max_wait {
            return Err(Refusal::WaitTooLong);
        }
        if s.queued() >= self.cfg.max_queue && !shed_lower(&mut s, prio) {
            return Err(Refusal::QueueFull);
        }
        let (tx, rx) = oneshot::channel();
        let id = s.next_id;
        s.next_id += 1;
        s.queues[prio as usize].push_back(Waiter { id, since: now, deadline, tx });
        Ok(Some((id, rx)))
    }

    /// The deadline passed while queued: leave the queue, or hand back a slot granted meanwhile.
    fn give_up(&self, id: u64, mut rx: Grant) -> Result<Permit, Refusal> {
        let mut s = self.lock();
        if !s.remove(id) && matches!(rx.try_recv(), Ok(Ok(()))) {
            s.inflight -= 1;
            self.dispatch(&mut s);
        }
        Err(Refusal::Deadline)
    }

    /// Rough wait for a new waiter: the queue ahead drains `limit` at a time, each round
    /// taking about one recent latency.
    fn expected_wait(&self, s: &State) -> Duration {
        let rounds = (s.queued() + 1) as f64 / s.limiter.limit() as f64;
        Duration::from_secs_f64((rounds * s.limiter.recent_latency()).min(3600.0))
    }

    fn release(&self, sample: Option<(Outcome, Duration)>) {
        let mut s = self.lock();
        s.inflight = s.inflight.saturating_sub(1);
        let inflight = s.inflight + 1;
        match sample {
            Some((Outcome::Success, rtt)) => s.limiter.sample(rtt.as_secs_f64(), inflight),
            Some((Outcome::Overloaded, _)) => s.limiter.back_off(),
            _ => {}
        }
        self.dispatch(&mut s);
    }

    /// CoDel bookkeeping, and shedding of stale waiters while overloaded.
    fn manage(&self, s: &mut State, now: Instant) {
        // Enter overload after a whole interval above target; leave it only after a whole
        // interval without (hysteresis: otherwise the queue would refill for an interval
        // after every exit, and those waiters would be shed late).
        match s.oldest() {
            Some(t) if now - t > self.cfg.target => {
                s.last_bad = now;
                if now - s.last_good > self.cfg.interval {
                    s.overloaded = true;
                }
            }
            _ => {
                s.last_good = now;
                if now - s.last_bad > self.cfg.interval {
                    s.overloaded = false;
                }
            }
        }
        if s.overloaded {
            let limit = 2 * self.cfg.target;
            let mut shed = 0;
            for q in &mut s.queues {
                let before = q.len();
                q.retain(|w| now - w.since <= limit);
                shed += before - q.len();
            }
            s.shed += shed as u64;
        }
    }

    /// Grants free slots to waiters: highest priority first; FIFO normally, LIFO in overload.
    fn dispatch(&self, s: &mut State) {
        let now = Instant::now();
        self.manage(s, now);
        while s.inflight < s.limiter.limit() || (!self.cfg.enabled && s.queued() > 0) {
            let lifo = s.overloaded;
            let Some(w) =
                s.queues
                    .iter_mut()
                    .find(|q| !q.is_empty())
                    .and_then(|q| if lifo { q.pop_back() } else { q.pop_front() })
            else {
                break;
            };
            if w.deadline.is_some_and(|d| d.saturating_duration_since(now) < latency(s)) {
                // It could not finish in time: refuse it instead of starting work for nothing.
                let _ = w.tx.send(Err(Refusal::Deadline));
                continue;
            }
            s.inflight += 1;
            if w.tx.send(Ok(())).is_err() {
                s.inflight -= 1;
            }
        }
    }
}

/// The recent latency of a request once admitted.
fn latency(s: &State) -> Duration {
    Duration::from_secs_f64(s.limiter.recent_latency().min(3600.0))
}

/// Makes room for a newcomer of `prio` under overload by shedding the oldest waiter of the
/// lowest priority present, if that is no higher than `prio`; false if none is.
fn displace_oldest(s: &mut State, prio: Priority) -> bool {
    s.queues[prio as usize..].iter_mut().rev().find(|q| !q.is_empty()).and_then(VecDeque::pop_front).is_some()
}

/// Makes room for a waiter of `prio` by shedding the oldest waiter of a lower priority.
fn shed_lower(s: &mut State, prio: Priority) -> bool {
    for p in (prio as usize + 1..3).rev() {
        if s.queues[p].pop_front().is_some() {
            s.shed += 1;
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(limit: f64, max_queue: usize) -> Arc<Admission> {
        let l = LimitConfig { initial: limit, min: limit, max: limit, ..LimitConfig::default() };
        Admission::new(AdmissionConfig { limit: l, max_queue, ..AdmissionConfig::default() })
    }

    #[tokio::test(start_paused = true)]
    async fn admits_up_to_the_limit_then_queues_fifo() {
        let a = fixed(2.0, 10);
        let p1 = a.acquire(Priority::Normal, None).await.unwrap();
        let _p2 = a.acquire(Priority::Normal, None).await.unwrap();
        let (a1, a2) = (a.clone(), a.clone());
        let w1 = tokio::spawn(async move { a1.acquire(Priority::Normal, None).await.map(|_| 1) });
        tokio::task::yield_now().await;
        let w2 = tokio::spawn(async move { a2.acquire(Priority::Normal, None).await.map(|_| 2) });
        tokio::task::yield_now().await;
        assert_eq!(a.view().queued, 2);
        p1.finish(Outcome::Success);
        assert_eq!(w1.await.unwrap(), Ok(1), "the first waiter goes first");
        assert_eq!(w2.await.unwrap(), Ok(2), "then the second, when the first finished");
        assert_eq!(a.view().queued, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn full_queue_refuses_and_high_priority_pushes_out_low() {
        let a = fixed(1.0, 1);
        let _p = a.acquire(Priority::Normal, None).await.unwrap();
        let a1 = a.clone();
        let low = tokio::spawn(async move { a1.acquire(Priority::Low, None).await.map(|_| ()) });
        tokio::task::yield_now().await;
        assert_eq!(a.acquire(Priority::Low, None).await.unwrap_err(), Refusal::QueueFull);
        let a2 = a.clone();
        let high = tokio::spawn(async move { a2.acquire(Priority::High, None).await.map(|_| ()) });
        tokio::task::yield_now().await;
        assert_eq!(low.await.unwrap(), Err(Refusal::Shed));
        assert_eq!(a.view().queued, 1);
        drop(high);
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_refuses_at_once_or_while_waiting() {
        let a = fixed(1.0, 10);
        let p = a.acquire(Priority::Normal, None).await.unwrap();
        let past = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(a.acquire(Priority::Normal, Some(past)).await.unwrap_err(), Refusal::Deadline);
        let soon = Instant::now() + Duration::from_millis(50);
        let started = Instant::now();
        assert_eq!(a.acquire(Priority::Normal, Some(soon)).await.unwrap_err(), Refusal::Deadline);
        assert_eq!(Instant::now() - started, Duration::from_millis(50));
        assert_eq!(a.view().queued, 0, "the waiter left the queue");
        drop(p);
        assert_eq!(a.view().inflight, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn expected_wait_beyond_deadline_is_refused_without_waiting() {
        let a = fixed(1.0, 10);
        // Teach the limiter that requests take 100 ms.
        for _ in 0..20 {
            let p = a.acquire(Priority::Normal, None).await.unwrap();
            tokio::time::advance(Duration::from_millis(100)).await;
            p.finish(Outcome::Success);
        }
        let _p = a.acquire(Priority::Normal, None).await.unwrap();
        let started = Instant::now();
        let r = a.acquire(Priority::Normal, Some(Instant::now() + Duration::from_millis(20))).await;
        assert_eq!(r.unwrap_err(), Refusal::Deadline);
        assert_eq!(Instant::now(), started, "refused at once, not after waiting");
    }

    #[tokio::test(start_paused = true)]
    async fn standing_queue_turns_lifo_and_sheds_stale_waiters() {
        let a = fixed(1.0, 100);
        let mut holder = Some(a.acquire(Priority::Normal, None).await.unwrap());
        let mut waiters = Vec::new();
        for i in 0..3 {
            let ai = a.clone();
            waiters.push(tokio::spawn(async move { ai.acquire(Priority::Normal, None).await.map(|p| (i, p)) }));
            tokio::task::yield_now().await;
            tokio::time::advance(Duration::from_millis(60)).await;
        }
        // The oldest waiter has waited 180 ms > target for more than an interval.
        let ai = a.clone();
        let fresh = tokio::spawn(async move { ai.acquire(Priority::Normal, None).await.map(|p| (3, p)) });
        tokio::task::yield_now().await;
        assert!(a.view().overloaded);
        holder.take().unwrap().finish(Outcome::Success);
        let (i, p) = fresh.await.unwrap().unwrap();
        assert_eq!(i, 3, "newest first under overload");
        for w in waiters {
            assert_eq!(w.await.unwrap().map(|(i, _)| i).unwrap_err(), Refusal::Shed, "stale waiters were shed");
        }
        assert!(a.view().shed >= 3);
        p.finish(Outcome::Success);
        assert_eq!(a.view().inflight, 0);
    }

    /// A limit of one whose requests are known to take `ms`.
    async fn taught(ms: u64) -> Arc<Admission> {
        let a = fixed(1.0, 100);
        for _ in 0..5 {
            let p = a.acquire(Priority::Normal, None).await.unwrap();
            tokio::time::advance(Duration::from_millis(ms)).await;
            p.finish(Outcome::Success);
        }
        a
    }

    /// Limit 4, requests known to take 4 ms (each waiter ahead adds ~1 ms of expected wait),
    /// all four slots held, and overload mode entered (a waiter stood in the queue for longer
    /// than an interval and was shed). Returns the slots' permits.
    async fn overloaded_four() -> (Arc<Admission>, Vec<Permit>) {
        let a = fixed(4.0, 100);
        for _ in 0..5 {
            let p = a.acquire(Priority::Normal, None).await.unwrap();
            tokio::time::advance(Duration::from_millis(4)).await;
            p.finish(Outcome::Success);
        }
        let held = futures_lite(&a, 4).await;
        let a1 = a.clone();
        let stale = tokio::spawn(async move { a1.acquire(Priority::Normal, None).await.map(|_| ()) });
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_millis(150)).await;
        let _ = a.acquire(Priority::Normal, Some(Instant::now())).await;
        assert!(a.view().overloaded);
        assert_eq!(stale.await.unwrap(), Err(Refusal::Shed));
        (a, held)
    }

    fn spawn_waiter(a: &Arc<Admission>, prio: Priority) -> tokio::task::JoinHandle<Result<(), Refusal>> {
        let a = a.clone();
        tokio::spawn(async move { a.acquire(prio, None).await.map(|_| ()) })
    }

    #[tokio::test(start_paused = true)]
    async fn in_overload_a_newcomer_displaces_the_oldest_waiter_at_once() {
        let (a, _held) = overloaded_four().await;
        let mut waiters = Vec::new();
        // Expected wait = (waiters ahead + 1) ms: two fit under half the 5 ms target.
        for _ in 0..2 {
            waiters.push(spawn_waiter(&a, Priority::Normal));
            tokio::task::yield_now().await;
            tokio::time::advance(Duration::from_micros(100)).await;
        }
        assert_eq!(a.view().queued, 2);
        let newest = spawn_waiter(&a, Priority::Normal);
        tokio::task::yield_now().await;
        assert_eq!(waiters.remove(0).await.unwrap(), Err(Refusal::Shed), "the oldest waiter made room");
        assert_eq!(a.view().queued, 2, "the newcomer waits in its place");
        newest.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn overload_mode_lasts_while_newcomers_displace_waiters() {
        let (a, _held) = overloaded_four().await;
        let mut waiters = Vec::new();
        // 300 ms of arrivals every 0.5 ms and no slot freed: every waiter is displaced young
        // (never older than the target), yet the overload is plain, and the mode must stay.
        for _ in 0..600 {
            waiters.push(spawn_waiter(&a, Priority::Normal));
            tokio::task::yield_now().await;
            tokio::time::advance(Duration::from_micros(500)).await;
        }
        assert!(a.view().overloaded, "overload mode ended while the overload went on");
        assert!(a.view().queued <= 2, "the queue stays within half the target's worth");
        for w in waiters {
            w.abort();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn in_overload_a_newcomer_behind_more_important_waiters_is_refused_at_once() {
        let (a, _held) = overloaded_four().await;
        for _ in 0..2 {
            drop(spawn_waiter(&a, Priority::High));
            tokio::task::yield_now().await;
        }
        assert_eq!(a.view().queued, 2);
        let started = Instant::now();
        assert_eq!(a.acquire(Priority::Normal, None).await.unwrap_err(), Refusal::Shed);
        assert_eq!(Instant::now(), started, "refused without waiting");
        assert_eq!(a.view().queued, 2, "the high-priority waiters stay");
    }

    #[tokio::test(start_paused = true)]
    async fn outside_overload_a_wait_beyond_max_wait_is_refused_at_once() {
        // 4 ms per request, limit 1: the third waiter would wait 12 ms > 10 ms.
        let a = taught(4).await;
        let _holder = a.acquire(Priority::Normal, None).await.unwrap();
        let mut waiting = Vec::new();
        for _ in 0..2 {
            let ai = a.clone();
            waiting.push(tokio::spawn(async move { ai.acquire(Priority::Normal, None).await.map(|_| ()) }));
            tokio::task::yield_now().await;
        }
        assert_eq!(a.view().queued, 2);
        let started = Instant::now();
        assert_eq!(a.acquire(Priority::Normal, None).await.unwrap_err(), Refusal::WaitTooLong);
        assert_eq!(Instant::now(), started, "refused without waiting");
        assert!(!a.view().overloaded);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_could_not_finish_in_time_is_refused_on_arrival() {
        // Requests take 20 ms; the queue is empty but the limit is reached, so the expected
        // wait is 20 ms: with 30 ms left, starting in 20 ms leaves 10 ms for a 20 ms request.
        let a = taught(20).await;
        let _holder = a.acquire(Priority::Normal, None).await.unwrap();
        let r = a.acquire(Priority::Normal, Some(Instant::now() + Duration::from_millis(30))).await;
        assert_eq!(r.unwrap_err(), Refusal::Deadline);
        assert_eq!(a.view().queued, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_whose_deadline_is_too_close_when_its_turn_comes_is_refused_not_started() {
        let a = taught(4).await;
        let holder = a.acquire(Priority::Normal, None).await.unwrap();
        let a1 = a.clone();
        let d = Instant::now() + Duration::from_millis(9);
        let w = tokio::spawn(async move { a1.acquire(Priority::Normal, Some(d)).await.map(|_| ()) });
        tokio::task::yield_now().await;
        assert_eq!(a.view().queued, 1, "9 ms is enough on arrival (4 ms wait + 4 ms work)");
        // The holder runs long: when its slot frees, 2 ms are left for 4 ms of work.
        tokio::time::advance(Duration::from_millis(7)).await;
        holder.finish(Outcome::Ignore);
        assert_eq!(w.await.unwrap(), Err(Refusal::Deadline));
        assert_eq!(a.view().inflight, 0, "the slot was not given to a request doomed to time out");
    }

    #[tokio::test(start_paused = true)]
    async fn overload_mode_lasts_an_interval_after_the_queue_drains() {
        let a = fixed(1.0, 100);
        let holder = a.acquire(Priority::Normal, None).await.unwrap();
        let a1 = a.clone();
        let w =
            tokio::spawn(async move { a1.acquire(Priority::Normal, None).await.map(|p| p.finish(Outcome::Ignore)) });
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_millis(150)).await;
        let _ = a.acquire(Priority::Normal, Some(Instant::now() + Duration::from_millis(1))).await;
        assert!(a.view().overloaded);
        holder.finish(Outcome::Ignore);
        let _ = w.await;
        tokio::time::advance(Duration::from_millis(50)).await;
        let p = a.acquire(Priority::Normal, None).await.unwrap();
        assert!(a.view().overloaded, "still overloaded within an interval of the last bad moment");
        tokio::time::advance(Duration::from_millis(120)).await;
        p.finish(Outcome::Ignore);
        assert!(!a.view().overloaded, "back to normal after a good interval");
    }

    #[tokio::test(start_paused = true)]
    async fn disabled_admission_counts_but_never_waits() {
        let a = Admission::new(AdmissionConfig { enabled: false, ..AdmissionConfig::default() });
        let permits: Vec<_> = futures_lite(&a, 500).await;
        assert_eq!(a.view().inflight, 500);
        drop(permits);
        assert_eq!(a.view().inflight, 0);
    }

    async fn futures_lite(a: &Arc<Admission>, n: usize) -> Vec<Permit> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(a.acquire(Priority::Low, None).await.unwrap());
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn overload_outcome_shrinks_the_limit() {
        let a = Admission::new(AdmissionConfig::default());
        let before = a.view().limit;
        for _ in 0..5 {
            a.acquire(Priority::Normal, None).await.unwrap().finish(Outcome::Overloaded);
        }
        assert!(a.view().limit < before);
    }
}
