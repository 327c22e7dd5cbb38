//! The servers as the admin listener shows them: `GET /pg/pools`, `/pg/servers` (JSON), the
//! servers as the engine's members (`GET /backends`), and their pool and lag gauges of
//! `/metrics`. Each takes the servers (or every shard's), not the front end's shared state.

use super::metrics::PgMetrics;
use super::servers::{Server, Servers};
use crate::config::PgRole;
use refract_core::metrics::Metrics;
use serde_json::{json, Value};
use std::sync::Arc;

fn role(s: &Server) -> &'static str {
    match s.role {
        PgRole::Primary => "primary",
        PgRole::Replica => "replica",
    }
}

/// `GET /pg/pools`: per server (of `servers`, the cluster or shard 0), its connections and who
/// waits for one.
pub(crate) fn pools_view(servers: &Servers) -> Value {
    let pools: Vec<Value> = servers
        .list()
        .iter()
        .map(|s| {
            json!({
                "name": s.name,
                "address": s.addr().to_string(),
                "role": role(s),
                "healthy": s.is_up(),
                "idle": s.pool.idle_count(),
                "busy": s.pool.in_use(),
                "waiting": s.pool.waiting(),
                "pool_size": s.pool.size(),
            })
        })
        .collect();
    json!(pools)
}

/// `GET /pg/servers`: health and replication lag from the last probe, admission control
/// (the limit, units of work in flight and waiting, whether the queue is in overload mode) and
/// the buffer cache from the last sample (`cache.rs`).
pub(crate) fn servers_view(shards: &[Arc<Servers>]) -> Value {
    let servers: Vec<Value> = all(shards)
        .iter()
        .map(|s| {
            let adm = s.member.admission.view();
            json!({
                "name": s.name,
                "address": s.addr().to_string(),
                "role": role(s),
                "healthy": s.is_up(),
                "limit": adm.limit,
                "in_flight": adm.inflight,
                "queued": adm.queued,
                "overloaded": adm.overloaded,
                "lag_bytes": s.lag_bytes(),
                "lag_seconds": s.lag_ms() as f64 / 1000.0,
                "last_check_unix_ms": s.last_check_unix_ms(),
                // `null`: every table; else the relations a partial replica holds.
                "tables": s.holds().list(),
                "cache": s.cache(),
            })
        })
        .collect();
    json!(servers)
}

/// The servers as members of the engine, for `GET /backends` (after the HTTP backends): the
/// engine's view of each (its plain name, `"front": "postgres"`, state, admission, latency,
/// counts) and its replication lag.
pub(crate) fn members_view(shards: &[Arc<Servers>]) -> Vec<Value> {
    let list = all(shards);
    let view = |s: &Arc<Server>| {
        let mut v = json!(s.member.view());
        if let Some(obj) = v.as_object_mut() {
            obj.insert("lag_bytes".into(), json!(s.lag_bytes()));
        }
        v
    };
    list.iter().map(view).collect()
}

/// Refreshes every server's gauges (called when `/metrics` is scraped).
pub(crate) fn publish_metrics(shards: &[Arc<Servers>], metrics: &Metrics, pg_metrics: &PgMetrics) {
    for s in all(shards) {
        s.publish(metrics, pg_metrics);
    }
}

/// Every server of the cluster (of every shard).
pub(crate) fn all(shards: &[Arc<Servers>]) -> Vec<Arc<Server>> {
    shards.iter().flat_map(|s| s.list().iter().cloned().collect::<Vec<_>>()).collect()
}
