//! A backend: its identity, health, counters, and its pool of idle keep-alive connections.

use crate::config::{BackendConfig, Role};
use crate::metrics::BackendCounters;
use crate::overload::{Admission, AdmissionConfig, PeakEwma};
use bytes::BytesMut;
use refract_vocab::{FrontKind, MemberName};
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpStream;

/// Read buffer size of a backend connection.
const BACKEND_BUF: usize = 64 * 1024;

/// Opening a connection to a backend failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The connect failed.
    #[error("backend {backend}: connect failed: {source}")]
    Failed {
        /// The backend's name.
        backend: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The connect took too long.
    #[error("backend {backend}: connect timed out")]
    TimedOut {
        /// The backend's name.
        backend: String,
    },
}

/// One backend server.
#[derive(Debug)]
pub struct Backend {
    /// Unique name (across both front ends' members).
    pub name: String,
    /// The front end it belongs to.
    pub front: FrontKind,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Primary or replica.
    pub role: Role,
    up: AtomicBool,
    removed: AtomicBool,
    drained: AtomicBool,
    /// Its own cap on requests in flight, as configured (reload compares it).
    pub max_concurrency: Option<usize>,
    /// The tables it holds (a partial replica), as configured (reload compares it).
    pub holds: crate::partial::Holds,
    inflight: AtomicUsize,
    served: AtomicU64,
    errors: AtomicU64,
    /// Idle connections, one pool per worker (a socket belongs to one worker's event loop).
    idle: Vec<Mutex<Vec<BackendConn>>>,
    max_idle: usize,
    /// Request counters by class.
    pub counters: BackendCounters,
    /// Admission control: the adaptive limit and the wait queue.
    pub admission: Arc<Admission>,
    /// Peak-EWMA latency, for balancing.
    pub latency: PeakEwma,
    consecutive_failures: AtomicU32,
    /// Latencies observed since the last outlier check (see `membership::eject_slow`).
    window: crate::overload::LatencyWindow,
    /// Ejected until this instant (milliseconds since `EPOCH`); 0 = not ejected.
    ejected_until: AtomicU64,
}

/// Time base for ejection deadlines kept in atomics.
static EPOCH: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();

fn now_ms() -> u64 {
    let epoch = *EPOCH.get_or_init(tokio::time::Instant::now);
    (tokio::time::Instant::now() - epoch).as_millis() as u64 + 1
}

/// A connection to a backend with its read buffer (bytes read but not yet relayed).
#[derive(Debug)]
pub struct BackendConn {
    /// The socket.
    pub stream: TcpStream,
    /// Bytes read from it and not consumed yet.
    pub buf: BytesMut,
    /// Whether it came from the idle pool (a stale one may fail before any response byte).
    pub reused: bool,
}

/// What `/backends` shows for one backend.
#[derive(Debug, Serialize)]
pub struct BackendView {
    /// Name.
    pub name: String,
    /// Its front end: `"http"` or `"postgres"`.
    pub front: FrontKind,
    /// Address.
    pub addr: SocketAddr,
    /// Role.
    pub role: Role,
    /// "up", "down" or "ejected".
    pub state: &'static str,
    /// Current adaptive concurrency limit.
    pub limit: usize,
    /// Requests waiting for a slot.
    pub queued: usize,
    /// Peak-EWMA latency in milliseconds.
    pub latency_ms: f64,
    /// Requests in flight now.
    pub in_flight: usize,
    /// Requests completed.
    pub served: u64,
    /// Requests failed.
    pub errors: u64,
    /// Idle pooled connections.
    pub idle_connections: usize,
    /// Whether an operator drained it (`POST /backends/NAME/drain`).
    pub drained: bool,
}

/// Counts a request in flight on a backend for as long as it lives.
#[derive(Debug)]
pub struct InflightGuard(Arc<Backend>);

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Relaxed);
    }
}

impl Backend {
    /// A member of `front` from its configuration; it starts up (health checks correct that
    /// quickly).
    pub fn new(
        cfg: &BackendConfig,
        front: FrontKind,
        max_idle: usize,
        counters: BackendCounters,
        mut adm: AdmissionConfig,
    ) -> Self {
        if let Some(cap) = cfg.max_concurrency {
            adm.limit.max = cap as f64;
            adm.limit.initial = adm.limit.initial.min(cap as f64);
        }
        Backend {
            name: cfg.name.clone(),
            front,
            addr: cfg.addr,
            role: cfg.role,
            up: AtomicBool::new(true),
            removed: AtomicBool::new(false),
            drained: AtomicBool::new(false),
            max_concurrency: cfg.max_concurrency,
            holds: crate::partial::Holds::from_config(cfg.tables.as_deref()),
            inflight: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            idle: (0..crate::worker::count()).map(|_| Mutex::new(Vec::new())).collect(),
            max_idle,
            counters,
            admission: Admission::new(adm),
            latency: PeakEwma::new(Duration::ZERO, Duration::from_secs(10)),
            consecutive_failures: AtomicU32::new(0),
            window: Default::default(),
            ejected_until: AtomicU64::new(0),
        }
    }

    /// Its name and front end, as metrics label it.
    pub fn member(&self) -> MemberName<'_> {
        MemberName { name: &self.name, front: self.front }
    }

    /// Whether it is ejected for failing repeatedly.
    pub fn is_ejected(&self) -> bool {
        let until = self.ejected_until.load(Relaxed);
        until != 0 && now_ms() < until
    }

    /// Whether it may take a new request: up, not removed, not ejected, not drained.
    pub fn is_available(&self) -> bool {
        self.is_up() && !self.is_ejected() && !self.is_drained()
    }

    /// Whether an operator drained it (no new requests; those in flight finish).
    pub fn is_drained(&self) -> bool {
        self.drained.load(Relaxed)
    }

    /// Drains it (`true`: no new requests or connections, idle ones closed) or undrains it;
    /// returns whether that changed anything.
    pub fn set_drained(&self, drained: bool) -> bool {
        let was = self.drained.swap(drained, Relaxed);
        if drained {
            self.clear_idle();
        }
        was != drained
    }

    /// Counts a success (resets the failure streak) or a failure; returns true when this
    /// failure completes a streak of `threshold` (the caller decides whether to eject).
    pub fn note_outcome(&self, ok: bool, threshold: u32) -> bool {
        if ok {
            self.consecutive_failures.store(0, Relaxed);
            return false;
        }
        self.consecutive_failures.fetch_add(1, Relaxed) + 1 == threshold
    }

    /// Takes it out of rotation for `for_ms`.
    pub fn eject(&self, for_ms: u64) {
        self.ejected_until.store(now_ms() + for_ms, Relaxed);
        self.consecutive_failures.store(0, Relaxed);
    }

    /// Books the latency of one completed exchange: the balancer's estimate and the window
    /// the outlier check reads.
    pub fn observe(&self, rtt: Duration) {
        self.latency.observe(rtt);
        self.window.add(rtt);
    }

    /// The latencies since the last outlier check.
    pub fn window(&self) -> &crate::overload::LatencyWindow {
        &self.window
    }

    /// Balancing cost: peak-EWMA latency × (requests in flight + 1).
    pub fn cost(&self) -> f64 {
        self.latency.get() * (self.inflight() + 1) as f64
    }

    /// Whether it takes requests.
    pub fn is_up(&self) -> bool {
        self.up.load(Relaxed) && !self.removed.load(Relaxed)
    }

    /// Marks it up or down; returns whether that changed anything. Down drops idle connections.
    pub fn set_up(&self, up: bool) -> bool {
        let was = self.up.swap(up, Relaxed);
        if !up {
            self.clear_idle();
        }
        was != up
    }

    /// Marks it removed from membership: no new requests, no pooling.
    pub fn retire(&self) {
        self.removed.store(true, Relaxed);
        self.clear_idle();
    }

    /// Requests in flight.
    pub fn inflight(&self) -> usize {
        self.inflight.load(Relaxed)
    }

    /// Counts a request in flight until the guard drops.
    pub fn begin(self: &Arc<Self>) -> InflightGuard {
        self.inflight.fetch_add(1, Relaxed);
        InflightGuard(self.clone())
    }

    /// Counts a finished request.
    pub fn record(&self, ok: bool) {
        if ok {
            self.served.fetch_add(1, Relaxed);
        } else {
            self.errors.fetch_add(1, Relaxed);
        }
    }

    fn lock_idle(&self) -> std::sync::MutexGuard<'_, Vec<BackendConn>> {
        let pool = &self.idle[crate::worker::current() % self.idle.len()];
        pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn clear_idle(&self) {
        for pool in &self.idle {
            pool.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }

    /// An idle pooled connection that still looks alive, or a new one.
    pub async fn checkout(&self, connect_timeout: Duration) -> Result<BackendConn, ConnectError> {
        while let Some(conn) = self.pop_idle() {
            if looks_alive(&conn.stream) {
                return Ok(conn);
            }
        }
        self.connect(connect_timeout).await
    }

    fn pop_idle(&self) -> Option<BackendConn> {
        self.lock_idle().pop()
    }

    /// Opens a new connection.
    pub async fn connect(&self, timeout: Duration) -> Result<BackendConn, ConnectError> {
        let stream = match tokio::time::timeout(timeout, TcpStream::connect(self.addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(source)) => return Err(ConnectError::Failed { backend: self.name.clone(), source }),
            Err(_) => return Err(ConnectError::TimedOut { backend: self.name.clone() }),
        };
        let _ = stream.set_nodelay(true);
        Ok(BackendConn { stream, buf: BytesMut::with_capacity(BACKEND_BUF), reused: false })
    }

    /// Returns a connection whose exchange is complete to the idle pool.
    pub fn checkin(&self, mut conn: BackendConn) {
        if !conn.buf.is_empty() || !self.is_up() || self.is_drained() {
            return;
        }
        conn.reused = true;
        let mut idle = self.lock_idle();
        if idle.len() < self.max_idle {
            idle.push(conn);
        }
    }

    /// The admin view.
    pub fn view(&self) -> BackendView {
        let adm = self.admission.view();
        BackendView {
            name: self.name.clone(),
            front: self.front,
            addr: self.addr,
            role: self.role,
            state: match (self.up.load(Relaxed), self.is_ejected()) {
                (false, _) => "down",
                (true, true) => "ejected",
                (true, false) => "up",
            },
            limit: adm.limit,
            queued: adm.queued,
            latency_ms: self.latency.get() * 1000.0,
            in_flight: self.inflight(),
            served: self.served.load(Relaxed),
            errors: self.errors.load(Relaxed),
            drained: self.is_drained(),
            idle_connections: self.idle.iter().map(|p| p.lock().unwrap_or_else(|e| e.into_inner()).len()).sum(),
        }
    }
}

/// An idle connection is alive if reading it would block: data or EOF means the server closed
/// it (or broke protocol), and a request sent on it would fail.
fn looks_alive(stream: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}
