//! This dispatcher among several (`[cluster]`): started with the admin API, it registers in
//! etcd (`refract-cluster`), follows the membership changes any dispatcher shares
//! (`members/NAME` entries) and the reloads any of them asks for (`reload`), and shows what it
//! sees (`GET /cluster`, `/health`, `refract_cluster_*` metrics). Without `[cluster]` none of
//! this runs.

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use refract_cluster::{Cluster, ClusterConfig, Link, View};
use refract_core::Ctx;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

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

/// Starts the etcd session when `[cluster]` is configured; `admin` is the admin address the
/// peers see in `GET /cluster`.
pub(crate) fn start(ctx: &Arc<Ctx>, admin: Option<std::net::SocketAddr>) -> Option<Arc<Cluster>> {
    let cfg = ctx.cfg.sections.get::<ClusterConfig>()?.clone();
    let me = serde_json::json!({
        "admin": admin.map(|a| a.to_string()),
        "pid": std::process::id(),
        "version": env!("CARGO_PKG_VERSION"),
    });
    tracing::info!(node_id = cfg.node_id, etcd = ?cfg.etcd, "joining the cluster of dispatchers");
    Some(Cluster::start(cfg, me, ctx.stop.clone()))
}

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
}

impl ClusterMetrics {
    /// Registers the families into the dispatcher's registry.
    pub fn register(reg: &mut Registry) -> Self {
        let m = ClusterMetrics { dispatchers: Gauge::default(), etcd_up: Gauge::default() };
        reg.register("cluster_dispatchers", "Dispatchers registered in etcd, as this one last saw", m.dispatchers.clone());
        reg.register("cluster_etcd_up", "1 while this dispatcher is in touch with etcd, else 0", m.etcd_up.clone());
        m
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
