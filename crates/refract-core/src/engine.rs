//! The engine's loops, for any protocol: binds each front end's client listener, starts the
//! front ends' background work, accepts and places client connections, and drains on
//! shutdown. Either one event loop per worker (`run_workers`) or one multi-threaded runtime
//! (`start`). What a connection speaks is the [`Front`]'s business; the engine never names a
//! protocol.

use crate::accept::{accept_each, named, OpenConnection};
use crate::config::{AcceptMode, Config};
use crate::ctx::Ctx;
use prometheus_client::metrics::gauge::Gauge;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

/// A session's future, as a front end returns it.
pub type Serving = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A front end the engine runs: a protocol's sessions (HTTP, PostgreSQL), or a service
/// without client connections (the admin API).
pub trait Front: Send + Sync + 'static {
    /// Its name in logs and in the accept metrics (`http`, `postgres`).
    fn name(&self) -> &'static str;

    /// The config key and address of its client listener, if it has one.
    fn listener(&self, cfg: &Config) -> Option<(&'static str, SocketAddr)>;

    /// Whether a drain waits for its sessions. PostgreSQL's are not waited for: an idle client
    /// may stay connected for hours.
    fn drained(&self) -> bool {
        true
    }

    /// Starts its background work (health checks, probes, its own listeners), once per
    /// dispatcher, on the current runtime (worker 0 with the per-core runtime).
    fn start(&self, ctx: &Arc<Ctx>) -> std::io::Result<()>;

    /// Serves one client connection, on the current runtime.
    fn serve(&self, ctx: Arc<Ctx>, stream: TcpStream, peer: SocketAddr) -> Serving;
}

/// The front ends of one dispatcher, in the order they start.
pub type Fronts = Arc<[Arc<dyn Front>]>;

/// A dispatcher running on a multi-threaded runtime (`runtime = "work-stealing"`, tests).
pub struct Running {
    ctx: Arc<Ctx>,
    bound: Vec<Option<SocketAddr>>,
    sessions: TaskTracker,
}

/// Binds every front end's listener, starts the front ends and serves on the current runtime.
pub async fn start(ctx: Arc<Ctx>, fronts: Fronts) -> std::io::Result<Running> {
    let mut listeners = Vec::new();
    for f in fronts.iter() {
        listeners.push(match f.listener(&ctx.cfg) {
            Some((key, addr)) => Some(TcpListener::bind(addr).await.map_err(named(key, addr))?),
            None => None,
        });
    }
    let bound = listeners.iter().map(|l| l.as_ref().and_then(|l| l.local_addr().ok())).collect();
    for f in fronts.iter() {
        f.start(&ctx)?;
    }
    let sessions = TaskTracker::new();
    for (f, listener) in fronts.iter().zip(listeners) {
        if let Some(listener) = listener {
            tokio::spawn(accept_loop(ctx.clone(), f.clone(), listener, sessions.clone()));
        }
    }
    Ok(Running { ctx, bound, sessions })
}

impl Running {
    /// The address front end `i` listens on (bound, so port 0 is resolved).
    pub fn bound(&self, i: usize) -> Option<SocketAddr> {
        self.bound.get(i).copied().flatten()
    }

    /// The shared state.
    pub fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// Stops accepting, lets in-flight sessions of drained front ends finish (at most
    /// `drain_ms`), then returns whether every one ended in time.
    pub async fn shutdown(self) -> bool {
        self.ctx.stop.cancel();
        self.sessions.close();
        let drain = Duration::from_millis(self.ctx.cfg.timeouts.drain_ms);
        let drained = tokio::time::timeout(drain, self.sessions.wait()).await.is_ok();
        self.ctx.drain_ended(self.sessions.len(), None);
        drained
    }
}

/// Serves one accepted connection of `front`, counted open on `open` until it ends; tracked by
/// `sessions` when the front end's sessions are drained. A panic in the session ends that session only (`refract_process::contain`).
fn spawn_session(ctx: Arc<Ctx>, front: &dyn Front, sessions: &TaskTracker, open: OpenConnection, s: Accepted) {
    let session = front.serve(ctx, s.0, s.1);
    let run = refract_process::contain("connection", async move {
        if refract_process::failpoint::is("session-panic") {
            panic!("failpoint session-panic");
        }
        session.await;
        drop(open);
    });
    match front.drained() {
        true => drop(sessions.spawn(run)),
        false => drop(tokio::spawn(run)),
    }
}

/// A connection and its peer.
type Accepted = (TcpStream, SocketAddr);

async fn accept_loop(ctx: Arc<Ctx>, front: Arc<dyn Front>, listener: TcpListener, sessions: TaskTracker) {
    let serve = ctx.clone();
    accept_each(&ctx.stop, &ctx.metrics, front.name(), listener, |stream, peer| {
        let open = OpenConnection::count(serve.metrics.open_connections(crate::worker::current()));
        spawn_session(serve.clone(), front.as_ref(), &sessions, open, (stream, peer));
    })
    .await;
}

/// Runs the dispatcher with one single-threaded event loop per worker, each serving the client
/// connections placed on it (`accept = "balanced"`) or accepted on its own `SO_REUSEPORT`
/// listener (`reuseport`) and keeping its own backend connections, like HAProxy's threads:
/// a connection never changes thread, so no request pays a cross-thread wake-up. Every front
/// end listens the same way; worker 0 also starts the front ends' background work. Returns
/// after `stop` and the drain.
pub fn run_workers(ctx: Arc<Ctx>, fronts: Fronts, workers: usize) -> std::io::Result<()> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let mut threads = Vec::new();
    let (mut spread, mut inboxes) = match ctx.cfg.listen.accept {
        AcceptMode::Reuseport => (None, Vec::new()),
        AcceptMode::Balanced => {
            let (txs, rxs): (Vec<_>, Vec<_>) = (0..workers).map(|_| mpsc::unbounded_channel()).unzip();
            let load = (0..workers).map(|i| ctx.metrics.open_connections(i)).collect();
            (Some(Arc::new(Spread { inboxes: txs, load })), rxs.into_iter().map(Some).collect())
        }
    };
    for i in 0..workers {
        let (ctx, ready, fronts) = (ctx.clone(), ready_tx.clone(), fronts.clone());
        let feed =
            spread.as_ref().map(|s| Feed { spread: s.clone(), inbox: inboxes.get_mut(i).and_then(Option::take) });
        let t = std::thread::Builder::new()
            .name(format!("refract-{i}"))
            .spawn(move || worker_main(ctx, fronts, i, feed, ready))?;
        threads.push(t);
    }
    spread.take();
    inboxes.clear();
    drop(ready_tx);
    let mut first_error = None;
    for r in ready_rx.iter().take(workers) {
        if let Err(e) = r {
            ctx.stop.cancel();
            first_error.get_or_insert(e);
        }
    }
    if first_error.is_none() {
        tracing::info!(workers, "dispatcher listening");
    }
    for t in threads {
        let _ = t.join();
    }
    first_error.map_or(Ok(()), Err)
}

/// Balanced accept: each worker's inbox of accepted connections, and its open client
/// connections (every front end's; the `refract_client_connections_open` gauges).
struct Spread {
    inboxes: Vec<mpsc::UnboundedSender<Placed>>,
    load: Vec<Gauge>,
}

/// A client connection of front end `front` accepted on worker 0 for some worker to serve.
struct Placed {
    front: usize,
    stream: std::net::TcpStream,
    peer: SocketAddr,
}

/// One worker's part in balanced accept.
struct Feed {
    spread: Arc<Spread>,
    inbox: Option<mpsc::UnboundedReceiver<Placed>>,
}

/// How long balanced accept waits for a new connection's first bytes before placing it anyway.
const FIRST_BYTES_WAIT: Duration = Duration::from_millis(100);

impl Spread {
    /// Places a connection on the worker with the fewest open client connections once its
    /// client has sent something (HTTP and PostgreSQL clients speak first), or after
    /// [`FIRST_BYTES_WAIT`]. A connection closed before it sent anything is closed here, never
    /// counted: wrk, health checkers and port scanners open such probes just before their real
    /// connections, and counting them on a worker until its loop notices the close put the real
    /// connections on one worker.
    fn place_when_spoken(self: &Arc<Self>, front: usize, stream: TcpStream, peer: SocketAddr) {
        let spread = self.clone();
        drop(tokio::spawn(async move {
            let mut first = [0u8; 1];
            // Closed or reset before a byte arrived: nothing to serve. Data, or no word within
            // the wait: place it.
            if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(FIRST_BYTES_WAIT, stream.peek(&mut first)).await {
                return;
            }
            if let Ok(stream) = stream.into_std() {
                spread.send(Placed { front, stream, peer });
            }
        }));
    }

    fn send(&self, placed: Placed) {
        let j = least_loaded(&self.load.iter().map(Gauge::get).collect::<Vec<_>>());
        self.load[j].inc();
        if self.inboxes[j].send(placed).is_err() {
            self.load[j].dec();
        }
    }
}

/// The worker with the fewest open client connections (the lowest index on a tie).
fn least_loaded(load: &[i64]) -> usize {
    (0..load.len()).min_by_key(|&j| load[j]).unwrap_or(0)
}

/// Balanced accept, worker `i`'s side: serves the connections placed in its inbox (worker 0
/// also accepts on the one listener of each front end and places them).
async fn serve_inbox(ctx: Arc<Ctx>, fronts: Fronts, i: usize, feed: Feed, listeners: Listeners, sessions: TaskTracker) {
    let Feed { spread, inbox } = feed;
    let Some(mut inbox) = inbox else { return };
    for (f, listener) in listeners {
        let (ctx, spread, name) = (ctx.clone(), spread.clone(), fronts[f].name());
        tokio::spawn(async move {
            accept_each(&ctx.stop, &ctx.metrics, name, listener, |s, peer| spread.place_when_spoken(f, s, peer)).await
        });
    }
    loop {
        let placed = tokio::select! {
            s = inbox.recv() => match s { Some(s) => s, None => return },
            _ = ctx.stop.cancelled() => return,
        };
        // Counted on this worker when it was placed.
        let open = OpenConnection::counted(spread.load[i].clone());
        if refract_process::failpoint::is("worker-panic") {
            panic!("failpoint worker-panic: event loop {i}");
        }
        match TcpStream::from_std(placed.stream) {
            Ok(stream) => {
                spawn_session(ctx.clone(), fronts[placed.front].as_ref(), &sessions, open, (stream, placed.peer))
            }
            Err(e) => {
                drop(open);
                tracing::warn!(error = %e, "could not register a client connection");
            }
        }
    }
}

/// Each front end's listener on this worker, by front end index.
type Listeners = Vec<(usize, TcpListener)>;

/// The listeners worker `i` binds: with reuseport one per front end on every worker, with
/// balanced accept only on worker 0.
fn bind_listeners(cfg: &Config, fronts: &Fronts, i: usize, balanced: bool) -> std::io::Result<Listeners> {
    let mut out = Vec::new();
    if balanced && i > 0 {
        return Ok(out);
    }
    for (f, front) in fronts.iter().enumerate() {
        if let Some((key, addr)) = front.listener(cfg) {
            out.push((f, bind(key, addr, !balanced)?));
        }
    }
    Ok(out)
}

fn worker_main(
    ctx: Arc<Ctx>,
    fronts: Fronts,
    i: usize,
    feed: Option<Feed>,
    ready: std::sync::mpsc::Sender<std::io::Result<()>>,
) {
    crate::worker::enter(i);
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    rt.block_on(worker_serve(ctx, fronts, i, feed, ready));
    // Tasks still there are dropped; blocking work is not waited for past the grace.
    rt.shutdown_timeout(RUNTIME_GRACE);
}

/// How long a stopping runtime waits for its blocking work (a file write) to finish.
pub const RUNTIME_GRACE: Duration = Duration::from_millis(200);

/// Shard `i`'s event loop: binds, reports to `ready`, serves until `stop`, then drains.
async fn worker_serve(
    ctx: Arc<Ctx>,
    fronts: Fronts,
    i: usize,
    feed: Option<Feed>,
    ready: std::sync::mpsc::Sender<std::io::Result<()>>,
) {
    let started = async {
        let listeners = bind_listeners(&ctx.cfg, &fronts, i, feed.is_some())?;
        if i == 0 {
            for f in fronts.iter() {
                f.start(&ctx)?;
            }
        }
        Ok::<_, std::io::Error>(listeners)
    };
    let listeners = match started.await {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    if ctx.cfg.listen.busy_poll_us > 0 {
        let window = Duration::from_micros(ctx.cfg.listen.busy_poll_us);
        drop(tokio::spawn(crate::spin::run(window, ctx.metrics.busy_poll_seconds.clone())));
    }
    let sessions = TaskTracker::new();
    match feed {
        Some(feed) => serve_inbox(ctx.clone(), fronts, i, feed, listeners, sessions.clone()).await,
        None => {
            let loops = listeners
                .into_iter()
                .map(|(f, l)| tokio::spawn(accept_loop(ctx.clone(), fronts[f].clone(), l, sessions.clone())));
            for l in loops.collect::<Vec<_>>() {
                let _ = l.await;
            }
        }
    }
    sessions.close();
    let drain = Duration::from_millis(ctx.cfg.timeouts.drain_ms);
    let _ = tokio::time::timeout(drain, sessions.wait()).await;
    ctx.drain_ended(sessions.len(), Some(i));
}

/// A listener for config key `key` on `addr` with a backlog of 1024; with `reuseport` it
/// shares its address with the other workers' (the kernel spreads connections).
fn bind(key: &'static str, addr: SocketAddr, reuseport: bool) -> std::io::Result<TcpListener> {
    bind_plain(addr, reuseport).map_err(named(key, addr))
}

fn bind_plain(addr: SocketAddr, reuseport: bool) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(reuseport)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_accept_picks_the_least_loaded_worker() {
        assert_eq!(least_loaded(&[3, 1, 2]), 1);
        assert_eq!(least_loaded(&[3, 6, 2]), 2);
        assert_eq!(least_loaded(&[0, 0]), 0, "ties go to the lowest worker");
        assert_eq!(least_loaded(&[1, 0]), 1, "two connections land on two workers");
    }
}
