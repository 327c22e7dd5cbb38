//! The dispatcher: builds the shared state ([`Ctx`], `ctx`), binds the listeners, starts the
//! services (health checks, the PostgreSQL front end, hand-over, admin), runs the accept loop
//! (one event loop per shard, or one multi-threaded runtime), and drains in-flight requests on
//! shutdown.

use crate::accept::{accept_each, named, OpenConnection};
use crate::config::{AcceptMode, Config};
use crate::{admin, health, session};
use prometheus_client::metrics::gauge::Gauge;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

/// The shared state, named here too: embedders and tests know it as `dispatcher::Ctx`.
pub use crate::ctx::Ctx;

/// A running dispatcher.
pub struct Dispatcher {
    ctx: Arc<Ctx>,
    http_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    sessions: TaskTracker,
}

/// Starts the side services on the current runtime: health checks, the PostgreSQL front
/// end (only its background work when `sharded`: every shard listens itself), the admin
/// listener. Returns the admin address.
async fn start_services(ctx: &Arc<Ctx>, sharded: bool) -> std::io::Result<Option<SocketAddr>> {
    tokio::spawn(health::run(ctx.clone()));
    crate::handover::prepare(ctx);
    match ctx.cfg.postgres.clone() {
        Some(pg) if sharded => crate::pg::start_background(ctx, &pg),
        Some(pg) => crate::pg::start(ctx.clone(), pg).await?,
        None => {}
    }
    if let Some(path) = &ctx.cfg.listen.admin_socket {
        let listener = admin::bind_socket(path, ctx.cfg.admin.socket_mode)
            .map_err(|e| std::io::Error::new(e.kind(), format!("[listen] admin_socket {}: {e}", path.display())))?;
        tokio::spawn(admin::serve(ctx.clone(), listener));
    }
    let Some(addr) = ctx.cfg.listen.admin else { return Ok(None) };
    let listener = TcpListener::bind(addr).await.map_err(named("[listen] admin", addr))?;
    let bound = listener.local_addr()?;
    tokio::spawn(admin::serve(ctx.clone(), listener));
    Ok(Some(bound))
}

impl Dispatcher {
    /// Binds the listeners and starts serving on the current runtime.
    pub async fn start(cfg: Config) -> std::io::Result<Dispatcher> {
        let ctx = Ctx::new(cfg);
        let http = ctx.cfg.listen.http;
        let listener = TcpListener::bind(http).await.map_err(named("[listen] http", http))?;
        let http_addr = listener.local_addr()?;
        let admin_addr = start_services(&ctx, false).await?;
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
        let open = OpenConnection::counted(spread.load[i].clone());
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
                start_services(&ctx, true).await?;
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
