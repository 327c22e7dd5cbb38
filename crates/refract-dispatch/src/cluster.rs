//! This dispatcher among several (`[cluster]`): started with the admin API, it registers in
//! etcd (`refract-cluster`), follows the membership changes any dispatcher shares
//! (`members/NAME` entries) and the reloads any of them asks for (`reload`), and shows what it
//! sees (`GET /cluster`, `/health`, `refract_cluster_*` metrics). Without `[cluster]` none of
//! this runs.

use crate::members::{self, Definition, Refusal};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use refract_cluster::{Cluster, ClusterConfig, ClusterError, Link, View};
use refract_core::Ctx;
use refract_front_pg::{PgFront, SharedDecisions};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How often every shared entry is applied again even without a change: what a local reload
/// (SIGHUP) undid comes back within this.
const REAPPLY: Duration = Duration::from_secs(1);

/// The shared entry that asks every dispatcher to reload its file.
pub(crate) const RELOAD: &str = "reload";
/// Where membership entries live among the shared ones.
pub(crate) const MEMBERS: &str = "members/";

/// What the cluster decided about one member, whatever the dispatcher that decided it: the
/// value of the shared entry `members/NAME`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct MemberEntry {
    /// The definition it joined with (`POST /backends`' body), when it joined at run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub def: Option<serde_json::Value>,
    /// Drained (`true`) or undrained (`false`) by an operator; absent: as configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained: Option<bool>,
    /// Removed by an operator.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
}

impl MemberEntry {
    /// Decodes an entry; a value this version cannot read is `None` (and logged by the caller).
    pub fn parse(value: &str) -> Option<MemberEntry> {
        serde_json::from_str(value).ok()
    }
}

/// Starts the etcd session when `[cluster]` is configured; `admin` and `cancel` are the
/// addresses the peers see (`GET /cluster`; where they forward CancelRequests).
pub(crate) fn start(
    ctx: &Arc<Ctx>,
    admin: Option<std::net::SocketAddr>,
    cancel: Option<std::net::SocketAddr>,
) -> Option<Arc<Cluster>> {
    let cfg = ctx.cfg.sections.get::<ClusterConfig>()?.clone();
    let me = serde_json::json!({
        "admin": admin.map(|a| a.to_string()),
        "cancel": cancel.map(|a| a.to_string()),
        "pid": std::process::id(),
        "version": env!("CARGO_PKG_VERSION"),
    });
    tracing::info!(node_id = cfg.node_id, etcd = ?cfg.etcd, "joining the cluster of dispatchers");
    Some(Cluster::start(cfg, me, ctx.stop.clone()))
}

/// A membership change an operator asked of this dispatcher, to be shared.
pub(crate) enum Op {
    /// `POST /backends` with this body.
    Add(serde_json::Value),
    /// `POST /backends/NAME/drain` (`true`) or `/undrain`.
    Drain(String, bool),
    /// `DELETE /backends/NAME`.
    Remove(String),
}

/// Applies what the cluster shares to this dispatcher: every `members/NAME` entry, and a
/// changed `reload` entry. One entry at a time (the admin API's own changes and the watch's
/// go through the same lock), each idempotent: an entry already in force changes nothing.
pub(crate) struct Follower {
    ctx: Arc<Ctx>,
    pg: Arc<PgFront>,
    pub cluster: Arc<Cluster>,
    state: Mutex<Following>,
    /// Held while an entry is put in force, so that the admin API's own change and the
    /// watch's copy of it never both add the member.
    applying: Mutex<()>,
}

#[derive(Default)]
struct Following {
    /// The `reload` entry last acted on (`None` until the first view: a dispatcher that just
    /// started has read its file already).
    reload_seen: Option<Option<String>>,
    /// Entries that could not be applied, by name, with the value that failed (logged once).
    failed: HashMap<String, String>,
}

impl Follower {
    pub fn new(ctx: Arc<Ctx>, pg: Arc<PgFront>, cluster: Arc<Cluster>) -> Follower {
        Follower { ctx, pg, cluster, state: Mutex::default(), applying: Mutex::default() }
    }

    /// Follows the view until the dispatcher stops: at each change, and every [`REAPPLY`].
    pub async fn run(self: Arc<Self>) {
        let mut rx = self.cluster.subscribe();
        loop {
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(REAPPLY) => {}
                _ = self.ctx.stop.cancelled() => return,
            }
            let view = rx.borrow_and_update().clone();
            if view.revision > 0 {
                self.apply_all(&view);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Following> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn apply_all(&self, view: &View) {
        let reload = view.shared.get(RELOAD).cloned();
        let seen = self.lock().reload_seen.replace(reload.clone());
        if seen.is_some_and(|s| s != reload) {
            tracing::info!(entry = ?reload, "a reload was asked through another dispatcher");
            let _ = crate::reload::reload_logged(&self.ctx);
        }
        for (name, value) in view.entries(MEMBERS) {
            let outcome = match MemberEntry::parse(value) {
                Some(entry) => self.apply(name, &entry),
                None => Err(Refusal::new(400, "an entry this version cannot read")),
            };
            let mut state = self.lock();
            match outcome {
                Ok(()) => drop(state.failed.remove(name)),
                Err(r) if state.failed.get(name).map(String::as_str) != Some(value) => {
                    tracing::warn!(
                        member = name,
                        entry = value,
                        reason = r.message,
                        "shared membership change not applied here"
                    );
                    state.failed.insert(name.to_owned(), value.to_owned());
                }
                Err(_) => {}
            }
        }
    }

    /// Puts one entry in force here.
    fn apply(&self, name: &str, entry: &MemberEntry) -> Result<(), Refusal> {
        let _one_at_a_time = self.applying.lock().unwrap_or_else(PoisonError::into_inner);
        let (ctx, pg) = (&*self.ctx, &*self.pg);
        let exists = members::exists(ctx, pg, name);
        if entry.removed {
            return if exists { members::remove(ctx, pg, name) } else { Ok(()) };
        }
        if !exists {
            let Some(def) = &entry.def else { return Ok(()) };
            members::add(ctx, pg, Definition::parse(def.clone())?)?;
        }
        match (entry.drained, members::drained(ctx, pg, name)) {
            (Some(want), Some(now)) if want != now => members::drain(ctx, pg, name, want),
            _ => Ok(()),
        }
    }

    /// An operator's change: checked here, written to etcd, then put in force here (the other
    /// dispatchers follow from the watch). Refused, and made nowhere, while etcd is away; a
    /// change this dispatcher then refuses is taken back from etcd.
    pub async fn share(&self, op: Op) -> Result<String, Refusal> {
        let view = self.cluster.view();
        if let Link::Down { error, .. } = &view.link {
            return Err(Refusal::new(503, ClusterError::Unavailable(error.clone()).to_string()));
        }
        let (ctx, pg) = (&*self.ctx, &*self.pg);
        if let Op::Drain(name, _) | Op::Remove(name) = &op {
            if !members::exists(ctx, pg, name) {
                return Err(Refusal::new(404, format!("no such backend: {name}")));
            }
        }
        let (name, entry) = match op {
            Op::Add(def) => {
                let name = Definition::parse(def.clone())?.name().to_owned();
                if members::exists(ctx, pg, &name) {
                    return Err(Refusal::new(409, format!("backend {name} already exists")));
                }
                (name, MemberEntry { def: Some(def), ..Default::default() })
            }
            Op::Drain(name, drain) => {
                let key = format!("{MEMBERS}{name}");
                let before = view.shared.get(&key).and_then(|v| MemberEntry::parse(v)).unwrap_or_default();
                (name, MemberEntry { drained: Some(drain), removed: false, ..before })
            }
            Op::Remove(name) => (name, MemberEntry { removed: true, ..Default::default() }),
        };
        let key = format!("{MEMBERS}{name}");
        let unshared = |e: ClusterError| Refusal::new(503, e.to_string());
        let value = serde_json::to_string(&entry).map_err(|e| Refusal::new(500, e.to_string()))?;
        self.cluster.put(&key, &value).await.map_err(unshared)?;
        let Err(refused) = self.apply(&name, &entry) else { return Ok(name) };
        let restored = match view.shared.get(&key) {
            Some(before) => self.cluster.put(&key, before).await,
            None => self.cluster.delete(&key).await,
        };
        if let Err(e) = restored {
            tracing::warn!(member = name, error = %e, "a refused change could not be taken back from etcd");
        }
        Err(refused)
    }

    /// `POST /reload`: this dispatcher reloads its file, then asks every other to reload theirs.
    pub async fn reload(&self) -> Result<serde_json::Value, Refusal> {
        if let Link::Down { error, .. } = &self.cluster.view().link {
            return Err(Refusal::new(503, ClusterError::Unavailable(error.clone()).to_string()));
        }
        let changes = crate::reload::reload_logged(&self.ctx)
            .map_err(|e| Refusal::new(400, format!("reload refused, the old configuration stays: {e}")))?;
        let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let asked = serde_json::json!({ "by": self.cluster.node_id(), "at_ns": at.as_nanos() as u64 }).to_string();
        // This dispatcher has reloaded: its follower must not do it again.
        self.lock().reload_seen = Some(Some(asked.clone()));
        let shared = self.cluster.put(RELOAD, &asked).await;
        Ok(match shared {
            Ok(()) => serde_json::json!({ "reloaded": changes, "shared": true }),
            Err(e) => serde_json::json!({ "reloaded": changes, "shared": false, "error": e.to_string() }),
        })
    }
}

/// Two-phase decisions kept in etcd, for the PostgreSQL front end.
pub(crate) struct EtcdDecisions(pub Arc<Cluster>);

impl SharedDecisions for EtcdDecisions {
    fn node_id(&self) -> String {
        self.0.node_id().to_owned()
    }

    fn decide<'a>(&'a self, gid: &'a str, commit: bool) -> Boxed<'a, Result<bool, String>> {
        Box::pin(async move {
            let outcome = self.0.decide(gid, if commit { "commit" } else { "rollback" }).await;
            outcome.map(|o| o == "commit").map_err(|e| e.to_string())
        })
    }

    fn forget<'a>(&'a self, gid: &'a str) -> Boxed<'a, ()> {
        Box::pin(async move {
            if let Err(e) = self.0.forget(gid).await {
                tracing::warn!(gid, error = %e, "a finished two-phase decision stays in etcd");
            }
        })
    }

    fn is_alive(&self, node_id: &str) -> bool {
        self.0.view().peers.contains_key(node_id)
    }
}

type Boxed<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// `GET /cluster`: this dispatcher's node id, the link to etcd, the dispatchers it sees.
pub(crate) fn view_json(cluster: &Cluster) -> serde_json::Value {
    let view = cluster.view();
    let (etcd, error) = match &view.link {
        Link::Connecting => ("connecting", None),
        Link::Up => ("up", None),
        Link::Down { error, .. } => ("down", Some(error.clone())),
    };
    serde_json::json!({
        "node_id": cluster.node_id(),
        "etcd": etcd,
        "etcd_error": error,
        "etcd_down_seconds": view.down_for().map(|d| d.as_secs_f64()),
        "revision": view.revision,
        "dispatchers": view.peers.values().collect::<Vec<_>>(),
        "members_shared": view.entries(MEMBERS).count(),
    })
}

/// `/health`'s line about etcd: the dispatcher serves either way (the last shared state when
/// etcd is away), so the status stays 200 and the text says which.
pub(crate) fn health_line(cluster: &Cluster) -> String {
    let view = cluster.view();
    match (&view.link, view.down_for()) {
        (Link::Up, _) => format!("etcd: up, {} dispatchers\n", view.peers.len()),
        (Link::Connecting, _) => "etcd: connecting\n".into(),
        (Link::Down { error, .. }, d) => format!(
            "etcd: unreachable for {:.0} s ({error}): serving the last shared state; admin changes refused\n",
            d.unwrap_or_default().as_secs_f64()
        ),
    }
}

/// The cluster's gauges (`refract_cluster_*`).
pub(crate) struct ClusterMetrics {
    dispatchers: Gauge,
    etcd_up: Gauge,
    /// PostgreSQL CancelRequests between dispatchers, by what happened (`peers.rs`).
    cancels: Family<[(&'static str, &'static str); 1], Counter>,
}

impl ClusterMetrics {
    /// Registers the families into the dispatcher's registry.
    pub fn register(reg: &mut Registry) -> Self {
        let m = ClusterMetrics { dispatchers: Gauge::default(), etcd_up: Gauge::default(), cancels: Family::default() };
        reg.register(
            "cluster_cancels",
            "PostgreSQL CancelRequests between dispatchers: forwarded to a peer, forward_failed (twice), \
             unroutable (no peer holds the key's slot), received from a peer, refused (failed authentication)",
            m.cancels.clone(),
        );
        reg.register(
            "cluster_dispatchers",
            "Dispatchers registered in etcd, as this one last saw",
            m.dispatchers.clone(),
        );
        reg.register("cluster_etcd_up", "1 while this dispatcher is in touch with etcd, else 0", m.etcd_up.clone());
        m
    }

    /// Counts a cancel `event` (see the family's help).
    pub fn cancel(&self, event: &'static str) {
        self.cancels.get_or_create(&[("event", event)]).inc();
    }

    /// Sets the gauges from the view now.
    pub fn publish(&self, view: &View) {
        self.dispatchers.set(view.peers.len() as i64);
        self.etcd_up.set(i64::from(view.is_up()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_entries_round_trip_and_omit_what_is_unset() {
        let e = MemberEntry { drained: Some(true), ..Default::default() };
        let text = serde_json::to_string(&e).expect("encodes");
        assert_eq!(text, r#"{"drained":true}"#);
        assert_eq!(MemberEntry::parse(&text), Some(e));
        let gone = MemberEntry { removed: true, ..Default::default() };
        assert_eq!(serde_json::to_string(&gone).expect("encodes"), r#"{"removed":true}"#);
        assert_eq!(MemberEntry::parse("not json"), None);
    }
}
