//! The admin listener: `GET /backends`, `POST /backends`, `DELETE /backends/NAME`,
//! `POST /backends/NAME/drain` and `/undrain`, `POST /reload`, `GET /metrics` (Prometheus
//! text), `GET /health`, with `[cluster]` `GET /cluster` (membership changes and reloads are
//! then shared with the other dispatchers, `cluster.rs`), and with `[postgres]` `GET /pg/pools`, `GET /pg/clients`,
//! `GET /pg/servers` (JSON). PostgreSQL servers are members too: `/backends` lists every member
//! by its plain name with its `"front"` (`"http"`, then `"postgres"`), and the same calls add
//! (`"front": "postgres"`), remove and drain them by that name (`pg:NAME` is still accepted,
//! deprecated); a name is unique across both front ends. It runs on its own address
//! so that operators reach it even when the client listener is saturated; `guard` decides who
//! may use it (docs/operations.md).

mod guard;

use crate::cluster::{self, ClusterMetrics, Follower, Op};
use crate::members::{self, Definition, Refusal};
use crate::peers::{self, PeerCancels};
use bytes::Bytes;
use refract_cluster::ClusterConfig;
use refract_core::accept::named;
use refract_core::engine::{Front, Serving};
use refract_core::Config;
use refract_core::Ctx;
use refract_front_http::conn::{ClientConn, ClientStream};
use refract_front_pg::PgFront;
use refract_handover::metrics::HandoverMetrics;
use refract_http::{reply, RequestHead};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

/// Largest admin request body.
const MAX_ADMIN_BODY: usize = 64 * 1024;

/// A listener the admin API is served on: TCP (token rules) or the Unix admin socket.
pub trait AdminListener: Send + 'static {
    /// The connections it accepts.
    type Stream: ClientStream + 'static;
    /// Accepts one connection.
    fn accept_one(&self) -> impl std::future::Future<Output = std::io::Result<Self::Stream>> + Send;
    /// Whether the file's permissions, not a token, decide who connects.
    const LOCAL: bool;
}

impl AdminListener for TcpListener {
    type Stream = TcpStream;
    const LOCAL: bool = false;
    async fn accept_one(&self) -> std::io::Result<TcpStream> {
        Ok(self.accept().await?.0)
    }
}

/// The Unix admin socket; the file is removed when the dispatcher stops.
pub struct AdminSocket {
    listener: UnixListener,
    path: PathBuf,
    /// The dispatcher's user (the socket file's owner).
    owner: u32,
    /// The mode gives no group access: only the owner (or root) may connect.
    owner_only: bool,
}

impl Drop for AdminSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl AdminListener for AdminSocket {
    type Stream = UnixStream;
    const LOCAL: bool = true;
    async fn accept_one(&self) -> std::io::Result<UnixStream> {
        loop {
            let (stream, _) = self.listener.accept().await?;
            let uid = stream.peer_cred()?.uid();
            if !self.owner_only || uid == self.owner || uid == 0 {
                return Ok(stream);
            }
            tracing::warn!(uid, "admin socket: a connection from another user refused");
        }
    }
}

/// Binds the Unix admin socket at `path` with file mode `mode`. A socket file nobody listens
/// on (left by a dispatcher that was killed) is replaced; one that answers is in use.
pub fn bind_socket(path: &Path, mode: u32) -> std::io::Result<AdminSocket> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, "exists and is not a socket"));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, "another process listens on it"));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(path)?);
    // Until the mode is set the umask's applied; the peer check also covers that moment.
    let owner_only = mode & 0o070 == 0;
    Ok(AdminSocket { listener, path: path.to_path_buf(), owner, owner_only })
}

/// Accepts admin connections until the dispatcher stops.
pub async fn serve<L: AdminListener>(api: Arc<Api>, listener: L) {
    let ctx = api.ctx.clone();
    loop {
        let accepted = tokio::select! {
            a = listener.accept_one() => a,
            _ = ctx.stop.cancelled() => return,
        };
        match accepted {
            Ok(stream) => {
                let api = api.clone();
                let serve = async move { connection(&api, ClientConn::new(stream), L::LOCAL).await };
                tokio::spawn(refract_process::contain("admin connection", serve));
            }
            Err(e) => {
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn connection<S: ClientStream>(api: &Api, mut conn: ClientConn<S>, local: bool) {
    let ctx = &*api.ctx;
    let idle = Duration::from_millis(ctx.cfg.timeouts.client_idle_ms);
    loop {
        let head = match conn.read_head(ctx.cfg.limits.max_head_bytes, idle, &ctx.stop).await {
            Ok(Ok(h)) => h,
            Ok(Err(_)) => break,
            Err(e) => {
                let _ = conn.reply(&reply::error(e.status(), &e.to_string(), &[], true)).await;
                break;
            }
        };
        let raw = conn.buf.split_to(head.len).freeze();
        let body = match conn.read_body(head.body, MAX_ADMIN_BODY).await {
            Ok(b) => b,
            Err(e) => {
                let _ = conn.reply(&reply::error(e.status(), &e.to_string(), &[], true)).await;
                break;
            }
        };
        let close = !head.keep_alive;
        let answer = match guard::check(&ctx.cfg.admin, &head, &raw, local) {
            Ok(()) => route(api, &head, &body, close).await,
            Err(refusal) => {
                tracing::warn!(
                    path = head.path(),
                    status = refusal.status,
                    reason = refusal.message,
                    "admin request refused"
                );
                refusal.reply(close)
            }
        };
        if conn.reply(&answer).await.is_err() || close {
            break;
        }
    }
    conn.close_gracefully().await;
}

/// A backend's admin view, with the tables it holds (`null`: all); with `[handover]` and an
/// agent for it, plus its hand-over totals.
fn backend_view(ctx: &Ctx, b: &refract_core::backend::Backend) -> serde_json::Value {
    let mut v = serde_json::json!(b.view());
    if let Some(obj) = v.as_object_mut() {
        obj.insert("tables".into(), serde_json::json!(b.holds.list()));
        if refract_front_http::has_agent(ctx, &b.name) {
            let t = ctx.metrics.families(HandoverMetrics::register).totals(&b.name);
            let totals = serde_json::json!({
                "handovers": t.handovers, "handbacks": t.handbacks, "bytes_direct": t.bytes_direct,
            });
            obj.insert("handover".into(), totals);
        }
    }
    v
}

/// `POST /backends`, drain, undrain, `DELETE /backends/NAME`: made here when the dispatcher
/// runs alone; shared through etcd first with `[cluster]`.
async fn change(api: &Api, op: Op) -> Result<String, Refusal> {
    if let Some(follower) = &api.follower {
        return follower.share(op).await;
    }
    let (ctx, pg) = (&*api.ctx, &*api.pg);
    match op {
        Op::Add(def) => members::add(ctx, pg, Definition::parse(def)?),
        Op::Drain(name, drain) => members::drain(ctx, pg, &name, drain).map(|()| name),
        Op::Remove(name) => members::remove(ctx, pg, &name).map(|()| name),
    }
}

async fn route(api: &Api, head: &RequestHead, body: &Bytes, close: bool) -> Bytes {
    let (ctx, pg) = (&*api.ctx, &*api.pg);
    let json =
        |status, v: serde_json::Value| reply::response(status, "application/json", v.to_string().as_bytes(), close);
    let refused = |r: Refusal, name: &str| match name {
        "" => reply::error(r.status, &r.message, &[], close),
        _ => reply::error(r.status, &r.message, &[("backend", name)], close),
    };
    match (head.method.as_str(), head.path()) {
        ("GET", "/backends") => {
            let mut views: Vec<_> = ctx.members.snapshot().iter().map(|b| backend_view(ctx, b)).collect();
            views.extend(pg.members());
            json(200, serde_json::json!(views))
        }
        ("POST", "/backends") => {
            let def = match serde_json::from_slice(body) {
                Ok(def) => def,
                Err(e) => return reply::error(400, &format!("bad backend definition: {e}"), &[], close),
            };
            match change(api, Op::Add(def)).await {
                Ok(name) => json(201, serde_json::json!({ "added": name })),
                Err(r) => refused(r, ""),
            }
        }
        ("POST", "/reload") => match &api.follower {
            Some(follower) => match follower.reload().await {
                Ok(answer) => json(200, answer),
                Err(r) => refused(r, ""),
            },
            None => match crate::reload::reload_logged(ctx) {
                Ok(changes) => json(200, serde_json::json!({ "reloaded": changes })),
                Err(e) => reply::error(400, &format!("reload refused, the old configuration stays: {e}"), &[], close),
            },
        },
        ("POST", path)
            if path.starts_with("/backends/") && (path.ends_with("/drain") || path.ends_with("/undrain")) =>
        {
            let (name, action) = path["/backends/".len()..].rsplit_once('/').unwrap_or_default();
            match change(api, Op::Drain(name.to_owned(), action == "drain")).await {
                Ok(_) => json(200, serde_json::json!({ "backend": name, "drained": action == "drain" })),
                Err(r) => refused(r, name),
            }
        }
        ("DELETE", path) if path.starts_with("/backends/") && !path["/backends/".len()..].contains('/') => {
            let name = &path["/backends/".len()..];
            match change(api, Op::Remove(name.to_owned())).await {
                Ok(_) => json(200, serde_json::json!({ "removed": name })),
                Err(r) => refused(r, name),
            }
        }
        ("GET", "/metrics") => {
            for b in ctx.members.snapshot().iter() {
                ctx.metrics.set_backend(&b.name, b.is_up(), b.inflight());
                ctx.metrics.set_drained(&b.name, b.is_drained());
                ctx.metrics.set_admission(&b.name, &b.admission.view());
            }
            pg.publish_metrics();
            refract_front_http::publish_metrics(ctx);
            if let Some(f) = &api.follower {
                ctx.metrics.families(ClusterMetrics::register).publish(&f.cluster.view());
            }
            reply::response(200, "text/plain; version=0.0.4", ctx.metrics.render().as_bytes(), close)
        }
        ("GET", "/health") => {
            let etcd = api.follower.as_ref().map(|f| cluster::health_line(&f.cluster)).unwrap_or_default();
            reply::response(200, "text/plain", format!("ok\n{etcd}").as_bytes(), close)
        }
        ("GET", "/cluster") => match &api.follower {
            Some(f) => json(200, cluster::view_json(&f.cluster)),
            None => reply::error(404, "this dispatcher runs alone: no [cluster] section", &[], close),
        },
        ("GET", path @ ("/pg/pools" | "/pg/clients" | "/pg/servers" | "/pg/shards")) => match pg.view(path) {
            None => reply::error(404, "the PostgreSQL front end is not configured", &[("path", path)], close),
            Some(view) => json(200, view),
        },
        _ => reply::error(404, "unknown admin path", &[("path", head.path())], close),
    }
}

/// What an admin request may reach: the engine, the PostgreSQL front end, and with `[cluster]`
/// the follower that shares changes with the other dispatchers.
pub struct Api {
    ctx: Arc<Ctx>,
    pg: Arc<PgFront>,
    follower: Option<Arc<Follower>>,
}

/// The admin API as a front end of the engine: no client listener of its own kind, but its
/// TCP listener (`[listen] admin`) and Unix socket (`[listen] admin_socket`), started with the
/// other front ends' background work.
pub struct Admin {
    /// The PostgreSQL front end, for its `/pg/*` views and gauges.
    pub pg: Arc<PgFront>,
    /// The TCP address bound, once started.
    pub bound: std::sync::OnceLock<std::net::SocketAddr>,
}

impl Admin {
    /// With `[cluster] cancel_listen`: its listener bound, and the peers' shared key read.
    #[allow(clippy::type_complexity)]
    fn bind_cancels(&self, ctx: &Ctx) -> std::io::Result<Option<(SocketAddr, TcpListener, Arc<Vec<u8>>)>> {
        let cfg = ctx.cfg.sections.get::<ClusterConfig>();
        let Some((addr, file)) = cfg.and_then(|c| Some((c.cancel_listen?, c.peer_key_file.clone()?))) else {
            return Ok(None);
        };
        let key = Arc::new(peers::read_key(&file)?);
        let std = std::net::TcpListener::bind(addr).map_err(named("[cluster] cancel_listen", addr))?;
        std.set_nonblocking(true)?;
        let listener = TcpListener::from_std(std)?;
        Ok(Some((listener.local_addr()?, listener, key)))
    }
}

impl Front for Admin {
    fn name(&self) -> &'static str {
        "admin"
    }

    fn listener(&self, _cfg: &Config) -> Option<(&'static str, std::net::SocketAddr)> {
        None
    }

    fn start(&self, ctx: &Arc<Ctx>) -> std::io::Result<()> {
        let socket = match &ctx.cfg.listen.admin_socket {
            Some(path) => Some(bind_socket(path, ctx.cfg.admin.socket_mode).map_err(|e| {
                std::io::Error::new(e.kind(), format!("[listen] admin_socket {}: {e}", path.display()))
            })?),
            None => None,
        };
        let tcp = match ctx.cfg.listen.admin {
            Some(addr) => {
                let std = std::net::TcpListener::bind(addr).map_err(named("[listen] admin", addr))?;
                std.set_nonblocking(true)?;
                let listener = TcpListener::from_std(std)?;
                let _ = self.bound.set(listener.local_addr()?);
                Some(listener)
            }
            None => None,
        };
        let cancels = self.bind_cancels(ctx)?;
        let cluster = cluster::start(ctx, self.bound.get().copied(), cancels.as_ref().map(|c| c.0));
        if let (Some(c), Some((_, listener, key))) = (&cluster, cancels) {
            let metrics = ctx.metrics.families(ClusterMetrics::register);
            let relay = PeerCancels { cluster: c.clone(), key: key.clone(), metrics: metrics.clone() };
            self.pg.join_cluster(ctx, peers::slot(c.node_id()), Arc::new(relay));
            tokio::spawn(peers::serve(listener, key, self.pg.clone(), metrics, ctx.stop.clone()));
        }
        if let Some(c) = &cluster {
            self.pg.share_decisions(ctx, Arc::new(cluster::EtcdDecisions(c.clone())));
        }
        let follower = cluster.map(|c| Arc::new(Follower::new(ctx.clone(), self.pg.clone(), c)));
        if let Some(f) = &follower {
            tokio::spawn(refract_process::contain("cluster follower", f.clone().run()));
        }
        let api = Arc::new(Api { ctx: ctx.clone(), pg: self.pg.clone(), follower });
        if let Some(listener) = socket {
            tokio::spawn(serve(api.clone(), listener));
        }
        if let Some(listener) = tcp {
            tokio::spawn(serve(api, listener));
        }
        Ok(())
    }

    fn serve(&self, _ctx: Arc<Ctx>, _stream: TcpStream, _peer: std::net::SocketAddr) -> Serving {
        Box::pin(async {})
    }
}
