//! A backend: its identity, health, counters, and its pool of idle keep-alive connections.

use crate::config::{BackendConfig, Role};
use crate::error::Error;
use crate::metrics::BackendCounters;
use bytes::BytesMut;
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpStream;

/// Read buffer size of a backend connection.
const BACKEND_BUF: usize = 64 * 1024;

/// One backend server.
#[derive(Debug)]
pub struct Backend {
    /// Unique name.
    pub name: String,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Primary or replica.
    pub role: Role,
    up: AtomicBool,
    removed: AtomicBool,
    inflight: AtomicUsize,
    served: AtomicU64,
    errors: AtomicU64,
    idle: Mutex<Vec<BackendConn>>,
    max_idle: usize,
    /// Request counters by class.
    pub counters: BackendCounters,
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
    /// Address.
    pub addr: SocketAddr,
    /// Role.
    pub role: Role,
    /// "up" or "down".
    pub state: &'static str,
    /// Requests in flight now.
    pub in_flight: usize,
    /// Requests completed.
    pub served: u64,
    /// Requests failed.
    pub errors: u64,
    /// Idle pooled connections.
    pub idle_connections: usize,
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
    /// A backend from its configuration; it starts up (health checks correct that quickly).
    pub fn new(cfg: &BackendConfig, max_idle: usize, counters: BackendCounters) -> Self {
        Backend {
            name: cfg.name.clone(),
            addr: cfg.addr,
            role: cfg.role,
            up: AtomicBool::new(true),
            removed: AtomicBool::new(false),
            inflight: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            idle: Mutex::new(Vec::new()),
            max_idle,
            counters,
        }
    }

    /// Whether it takes requests.
    pub fn is_up(&self) -> bool {
        self.up.load(Relaxed) && !self.removed.load(Relaxed)
    }

    /// Marks it up or down; returns whether that changed anything. Down drops idle connections.
    pub fn set_up(&self, up: bool) -> bool {
        let was = self.up.swap(up, Relaxed);
        if !up {
            self.lock_idle().clear();
        }
        was != up
    }

    /// Marks it removed from membership: no new requests, no pooling.
    pub fn retire(&self) {
        self.removed.store(true, Relaxed);
        self.lock_idle().clear();
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
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle pooled connection that still looks alive, or a new one.
    pub async fn checkout(&self, connect_timeout: Duration) -> Result<BackendConn, Error> {
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
    pub async fn connect(&self, timeout: Duration) -> Result<BackendConn, Error> {
        let stream = match tokio::time::timeout(timeout, TcpStream::connect(self.addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(source)) => return Err(Error::Connect { backend: self.name.clone(), source }),
            Err(_) => return Err(Error::ConnectTimeout { backend: self.name.clone() }),
        };
        let _ = stream.set_nodelay(true);
        Ok(BackendConn { stream, buf: BytesMut::with_capacity(BACKEND_BUF), reused: false })
    }

    /// Returns a connection whose exchange is complete to the idle pool.
    pub fn checkin(&self, mut conn: BackendConn) {
        if !conn.buf.is_empty() || !self.is_up() {
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
        BackendView {
            name: self.name.clone(),
            addr: self.addr,
            role: self.role,
            state: if self.up.load(Relaxed) { "up" } else { "down" },
            in_flight: self.inflight(),
            served: self.served.load(Relaxed),
            errors: self.errors.load(Relaxed),
            idle_connections: self.lock_idle().len(),
        }
    }
}

/// An idle connection is alive if reading it would block: data or EOF means the server closed
/// it (or broke protocol), and a request sent on it would fail.
fn looks_alive(stream: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}
