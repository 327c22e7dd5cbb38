//! The etcd session behind a [`Cluster`]: connect, register under a lease, read the whole
//! state, then renew the lease and fold the watch's events into the view until something
//! breaks; then mark the link down (the view kept) and start again, backing off up to 2 s.
//! Every start re-reads the whole state, so a dispatcher converges after any outage.

use crate::cluster::Cluster;
use crate::config::ClusterConfig;
use crate::error::ClusterError;
use crate::view::{Change, View};
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity, LeaseKeepAliveStream,
    LeaseKeeper, PutOptions, TlsOptions, Txn, TxnOp, WatchOptions, WatchStream,
};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Runs sessions until `stop`; on `stop`, revokes the lease.
pub(crate) async fn run(cluster: Arc<Cluster>, stop: CancellationToken) {
    let mut lease = None;
    let mut backoff = Duration::from_millis(100);
    loop {
        let ended = tokio::select! {
            e = session(&cluster, &mut lease) => e,
            _ = stop.cancelled() => return leave(&cluster, lease).await,
        };
        if cluster.view().is_up() {
            backoff = Duration::from_millis(100);
            tracing::warn!(error = %ended, "etcd lost: serving with the last shared state until it is back");
        } else {
            tracing::debug!(error = %ended, "etcd still unreachable");
        }
        lose(&cluster, ended.to_string());
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.cancelled() => return leave(&cluster, lease).await,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One session: returns only when it breaks.
async fn session(c: &Cluster, lease: &mut Option<i64>) -> ClusterError {
    match serve(c, lease).await {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

async fn serve(c: &Cluster, lease: &mut Option<i64>) -> Result<std::convert::Infallible, ClusterError> {
    let mut client = connect(&c.cfg).await?;
    let id = register(c, &mut client, lease).await?;
    let (mut keeper, mut acks) = client.lease_keep_alive(id).await?;
    let all = client.get(c.keys.all(), Some(GetOptions::new().with_prefix())).await?;
    let revision = all.header().map_or(0, |h| h.revision());
    let watch = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
    let mut events = client.watch(c.keys.all(), Some(watch)).await?;
    let kvs = all.kvs().iter().filter_map(|kv| Some((kv.key_str().ok()?, kv.value())));
    // The writer's client first: a view that says "up" must be writable.
    *c.client.lock().unwrap_or_else(PoisonError::into_inner) = Some(client);
    update(c, |v| v.reload(&c.keys, kvs, revision));
    tracing::info!(node_id = c.cfg.node_id, revision, "in touch with etcd: registered, shared state read");
    renew_and_watch(c, &mut keeper, &mut acks, &mut events).await
}

async fn renew_and_watch(
    c: &Cluster,
    keeper: &mut LeaseKeeper,
    acks: &mut LeaseKeepAliveStream,
    events: &mut WatchStream,
) -> Result<std::convert::Infallible, ClusterError> {
    let ttl = Duration::from_secs(c.cfg.lease_ttl_s);
    let mut tick = tokio::time::interval((ttl / 3).max(Duration::from_millis(200)));
    let mut last_ack = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if last_ack.elapsed() > ttl {
                    return Err(ClusterError::LeaseLost);
                }
                keeper.keep_alive().await?;
            }
            ack = acks.message() => match ack? {
                Some(a) if a.ttl() > 0 => last_ack = Instant::now(),
                Some(_) => return Err(ClusterError::LeaseLost),
                None => return Err(ClusterError::WatchEnded("the lease's keep-alive stream ended".into())),
            },
            msg = events.message() => {
                let Some(resp) = msg? else {
                    return Err(ClusterError::WatchEnded("etcd closed it".into()));
                };
                if resp.canceled() {
                    return Err(ClusterError::WatchEnded(format!("canceled: {}", resp.cancel_reason())));
                }
                let revision = resp.header().map_or(0, |h| h.revision());
                update(c, |v| {
                    for e in resp.events() {
                        let Some((key, value)) = e.kv().and_then(|kv| Some((kv.key_str().ok()?, kv.value()))) else {
                            continue;
                        };
                        let change = match e.event_type() {
                            EventType::Put => Change::Put { key, value },
                            EventType::Delete => Change::Delete { key },
                        };
                        v.fold(&c.keys, change);
                    }
                    v.revision = v.revision.max(revision);
                });
            }
        }
    }
}

/// Registers this dispatcher under a lease: the one from before a short outage if etcd still
/// has it, else a new one; a node id another live dispatcher holds is refused.
async fn register(c: &Cluster, client: &mut Client, lease: &mut Option<i64>) -> Result<i64, ClusterError> {
    let key = c.keys.node(&c.cfg.node_id);
    let value = c.me.to_string();
    if let Some(id) = *lease {
        let alive = client.lease_time_to_live(id, None).await.map(|r| r.ttl() > 0).unwrap_or(false);
        if alive {
            client.put(key, value, Some(PutOptions::new().with_lease(id))).await?;
            return Ok(id);
        }
    }
    let id = client.lease_grant(c.cfg.lease_ttl_s as i64, None).await?.id();
    *lease = Some(id);
    let create = Txn::new().when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
        key,
        value,
        Some(PutOptions::new().with_lease(id)),
    )]);
    if client.txn(create).await?.succeeded() {
        return Ok(id);
    }
    let _ = client.lease_revoke(id).await;
    *lease = None;
    Err(ClusterError::Taken(c.cfg.node_id.clone()))
}

async fn connect(cfg: &ClusterConfig) -> Result<Client, ClusterError> {
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1))
        .with_keep_alive_while_idle(true);
    if let (Some(user), Some(file)) = (&cfg.user, &cfg.password_file) {
        let text = read(file)?;
        let password = String::from_utf8_lossy(&text).lines().next().unwrap_or_default().to_owned();
        opts = opts.with_user(user.clone(), password);
    }
    if cfg.etcd.iter().any(|e| e.starts_with("https://")) {
        let mut tls = TlsOptions::new();
        if let Some(ca) = &cfg.ca_file {
            tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
        }
        if let (Some(cert), Some(key)) = (&cfg.cert_file, &cfg.key_file) {
            tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        opts = opts.with_tls(tls);
    }
    let connect = Client::connect(&cfg.etcd, Some(opts));
    let timeout = Duration::from_secs(2);
    tokio::time::timeout(timeout, connect).await.map_err(|_| ClusterError::Timeout(timeout))?.map_err(Into::into)
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, ClusterError> {
    std::fs::read(path).map_err(|e| ClusterError::File(path.display().to_string(), e))
}

fn update(c: &Cluster, change: impl FnOnce(&mut View)) {
    c.view.send_modify(|v| change(Arc::make_mut(v)));
}

fn lose(c: &Cluster, error: String) {
    *c.client.lock().unwrap_or_else(PoisonError::into_inner) = None;
    update(c, |v| v.lose(error));
}

/// Revokes the lease so peers see this dispatcher leave now (at most 1 s spent trying).
async fn leave(c: &Cluster, lease: Option<i64>) {
    let client = c.client.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let (Some(mut client), Some(id)) = (client, lease) {
        let _ = tokio::time::timeout(Duration::from_secs(1), client.lease_revoke(id)).await;
    }
    update(c, |v| v.lose("stopped".into()));
}
