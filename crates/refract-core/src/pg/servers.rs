//! [`Servers`]: the primary and the replicas with their pools, admission control, health and
//! replication lag, and the choice of a server per statement; [`run_health`] probes them and
//! publishes their gauges.

use super::pool::Pool;
use super::server::{parse_lsn, Login, ServerConn};
use crate::config::pg::{PgConfig, PgRole};
use crate::metrics::{BackendCounters, Metrics};
use crate::overload::{Admission, AdmissionConfig};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

/// One server at run time.
#[derive(Debug)]
pub struct Server {
    /// Its name.
    pub name: String,
    /// Primary or replica.
    pub role: PgRole,
    /// Its connections.
    pub pool: Arc<Pool>,
    /// Its position in [`Servers::list`].
    pub index: usize,
    /// Its request counters (`pg:<name>`), looked up once.
    pub counters: BackendCounters,
    /// Admission control: the adaptive limit and the wait queue (`pg/admit.rs`).
    pub admission: Arc<Admission>,
    up: AtomicBool,
    /// Primary: current WAL position; replica: last replayed position (0 = unknown).
    lsn: AtomicU64,
    /// Replica: bytes behind the primary at the last poll.
    lag: AtomicU64,
    /// Replica: replay delay in milliseconds at the last poll (see [`REPLICA_PROBE`]).
    lag_ms: AtomicU64,
    /// When the last probe finished (Unix milliseconds; 0 = never).
    last_check: AtomicU64,
    login: Arc<Login>,
    addr: std::net::SocketAddr,
}

impl Server {
    /// Whether it passed its last check.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Marks it down (a connection to it failed); the health loop brings it back.
    pub fn mark_down(&self) {
        if self.up.swap(false, Ordering::Relaxed) {
            tracing::warn!(server = %self.name, "postgres server marked down");
            self.pool.clear();
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

    /// Publishes its gauges (health loop and `/metrics` scrape time). Lives here, not in
    /// `status`, so that the health loop does not reach back into the admin views.
    pub(super) fn publish(&self, metrics: &Metrics) {
        let name = format!("pg:{}", self.name);
        metrics.set_backend(&name, self.is_up(), self.pool.in_use());
        metrics.set_pg_pool(&name, self.pool.idle_count(), self.pool.in_use(), self.pool.waiting());
        metrics.set_admission(&name, &self.admission.view());
        if self.role == PgRole::Replica {
            metrics.set_pg_lag(&name, self.lag_bytes());
            metrics.set_pg_lag_seconds(&name, self.lag_ms() as f64 / 1000.0);
        }
    }
}

/// All servers.
#[derive(Debug)]
pub struct Servers {
    /// In configuration order.
    pub list: Vec<Arc<Server>>,
    primary: Arc<Server>,
    /// The replicas, in configuration order.
    replicas: Vec<Arc<Server>>,
    next: AtomicUsize,
    max_lag: u64,
    max_lag_ms: u64,
    /// Sequence number of the last primary WAL-position poll started (health or fast poll).
    poll_started: AtomicU64,
    /// Recent primary polls that finished: (sequence number, WAL position), oldest first.
    polls: Mutex<VecDeque<(u64, u64)>>,
    /// When a session last needed fresh WAL positions (Unix ms): fast polling runs while
    /// this is recent.
    demand: AtomicU64,
}

/// How many finished primary polls [`Servers::polls`] keeps.
const POLLS_KEPT: usize = 256;

/// The fast WAL-position poll interval (read-your-writes, while sessions wait for it).
pub const LSN_POLL: Duration = Duration::from_millis(10);

/// Fast polling goes on this long after the last session that needed it.
const DEMAND_FOR_MS: u64 = 2000;

impl Servers {
    /// Pools for every configured server; all start up (the first probe corrects that).
    pub fn new(cfg: &PgConfig, adm: &AdmissionConfig, metrics: &Metrics) -> Servers {
        let login = Arc::new(Login {
            user: cfg.server_user.clone(),
            password: cfg.server_password.clone(),
            database: cfg.database.clone(),
            timeout: Duration::from_millis(cfg.connect_timeout_ms),
        });
        let checkout = Duration::from_millis(cfg.checkout_timeout_ms);
        let list: Vec<Arc<Server>> = cfg
            .servers
            .iter()
            .enumerate()
            .map(|(index, s)| {
                Arc::new(Server {
                    name: s.name.clone(),
                    role: s.role,
                    pool: Pool::new(s.addr, login.clone(), cfg.pool_size, checkout),
                    index,
                    counters: metrics.backend(&format!("pg:{}", s.name)),
                    admission: Admission::new(adm.clone()),
                    up: AtomicBool::new(true),
                    lsn: AtomicU64::new(0),
                    lag: AtomicU64::new(0),
                    lag_ms: AtomicU64::new(0),
                    last_check: AtomicU64::new(0),
                    login: login.clone(),
                    addr: s.addr,
                })
            })
            .collect();
        // Validation guarantees exactly one primary.
        let primary = list.iter().find(|s| s.role == PgRole::Primary).cloned().unwrap_or_else(|| list[0].clone());
        let replicas = list.iter().filter(|s| s.role == PgRole::Replica).cloned().collect();
        Servers {
            list,
            primary,
            replicas,
            next: AtomicUsize::new(0),
            max_lag: cfg.max_lag_bytes,
            max_lag_ms: cfg.max_lag_ms,
            poll_started: AtomicU64::new(0),
            polls: Mutex::new(VecDeque::with_capacity(POLLS_KEPT)),
            demand: AtomicU64::new(0),
        }
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
        let polls = self.polls.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        polls.iter().find(|(s, _)| *s >= seq).map(|(_, lsn)| *lsn)
    }

    /// A session waits for WAL positions: poll fast for a while.
    pub fn want_fresh_lsn(&self) {
        self.demand.store(unix_ms(), Ordering::Relaxed);
    }

    fn fast_poll_wanted(&self) -> bool {
        unix_ms().saturating_sub(self.demand.load(Ordering::Relaxed)) < DEMAND_FOR_MS
    }

    /// Numbers a primary poll about to be sent.
    fn begin_primary_poll(&self) -> u64 {
        self.poll_started.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Records a finished primary poll.
    fn record_primary_poll(&self, seq: u64, lsn: u64) {
        self.primary.lsn.fetch_max(lsn, Ordering::Relaxed);
        let mut polls = self.polls.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if polls.len() == POLLS_KEPT {
            polls.pop_front();
        }
        // Polls may finish out of order (health and fast loop): keep the list sorted.
        let at = polls.iter().rposition(|(s, _)| *s < seq).map_or(0, |i| i + 1);
        polls.insert(at, (seq, lsn));
    }

    /// The primary, if it is up.
    pub fn primary(&self) -> Option<Arc<Server>> {
        self.primary.is_up().then(|| self.primary.clone())
    }

    /// Replicas that may serve a read, round robin from the next one: up, within the lag bounds
    /// (bytes and time), and (read-your-writes) past `min_lsn`.
    pub fn replicas_for_read(&self, min_lsn: Option<u64>) -> Vec<Arc<Server>> {
        let replicas = &self.replicas;
        if replicas.is_empty() {
            return vec![];
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..replicas.len())
            .map(|i| &replicas[(start + i) % replicas.len()])
            .filter(|s| s.is_up() && (self.max_lag == 0 || s.lag_bytes() <= self.max_lag))
            .filter(|s| self.max_lag_ms == 0 || s.lag_ms() <= self.max_lag_ms)
            .filter(|s| match min_lsn {
                None => true,
                Some(want) if s.lsn() >= want => true,
                Some(_) => {
                    self.want_fresh_lsn();
                    false
                }
            })
            .cloned()
            .collect()
    }
}

/// Probes every server each interval until `stop`: up/down, WAL positions, lag; keeps
/// `min_idle` connections open on healthy servers and publishes gauges.
pub async fn run_health(
    servers: Arc<Servers>,
    interval: Duration,
    min_idle: usize,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut probes: Vec<Option<ServerConn>> = servers.list.iter().map(|_| None).collect();
    loop {
        let primary_lsn = probe_all(&servers, &mut probes).await;
        for s in &servers.list {
            if s.role == PgRole::Replica {
                let lag = match (primary_lsn, s.lsn()) {
                    (Some(p), r) if r > 0 => p.saturating_sub(r),
                    _ => s.lag.load(Ordering::Relaxed),
                };
                s.lag.store(lag, Ordering::Relaxed);
            }
            if s.is_up() {
                let _ = s.pool.fill_to(min_idle).await;
            }
            s.publish(&metrics);
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Read-your-writes: while sessions wait for a replica to pass their writes, polls the
/// primary's WAL position and the replicas' replay positions every [`LSN_POLL`], each on a
/// dedicated connection (one tiny query per server); idle otherwise.
pub async fn run_lsn_poll(servers: Arc<Servers>, stop: CancellationToken) {
    let mut conns: Vec<Option<ServerConn>> = servers.list.iter().map(|_| None).collect();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(LSN_POLL) => {}
            _ = stop.cancelled() => return,
        }
        if !servers.fast_poll_wanted() {
            continue;
        }
        for (s, conn) in servers.list.iter().zip(conns.iter_mut()) {
            if !s.is_up() {
                *conn = None;
                continue;
            }
            let seq = (s.role == PgRole::Primary).then(|| servers.begin_primary_poll());
            let sql = match s.role {
                PgRole::Primary => "SELECT pg_current_wal_lsn()::text",
                PgRole::Replica => "SELECT coalesce(pg_last_wal_replay_lsn(), '0/0')::text",
            };
            let Some(lsn) = poll_lsn(s, conn, sql).await else {
                *conn = None;
                continue;
            };
            match seq {
                Some(seq) => servers.record_primary_poll(seq, lsn),
                None => drop(s.lsn.fetch_max(lsn, Ordering::Relaxed)),
            }
        }
    }
}

/// One WAL position from `sql` on `conn` (connected first if need be).
async fn poll_lsn(s: &Server, conn: &mut Option<ServerConn>, sql: &str) -> Option<u64> {
    if conn.is_none() {
        *conn = ServerConn::connect(s.addr, &s.login).await.ok();
    }
    let lsn = tokio::time::timeout(s.login.timeout, conn.as_mut()?.query_one(sql)).await.ok()?.ok()??;
    parse_lsn(&lsn)
}

/// Probes each server; returns the primary's WAL position if it answered.
async fn probe_all(servers: &Servers, probes: &mut [Option<ServerConn>]) -> Option<u64> {
    let mut primary_lsn = None;
    for (s, probe) in servers.list.iter().zip(probes.iter_mut()) {
        let seq = (s.role == PgRole::Primary).then(|| servers.begin_primary_poll());
        let result = probe_one(s, probe).await;
        s.last_check.store(unix_ms(), Ordering::Relaxed);
        match result {
            Some((lsn, lag_ms)) => {
                match seq {
                    Some(seq) => servers.record_primary_poll(seq, lsn),
                    None => s.lsn.store(lsn, Ordering::Relaxed),
                }
                s.lag_ms.store(lag_ms, Ordering::Relaxed);
                if !s.up.swap(true, Ordering::Relaxed) {
                    tracing::info!(server = %s.name, "postgres server up");
                }
                if s.role == PgRole::Primary {
                    primary_lsn = Some(lsn);
                }
            }
            None => {
                *probe = None;
                s.mark_down();
            }
        }
    }
    primary_lsn
}

/// The primary's probe: its WAL position.
const PRIMARY_PROBE: &str = "SELECT pg_current_wal_lsn()::text, 0";

/// A replica's probe: its replay position, and its replay delay in milliseconds, measured on
/// the replica as `now() - pg_last_xact_replay_timestamp()` but only while it has received WAL
/// it has not replayed yet (`pg_last_wal_receive_lsn() > pg_last_wal_replay_lsn()`). An idle
/// replica that has replayed everything is not lagging however old its last replayed commit
/// is; one that has replayed no commit since it started counts 0.
pub(super) const REPLICA_PROBE: &str = "SELECT coalesce(pg_last_wal_replay_lsn(), '0/0')::text, \
     CASE WHEN pg_last_wal_receive_lsn() > pg_last_wal_replay_lsn() \
     THEN greatest(0, coalesce((extract(epoch FROM now() - pg_last_xact_replay_timestamp()) * 1000)::bigint, 0)) \
     ELSE 0 END";

/// (WAL position, replay delay in ms) if the server answered.
async fn probe_one(s: &Server, probe: &mut Option<ServerConn>) -> Option<(u64, u64)> {
    if probe.is_none() {
        *probe = ServerConn::connect(s.addr, &s.login).await.ok();
    }
    let conn = probe.as_mut()?;
    let sql = match s.role {
        PgRole::Primary => PRIMARY_PROBE,
        PgRole::Replica => REPLICA_PROBE,
    };
    let rows = tokio::time::timeout(s.login.timeout, conn.query(sql)).await.ok()?.ok()?;
    let row = rows.into_iter().next()?;
    let lsn = parse_lsn(row.first()?.as_deref()?)?;
    let lag_ms = row.get(1).and_then(|v| v.as_deref()).and_then(|v| v.parse().ok()).unwrap_or(0);
    Some((lsn, lag_ms))
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
