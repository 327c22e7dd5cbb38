//! Per-backend admission: at most `limit` requests in flight (the adaptive limit under the
//! configured cap); the rest wait in a bounded queue, highest priority first, until a slot
//! frees or their deadline makes waiting pointless. Nothing is refused merely because the
//! limit is reached for a moment: a closed loop (clients that send a request when an answer
//! comes) cannot outgrow its own population, so queueing it within its deadlines serves it all.
//!
//! The queue is managed CoDel-style, with one addition: overload mode needs a standing queue
//! (its oldest waiter above `target`) *and* evidence that demand exceeds what is served — the
//! queue grew over the last `interval` (or by more than a round of the limit at once), or
//! requests were refused (deadline, full queue). A closed loop's queue stands but does not
//! grow; an open loop past capacity grows. In overload mode the queue serves newest first, so
//! that served requests stay fresh while the oldest wait out their deadlines; it ends after an
//! interval with neither growth nor refusals.
//!
//! Refusals: a request that could not finish before its deadline (expected wait plus one
//! recent latency, on arrival; or less than one recent latency left when its turn comes) is
//! refused rather than started; a waiter still queued at its deadline, or after `max_wait`
//! when set, leaves the queue; a full queue refuses a newcomer, unless it can push out a
//! lower-priority waiter (or, in overload mode, the oldest waiter of its own priority: newest
//! first would never serve it).
//!
//! Fairness between clients: a request may name its client's address, and a client holding its
//! share of the slots waits behind other clients (`share.rs`). A holder can learn that another
//! request waits for its slot ([`Permit::contended`], [`Permit::claim`]): a front end whose
//! client stopped reading then lets the backend go instead of holding the slot for it.

use super::limit::{AdaptiveLimit, LimitConfig};
use super::share::Holders;
use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, Notify};
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
    /// It waited in the queue as long as `max_queue_wait_ms` allows.
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
    /// The longest a waiter stays queued (zero: only its deadline bounds the wait).
    pub max_wait: Duration,
    /// A client holding this fraction of the limit waits behind other clients' requests of its
    /// priority (`share.rs`); 1 = no preference.
    pub client_share: f64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            enabled: true,
            limit: LimitConfig::default(),
            max_queue: 1024,
            target: Duration::from_millis(5),
            interval: Duration::from_millis(100),
            max_wait: Duration::ZERO,
            client_share: 0.5,
        }
    }
}

/// Whether a request is new demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// A request in its own right.
    Fresh,
    /// Paced by refract: a request pipelined behind the previous one on its connection, which
    /// refract reads only when that exchange ended (refused or served). Such a connection is a
    /// closed loop by construction: it adds no demand, whatever its depth of pipelining.
    Paced,
}

/// What one CoDel interval has seen so far.
#[derive(Debug)]
struct Interval {
    start: Instant,
    fresh: u64,
    granted: u64,
    refused: u64,
}

impl Interval {
    fn new(start: Instant) -> Self {
        Interval { start, fresh: 0, granted: 0, refused: 0 }
    }

    /// More fresh requests arrived than slots were granted (beyond noise and a round of the
    /// limit), or requests were refused for their deadline or a full queue.
    fn excess(&self, limit: usize) -> bool {
        self.fresh > self.granted + self.granted / 8 + limit as u64 || self.refused > 0
    }
}

/// Intervals of excess demand in a row after which the overload counts as sustained: waiters
/// are then shed. A closed loop's first burst is one interval of excess, never three.
const SUSTAINED: u32 = 3;

/// Where a waiter learns whether it got a slot.
type Grant = oneshot::Receiver<Result<(), Refusal>>;

/// A place in the queue held by a waiting [`Admission::acquire_as`]; dropped unfinished, it
/// leaves the queue (or hands on the slot it was granted), so a cancelled wait leaks nothing.
struct Waiting<'a> {
    adm: &'a Admission,
    id: u64,
    client: Option<IpAddr>,
    rx: Option<Grant>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(rx) = self.rx.take() {
            self.adm.leave(self.id, self.client, rx);
        }
    }
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    since: Instant,
    deadline: Option<Instant>,
    client: Option<IpAddr>,
    tx: oneshot::Sender<Result<(), Refusal>>,
}

#[derive(Debug)]
struct State {
    inflight: usize,
    limiter: AdaptiveLimit,
    queues: [VecDeque<Waiter>; 3],
    next_id: u64,
    /// This interval so far: when it started, fresh arrivals, slots granted, refusals.
    interval: Interval,
    /// Consecutive intervals of excess demand over a standing queue.
    streak: u32,
    overloaded: bool,
    shed: u64,
    /// Slots held per client.
    holders: Holders,
    /// Holders making room for a waiter ([`Permit::claim`] taken, slot not yet given back).
    yielding: usize,
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
    /// Woken when a request starts waiting (for holders watching [`Permit::contended`]).
    arrived: Notify,
}

/// A granted slot; give it back with [`Permit::finish`] (dropping it counts as `Ignore`).
#[derive(Debug)]
pub struct Permit {
    adm: Arc<Admission>,
    started: Instant,
    finished: bool,
    client: Option<IpAddr>,
    /// [`Permit::claim`] taken: this holder makes room for a waiter.
    yielding: AtomicBool,
}

impl Permit {
    /// Returns the slot and teaches the limit.
    pub fn finish(mut self, outcome: Outcome) {
        self.finished = true;
        self.adm.release(&self, Some(outcome));
    }

    /// Resolves once a request waits for a slot of this backend that no other holder is making
    /// room for yet (or this one already claimed it). Never resolves while nobody waits (nor with
    /// admission control off, where nobody does).
    pub async fn contended(&self) {
        loop {
            let arrived = self.adm.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            if self.adm.unclaimed(&self.yielding) {
                return;
            }
            arrived.await;
        }
    }

    /// Claims the making of room for a waiter: true when this holder is to give its slot up
    /// now. Each waiter claims one holder, so that not every holder watching lets its backend
    /// go for one waiter; the claim ends with the permit.
    pub fn claim(&self) -> bool {
        self.adm.claim(&self.yielding)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.finished {
            self.adm.release(self, None);
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
            interval: Interval::new(Instant::now()),
            streak: 0,
            overloaded: false,
            shed: 0,
            holders: Holders::default(),
            yielding: 0,
        };
        Arc::new(Admission { cfg, state: Mutex::new(state), arrived: Notify::new() })
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

    fn permit(self: &Arc<Self>, client: Option<IpAddr>) -> Permit {
        Permit { adm: self.clone(), started: Instant::now(), finished: false, client, yielding: AtomicBool::new(false) }
    }

    /// Waits for a slot, at most until `deadline`, as a fresh request.
    pub async fn acquire(self: &Arc<Self>, prio: Priority, deadline: Option<Instant>) -> Result<Permit, Refusal> {
        self.acquire_as(prio, deadline, Arrival::Fresh).await
    }

    /// Waits for a slot, at most until `deadline`.
    pub async fn acquire_as(
        self: &Arc<Self>,
        prio: Priority,
        deadline: Option<Instant>,
        arrival: Arrival,
    ) -> Result<Permit, Refusal> {
        self.acquire_by(None, prio, deadline, arrival).await
    }

    /// Waits for a slot for a request of `client` (its address: a client holding its share
    /// waits behind others), at most until `deadline`.
    pub async fn acquire_by(
        self: &Arc<Self>,
        client: Option<IpAddr>,
        prio: Priority,
        deadline: Option<Instant>,
        arrival: Arrival,
    ) -> Result<Permit, Refusal> {
        let (id, rx) = match self.enqueue(client, prio, deadline, arrival)? {
            None => return Ok(self.permit(client)),
            Some(w) => w,
        };
        // Dropped while waiting (the client went away, the task was cancelled): the guard
        // leaves the queue, or hands back a slot granted in the meantime.
        let mut waiting = Waiting { adm: self, id, client, rx: Some(rx) };
        let max_wait = (!self.cfg.max_wait.is_zero()).then(|| Instant::now() + self.cfg.max_wait);
        let until = match (deadline, max_wait) {
            (Some(d), Some(m)) => Some(d.min(m)),
            (d, m) => d.or(m),
        };
        let rx = waiting.rx.as_mut().ok_or(Refusal::Shed)?;
        let granted = match until {
            Some(d) => tokio::select! {
                r = &mut *rx => Some(r),
                _ = tokio::time::sleep_until(d) => None,
            },
            None => Some((&mut *rx).await),
        };
        let rx = waiting.rx.take().ok_or(Refusal::Shed)?;
        match granted {
            Some(Ok(Ok(()))) => Ok(self.permit(client)),
            Some(Ok(Err(r))) => Err(r),
            Some(Err(_)) => Err(Refusal::Shed),
            None => {
                let why = if until == deadline { Refusal::Deadline } else { Refusal::WaitTooLong };
                self.give_up(id, client, rx, why)
            }
        }
    }

    /// Either a slot now (`None`), or a place in the queue.
    fn enqueue(
        &self,
        client: Option<IpAddr>,
        prio: Priority,
        deadline: Option<Instant>,
        arrival: Arrival,
    ) -> Result<Option<(u64, Grant)>, Refusal> {
        let mut s = self.lock();
        let now = Instant::now();
        s.interval.fresh += u64::from(arrival == Arrival::Fresh);
        if !self.cfg.enabled || (s.inflight < s.limiter.limit() && s.queued() == 0) {
            s.inflight += 1;
            s.interval.granted += 1;
            s.holders.add(client);
            return Ok(None);
        }
        self.manage(&mut s, now);
        if let Some(d) = deadline {
            if d <= now || now + self.wait_estimate(&s) + latency(&s) > d {
                s.interval.refused += 1;
                return Err(Refusal::Deadline);
            }
        }
        // Sustained overload: a round of the limit waiting is enough to fill every slot that
        // frees before a newer request comes; an older waiter would only wait to be shed.
        let round = if s.streak >= SUSTAINED { (s.limiter.limit() / 4).max(1) } else { self.cfg.max_queue };
        if s.queued() >= round.min(self.cfg.max_queue) && !make_room(&mut s, prio) {
            s.interval.refused += 1;
            return Err(Refusal::QueueFull);
        }
        let (tx, rx) = oneshot::channel();
        let id = s.next_id;
        s.next_id += 1;
        s.queues[prio as usize].push_back(Waiter { id, since: now, deadline, client, tx });
        self.arrived.notify_waiters();
        Ok(Some((id, rx)))
    }

    /// How long a request arriving now would expect to wait for a slot.
    pub fn expected_wait(&self) -> Duration {
        let s = self.lock();
        if s.inflight < s.limiter.limit() && s.queued() == 0 {
            return Duration::ZERO;
        }
        self.wait_estimate(&s)
    }

    /// A slot now if one is free and nobody waits for it; never queues.
    pub fn try_acquire(self: &Arc<Self>, arrival: Arrival) -> Option<Permit> {
        self.try_acquire_by(None, arrival)
    }

    /// [`Admission::try_acquire`] for a request of `client`.
    pub fn try_acquire_by(self: &Arc<Self>, client: Option<IpAddr>, arrival: Arrival) -> Option<Permit> {
        let mut s = self.lock();
        if self.cfg.enabled && (s.inflight >= s.limiter.limit() || s.queued() > 0) {
            return None;
        }
        s.inflight += 1;
        s.interval.granted += 1;
        s.interval.fresh += u64::from(arrival == Arrival::Fresh);
        s.holders.add(client);
        Some(self.permit(client))
    }

    /// The deadline passed while queued: leave the queue, or hand back a slot granted meanwhile.
    fn give_up(&self, id: u64, client: Option<IpAddr>, rx: Grant, why: Refusal) -> Result<Permit, Refusal> {
        if self.leave(id, client, rx) {
            self.lock().interval.refused += 1;
        }
        Err(why)
    }

    /// Leaves the queue (`true`), or, when the slot was already granted, hands it on.
    fn leave(&self, id: u64, client: Option<IpAddr>, mut rx: Grant) -> bool {
        let mut s = self.lock();
        if s.remove(id) {
            return true;
        }
        if matches!(rx.try_recv(), Ok(Ok(()))) {
            s.inflight -= 1;
            s.holders.remove(client);
            self.dispatch(&mut s);
        }
        false
    }

    /// Whether a waiter is not yet claimed by a holder (or this holder claimed one).
    fn unclaimed(&self, yielding: &AtomicBool) -> bool {
        yielding.load(Relaxed) || {
            let s = self.lock();
            s.queued() > s.yielding
        }
    }

    /// Claims the making of room for one waiter not yet claimed by another holder.
    fn claim(&self, yielding: &AtomicBool) -> bool {
        let mut s = self.lock();
        if yielding.load(Relaxed) {
            return true;
        }
        if s.queued() <= s.yielding {
            return false;
        }
        s.yielding += 1;
        yielding.store(true, Relaxed);
        true
    }

    /// Rough wait for a new waiter: the queue ahead drains `limit` at a time, each round
    /// taking about one recent latency (in overload mode, newest first, nobody is ahead).
    fn wait_estimate(&self, s: &State) -> Duration {
        let ahead = if s.overloaded { 0 } else { s.queued() };
        let rounds = (ahead + 1) as f64 / s.limiter.limit() as f64;
        Duration::from_secs_f64((rounds * s.limiter.recent_latency()).min(3600.0))
    }

    /// Teaches the limit one sample taken inside a permit's lifetime, measured against its own
    /// `baseline` (the no-load time of its kind of request; see
    /// [`AdaptiveLimit::sample_relative`]), with the requests now in flight. For a front end whose
    /// permit spans more than the work it measures (a PostgreSQL transaction holds its permit
    /// across the client's round trips): such permits finish with [`Outcome::Ignore`] and the
    /// work inside them is sampled here. A limit that grew grants waiters at once.
    pub fn learn(&self, rtt: Duration, baseline: Duration) {
        let mut s = self.lock();
        let inflight = s.inflight;
        s.limiter.sample_relative(rtt.as_secs_f64(), baseline.as_secs_f64(), inflight);
        self.dispatch(&mut s);
    }

    fn release(&self, p: &Permit, outcome: Option<Outcome>) {
        let mut s = self.lock();
        s.inflight = s.inflight.saturating_sub(1);
        s.holders.remove(p.client);
        if p.yielding.load(Relaxed) {
            s.yielding = s.yielding.saturating_sub(1);
        }
        let inflight = s.inflight + 1;
        match outcome {
            Some(Outcome::Success) => s.limiter.sample(p.started.elapsed().as_secs_f64(), inflight),
            Some(Outcome::Overloaded) => s.limiter.back_off(),
            _ => {}
        }
        self.dispatch(&mut s);
    }

    /// CoDel bookkeeping. Excess demand over a standing queue turns the queue newest first
    /// (at once when more than a round of the limit piled up within the interval, else at the
    /// interval's end); `SUSTAINED` intervals of excess in a row also shed waiters older than
    /// the target and keep at most a round of the limit waiting; an interval without excess
    /// ends both. A closed loop cannot keep up excess
    /// demand (it cannot outgrow its population): its first burst is served, never shed.
    fn manage(&self, s: &mut State, now: Instant) {
        if s.streak >= SUSTAINED {
            self.shed_stale(s, now);
        }
        let standing = s.oldest().is_some_and(|t| now - t > self.cfg.target);
        let piled = s.interval.fresh.saturating_sub(s.interval.granted);
        if standing && piled > s.limiter.limit() as u64 {
            s.overloaded = true;
        }
        if now - s.interval.start < self.cfg.interval {
            return;
        }
        let excess = s.interval.excess(s.limiter.limit());
        // Once in overload mode, excess alone keeps it: newest first, waiters no longer age.
        s.streak = if excess && (standing || s.overloaded) { s.streak.saturating_add(1) } else { 0 };
        s.overloaded = s.streak >= 1;
        s.interval = Interval::new(now);
    }

    /// Refuses the waiters older than half the target (they would be served late, if at all, and a
    /// refusal is worth most to a client when it comes at once).
    fn shed_stale(&self, s: &mut State, now: Instant) {
        let limit = self.cfg.target / 2;
        let mut shed = 0;
        for q in &mut s.queues {
            while q.front().is_some_and(|w| now - w.since > limit) {
                if let Some(w) = q.pop_front() {
                    let _ = w.tx.send(Err(Refusal::Shed));
                    shed += 1;
                }
            }
        }
        s.shed += shed;
    }

    /// Grants free slots to waiters: highest priority first; FIFO normally, LIFO in overload;
    /// within a priority, clients under their share first.
    fn dispatch(&self, s: &mut State) {
        let now = Instant::now();
        self.manage(s, now);
        while s.inflight < s.limiter.limit() || (!self.cfg.enabled && s.queued() > 0) {
            let Some(w) = self.next_waiter(s) else {
                break;
            };
            if w.deadline.is_some_and(|d| d.saturating_duration_since(now) < latency(s)) {
                // It could not finish in time: refuse it instead of starting work for nothing.
                s.interval.refused += 1;
                let _ = w.tx.send(Err(Refusal::Deadline));
                continue;
            }
            s.inflight += 1;
            if w.tx.send(Ok(())).is_err() {
                s.inflight -= 1;
            } else {
                s.interval.granted += 1;
                s.holders.add(w.client);
            }
        }
    }

    /// The waiter the next free slot goes to (taken out of the queue).
    fn next_waiter(&self, s: &mut State) -> Option<Waiter> {
        let share = s.limiter.limit() as f64 * self.cfg.client_share;
        let q = s.queues.iter_mut().find(|q| !q.is_empty())?;
        let i = if s.overloaded {
            q.len() - 1 - s.holders.pick(q.iter().rev().map(|w| w.client), share)
        } else {
            s.holders.pick(q.iter().map(|w| w.client), share)
        };
        q.remove(i)
    }
}

/// The recent latency of a request once admitted.
fn latency(s: &State) -> Duration {
    Duration::from_secs_f64(s.limiter.recent_latency().min(3600.0))
}

/// Makes room in a full queue for a newcomer of `prio`: the oldest waiter of a lower priority
/// is pushed out, or in overload mode the oldest of its own (newest first would never serve
/// it while the overload lasts). False if there is none.
fn make_room(s: &mut State, prio: Priority) -> bool {
    let lowest = if s.overloaded { prio as usize } else { prio as usize + 1 };
    for p in (lowest..3).rev() {
        if let Some(w) = s.queues[p].pop_front() {
            let _ = w.tx.send(Err(Refusal::Shed));
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
    async fn a_cancelled_wait_leaves_the_queue_and_hands_on_a_slot_granted_to_it() {
        let a = fixed(1.0, 10);
        let p = a.acquire(Priority::Normal, None).await.unwrap();
        let a1 = a.clone();
        let gone = tokio::spawn(async move { a1.acquire(Priority::Normal, None).await.map(|_| ()) });
        tokio::task::yield_now().await;
        assert_eq!(a.view().queued, 1);
        gone.abort();
        let _ = gone.await;
        assert_eq!(a.view().queued, 0, "a cancelled waiter left the queue at once");
        // Granted, then cancelled before it could take the slot: the slot is not lost.
        let a2 = a.clone();
        let late = tokio::spawn(async move { a2.acquire(Priority::Normal, None).await.map(|_| ()) });
        tokio::task::yield_now().await;
        p.finish(Outcome::Success);
        late.abort();
        let _ = late.await;
        assert_eq!((a.view().inflight, a.view().queued), (0, 0));
        let again = tokio::time::timeout(Duration::from_millis(1), a.acquire(Priority::Normal, None)).await;
        assert!(matches!(again, Ok(Ok(_))), "the slot granted to the cancelled waiter was handed on");
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

    /// One slot, 10 ms per request; a new request every `every` for `for_`; returns how each
    /// request ended (arrival order; `Ok` = its wait).
    async fn drive(a: &Arc<Admission>, every: Duration, for_: Duration) -> Vec<Result<Duration, Refusal>> {
        let service = Duration::from_millis(10);
        let start = Instant::now();
        let mut tasks = Vec::new();
        while start.elapsed() < for_ {
            let a = a.clone();
            tasks.push(tokio::spawn(async move {
                let t = Instant::now();
                let p = a.acquire(Priority::Normal, None).await?;
                let wait = t.elapsed();
                tokio::time::sleep(service).await;
                p.finish(Outcome::Success);
                Ok(wait)
            }));
            tokio::time::sleep(every).await;
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn a_standing_queue_that_does_not_grow_is_served_in_order_and_never_shed() {
        // A closed loop: 8 clients, one slot, each client sends again when answered. The queue
        // stands (7 waiting, 70 ms) for a second, but never grows: nothing is refused.
        let a = fixed(1.0, 100);
        let clients: Vec<_> = (0..8)
            .map(|_| {
                let a = a.clone();
                tokio::spawn(async move {
                    let mut waits = Vec::new();
                    for _ in 0..12 {
                        let t = Instant::now();
                        let p = a.acquire(Priority::Normal, None).await?;
                        waits.push(t.elapsed());
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        p.finish(Outcome::Success);
                    }
                    Ok::<_, Refusal>(waits)
                })
            })
            .collect();
        let mut longest = Duration::ZERO;
        for c in clients {
            let waits = c.await.unwrap().expect("a closed loop is never refused");
            // After its first burst (which may look like an open loop's for an interval or two).
            longest = longest.max(waits[6..].iter().copied().max().unwrap());
        }
        assert!(longest <= Duration::from_millis(80), "served in order: no waiter starves ({longest:?})");
        assert!(!a.view().overloaded);
        assert_eq!(a.view().shed, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn sustained_excess_turns_the_queue_newest_first_then_sheds_stale_waiters() {
        // Five times the capacity for a second: once the excess is plain, served requests
        // are fresh (newest first) and the stale ones are shed rather than served late.
        let a = fixed(1.0, 1000);
        let ends = drive(&a, Duration::from_millis(2), Duration::from_secs(1)).await;
        let late: Vec<_> = ends[ends.len() / 2..].iter().filter_map(|r| r.as_ref().ok()).collect();
        assert!(late.len() >= 40, "goodput held: {}", late.len());
        let slow = late.iter().filter(|w| ***w > Duration::from_millis(20)).count();
        assert!(slow * 20 <= late.len(), "{slow} of {} served late in the second half", late.len());
        assert!(ends.contains(&Err(Refusal::Shed)), "stale waiters were shed");
    }

    #[tokio::test(start_paused = true)]
    async fn in_overload_a_full_queue_pushes_out_its_oldest_waiter() {
        let a = fixed(1.0, 2);
        let ends = drive(&a, Duration::from_millis(2), Duration::from_millis(400)).await;
        assert!(a.view().shed > 0);
        let later = &ends[ends.len() / 2..];
        assert!(!later.contains(&Err(Refusal::QueueFull)), "newcomers were queued, the oldest pushed out");
    }

    #[tokio::test(start_paused = true)]
    async fn max_wait_bounds_the_wait_when_set() {
        let l = LimitConfig { initial: 1.0, min: 1.0, max: 1.0, ..LimitConfig::default() };
        let cfg = AdmissionConfig { limit: l, max_wait: Duration::from_millis(30), ..AdmissionConfig::default() };
        let a = Admission::new(cfg);
        let _holder = a.acquire(Priority::Normal, None).await.unwrap();
        let t = Instant::now();
        assert_eq!(a.acquire(Priority::Normal, None).await.unwrap_err(), Refusal::WaitTooLong);
        assert_eq!(t.elapsed(), Duration::from_millis(30));
    }

    #[tokio::test(start_paused = true)]
    async fn paced_requests_are_not_counted_as_new_demand() {
        let a = fixed(1.0, 100);
        let holder = a.acquire(Priority::Normal, None).await.unwrap();
        let mut waiters = Vec::new();
        for _ in 0..3 {
            let a1 = a.clone();
            waiters.push(tokio::spawn(async move { a1.acquire_as(Priority::Normal, None, Arrival::Paced).await }));
            tokio::task::yield_now().await;
            tokio::time::advance(Duration::from_millis(60)).await;
        }
        let _ = a.acquire(Priority::Normal, Some(Instant::now())).await.map(drop);
        assert!(!a.view().overloaded, "paced requests over a standing queue are no excess");
        drop(holder);
        for w in waiters {
            w.abort();
        }
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

    #[tokio::test(start_paused = true)]
    async fn learnt_samples_move_the_limit_and_a_grown_limit_grants_waiters() {
        let l = LimitConfig { initial: 4.0, min: 1.0, max: 4.0, ..LimitConfig::default() };
        let a = Admission::new(AdmissionConfig { limit: l, ..AdmissionConfig::default() });
        let mut held: Vec<Permit> = futures_lite(&a, 4).await;
        for _ in 0..4 {
            a.learn(Duration::from_millis(80), Duration::from_millis(20));
        }
        assert_eq!(a.view().limit, 2, "4× the baseline with 4 in flight: the limit came down");
        held.truncate(2);
        let a1 = a.clone();
        let waiter = tokio::spawn(async move { a1.acquire(Priority::Normal, None).await.map(drop) });
        tokio::task::yield_now().await;
        assert_eq!((a.view().inflight, a.view().queued), (2, 1), "2 in flight fill the limit");
        for _ in 0..2 {
            a.learn(Duration::from_millis(20), Duration::from_millis(20));
        }
        assert_eq!(a.view().limit, 3, "at its baseline the limit grows again");
        assert_eq!(waiter.await.unwrap(), Ok(()), "the grown limit granted the waiter, no permit ended");
        drop(held);
    }

    fn from(last: u8) -> Option<std::net::IpAddr> {
        Some(std::net::IpAddr::from([127, 0, 0, last]))
    }

    /// Waits in the background as a request of `client`; the join handle gives who it was and
    /// its permit.
    async fn wait_as(
        a: &Arc<Admission>,
        client: Option<std::net::IpAddr>,
        who: u8,
    ) -> tokio::task::JoinHandle<(u8, Permit)> {
        let a = a.clone();
        let h =
            tokio::spawn(
                async move { (who, a.acquire_by(client, Priority::Normal, None, Arrival::Fresh).await.unwrap()) },
            );
        tokio::task::yield_now().await;
        h
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_holding_its_share_waits_behind_other_clients() {
        let a = fixed(4.0, 100);
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(a.try_acquire_by(from(2), Arrival::Fresh).unwrap());
        }
        // .2 holds every slot (its share is 2) and queued first; .1 queued after it.
        let first = wait_as(&a, from(2), 2).await;
        let other = wait_as(&a, from(1), 1).await;
        assert_eq!(a.view().queued, 2);
        drop(held.pop());
        tokio::task::yield_now().await;
        assert!(other.is_finished() && !first.is_finished(), "the free slot went to .1, not to .2 ahead of it");
        assert_eq!(other.await.unwrap().0, 1);
        drop(held.pop());
        assert_eq!(first.await.unwrap().0, 2, "alone in the queue, .2 is served (work-conserving)");
        drop(held);
        assert_eq!(a.view().inflight, 0);
        assert!(a.lock().holders.of(std::net::IpAddr::from([127, 0, 0, 2])) == 0, "every slot given back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_learns_that_someone_waits_and_one_holder_makes_room_per_waiter() {
        let a = fixed(2.0, 100);
        let (p1, p2) = (a.try_acquire(Arrival::Fresh).unwrap(), a.try_acquire(Arrival::Fresh).unwrap());
        let quiet = tokio::time::timeout(Duration::from_secs(5), p1.contended()).await;
        assert!(quiet.is_err() && !p1.claim(), "nobody waits: nothing to make room for");
        let watching = tokio::time::timeout(Duration::from_secs(5), p2.contended());
        let (waiter, woken) = tokio::join!(wait_as(&a, None, 0), watching);
        assert!(woken.is_ok(), "a holder watching learns of the waiter when it comes");
        assert!(p1.claim() && p1.claim(), "the first claim wins (and holds)");
        assert!(!p2.claim(), "one waiter claims one holder");
        let second = tokio::time::timeout(Duration::from_secs(1), p2.contended()).await;
        assert!(second.is_err(), "the waiter is claimed: nothing more to learn");
        p1.finish(Outcome::Ignore);
        assert_eq!(waiter.await.unwrap().0, 0);
        assert_eq!(a.lock().yielding, 0, "the claim ended with the permit");
        drop(p2);
    }
}
