//! The dispatcher: binds the listeners, runs the accept loop, health checks and admin, and
//! drains in-flight requests on shutdown.

use crate::config::{AcceptMode, Config};
use crate::live::{Live, LiveClassifier, LiveConfig};
use crate::membership::Membership;
use crate::metrics::Metrics;
use crate::overload::{RetryBudget, UserLimits};
use crate::{admin, health, session};
use prometheus_client::metrics::gauge::Gauge;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What every session shares.
pub struct Ctx {
    /// The configuration in force (a reload swaps it whole; see `live`).
    pub cfg: LiveConfig,
    /// The backends.
    pub members: Membership,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Request classification (from the configuration in force).
    pub classifier: LiveClassifier,
    /// Cancelled when the dispatcher starts draining.
    pub stop: CancellationToken,
    /// Retries allowed (shared by all sessions).
    pub budget: RetryBudget,
    /// Per-user token buckets.
    pub users: UserLimits,
    /// The PostgreSQL front end's shared state, once it runs (for the admin `/pg/*` views).
    pub(crate) pg: std::sync::OnceLock<Arc<crate::pg::Shared>>,
    /// The file the configuration came from, which a reload reads again.
    pub config_path: std::sync::OnceLock<std::path::PathBuf>,
    /// Set when a drain ended with sessions still open.
    pub drain_timed_out: std::sync::atomic::AtomicBool,
}

/// A running dispatcher.
pub struct Dispatcher {
    ctx: Arc<Ctx>,
    http_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    sessions: TaskTracker,
}

impl Ctx {
    /// The shared state for a configuration.
    pub fn new(cfg: Config) -> Arc<Ctx> {
        let metrics = Arc::new(Metrics::new());
        let members = Membership::new(
            &cfg.backend_list(),
            cfg.balance.clone(),
            cfg.limits.max_idle_per_backend,
            metrics.clone(),
            &cfg.overload,
        );
        let o = &cfg.overload;
        let budget = RetryBudget::new(o.retry_budget_ratio, o.retry_budget_floor, 100.0);
        let users = UserLimits::new(o.users.iter().map(|u| (u.name.as_str(), u.rate, u.burst)));
        let (stop, pg) = (CancellationToken::new(), std::sync::OnceLock::new());
        let live = Live::new(cfg);
        let (cfg, classifier) = (LiveConfig(live.clone()), LiveClassifier(live));
        let (config_path, drain_timed_out) = (Default::default(), Default::default());
        Arc::new(Ctx { cfg, members, metrics, classifier, stop, budget, users, pg, config_path, drain_timed_out })
    }

    /// Puts a validated configuration in force (a reload has already applied its membership
    /// and kept the parts that need a restart).
    pub(crate) fn replace_config(&self, cfg: Config) {
        self.cfg.0.replace(cfg);
    }

    /// Notes a drain that ended with `left` sessions still open.
    fn drain_ended(&self, left: usize, shard: Option<usize>) {
        if left > 0 {
            self.drain_timed_out.store(true, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(?shard, left, "drain timeout: closing remaining connections");
        }
    }

    /// Starts the side services on the current runtime: health checks, the PostgreSQL front
    /// end (only its background work when `sharded`: every shard listens itself), the admin
    /// listener. Returns the admin address.
    async fn start_services(self: &Arc<Self>, sharded: bool) -> std::io::Result<Option<SocketAddr>> {
        tokio::spawn(health::run(self.clone()));
        crate::handover::prepare(self);
        match self.cfg.postgres.clone() {
            Some(pg) if sharded => crate::pg::start_background(self, &pg),
            Some(pg) => crate::pg::start(self.clone(), pg).await?,
            None => {}
        }
        if let Some(path) = &self.cfg.listen.admin_socket {
            let listener = admin::bind_socket(path, self.cfg.admin.socket_mode)
                .map_err(|e| std::io::Error::new(e.kind(), format!("[listen] admin_socket {}: {e}", path.display())))?;
            tokio::spawn(admin::serve(self.clone(), listener));
        }
        let Some(addr) = self.cfg.listen.admin else { return Ok(None) };
        let listener = TcpListener::bind(addr).await.map_err(named("[listen] admin", addr))?;
        let bound = listener.local_addr()?;
        tokio::spawn(admin::serve(self.clone(), listener));
        Ok(Some(bound))
    }
}

impl Dispatcher {
    /// Binds the listeners and starts serving on the current runtime.
    pub async fn start(cfg: Config) -> std::io::Result<Dispatcher> {
        let ctx = Ctx::new(cfg);
        let http = ctx.cfg.listen.http;
        let listener = TcpListener::bind(http).await.map_err(named("[listen] http", http))?;
        let http_addr = listener.local_addr()?;
        let admin_addr = ctx.start_services(false).await?;
        let sessions = TaskTracker::new();
        tokio::spawn(accept_loop(ctx.clone(), listener, sessions.clone()));
        tracing::info!(http = %http_addr, admin = ?admin_addr, "dispatcher listening");
        Ok(Dispatcher { ctx, http_addr, admin_addr, sessions })
    }

    /// The bound client address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The bound admin address.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The shared context (for tests and embedding).
    pub fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// Stops accepting, lets in-flight requests finish (at most `drain_ms`), then returns
    /// whether every session ended in time.
    pub async fn shutdown(self) -> bool {
        self.ctx.stop.cancel();
        self.sessions.close();
        let drain = Duration::from_millis(self.ctx.cfg.timeouts.drain_ms);
        let drained = tokio::time::timeout(drain, self.sessions.wait()).await.is_ok();
        self.ctx.drain_ended(self.sessions.len(), None);
        drained
    }
}

async fn accept_loop(ctx: Arc<Ctx>, listener: TcpListener, sessions: TaskTracker) {
    let serve = ctx.clone();
    accept_each(&ctx.stop, &ctx.metrics, "http", listener, |stream, _| {
        let open = OpenConnection::count(serve.metrics.open_connections(crate::shard::current()));
        let serve = serve.clone();
        sessions.spawn(async move {
            session::run(serve, stream).await;
            drop(open);
        });
    })
    .await;
}

/// A client connection counted as open on its event loop (`refract_client_connections_open`)
/// until dropped.
pub(crate) struct OpenConnection(Gauge);

impl OpenConnection {
    /// Counts a new connection on `gauge`.
    pub(crate) fn count(gauge: Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Accepts client connections (HTTP or PostgreSQL, `what`) until `stop`, counting each and
/// handing it (with `TCP_NODELAY`) and its peer address to `place`.
pub(crate) async fn accept_each(
    stop: &CancellationToken,
    metrics: &Metrics,
    what: &'static str,
    listener: TcpListener,
    mut place: impl FnMut(TcpStream, SocketAddr),
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.cancelled() => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                metrics.connections.inc();
                place(stream, peer);
            }
            Err(e) => {
                // Out of descriptors or similar: back off instead of spinning.
                tracing::warn!(error = %e, listener = what, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Runs the dispatcher with one single-threaded event loop per shard, each serving the client
/// connections placed on it (`accept = "balanced"`) or accepted on its own `SO_REUSEPORT`
/// listener (`reuseport`) and keeping its own backend connections, like HAProxy's threads:
/// a connection never changes thread, so no request pays a cross-thread wake-up. The
/// PostgreSQL front end listens the same way on every shard; shard 0 also runs health checks,
/// the PostgreSQL servers' probes and admin. Returns after `stop` and the drain.
pub fn run_sharded(ctx: Arc<Ctx>, shards: usize) -> std::io::Result<()> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let mut threads = Vec::new();
    let (mut spread, mut inboxes) = match ctx.cfg.listen.accept {
        AcceptMode::Reuseport => (None, Vec::new()),
        AcceptMode::Balanced => {
            let (txs, rxs): (Vec<_>, Vec<_>) = (0..shards).map(|_| mpsc::unbounded_channel()).unzip();
            let load = (0..shards).map(|i| ctx.metrics.open_connections(i)).collect();
            (Some(Arc::new(Spread { inboxes: txs, load })), rxs.into_iter().map(Some).collect())
        }
    };
    for i in 0..shards {
        let (ctx, ready) = (ctx.clone(), ready_tx.clone());
        let feed =
            spread.as_ref().map(|s| Feed { spread: s.clone(), inbox: inboxes.get_mut(i).and_then(Option::take) });
        let t =
            std::thread::Builder::new().name(format!("refract-{i}")).spawn(move || shard_main(ctx, i, feed, ready))?;
        threads.push(t);
    }
    spread.take();
    inboxes.clear();
    drop(ready_tx);
    let mut first_error = None;
    for r in ready_rx.iter().take(shards) {
        if let Err(e) = r {
            ctx.stop.cancel();
            first_error.get_or_insert(e);
        }
    }
    if first_error.is_none() {
        tracing::info!(http = %ctx.cfg.listen.http, shards, "dispatcher listening");
    }
    for t in threads {
        let _ = t.join();
    }
    first_error.map_or(Ok(()), Err)
}

/// Balanced accept: each shard's inbox of accepted connections, and its open client
/// connections (HTTP and PostgreSQL alike; the `refract_client_connections_open` gauges).
struct Spread {
    inboxes: Vec<mpsc::UnboundedSender<Placed>>,
    load: Vec<Gauge>,
}

/// A client connection accepted on shard 0 for some shard to serve.
enum Placed {
    Http(std::net::TcpStream),
    Pg(std::net::TcpStream, SocketAddr),
}

/// One shard's part in balanced accept.
struct Feed {
    spread: Arc<Spread>,
    inbox: Option<mpsc::UnboundedReceiver<Placed>>,
}

/// How long balanced accept waits for a new connection's first bytes before placing it anyway.
const FIRST_BYTES_WAIT: Duration = Duration::from_millis(100);

impl Spread {
    /// Hands an accepted HTTP connection to the shard with the fewest open client connections.
    fn place(self: &Arc<Self>, stream: TcpStream) {
        self.place_when_spoken(stream, None);
    }

    /// Hands an accepted PostgreSQL connection to the shard with the fewest open client
    /// connections.
    fn place_pg(self: &Arc<Self>, stream: TcpStream, peer: SocketAddr) {
        self.place_when_spoken(stream, Some(peer));
    }

    /// Places a connection once its client has sent something (HTTP and PostgreSQL clients
    /// speak first), or after [`FIRST_BYTES_WAIT`]. A connection closed before it sent
    /// anything is closed here, never counted: wrk, health checkers and port scanners open
    /// such probes just before their real connections, and counting them on a shard until its
    /// loop notices the close put the real connections on one shard.
    fn place_when_spoken(self: &Arc<Self>, stream: TcpStream, pg_peer: Option<SocketAddr>) {
        let spread = self.clone();
        drop(tokio::spawn(async move {
            let mut first = [0u8; 1];
            // Closed or reset before a byte arrived: nothing to serve. Data, or no word within
            // the wait: place it.
            if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(FIRST_BYTES_WAIT, stream.peek(&mut first)).await {
                return;
            }
            if let Ok(std) = stream.into_std() {
                spread.send(match pg_peer {
                    Some(peer) => Placed::Pg(std, peer),
                    None => Placed::Http(std),
                });
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

/// The shard with the fewest open client connections (the lowest index on a tie).
fn least_loaded(load: &[i64]) -> usize {
    (0..load.len()).min_by_key(|&j| load[j]).unwrap_or(0)
}

/// Balanced accept, shard `i`'s side: serves the connections placed in its inbox (shard 0
/// also accepts on the one listener and places them).
async fn serve_inbox(ctx: Arc<Ctx>, i: usize, feed: Feed, listener: Option<TcpListener>, sessions: TaskTracker) {
    let Feed { spread, inbox } = feed;
    let Some(mut inbox) = inbox else { return };
    if let Some(listener) = listener {
        let (ctx, spread) = (ctx.clone(), spread.clone());
        tokio::spawn(async move {
            accept_each(&ctx.stop, &ctx.metrics, "http", listener, |stream, _| spread.place(stream)).await
        });
    }
    loop {
        let placed = tokio::select! {
            s = inbox.recv() => match s { Some(s) => s, None => return },
            _ = ctx.stop.cancelled() => return,
        };
        let (std, pg_peer) = match placed {
            Placed::Http(std) => (std, None),
            Placed::Pg(std, peer) => (std, Some(peer)),
        };
        // Counted on this shard when it was placed.
        let open = OpenConnection(spread.load[i].clone());
        match TcpStream::from_std(std) {
            Ok(stream) => {
                let ctx = ctx.clone();
                match (pg_peer, ctx.cfg.postgres.clone()) {
                    // PostgreSQL sessions are not drained (as with reuseport accept): an idle
                    // client may stay connected for hours.
                    (Some(peer), Some(pg)) => drop(tokio::spawn(async move {
                        crate::pg::run_session(&ctx, &pg, stream, peer).await;
                        drop(open);
                    })),
                    _ => drop(sessions.spawn(async move {
                        session::run(ctx, stream).await;
                        drop(open);
                    })),
                }
            }
            Err(e) => {
                drop(open);
                tracing::warn!(error = %e, "could not register a client connection");
            }
        }
    }
}

fn shard_main(ctx: Arc<Ctx>, i: usize, feed: Option<Feed>, ready: std::sync::mpsc::Sender<std::io::Result<()>>) {
    crate::shard::enter(i);
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    rt.block_on(async move {
        let started = async {
            let listener = match &feed {
                None => Some(bind("[listen] http", ctx.cfg.listen.http, true)?),
                Some(_) if i == 0 => Some(bind("[listen] http", ctx.cfg.listen.http, false)?),
                Some(_) => None,
            };
            if i == 0 {
                ctx.start_services(true).await?;
            }
            if let Some(pg) = &ctx.cfg.postgres {
                match &feed {
                    None => crate::pg::serve(&ctx, pg, bind("[postgres] listen", pg.listen, true)?)?,
                    Some(f) if i == 0 => {
                        let spread = f.spread.clone();
                        let listener = bind("[postgres] listen", pg.listen, false)?;
                        crate::pg::accept_placing(&ctx, pg, listener, move |s, peer| spread.place_pg(s, peer))?;
                    }
                    Some(_) => {}
                }
            }
            Ok::<_, std::io::Error>(listener)
        };
        let listener = match started.await {
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
        match (feed, listener) {
            (Some(feed), listener) => serve_inbox(ctx.clone(), i, feed, listener, sessions.clone()).await,
            (None, Some(listener)) => accept_loop(ctx.clone(), listener, sessions.clone()).await,
            (None, None) => {}
        }
        sessions.close();
        let drain = Duration::from_millis(ctx.cfg.timeouts.drain_ms);
        let _ = tokio::time::timeout(drain, sessions.wait()).await;
        ctx.drain_ended(sessions.len(), Some(i));
    });
}

/// Turns a bind error into one that names the config key and the address: "Address already
/// in use" alone does not say which listener.
pub(crate) fn named(key: &'static str, addr: SocketAddr) -> impl FnOnce(std::io::Error) -> std::io::Error {
    move |e| std::io::Error::new(e.kind(), format!("{key} {addr}: {e}"))
}

/// A listener for config key `key` on `addr` with a backlog of 1024; with `reuseport` it
/// shares its address with the other shards' (the kernel spreads connections).
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
    fn balanced_accept_picks_the_least_loaded_shard() {
        assert_eq!(least_loaded(&[3, 1, 2]), 1);
        assert_eq!(least_loaded(&[3, 6, 2]), 2);
        assert_eq!(least_loaded(&[0, 0]), 0, "ties go to the lowest shard");
        assert_eq!(least_loaded(&[1, 0]), 1, "two connections land on two shards");
    }
}
