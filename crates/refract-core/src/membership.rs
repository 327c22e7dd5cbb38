//! Runtime membership (members added and removed while serving) and the choice of a member for
//! a request: the primary for writes, a replica for reads (round robin, least outstanding or
//! peak-EWMA with two random choices, or the owner of the read's key on a ring with bounded
//! loads). One [`Membership`] per front end, generic over what a member is ([`Member`]): HTTP
//! backends ([`Backend`]) and PostgreSQL servers are kept, chosen and ejected by the same code.
//!
//! # Layout
//! - this file: [`Membership`], the chooser ([`choose`], [`Membership::choose_keyed`]),
//!   ejection and the outlier check.
//! - `member.rs`: [`Member`], what the engine needs of a member.
//! - `ring.rs`: the affinity policy's ring ([`ring::Ring`]) and its stable hash
//!   ([`ring::key_hash`]).

mod member;
pub mod ring;

pub use member::Member;

use crate::backend::Backend;
use crate::config::{validate_backend, BackendConfig, Balance, Overload, Policy, Role};
use crate::metrics::{AffinityCounters, Metrics};
use crate::overload::AdmissionConfig;
use crate::partial::Shares;
use rand::Rng;
use refract_vocab::{FrontKind, MemberName, RouteClass};
use ring::Ring;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

/// What a read names, for partial replicas (a Hyrise-R plan's tables): only members holding
/// every one of `tables` may serve it, in the class's share when `shares` configures one; and,
/// for the affinity policy, its key.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    /// The tables, sorted; empty when refract cannot name them all (then only a member that
    /// holds everything may serve it).
    pub tables: &'a [String],
    /// The configured shares.
    pub shares: &'a Shares,
    /// Its affinity key ([`ring::key_hash`] of what it reads), for `[balance] policy =
    /// "affinity"`; `None`: balanced by load alone.
    pub key: Option<u64>,
}

/// Why a member could not be added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddError {
    /// The definition itself is wrong (admin: 400).
    #[error("{0}")]
    Invalid(String),
    /// It clashes with the current membership: its name or address is taken, or it is a second
    /// primary (admin: 409; the same request succeeds once the other member is removed).
    #[error("{0}")]
    Conflict(String),
}

/// The current members (HTTP backends by default).
pub struct Membership<M: Member = Backend> {
    list: RwLock<Arc<Vec<Arc<M>>>>,
    rr: AtomicUsize,
    balance: Balance,
    /// A new member's engine part: idle connections kept, admission settings.
    max_idle: usize,
    admission: AdmissionConfig,
    metrics: Arc<Metrics>,
    eject_max_fraction: f64,
    /// The front end its members belong to (HTTP unless [`Membership::serving`] says).
    front: FrontKind,
    /// The affinity ring over the members, as last built.
    ring: RwLock<Arc<Keyed>>,
    /// The affinity policy's counts, registered at its first choice.
    affinity: OnceLock<AffinityCounters>,
}

/// The affinity ring over a membership's members, by name (each of weight 1).
struct Keyed {
    names: Vec<String>,
    ring: Ring,
}

impl Keyed {
    fn of<M: Member>(list: &[Arc<M>]) -> Keyed {
        let names: Vec<String> = list.iter().map(|m| m.name().to_string()).collect();
        let ring = Ring::new(names.iter().map(|n| (n.as_str(), 1)));
        Keyed { names, ring }
    }

    /// Whether it is the ring of `list` (the same names in the same order).
    fn is_of<M: Member>(&self, list: &[Arc<M>]) -> bool {
        self.names.len() == list.len() && self.names.iter().zip(list).all(|(n, m)| n == m.name())
    }
}

impl<M: Member> Membership<M> {
    /// Membership of `members`, chosen by `balance`; a new member's engine part keeps
    /// `max_idle` idle connections and follows `admission`.
    pub fn of(
        members: Vec<Arc<M>>,
        balance: Balance,
        max_idle: usize,
        admission: AdmissionConfig,
        metrics: Arc<Metrics>,
        eject_max_fraction: f64,
    ) -> Self {
        Membership {
            // Built at the first keyed read (only the affinity policy has any).
            ring: RwLock::new(Arc::new(Keyed::of::<M>(&[]))),
            list: RwLock::new(Arc::new(members)),
            rr: AtomicUsize::new(0),
            balance,
            max_idle,
            admission,
            metrics,
            eject_max_fraction,
            front: FrontKind::Http,
            affinity: OnceLock::new(),
        }
    }

    /// The same membership, its members belonging to `front` (their engine parts and metrics
    /// say so).
    pub fn serving(self, front: FrontKind) -> Self {
        Membership { front, ..self }
    }

    /// The engine part of a new member defined by `cfg`, its counters labelled `cfg.name`
    /// (and its front end).
    pub fn engine_part(&self, cfg: &BackendConfig) -> Backend {
        let counters = self.metrics.backend(MemberName { name: &cfg.name, front: self.front });
        Backend::new(cfg, self.front, self.max_idle, counters, self.admission.clone())
    }

    /// Makes `members` the membership (a front end building its list; those left are retired).
    pub fn replace(&self, members: Vec<Arc<M>>) {
        let mut guard = self.list.write().unwrap_or_else(|p| p.into_inner());
        for old in guard.iter().filter(|o| !members.iter().any(|n| Arc::ptr_eq(n, o))) {
            old.retire();
        }
        *guard = Arc::new(members);
    }

    /// The `[balance]` its reads follow.
    pub fn balance(&self) -> &Balance {
        &self.balance
    }

    /// Ejects a failing replica for `for_ms`, unless that would eject more than the allowed
    /// fraction of replicas (the primary is never ejected: writes have nowhere else to go).
    pub fn try_eject(&self, b: &Backend, for_ms: u64) -> bool {
        try_eject_in(&self.snapshot(), b, for_ms, self.eject_max_fraction, "consecutive failures")
    }

    /// The members now (a cheap snapshot; membership may change after).
    pub fn snapshot(&self) -> Arc<Vec<Arc<M>>> {
        self.list.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The member called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<M>> {
        self.snapshot().iter().find(|m| m.name() == name).cloned()
    }

    /// Adds `member`, unless its name or address is taken or it is a second primary.
    pub fn insert(&self, member: Arc<M>) -> Result<(), AddError> {
        let mut guard = self.list.write().unwrap_or_else(|p| p.into_inner());
        if guard.iter().any(|b| b.name() == member.name()) {
            return Err(AddError::Conflict(format!("backend {} already exists", member.name())));
        }
        if let Some(b) = guard.iter().find(|b| b.addr() == member.addr()) {
            return Err(AddError::Conflict(format!("backend {} already has the address {}", b.name(), b.addr())));
        }
        if member.role() == Role::Primary && guard.iter().any(|b| b.role() == Role::Primary) {
            return Err(AddError::Conflict("there is already a primary; remove it first".into()));
        }
        let mut next = guard.as_ref().clone();
        next.push(member);
        *guard = Arc::new(next);
        Ok(())
    }

    /// Removes the member `name` (retired: its in-flight requests finish, its counters go);
    /// returns it, `None` when there is no such member.
    pub fn take(&self, name: &str) -> Option<Arc<M>> {
        let mut guard = self.list.write().unwrap_or_else(|p| p.into_inner());
        let pos = guard.iter().position(|b| b.name() == name)?;
        let mut next = guard.as_ref().clone();
        let gone = next.remove(pos);
        gone.retire();
        *guard = Arc::new(next);
        self.metrics.remove_backend(gone.backend().member());
        Some(gone)
    }

    /// Removes a member by name; its in-flight requests finish. Returns whether it existed.
    pub fn remove(&self, name: &str) -> bool {
        let gone = self.take(name).is_some();
        if gone {
            tracing::info!(backend = %name, "backend removed");
        }
        gone
    }

    /// Drains (`true`) or undrains a member by name; `None` when there is no such member,
    /// else whether that changed anything.
    pub fn set_drained(&self, name: &str, drained: bool) -> Option<bool> {
        let m = self.get(name)?;
        let changed = m.backend().set_drained(drained);
        self.metrics.set_drained(m.backend().member(), drained);
        if changed {
            tracing::info!(backend = %name, drained, "backend drain changed by the admin API");
        }
        Some(changed)
    }

    /// The primary, if there is one.
    pub fn primary(&self) -> Option<Arc<M>> {
        self.snapshot().iter().find(|b| b.role() == Role::Primary).cloned()
    }

    /// The member for one request of `class` (not `All`), avoiding those that `failed` it and
    /// those that refused it as `saturated`.
    pub fn pick(&self, class: RouteClass, failed: &[Arc<M>], saturated: &[Arc<M>]) -> Option<Arc<M>> {
        self.pick_in(class, None, failed, saturated)
    }

    /// [`Self::pick`] for a read that names tables (`scope`): only a member holding every one
    /// of them takes it (`partial`), in its class's share when one is configured (a share may
    /// name the primary), else balanced; the primary when no replica holds them all.
    pub fn pick_in(
        &self,
        class: RouteClass,
        scope: Option<Scope<'_>>,
        failed: &[Arc<M>],
        saturated: &[Arc<M>],
    ) -> Option<Arc<M>> {
        let list = self.snapshot();
        let is_in = |set: &[Arc<M>], b: &Arc<M>| set.iter().any(|e| Arc::ptr_eq(e, b));
        let usable = |b: &&Arc<M>| b.backend().is_available() && !is_in(failed, b) && !is_in(saturated, b);
        let primary = || list.iter().filter(usable).find(|b| b.role() == Role::Primary).cloned();
        if class != RouteClass::Read {
            return primary();
        }
        let holds = |b: &&Arc<M>| scope.is_none_or(|s| b.covers(s.tables));
        let reads = |b: &&Arc<M>| (b.role() == Role::Replica || self.balance.read_from_primary) && holds(b);
        if let Some(s) = scope.filter(|s| !s.shares.is_empty()) {
            let named = |b: &&Arc<M>| reads(b) || (s.shares.names(b.name()) && holds(b));
            let eligible: Vec<&Arc<M>> = list.iter().filter(usable).filter(named).collect();
            if let Some(i) = s.shares.pick(s.tables, &eligible, |b| b.name()) {
                return Some(eligible[i].clone());
            }
        }
        let readers: Vec<&Arc<M>> = list.iter().filter(usable).filter(reads).collect();
        if readers.is_empty() {
            // The primary takes reads only when no replica can: none is up, or each one up
            // failed this request. A replica that is merely saturated (its admission refused)
            // keeps reads off the primary, whose capacity the writes need. A read no replica
            // holds the tables of is the primary's whatever the fallback says.
            let replica_left = list.iter().filter(reads).any(|b| b.backend().is_available() && !is_in(failed, b));
            let none_holds = scope.is_some() && !list.iter().any(|b| b.role() == Role::Replica && holds(&b));
            let fallback = self.balance.read_fallback_to_primary || none_holds;
            return if fallback && !replica_left { primary() } else { None };
        }
        // A read's first choice is counted; one moved off a member that failed it or refused
        // it is not counted again.
        let first = failed.is_empty() && saturated.is_empty();
        let key = scope.and_then(|s| s.key);
        let keyed = self.keyed(&readers, key, &|b| b.backend(), first);
        let i = keyed.unwrap_or_else(|| self.choose_in(&readers, |b| b.backend()));
        Some(readers[i].clone())
    }

    /// The index in `readers` (not empty) of the one a request goes to under the `[balance]`
    /// policy, turns counted by this membership (the affinity policy, given no key: peak-EWMA).
    pub fn choose_in<T>(&self, readers: &[T], member: impl Fn(&T) -> &Backend) -> usize {
        choose(self.balance.policy, &self.rr, readers, member)
    }

    /// The index in `readers` (not empty: the members eligible for one read) of the one a read
    /// with affinity `key` goes to. Under `policy = "affinity"` with a key: the key's owner on
    /// the ring over every member of this membership, or the next reader on the ring when the
    /// owner is no reader (down, drained, behind, not holding the tables) or carries more than
    /// `affinity_load_factor` × its share of the readers' requests in flight (counted in
    /// `refract_balance_affinity_total{outcome}`). Without a key, under another policy, or
    /// when no reader is a member (by `member(r).name`): [`Self::choose_in`]. `member` gives a
    /// reader's engine member.
    pub fn choose_keyed<T>(&self, readers: &[T], key: Option<u64>, member: impl Fn(&T) -> &Backend) -> usize {
        self.keyed(readers, key, &member, true).unwrap_or_else(|| self.choose_in(readers, member))
    }

    /// [`Self::choose_keyed`]'s ring choice (`None`: no key, another policy, no reader on the
    /// ring); counted when `count`.
    fn keyed<T>(
        &self,
        readers: &[T],
        key: Option<u64>,
        member: &impl Fn(&T) -> &Backend,
        count: bool,
    ) -> Option<usize> {
        let key = key.filter(|_| self.balance.policy == Policy::Affinity)?;
        let keyed = self.ring();
        let at: Vec<Option<usize>> =
            keyed.names.iter().map(|n| readers.iter().position(|r| member(r).name == *n)).collect();
        let inflight = |i: usize| at[i].map_or(0, |j| member(&readers[j]).inflight());
        let pick = keyed.ring.pick(key, |i| at[i].is_some(), inflight, self.balance.affinity_load_factor)?;
        if count {
            self.affinity.get_or_init(|| self.metrics.affinity(self.front)).count(pick.spilled);
        }
        at[pick.member]
    }

    /// The ring over the members now: the cached one, built again when they changed.
    fn ring(&self) -> Arc<Keyed> {
        let list = self.snapshot();
        let cached = self.ring.read().unwrap_or_else(|p| p.into_inner()).clone();
        if cached.is_of(&list) {
            return cached;
        }
        let fresh = Arc::new(Keyed::of(&list));
        *self.ring.write().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        fresh
    }
}

impl<M: Member> std::fmt::Debug for Membership<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.snapshot().iter().map(|m| m.name().to_string()).collect();
        f.debug_struct("Membership").field("members", &names).finish_non_exhaustive()
    }
}

impl Membership {
    /// Membership from the configured backends.
    pub fn new(
        cfgs: &[BackendConfig],
        balance: Balance,
        max_idle: usize,
        metrics: Arc<Metrics>,
        overload: &Overload,
    ) -> Self {
        let m =
            Membership::of(Vec::new(), balance, max_idle, overload.admission(), metrics, overload.eject_max_fraction);
        let list = cfgs.iter().map(|c| Arc::new(m.engine_part(c))).collect();
        *m.list.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(list);
        m
    }

    /// Adds a backend; refuses a bad definition, a duplicate name or address, a second primary.
    pub fn add(&self, cfg: BackendConfig) -> Result<(), AddError> {
        validate_backend(&cfg).map_err(AddError::Invalid)?;
        let list = self.snapshot();
        if list.iter().any(|b| b.name == cfg.name) {
            return Err(AddError::Conflict(format!("backend {} already exists", cfg.name)));
        }
        if let Some(b) = list.iter().find(|b| b.addr == cfg.addr) {
            return Err(AddError::Conflict(format!("backend {} already has the address {}", b.name, cfg.addr)));
        }
        if cfg.role == Role::Primary && self.primary().is_some() {
            return Err(AddError::Conflict("there is already a primary; remove it first".into()));
        }
        self.insert(Arc::new(self.engine_part(&cfg)))?;
        tracing::info!(backend = %cfg.name, addr = %cfg.addr, "backend added");
        Ok(())
    }

    /// Makes the membership `cfgs` (a reload): backends whose definition is unchanged stay as
    /// they are (pool, counters, drain), others are added, replaced or removed; requests in
    /// flight on a replaced or removed backend finish. Returns what changed, for the log.
    pub fn apply(&self, cfgs: &[BackendConfig]) -> Vec<String> {
        let mut guard = self.list.write().unwrap_or_else(|p| p.into_inner());
        let mut changes = Vec::new();
        let next: Vec<Arc<Backend>> = cfgs
            .iter()
            .map(|c| match guard.iter().find(|b| b.name == c.name) {
                Some(b) if same_definition(b, c) => b.clone(),
                old => {
                    changes.push(format!("{} {}", if old.is_some() { "changed" } else { "added" }, c.name));
                    Arc::new(self.engine_part(c))
                }
            })
            .collect();
        for old in guard.iter().filter(|o| !next.iter().any(|n| Arc::ptr_eq(n, o))) {
            old.retire();
            if !next.iter().any(|n| n.name == old.name) {
                self.metrics.remove_backend(old.member());
                changes.push(format!("removed {}", old.name));
            }
        }
        *guard = Arc::new(next);
        changes
    }
}

/// Whether backend `b` is what `c` defines (a reload keeps it as it is).
fn same_definition(b: &Backend, c: &BackendConfig) -> bool {
    let holds = crate::partial::Holds::from_config(c.tables.as_deref());
    b.addr == c.addr && b.role == c.role && b.max_concurrency == c.max_concurrency && b.holds == holds
}

/// The index in `readers` (not empty) of the one a request goes to under `policy`: in turn
/// (`rr` counts the turns), or the lower cost of two random choices (the affinity policy
/// without a key: peak-EWMA). `member` gives each reader's engine member, so that any front
/// end's servers (HTTP backends, PostgreSQL servers) are balanced by this one chooser.
pub fn choose<T>(policy: Policy, rr: &AtomicUsize, readers: &[T], member: impl Fn(&T) -> &Backend) -> usize {
    let n = readers.len();
    match policy {
        _ if n <= 1 => 0,
        Policy::RoundRobin => rr.fetch_add(1, Relaxed) % n,
        Policy::LeastOutstanding => two_choices(n, |i| member(&readers[i]).inflight() as f64),
        Policy::PeakEwma | Policy::Affinity => two_choices(n, |i| member(&readers[i]).cost()),
    }
}

/// Power of two choices among `n` (at least 2): two distinct random indices, the one with the
/// lower cost.
fn two_choices(n: usize, cost: impl Fn(usize) -> f64) -> usize {
    let mut rng = rand::thread_rng();
    let a = rng.gen_range(0..n);
    let b = (a + rng.gen_range(1..n)) % n;
    if cost(b) < cost(a) {
        b
    } else {
        a
    }
}

/// Ejects replica `b` of `list` for `for_ms` (`why` goes to the log), unless it is the primary,
/// is ejected already, or more than `max_fraction` of the replicas would then be out.
pub fn try_eject_in<M: Member>(list: &[Arc<M>], b: &Backend, for_ms: u64, max_fraction: f64, why: &str) -> bool {
    let replicas = list.iter().filter(|r| r.role() == Role::Replica).count();
    let ejected = list.iter().filter(|r| r.role() == Role::Replica && r.backend().is_ejected()).count();
    let allowed = (replicas as f64 * max_fraction).floor() as usize;
    if b.role != Role::Replica || b.is_ejected() || ejected + 1 > allowed {
        return false;
    }
    b.eject(for_ms);
    tracing::warn!(backend = %b.name, for_ms, why, "backend ejected");
    true
}

/// The latency outlier check, run once per health interval for any front end's members: each
/// member's median latency over the interval is compared with the median of the others' (those
/// that served in it); a replica at least `eject_slow_factor` times slower, and slower than
/// `eject_slow_min_ms`, for `eject_slow_intervals` checks in a row, is ejected for `eject_ms`
/// (within `eject_max_fraction`). Returns the members it ejected.
pub fn eject_slow<M: Member>(list: &[Arc<M>], o: &Overload) -> Vec<Arc<M>> {
    let medians: Vec<Option<Duration>> = list.iter().map(|m| m.backend().window().take_median()).collect();
    if o.eject_slow_factor <= 0.0 {
        return Vec::new();
    }
    let floor = Duration::from_millis(o.eject_slow_min_ms);
    let mut out = Vec::new();
    for (i, b) in list.iter().enumerate() {
        let others = medians.iter().enumerate().filter(|(j, _)| *j != i).filter_map(|(_, m)| *m).collect();
        let slow = match (medians[i], median(others)) {
            (Some(mine), Some(median)) => {
                mine >= floor && mine.as_secs_f64() >= o.eject_slow_factor * median.as_secs_f64()
            }
            // No sample this interval: no verdict, the streak stays.
            _ => continue,
        };
        let streak = b.backend().window().note_slow(slow);
        let why = "slow: a latency outlier";
        if slow
            && streak >= o.eject_slow_intervals.max(1)
            && try_eject_in(list, b.backend(), o.eject_ms, o.eject_max_fraction, why)
        {
            b.backend().window().note_slow(false);
            out.push(b.clone());
        }
    }
    out
}

/// The median of `v` (the lower middle value of an even count); `None` when empty.
fn median(mut v: Vec<Duration>) -> Option<Duration> {
    v.sort();
    v.get(v.len().saturating_sub(1) / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(name: &str, port: u16, role: Role) -> BackendConfig {
        BackendConfig {
            name: name.into(),
            addr: ([127, 0, 0, 1], port).into(),
            role,
            max_concurrency: None,
            tables: None,
        }
    }

    fn three(policy: Policy) -> Membership {
        let cfgs = [cfg("p", 1, Role::Primary), cfg("r1", 2, Role::Replica), cfg("r2", 3, Role::Replica)];
        let balance = Balance { policy, ..Balance::default() };
        Membership::new(&cfgs, balance, 4, Arc::new(Metrics::new()), &Overload::default())
    }

    /// A primary and two partial replicas holding {a, b} and {b, c}.
    fn partial(balance: Balance) -> Membership {
        let holding = |name, port, t: &[&str]| BackendConfig {
            tables: Some(t.iter().map(|s| s.to_string()).collect()),
            ..cfg(name, port, Role::Replica)
        };
        let cfgs = [cfg("p", 1, Role::Primary), holding("r1", 2, &["a", "b"]), holding("r2", 3, &["b", "c"])];
        Membership::new(&cfgs, balance, 4, Arc::new(Metrics::new()), &Overload::default())
    }

    fn tables(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// Who serves `n` reads naming `t`, counted by name.
    fn served(m: &Membership, t: &[&str], shares: &Shares, n: usize) -> std::collections::BTreeMap<String, usize> {
        let t = tables(t);
        let scope = Scope { tables: &t, shares, key: None };
        let mut out = std::collections::BTreeMap::new();
        for _ in 0..n {
            let b = m.pick_in(RouteClass::Read, Some(scope), &[], &[]).map_or("none".into(), |b| b.name.clone());
            *out.entry(b).or_insert(0) += 1;
        }
        out
    }

    /// A primary and three replicas under the affinity policy.
    fn affine() -> Membership {
        let cfgs = [
            cfg("p", 1, Role::Primary),
            cfg("r1", 2, Role::Replica),
            cfg("r2", 3, Role::Replica),
            cfg("r3", 4, Role::Replica),
        ];
        let balance = Balance { policy: Policy::Affinity, ..Balance::default() };
        Membership::new(&cfgs, balance, 4, Arc::new(Metrics::new()), &Overload::default())
    }

    /// Who serves a read with key `key`.
    fn keyed(m: &Membership, key: u64) -> String {
        let none = Shares::default();
        let scope = Scope { tables: &[], shares: &none, key: Some(key) };
        m.pick_in(RouteClass::Read, Some(scope), &[], &[]).map_or("none".into(), |b| b.name.clone())
    }

    /// The keys the affinity tests place.
    fn keys() -> Vec<u64> {
        (0u32..300).map(|i| ring::key_hash(&[b"t", &i.to_le_bytes()])).collect()
    }

    #[test]
    fn affinity_sends_a_key_to_one_replica_and_dispatchers_agree() {
        let (a, b) = (affine(), affine());
        let placed: Vec<String> = keys().into_iter().map(|k| keyed(&a, k)).collect();
        for (k, name) in keys().into_iter().zip(&placed) {
            assert!((0..5).all(|_| keyed(&a, k) == *name), "one key, one replica");
            assert_eq!(keyed(&b, k), *name, "another membership of the same members agrees");
        }
        for r in ["r1", "r2", "r3"] {
            let n = placed.iter().filter(|p| *p == r).count();
            assert!((50..=150).contains(&n), "{r} took {n} of 300 keys: {placed:?}");
        }
        assert!(!placed.contains(&"p".to_string()), "the primary takes no read");
    }

    #[test]
    fn affinity_moves_only_the_keys_of_a_replica_that_is_down_removed_or_added() {
        let m = affine();
        let before: Vec<String> = keys().into_iter().map(|k| keyed(&m, k)).collect();
        m.snapshot()[2].set_up(false);
        let down: Vec<String> = keys().into_iter().map(|k| keyed(&m, k)).collect();
        for (b, d) in before.iter().zip(&down) {
            assert!(b == d || (b == "r2" && d != "r2"), "{b} -> {d}");
        }
        m.snapshot()[2].set_up(true);
        assert_eq!(keys().into_iter().map(|k| keyed(&m, k)).collect::<Vec<_>>(), before, "back up: back");
        assert!(m.remove("r2"));
        let removed: Vec<String> = keys().into_iter().map(|k| keyed(&m, k)).collect();
        assert_eq!(removed, down, "removed: as when down");
        m.add(cfg("r4", 5, Role::Replica)).unwrap();
        let added: Vec<String> = keys().into_iter().map(|k| keyed(&m, k)).collect();
        for (r, a) in removed.iter().zip(&added) {
            assert!(r == a || a == "r4", "{r} -> {a}");
        }
        assert!(added.iter().any(|a| a == "r4"));
    }

    #[test]
    fn affinity_spills_past_a_busy_owner_and_counts_it() {
        let m = affine();
        let key = keys()[0];
        let owner = m.get(&keyed(&m, key)).unwrap();
        // 4 in flight at the owner, none elsewhere: its bound is ceil(1.25 × 5 / 3) = 3.
        let _busy: Vec<_> = (0..4).map(|_| owner.begin()).collect();
        let spilled = keyed(&m, key);
        assert_ne!(spilled, owner.name);
        assert!((0..5).all(|_| keyed(&m, key) == spilled), "the next on the ring, every time");
        let text = m.metrics.render();
        assert!(text.contains(r#"refract_balance_affinity_total{outcome="spilled"} 6"#), "{text}");
        assert!(text.contains(r#"refract_balance_affinity_total{outcome="owner"} 1"#), "{text}");
        // A retry (owner failed it) is not counted again.
        let none = Shares::default();
        let scope = Scope { tables: &[], shares: &none, key: Some(key) };
        m.pick_in(RouteClass::Read, Some(scope), std::slice::from_ref(&owner), &[]).unwrap();
        assert!(m.metrics.render().contains(r#"refract_balance_affinity_total{outcome="spilled"} 6"#));
    }

    #[test]
    fn affinity_without_a_key_is_peak_ewma_and_another_policy_ignores_keys() {
        let m = affine();
        let list = m.snapshot();
        for (i, ms) in [(1, 100), (2, 1), (3, 1)] {
            list[i].latency.observe(Duration::from_millis(ms));
        }
        for _ in 0..20 {
            assert_ne!(m.pick(RouteClass::Read, &[], &[]).unwrap().name, "r1", "the slow one is never chosen");
        }
        let rr = three(Policy::RoundRobin);
        let names: Vec<String> = (0..4).map(|_| keyed(&rr, keys()[0])).collect();
        assert_eq!(names, ["r1", "r2", "r1", "r2"]);
        assert!(!m.metrics.render().contains("refract_balance_affinity_total{"), "nothing keyed yet");
    }

    /// A front end's own reader type, as the PostgreSQL front end's servers.
    struct Reader {
        member: Arc<Backend>,
    }

    #[test]
    fn choose_keyed_maps_the_ring_onto_any_readers_by_name() {
        let m = affine();
        let readers: Vec<Reader> = m.snapshot().iter().skip(1).rev().map(|b| Reader { member: b.clone() }).collect();
        for k in keys() {
            let i = m.choose_keyed(&readers, Some(k), |r| &r.member);
            assert_eq!(readers[i].member.name, keyed(&m, k));
        }
        // Only r3 and r1 eligible: r2's keys go to one of them, the others' stay.
        let two = [Reader { member: m.snapshot()[3].clone() }, Reader { member: m.snapshot()[1].clone() }];
        for k in keys() {
            let name = &two[m.choose_keyed(&two, Some(k), |r| &r.member)].member.name;
            let owner = keyed(&m, k);
            assert!(*name == owner || owner == "r2", "{owner} -> {name}");
        }
        // A reader that is no member: load balancing.
        let stranger = Arc::new(m.engine_part(&cfg("x", 9, Role::Replica)));
        let alone = [Reader { member: stranger }];
        assert_eq!(m.choose_keyed(&alone, Some(keys()[0]), |r| &r.member), 0);
    }

    #[test]
    fn a_read_naming_tables_goes_to_a_replica_holding_them_all_else_the_primary() {
        let m = partial(Balance { policy: Policy::RoundRobin, ..Balance::default() });
        let none = Shares::default();
        let only = |name: &str, n| std::collections::BTreeMap::from([(name.to_string(), n)]);
        assert_eq!(served(&m, &["a"], &none, 4), only("r1", 4));
        assert_eq!(served(&m, &["c"], &none, 4), only("r2", 4));
        assert_eq!(served(&m, &["a", "c"], &none, 4), only("p", 4), "no replica holds both");
        assert_eq!(served(&m, &[], &none, 4), only("p", 4), "tables unknown: only a full copy");
        assert_eq!(served(&m, &["b"], &none, 4).len(), 2, "both hold b: {:?}", served(&m, &["b"], &none, 4));
        assert_eq!(m.pick(RouteClass::Read, &[], &[]).map(|b| b.role), Some(Role::Replica), "no scope: any replica");
        // The one replica holding a is down: the fallback rule applies as for any read.
        m.snapshot()[1].set_up(false);
        assert_eq!(served(&m, &["a"], &none, 2), only("p", 2));
        let strict = partial(Balance { read_fallback_to_primary: false, ..Balance::default() });
        strict.snapshot()[1].set_up(false);
        assert_eq!(served(&strict, &["a"], &none, 2), only("none", 2));
        assert_eq!(served(&strict, &["a", "c"], &none, 2), only("p", 2), "none holds them: the primary regardless");
    }

    #[test]
    fn a_share_spreads_its_class_and_may_name_the_primary() {
        let m = partial(Balance::default());
        let w = HashMap::from([("p".to_string(), 1.0), ("r1".to_string(), 1.0), ("r2".to_string(), 2.0)]);
        let class = tables(&["b"]);
        let shares = Shares::new([(class.as_slice(), &w)]);
        let got = served(&m, &["b"], &shares, 1000);
        for (name, want) in [("p", 250.0), ("r1", 250.0), ("r2", 500.0)] {
            assert!((got[name] as f64 - want).abs() <= 5.0, "{got:?}");
        }
        // Another class is balanced over the replicas; the primary a share named takes none.
        assert!(!served(&m, &["a"], &shares, 50).contains_key("p"));
        // A weighted backend that does not hold the tables serves none of them.
        let class = tables(&["a"]);
        let shares = Shares::new([(class.as_slice(), &w)]);
        let got = served(&m, &["a"], &shares, 1000);
        assert!(!got.contains_key("r2") && (got["p"] as f64 - 500.0).abs() <= 5.0, "{got:?}");
    }

    #[test]
    fn writes_go_to_primary_reads_rotate_over_replicas() {
        let m = three(Policy::RoundRobin);
        assert_eq!(m.pick(RouteClass::Write, &[], &[]).unwrap().name, "p");
        let names: Vec<_> = (0..4).map(|_| m.pick(RouteClass::Read, &[], &[]).unwrap().name.clone()).collect();
        assert_eq!(names, ["r1", "r2", "r1", "r2"]);
    }

    #[test]
    fn down_replicas_are_skipped_then_primary_takes_reads() {
        let m = three(Policy::LeastOutstanding);
        let list = m.snapshot();
        list[1].set_up(false);
        assert_eq!(m.pick(RouteClass::Read, &[], &[]).unwrap().name, "r2");
        list[2].set_up(false);
        assert_eq!(m.pick(RouteClass::Read, &[], &[]).unwrap().name, "p");
        list[0].set_up(false);
        assert!(m.pick(RouteClass::Read, &[], &[]).is_none());
        assert!(m.pick(RouteClass::Write, &[], &[]).is_none());
    }

    #[test]
    fn reads_do_not_spill_onto_the_primary_while_a_replica_is_up() {
        let m = three(Policy::RoundRobin);
        let list = m.snapshot();
        let saturated = [list[1].clone(), list[2].clone()];
        assert!(m.pick(RouteClass::Read, &[], &saturated).is_none(), "both replicas saturated: no primary");
        assert_eq!(m.pick(RouteClass::Read, &saturated, &[]).unwrap().name, "p", "both failed: the primary");
        list[1].set_up(false);
        assert!(m.pick(RouteClass::Read, &[], &saturated).is_none(), "one replica still up");
        list[2].set_up(false);
        assert_eq!(m.pick(RouteClass::Read, &[], &saturated).unwrap().name, "p", "no replica up: the primary");
    }

    #[test]
    fn peak_ewma_steers_away_from_a_slow_replica() {
        let m = three(Policy::PeakEwma);
        let list = m.snapshot();
        list[1].latency.observe(std::time::Duration::from_millis(100));
        list[2].latency.observe(std::time::Duration::from_millis(1));
        for _ in 0..20 {
            assert_eq!(m.pick(RouteClass::Read, &[], &[]).unwrap().name, "r2");
        }
    }

    #[test]
    fn ejection_is_bounded_to_a_fraction_of_replicas() {
        let m = three(Policy::RoundRobin);
        let list = m.snapshot();
        assert!(!m.try_eject(&list[0], 1000), "the primary is never ejected");
        assert!(m.try_eject(&list[1], 1000));
        assert!(!m.try_eject(&list[2], 1000), "at most half of two replicas");
        for _ in 0..4 {
            assert_eq!(m.pick(RouteClass::Read, &[], &[]).unwrap().name, "r2");
        }
    }

    #[test]
    fn exclusion_for_retries() {
        let m = three(Policy::RoundRobin);
        let first = m.pick(RouteClass::Read, &[], &[]).unwrap();
        for _ in 0..4 {
            assert!(!Arc::ptr_eq(&m.pick(RouteClass::Read, std::slice::from_ref(&first), &[]).unwrap(), &first));
        }
    }

    #[test]
    fn least_outstanding_prefers_idle_replica() {
        let m = three(Policy::LeastOutstanding);
        let busy = m.snapshot()[1].clone();
        let _guards: Vec<_> = (0..5).map(|_| busy.begin()).collect();
        for _ in 0..20 {
            assert_eq!(m.pick(RouteClass::Read, &[], &[]).unwrap().name, "r2");
        }
    }

    #[test]
    fn apply_keeps_unchanged_backends_and_replaces_the_rest() {
        let m = three(Policy::RoundRobin);
        let before = m.snapshot();
        let changes = m.apply(&[cfg("p", 1, Role::Primary), cfg("r1", 5, Role::Replica), cfg("r3", 4, Role::Replica)]);
        assert_eq!(changes, ["changed r1", "added r3", "removed r2"]);
        let after = m.snapshot();
        assert!(Arc::ptr_eq(&before[0], &after[0]), "p is unchanged: same backend, same pool");
        assert!(before[1].view().state == "up" && !before[1].is_available(), "the old r1 is retired");
        assert!(!before[2].is_available(), "r2 is retired");
        assert_eq!(after[1].addr.port(), 5);
        let partial = BackendConfig { tables: Some(vec!["a".into()]), ..cfg("r1", 5, Role::Replica) };
        let changes = m.apply(&[cfg("p", 1, Role::Primary), partial, cfg("r3", 4, Role::Replica)]);
        assert_eq!(changes, ["changed r1"], "a change of tables replaces the backend");
        assert_eq!(m.snapshot()[1].holds.list(), Some(vec!["a".to_string()]));
    }

    #[test]
    fn a_drained_backend_takes_no_reads_until_undrained() {
        let m = three(Policy::RoundRobin);
        assert_eq!(m.set_drained("r1", true), Some(true));
        assert_eq!(m.set_drained("r1", true), Some(false));
        assert_eq!(m.set_drained("nope", true), None);
        for _ in 0..4 {
            assert_eq!(m.pick(RouteClass::Read, &[], &[]).unwrap().name, "r2");
        }
        m.set_drained("r1", false);
        let names: Vec<_> = (0..4).map(|_| m.pick(RouteClass::Read, &[], &[]).unwrap().name.clone()).collect();
        assert!(names.contains(&"r1".to_string()), "{names:?}");
    }

    #[test]
    fn add_and_remove_at_runtime() {
        let m = three(Policy::RoundRobin);
        assert!(m.add(cfg("r1", 9, Role::Replica)).is_err());
        assert!(m.add(cfg("p2", 9, Role::Primary)).is_err());
        assert!(m.add(cfg("bad name", 9, Role::Replica)).is_err());
        m.add(cfg("r3", 4, Role::Replica)).unwrap();
        assert_eq!(m.snapshot().len(), 4);
        assert!(m.remove("r1"));
        assert!(!m.remove("r1"));
        let names: Vec<_> = (0..4).map(|_| m.pick(RouteClass::Read, &[], &[]).unwrap().name.clone()).collect();
        assert!(names.iter().all(|n| n == "r2" || n == "r3"), "{names:?}");
    }

    #[test]
    fn a_replica_slow_for_three_intervals_in_a_row_is_ejected_and_a_fast_one_never() {
        let m = three(Policy::PeakEwma);
        let list = m.snapshot();
        let o = Overload::default();
        let interval = |slow_ms: u64| {
            list[0].observe(Duration::from_millis(2));
            list[1].observe(Duration::from_millis(3));
            list[2].observe(Duration::from_millis(slow_ms));
            eject_slow(&list, &o)
        };
        assert!(interval(200).is_empty() && interval(200).is_empty(), "two intervals are not a streak");
        assert!(interval(4).is_empty(), "a fast interval ends the streak");
        assert!(interval(200).is_empty() && interval(200).is_empty());
        let out = interval(200);
        assert_eq!(out.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(), ["r2"]);
        assert!(list[2].is_ejected() && !list[1].is_ejected());
        // Only half of the replicas may be out: r1 slow now is not ejected.
        for _ in 0..4 {
            list[0].observe(Duration::from_millis(2));
            list[1].observe(Duration::from_millis(300));
            assert!(eject_slow(&list, &o).is_empty());
        }
    }

    #[test]
    fn slow_but_under_the_floor_or_switched_off_is_not_ejected() {
        let m = three(Policy::PeakEwma);
        let list = m.snapshot();
        let off = Overload { eject_slow_factor: 0.0, ..Overload::default() };
        for o in [Overload::default(), off] {
            for _ in 0..5 {
                list[0].observe(Duration::from_millis(1));
                list[1].observe(Duration::from_millis(1));
                // 20 ms is 20 times the others but under the 50 ms floor; with the factor 0
                // nothing is checked at all.
                list[2].observe(Duration::from_millis(if o.eject_slow_factor > 0.0 { 20 } else { 900 }));
                assert!(eject_slow(&list, &o).is_empty());
            }
        }
        assert!(!list[2].is_ejected());
    }
}
