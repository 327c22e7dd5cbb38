//! [`Servers`]: the primary and the replicas with their pools and replication lag, and the
//! choice of a server per statement. The servers are the engine's members
//! ([`Membership`]`<Server>`, which adds, removes and chooses them by `[balance]`); each one's
//! engine part ([`refract_core::backend::Backend`]) keeps its health state, drain, ejection
//! (failures and the latency outlier check), admission control and latency, as for an HTTP
//! backend. What stays here is PostgreSQL's: roles, lag bounds, WAL positions
//! (read-your-writes), the tables a partial replica holds, agents, what its buffer cache does
//! (`cache.rs`). Replicas join and leave at run time ([`Servers::add`], [`Servers::remove`]);
//! the probes are in `probes.rs`.

use super::cache::{Cache, CacheView, Warm};
use super::partial::{Holds, Shares};
use super::pool::Pool;
use super::sizes::Outcome;
use super::sizes::{Path, Sizes};
use super::{Login, Through};
use crate::admit::baseline::{Baselines, Load};
use crate::config::{PgConfig, PgRole, PgServerConfig};
use crate::server::metrics::PgMetrics;
use refract_core::backend::Backend;
use refract_core::config::{BackendConfig, Balance, Overload, Role};
use refract_core::membership::{Member, Membership};
use refract_core::metrics::Metrics;
use refract_core::overload::AdmissionConfig;
use refract_handover::config::{AgentAddr, HandoverConfig, HandoverMode};
use refract_pg::TxStatus;
use refract_vocab::FrontKind;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One server at run time.
#[derive(Debug)]
pub struct Server {
    /// Its name.
    pub name: String,
    /// Primary or replica.
    pub role: PgRole,
    /// Its connections.
    pub pool: Arc<Pool>,
    /// Unique among the servers this front end ever had (clients name their bound server by it).
    pub index: usize,
    /// The engine's view of it: health, drain, ejection, admission control (`admit.rs`),
    /// latency, its request counters (its name, `front="postgres"`).
    pub member: Arc<Backend>,
    /// Primary: current WAL position; replica: last replayed position (0 = unknown).
    pub(crate) lsn: AtomicU64,
    /// Replica: bytes behind the primary at the last poll.
    pub(crate) lag: AtomicU64,
    /// Replica: replay delay in milliseconds at the last poll (see `probes::REPLICA_PROBE`).
    pub(crate) lag_ms: AtomicU64,
    /// When the last probe finished (Unix milliseconds; 0 = never).
    pub(crate) last_check: AtomicU64,
    /// How the probes log in: straight to the server (its pool may go through its agent).
    pub(crate) login: Arc<Login>,
    addr: std::net::SocketAddr,
    /// Its agent, when results may be handed over (`[handover]` names one for it).
    pub(crate) agent: Option<AgentRoute>,
    /// Its no-load time per kind of statement, for its adaptive limit ([`Server::learn`]).
    baselines: Mutex<Baselines>,
    /// The tables it holds (a partial replica holds some: `partial.rs`).
    holds: RwLock<Holds>,
    /// `holds` is configured (`tables`), not read from the server.
    pub(crate) holds_fixed: bool,
    /// What its buffer cache does, from the health loop's samples.
    cache: Mutex<Cache>,
}

/// The next server's [`Server::index`], over every shard's servers.
static NEXT_INDEX: AtomicUsize = AtomicUsize::new(0);

/// How the session reaches a server's agent for a hand-over (`[handover]`).
#[derive(Debug, Clone)]
pub(crate) struct AgentRoute {
    /// `unix:/path` (same host) or its control listener (across hosts).
    pub addr: AgentAddr,
    /// The control key's file (across hosts).
    pub key_file: Option<std::path::PathBuf>,
    /// The steering interface and map capacity, when this dispatcher steers.
    pub steer: Option<(String, u32)>,
}

/// Added to every baseline a limit reads a statement against: a millisecond of delay is not
/// worth managing, and on a busy host a sub-millisecond statement is delayed that much by the
/// scheduler alone, with no queue in PostgreSQL (against its bare 0.1 ms, a 2 ms `SELECT 1`
/// would read as 20× queueing).
const NOISE: Duration = Duration::from_millis(1);

/// A server is an engine member, named by its plain name; its engine part's series carry
/// `front="postgres"` beside it.
impl Member for Server {
    fn name(&self) -> &str {
        &self.name
    }

    fn backend(&self) -> &Backend {
        &self.member
    }

    fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    fn covers(&self, tables: &[String]) -> bool {
        self.holds().covers(tables)
    }

    /// No new statement goes to it; its idle connections close.
    fn retire(&self) {
        self.member.retire();
        self.pool.clear();
    }
}

impl Server {
    /// Whether it passed its last check.
    pub fn is_up(&self) -> bool {
        self.member.is_up()
    }

    /// Whether it may take a new statement: up, not ejected, not drained, not removed.
    pub fn is_available(&self) -> bool {
        self.member.is_available()
    }

    /// Marks it down (its probe failed, or a new connection to it could not connect or log
    /// in); the health loop brings it back.
    pub fn mark_down(&self) {
        if self.member.set_up(false) {
            tracing::warn!(server = %self.name, "postgres server marked down");
            self.pool.clear();
        }
    }

    /// The tables it holds.
    pub fn holds(&self) -> Holds {
        self.holds.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// What the health loop read from the server (ignored when `tables` is configured).
    pub(crate) fn set_holds(&self, holds: Holds) {
        if self.holds_fixed {
            return;
        }
        let mut h = self.holds.write().unwrap_or_else(PoisonError::into_inner);
        if *h != holds {
            tracing::info!(server = %self.name, tables = ?holds.list(), "postgres server's tables changed");
            *h = holds;
        }
    }

    /// Its buffer cache as last sampled (`cache.rs`; empty when never sampled).
    pub fn cache(&self) -> CacheView {
        self.cache_state().view()
    }

    /// Its cache knowledge, to sample or look at.
    pub(crate) fn cache_state(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Logs a change of warming (once when it starts, once when it ends).
    pub(crate) fn log_warm(&self, warm: Option<Warm>) {
        match warm {
            Some(Warm::Started(reason)) => {
                tracing::info!(server = %self.name, reason, "postgres server cache warming")
            }
            Some(Warm::Ended { after, ratio, timed_out: false }) => {
                tracing::info!(server = %self.name, after_s = after.as_secs(), hit_ratio = ?ratio, "postgres server cache warm")
            }
            Some(Warm::Ended { after, ratio, timed_out: true }) => tracing::info!(
                server = %self.name, after_s = after.as_secs(), hit_ratio = ?ratio,
                "postgres server cache no longer counted as warming (its hit ratio never reached the bound)"
            ),
            None => {}
        }
    }

    /// Replication lag in WAL bytes (replicas; 0 for the primary).
    pub fn lag_bytes(&self) -> u64 {
        self.lag.load(Ordering::Relaxed)
    }

    /// The WAL position from the last poll.
    pub fn lsn(&self) -> u64 {
        self.lsn.load(Ordering::Relaxed)
    }

    /// Replay delay in milliseconds (replicas; 0 for the primary and for a replica that has
    /// replayed everything it received).
    pub fn lag_ms(&self) -> u64 {
        self.lag_ms.load(Ordering::Relaxed)
    }

    /// When the last probe finished, in Unix milliseconds (0 = not yet).
    pub fn last_check_unix_ms(&self) -> u64 {
        self.last_check.load(Ordering::Relaxed)
    }

    /// The server's address.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// Books one statement's result (at its ReadyForQuery, or its failure): the engine's
    /// latency estimate and outlier window, and its success and failure counts.
    pub fn book(&self, took: Duration, ok: bool) {
        self.member.record(ok);
        self.member.observe(took);
        if ok {
            self.member.note_outcome(true, 0);
        }
    }

    /// Teaches its adaptive limit one statement (or batch) of kind `key` (a fingerprint) that
    /// took `took`, server time, read against that kind's baseline (`baseline.rs`). The first
    /// sample of a kind only sets its baseline.
    pub(crate) fn learn(&self, key: u64, took: Duration) {
        let admission = &self.member.admission;
        let v = admission.view();
        let load = if v.inflight * 2 < v.limit { Load::Light } else { Load::Heavy };
        let baseline = self.baselines.lock().unwrap_or_else(PoisonError::into_inner).observe(key, took, load);
        if let Some(b) = baseline {
            admission.learn(took, b + NOISE);
        }
    }

    /// Publishes its gauges (health loop and `/metrics` scrape time). Lives here, not in
    /// `views`, so that the health loop does not reach back into the admin views.
    /// The engine's families (both front ends') label it by its name and `front="postgres"`,
    /// the front end's own (`refract_pg_*`) by its name alone.
    pub(crate) fn publish(&self, metrics: &Metrics, pg: &PgMetrics) {
        let member = self.member.member();
        metrics.set_backend(member, self.is_up(), self.pool.in_use());
        metrics.set_drained(member, self.member.is_drained());
        pg.set_pool(&self.name, self.pool.idle_count(), self.pool.in_use(), self.pool.waiting());
        metrics.set_admission(member, &self.member.admission.view());
        if self.role == PgRole::Replica {
            pg.set_lag(&self.name, self.lag_bytes(), self.lag_ms() as f64 / 1000.0);
        }
        let gauges = self.cache_state().gauges();
        if let Some((ratio, warming)) = gauges {
            pg.set_cache(&self.name, ratio, warming);
        }
    }
}

/// Why a server cannot join or leave.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChangeError {
    /// The request conflicts with the servers there are (a name or address taken, the primary).
    #[error("{0}")]
    Conflict(String),
    /// No server has that name.
    #[error("no postgres server {0:?}")]
    Unknown(String),
}

/// All servers.
#[derive(Debug)]
pub struct Servers {
    /// The engine's membership of them, in configuration order, then in the order they
    /// joined; its `[balance]` policy chooses among the readers.
    members: Membership<Server>,
    max_lag: u64,
    max_lag_ms: u64,
    /// What a new server's pool and member are built from.
    login: Arc<Login>,
    pool_size: usize,
    checkout: Duration,
    overload: Overload,
    /// `[handover]`, when it names agents.
    handover: Option<HandoverConfig>,
    /// In `hybrid`: which kinds of statement answer small (they skip the agents).
    sizes: Option<Mutex<Sizes>>,
    /// `[[postgres.share]]`: reads of a class spread in proportions (`partial.rs`).
    shares: Shares,
    /// Sequence number of the last primary WAL-position poll started (health or fast poll).
    poll_started: AtomicU64,
    /// Recent primary polls that finished: (sequence number, WAL position), oldest first.
    polls: Mutex<VecDeque<(u64, u64)>>,
    /// When a session last needed fresh WAL positions (Unix ms): fast polling runs while
    /// this is recent.
    demand: AtomicU64,
    /// How often the health loop samples each server's cache (`cache_stats_interval_ms`;
    /// `None`: never).
    cache_every: Option<Duration>,
    /// The front end's metric families (a server that leaves takes its series along).
    pg: Arc<PgMetrics>,
}

/// How many finished primary polls [`Servers::polls`] keeps.
const POLLS_KEPT: usize = 256;

/// Fast polling goes on this long after the last session that needed it.
const DEMAND_FOR_MS: u64 = 2000;

impl Servers {
    /// Pools for every configured server; all start up (the first probe corrects that). Each
    /// server's ejection and admission control follow `overload` (the engine's `[overload]`;
    /// admission as [`admission_config`] adapts it); reads are balanced by `balance`.
    pub fn new(
        cfg: &PgConfig,
        metrics: &Arc<Metrics>,
        overload: &Overload,
        balance: &Balance,
        handover: Option<HandoverConfig>,
    ) -> Servers {
        // Each server's admission follows `admission_config` (`[overload]` capped by the pool).
        let admission = admission_config(overload, cfg);
        let fraction = overload.eject_max_fraction;
        let members = Membership::of(Vec::new(), balance.clone(), 0, admission, metrics.clone(), fraction)
            .serving(FrontKind::Postgres);
        let login = Arc::new(Login {
            user: cfg.server_user.clone(),
            password: cfg.server_password.clone(),
            database: cfg.database.clone(),
            timeout: Duration::from_millis(cfg.connect_timeout_ms),
            hybrid: None,
        });
        let servers = Servers {
            members,
            max_lag: cfg.max_lag_bytes,
            max_lag_ms: cfg.max_lag_ms,
            login,
            pool_size: cfg.pool_size,
            checkout: Duration::from_millis(cfg.checkout_timeout_ms),
            overload: overload.clone(),
            shares: Shares::new(cfg.shares.iter().map(|s| (s.tables.as_slice(), &s.servers))),
            sizes: handover
                .as_ref()
                .filter(|h| h.mode == HandoverMode::Hybrid)
                .map(|h| Mutex::new(Sizes::new(h.postgres_threshold))),
            handover: handover.filter(|h| h.mode != HandoverMode::Off),
            poll_started: AtomicU64::new(0),
            polls: Mutex::new(VecDeque::with_capacity(POLLS_KEPT)),
            demand: AtomicU64::new(0),
            cache_every: (cfg.cache_stats_interval_ms > 0).then(|| Duration::from_millis(cfg.cache_stats_interval_ms)),
            pg: PgMetrics::of(metrics),
        };
        let list = cfg.servers.iter().map(|s| servers.server(s)).collect();
        servers.members.replace(list);
        servers
    }

    /// A new server, its pool and its engine member.
    fn server(&self, s: &PgServerConfig) -> Arc<Server> {
        let role = match s.role {
            PgRole::Primary => Role::Primary,
            PgRole::Replica => Role::Replica,
        };
        let def = BackendConfig { name: s.name.clone(), addr: s.addr, role, max_concurrency: None, tables: None };
        let member = Arc::new(self.members.engine_part(&def));
        let (agent, login) = self.through_agent(s);
        Arc::new(Server {
            name: s.name.clone(),
            role: s.role,
            pool: Pool::new(s.addr, login, self.pool_size, self.checkout),
            index: NEXT_INDEX.fetch_add(1, Ordering::Relaxed),
            member,
            lsn: AtomicU64::new(0),
            lag: AtomicU64::new(0),
            lag_ms: AtomicU64::new(0),
            last_check: AtomicU64::new(0),
            // Probes check the server itself, never through its agent.
            login: self.login.clone(),
            addr: s.addr,
            agent,
            baselines: Mutex::default(),
            holds: RwLock::new(s.tables.as_deref().map_or(Holds::All, Holds::only)),
            holds_fixed: s.tables.is_some(),
            cache: Mutex::default(),
        })
    }

    /// The agent of server `name` and the login of its connections: through the agent, they
    /// ask it to watch their results (`always`: every result with a row is offered).
    fn through_agent(&self, s: &PgServerConfig) -> (Option<AgentRoute>, Arc<Login>) {
        let plain = || (None, self.login.clone());
        let (Some(h), Some(through)) = (&self.handover, s.through) else { return plain() };
        let Some(agent) = h.agents.get(&s.name) else { return plain() };
        let threshold = if h.mode == HandoverMode::Always { 1 } else { h.postgres_threshold };
        let hybrid = Some(Through { agent: through, threshold });
        let route = AgentRoute {
            addr: agent.clone(),
            key_file: h.key_file.clone(),
            steer: h.interface.clone().map(|i| (i, h.map_capacity)),
        };
        (Some(route), Arc::new(Login { hybrid, ..(*self.login).clone() }))
    }

    /// The path for a statement of kind `key` (a fingerprint): straight to the server when
    /// hybrid knows it answers small (`sizes.rs`), else through the agent (if it has one).
    pub(crate) fn path_for(&self, key: u64) -> Path {
        match &self.sizes {
            Some(sizes) => sizes.lock().unwrap_or_else(PoisonError::into_inner).path(key),
            None => Path::Agent,
        }
    }

    /// Notes that a statement of kind `key` answered `bytes`, left the session `tx`, and ended
    /// with `outcome` (`Sizes::observe`).
    pub(crate) fn observe_size(&self, key: u64, bytes: u64, tx: TxStatus, outcome: Outcome) {
        if let Some(sizes) = &self.sizes {
            sizes.lock().unwrap_or_else(PoisonError::into_inner).observe(key, bytes, tx, outcome);
        }
    }

    /// The servers now (a cheap snapshot; servers may join or leave after).
    pub fn list(&self) -> Arc<Vec<Arc<Server>>> {
        self.members.snapshot()
    }

    /// A replica joins (`POST /backends` with `"front": "postgres"`): it takes reads once its first
    /// probe passes. A second primary, or a name or address already there, is refused.
    pub fn add(&self, s: &PgServerConfig) -> Result<(), ChangeError> {
        let list = self.list();
        if s.role == PgRole::Primary {
            return Err(ChangeError::Conflict("a postgres primary cannot join at run time".into()));
        }
        if let Some(o) = list.iter().find(|o| o.name == s.name || o.addr == s.addr) {
            return Err(ChangeError::Conflict(format!("postgres server {} has that name or address", o.name)));
        }
        let server = self.server(s);
        // Not up until the health loop has seen it answer.
        server.member.set_up(false);
        self.members.insert(server.clone()).map_err(|e| ChangeError::Conflict(e.to_string()))?;
        tracing::info!(server = %s.name, addr = %s.addr, "postgres replica joined");
        self.cold(&server, "joined");
        Ok(())
    }

    /// A replica leaves: no new statement goes to it, its idle connections close, and the
    /// transactions running on it finish. The primary cannot leave.
    pub fn remove(&self, name: &str) -> Result<(), ChangeError> {
        let Some(gone) = self.get(name) else {
            return Err(ChangeError::Unknown(name.into()));
        };
        if gone.role == PgRole::Primary {
            return Err(ChangeError::Conflict("the postgres primary cannot leave at run time".into()));
        }
        // Retired (its idle connections close) and its gauges gone.
        self.members.take(name).ok_or_else(|| ChangeError::Unknown(name.into()))?;
        self.pg.forget_server(name);
        tracing::info!(server = %name, "postgres replica left");
        Ok(())
    }

    /// The server called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Server>> {
        self.members.get(name)
    }

    /// A write just committed (its ReadyForQuery came): returns the sequence number of the
    /// first primary poll that certainly started after it. A replica that has replayed up to
    /// that poll's WAL position has the write ([`Servers::primary_lsn_since`]).
    pub fn write_committed(&self) -> u64 {
        self.want_fresh_lsn();
        self.poll_started.load(Ordering::SeqCst) + 1
    }

    /// The primary's WAL position from the first finished poll numbered `seq` or later, if one
    /// has finished.
    pub fn primary_lsn_since(&self, seq: u64) -> Option<u64> {
        let polls = self.polls.lock().unwrap_or_else(PoisonError::into_inner);
        polls.iter().find(|(s, _)| *s >= seq).map(|(_, lsn)| *lsn)
    }

    /// A session waits for WAL positions: poll fast for a while.
    pub fn want_fresh_lsn(&self) {
        self.demand.store(unix_ms(), Ordering::Relaxed);
    }

    pub(crate) fn fast_poll_wanted(&self) -> bool {
        unix_ms().saturating_sub(self.demand.load(Ordering::Relaxed)) < DEMAND_FOR_MS
    }

    /// Numbers a primary poll about to be sent.
    pub(crate) fn begin_primary_poll(&self) -> u64 {
        self.poll_started.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Records a finished primary poll.
    pub(crate) fn record_primary_poll(&self, primary: &Server, seq: u64, lsn: u64) {
        primary.lsn.fetch_max(lsn, Ordering::Relaxed);
        let mut polls = self.polls.lock().unwrap_or_else(PoisonError::into_inner);
        if polls.len() == POLLS_KEPT {
            polls.pop_front();
        }
        // Polls may finish out of order (health and fast loop): keep the list sorted.
        let at = polls.iter().rposition(|(s, _)| *s < seq).map_or(0, |i| i + 1);
        polls.insert(at, (seq, lsn));
    }

    /// The primary, if it may take statements (up, not drained).
    pub fn primary(&self) -> Option<Arc<Server>> {
        self.list().iter().find(|s| s.role == PgRole::Primary && s.is_available()).cloned()
    }

    /// The servers that may serve a read naming `tables`, the first choice first (the class's
    /// `[[postgres.share]]` if one is configured for `tables`, else the engine's `[balance]
    /// policy`, as for HTTP backends: by default the lower peak-EWMA cost of two random
    /// choices), the others after it by cost: replicas that hold every one of `tables`
    /// (`partial.rs`), are available (up, not ejected or drained), within the lag bounds (bytes
    /// and time) and (read-your-writes) past `min_lsn`; and the primary too with `[balance]
    /// read_from_primary` or a share for the class that names it. Empty when none may: the
    /// caller falls back to the primary. Under `policy = "affinity"` a read with an `affinity`
    /// key goes first to the replica that owns the key on the ring, unless it is loaded past
    /// the bound (`refract_core::membership::ring`).
    pub fn replicas_for_read(
        &self,
        min_lsn: Option<u64>,
        tables: &[String],
        affinity: Option<u64>,
    ) -> Vec<Arc<Server>> {
        let list = self.list();
        let mut readers: Vec<Arc<Server>> = list
            .iter()
            .filter(|s| s.role == PgRole::Replica || self.read_from_primary() || self.shares.names(&s.name))
            .filter(|s| s.is_available() && self.within_lag(s))
            .filter(|s| self.past(s, min_lsn) && s.holds().covers(tables))
            .cloned()
            .collect();
        if readers.is_empty() {
            return readers;
        }
        let first = match self.shares.pick(tables, &readers, |s| &s.name) {
            Some(i) => i,
            None => {
                // A primary a share named serves only its class's reads.
                readers.retain(|s| s.role == PgRole::Replica || self.read_from_primary());
                if readers.is_empty() {
                    return readers;
                }
                self.members.choose_keyed(&readers, affinity, |s| &s.member)
            }
        };
        let chosen = readers.remove(first);
        readers.sort_by(|a, b| a.member.cost().total_cmp(&b.member.cost()));
        readers.insert(0, chosen);
        readers
    }

    /// Whether the replica `s` is within the lag bounds (the primary always is).
    fn within_lag(&self, s: &Server) -> bool {
        (self.max_lag == 0 || s.lag_bytes() <= self.max_lag) && (self.max_lag_ms == 0 || s.lag_ms() <= self.max_lag_ms)
    }

    /// Whether `s` has replayed up to `min_lsn` (read-your-writes; the primary always has). A
    /// replica that has not asks for fresh WAL positions.
    fn past(&self, s: &Server, min_lsn: Option<u64>) -> bool {
        match min_lsn {
            _ if s.role == PgRole::Primary => true,
            None => true,
            Some(want) if s.lsn() >= want => true,
            Some(_) => {
                self.want_fresh_lsn();
                false
            }
        }
    }

    /// Whether the primary takes reads beside the replicas (`[balance] read_from_primary`).
    pub(crate) fn read_from_primary(&self) -> bool {
        self.members.balance().read_from_primary
    }

    /// A conversation with `s` failed (its connection broke, or it closed it): counted, and
    /// after `eject_after_failures` in a row the replica is ejected for `eject_ms`, as an HTTP
    /// backend would be.
    pub fn failed(&self, s: &Server) {
        s.member.record(false);
        let o = &self.overload;
        if s.member.note_outcome(false, o.eject_after_failures) {
            refract_core::membership::try_eject_in(
                &self.list(),
                &s.member,
                o.eject_ms,
                o.eject_max_fraction,
                "failures",
            );
        }
    }

    /// The engine's members, for its outlier check.
    pub(crate) fn members(&self) -> Vec<Arc<Backend>> {
        self.list().iter().map(|s| s.member.clone()).collect()
    }

    /// `s` starts taking reads (it `reason`: joined, came back up, was undrained): its cache is
    /// cold for them, and warming until its samples find it warm (`cache.rs`; only while the
    /// caches are sampled).
    pub fn cold(&self, s: &Server, reason: &'static str) {
        if self.cache_every.is_some() {
            let warm = s.cache_state().start_warming(reason, std::time::Instant::now(), unix_ms());
            s.log_warm(warm);
        }
    }

    /// How often the health loop samples each server's cache (`None`: never).
    pub(crate) fn cache_every(&self) -> Option<Duration> {
        self.cache_every
    }

    /// The `[overload]` the servers follow.
    pub(crate) fn overload(&self) -> &Overload {
        &self.overload
    }
}

/// One server's admission settings: `[overload]`, with the limit capped at `pool_size` (more
/// units in flight than connections would only queue in the pool, unmanaged) and starting
/// there, not at `initial_concurrency`: the pool size is the concurrency the operator stated,
/// and a limit starting lower would hold back transactions PgBouncer would run. It adapts from
/// there ([`Server::learn`]) down to `min_concurrency` (capped at `pool_size` too). The floor is
/// a trade-off: a limit below the number of transactions that wait on each other (a client
/// that keeps one open while it waits for another's) stalls them until their deadline, since
/// only new units wait (statements inside an open transaction never do); a floor at
/// `pool_size` keeps the limit fixed. When `max_queue_wait_ms` is 0 the wait is bounded by
/// `checkout_timeout_ms`, as the pool's was before admission.
pub(crate) fn admission_config(overload: &Overload, pg: &PgConfig) -> AdmissionConfig {
    let mut adm = overload.admission();
    let cap = pg.pool_size.max(1) as f64;
    adm.limit.max = adm.limit.max.min(cap);
    adm.limit.min = adm.limit.min.min(cap);
    adm.limit.initial = adm.limit.max;
    if adm.max_wait.is_zero() {
        adm.max_wait = Duration::from_millis(pg.checkout_timeout_ms);
    }
    adm
}

pub(crate) fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
