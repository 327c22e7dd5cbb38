//! The PostgreSQL front end as the admin listener shows it: `GET /pg/pools`, `/pg/clients`,
//! `/pg/servers` (JSON), and the pool, client and lag gauges of `/metrics`.
//!
//! # Layout
//! - this file: the admin views and the gauges set at scrape time.
//! - `metrics.rs`: the front end's metric families ([`metrics::PgMetrics`]).

pub(crate) mod metrics;

use super::shared::Shared;
use crate::client::clients::ClientState;
use crate::config::PgRole;
use crate::server::servers::Server;
use serde_json::{json, Value};
use std::sync::Arc;

fn role(s: &Server) -> &'static str {
    match s.role {
        PgRole::Primary => "primary",
        PgRole::Replica => "replica",
    }
}

/// `GET /pg/pools`: per server, its connections and who waits for one.
pub(crate) fn pools_view(shared: &Shared) -> Value {
    let pools: Vec<Value> = shared
        .servers
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

/// `GET /pg/clients`: every logged-in client and the server connection it holds.
pub(crate) fn clients_view(shared: &Shared) -> Value {
    let clients: Vec<Value> = shared
        .clients
        .snapshot()
        .iter()
        .map(|c| {
            let bound = c.bound().and_then(|i| all(shared).into_iter().find(|s| s.index == i).map(|s| s.name.clone()));
            json!({
                "id": c.id,
                "user": c.user,
                "database": c.database,
                "remote": c.remote.map(|a| a.to_string()),
                "pool_mode": c.pool_mode.as_str(),
                "state": c.state().as_str(),
                "server": bound,
                "pinned": crate::session::held::Pins(c.pinned()).names(),
                "tls": c.tls,
                "shard": c.shard,
            })
        })
        .collect();
    json!(clients)
}

/// `GET /pg/servers`: health and replication lag from the last probe, and admission control
/// (the limit, units of work in flight and waiting, whether the queue is in overload mode).
pub(crate) fn servers_view(shared: &Shared) -> Value {
    let servers: Vec<Value> = all(shared)
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
            })
        })
        .collect();
    json!(servers)
}

/// The servers as members of the engine, for `GET /backends` (after the HTTP backends): the
/// engine's view of each (its plain name, `"front": "postgres"`, state, admission, latency,
/// counts) and its replication lag.
pub(crate) fn members_view(shared: &Shared) -> Vec<Value> {
    let list = all(shared);
    let view = |s: &Arc<Server>| {
        let mut v = json!(s.member.view());
        if let Some(obj) = v.as_object_mut() {
            obj.insert("lag_bytes".into(), json!(s.lag_bytes()));
        }
        v
    };
    list.iter().map(view).collect()
}

/// Refreshes every PostgreSQL gauge (called when `/metrics` is scraped).
pub(crate) fn publish_metrics(shared: &Shared) {
    for s in all(shared) {
        s.publish(&shared.metrics, &shared.pg_metrics);
    }
    let mut counts = [0usize; ClientState::ALL.len()];
    for c in shared.clients.snapshot() {
        counts[c.state() as usize] += 1;
    }
    for (state, n) in ClientState::ALL.iter().zip(counts) {
        shared.pg_metrics.set_clients(state.as_str(), n);
    }
    let pinned = shared.clients.snapshot().iter().filter(|c| c.pinned() != 0).count();
    shared.pg_metrics.set_pinned_clients(pinned);
}

/// Every server of the cluster (of every shard).
fn all(shared: &Shared) -> Vec<Arc<Server>> {
    shared.shards.iter().flat_map(|s| s.list().iter().cloned().collect::<Vec<_>>()).collect()
}
