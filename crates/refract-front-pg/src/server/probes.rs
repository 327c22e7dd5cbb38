//! The servers' probes: [`run_health`] checks each server every interval (up or down, WAL
//! positions, lag), samples its cache every `cache_stats_interval_ms` (`cache.rs`), keeps
//! `min_idle` connections open, publishes gauges and runs the engine's latency outlier check;
//! [`run_lsn_poll`] polls WAL positions fast while read-your-writes sessions wait for them.

use super::cache::{Sample, CACHE_PROBE};
use super::partial::{holds_from_rows, TABLES_PROBE};
use super::servers::{unix_ms, Server, Servers};
use super::{parse_lsn, ServerConn};
use crate::config::PgRole;
use crate::error::PgError;
use crate::server::metrics::PgMetrics;
use refract_core::metrics::Metrics;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// A replica's position in the primary's WAL: a streaming standby's replay position; a
/// logical replica's (a server not in recovery, subscribing to the primary's publications:
/// `partial.rs`) the least position its subscriptions' apply workers confirmed to the primary
/// (`pg_stat_subscription.latest_end_lsn`); `0/0` when not known.
macro_rules! replica_lsn {
    () => {
        "CASE WHEN pg_is_in_recovery() THEN coalesce(pg_last_wal_replay_lsn(), '0/0') \
         ELSE coalesce((SELECT min(latest_end_lsn) FROM pg_stat_subscription WHERE relid IS NULL), '0/0') END::text"
    };
}

/// The fast WAL-position poll interval (read-your-writes, while sessions wait for it).
pub const LSN_POLL: Duration = Duration::from_millis(10);

/// A connection per server, by [`Server::index`], kept across rounds.
type Conns = HashMap<usize, ServerConn>;

/// Probes every server each interval until `stop`: up/down, WAL positions, lag; keeps
/// `min_idle` connections open on healthy servers and publishes gauges.
pub async fn run_health(
    servers: Arc<Servers>,
    interval: Duration,
    min_idle: usize,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut probes = Conns::new();
    let pg = PgMetrics::of(&metrics);
    loop {
        let list = servers.list();
        probes.retain(|i, _| list.iter().any(|s| s.index == *i));
        let primary_lsn = probe_all(&servers, &list, &mut probes).await;
        if let Some(every) = servers.cache_every() {
            sample_caches(&list, every, &mut probes, &pg).await;
        }
        for s in list.iter() {
            if s.role == PgRole::Replica {
                let lag = match (primary_lsn, s.lsn()) {
                    (Some(p), r) if r > 0 => p.saturating_sub(r),
                    _ => s.lag.load(Ordering::Relaxed),
                };
                s.lag.store(lag, Ordering::Relaxed);
            }
            if s.is_up() {
                let _ = s.pool.fill_to(min_idle).await;
            }
            s.publish(&metrics, &pg);
        }
        refract_core::membership::eject_slow(&servers.members(), servers.overload());
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Read-your-writes: while sessions wait for a replica to pass their writes, polls the
/// primary's WAL position and the replicas' replay positions every [`LSN_POLL`], each on a
/// dedicated connection (one tiny query per server); idle otherwise.
pub async fn run_lsn_poll(servers: Arc<Servers>, stop: CancellationToken) {
    let mut conns = Conns::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(LSN_POLL) => {}
            _ = stop.cancelled() => return,
        }
        if !servers.fast_poll_wanted() {
            continue;
        }
        let list = servers.list();
        conns.retain(|i, _| list.iter().any(|s| s.index == *i));
        for s in list.iter() {
            if !s.is_up() {
                conns.remove(&s.index);
                continue;
            }
            let seq = (s.role == PgRole::Primary).then(|| servers.begin_primary_poll());
            let sql = match s.role {
                PgRole::Primary => "SELECT pg_current_wal_lsn()::text",
                PgRole::Replica => concat!("SELECT ", replica_lsn!()),
            };
            let Some(lsn) = poll_lsn(s, &mut conns, sql).await else {
                conns.remove(&s.index);
                continue;
            };
            match seq {
                Some(seq) => servers.record_primary_poll(s, seq, lsn),
                None => drop(s.lsn.fetch_max(lsn, Ordering::Relaxed)),
            }
        }
    }
}

/// One WAL position from `sql` on `conn` (connected first if need be).
async fn poll_lsn(s: &Server, conns: &mut Conns, sql: &str) -> Option<u64> {
    let conn = connected(s, conns).await?;
    let lsn = tokio::time::timeout(s.login.timeout, conn.query_one(sql)).await.ok()?.ok()??;
    parse_lsn(&lsn)
}

/// Probes each server; returns the primary's WAL position if it answered.
async fn probe_all(servers: &Servers, list: &[Arc<Server>], probes: &mut Conns) -> Option<u64> {
    let mut primary_lsn = None;
    for s in list {
        let seq = (s.role == PgRole::Primary).then(|| servers.begin_primary_poll());
        let result = probe_one(s, probes).await;
        s.last_check.store(unix_ms(), Ordering::Relaxed);
        match result {
            Some((lsn, lag_ms)) => {
                match seq {
                    Some(seq) => servers.record_primary_poll(s, seq, lsn),
                    None => s.lsn.store(lsn, Ordering::Relaxed),
                }
                s.lag_ms.store(lag_ms, Ordering::Relaxed);
                if s.member.set_up(true) {
                    tracing::info!(server = %s.name, "postgres server up");
                    servers.cold(s, "back up");
                }
                if s.role == PgRole::Primary {
                    primary_lsn = Some(lsn);
                }
            }
            None => {
                probes.remove(&s.index);
                s.mark_down();
            }
        }
    }
    primary_lsn
}

/// Samples the cache of each server that is up and due, on the connection its probe just used
/// (no other).
async fn sample_caches(list: &[Arc<Server>], every: Duration, probes: &mut Conns, pg: &PgMetrics) {
    for s in list {
        if !s.is_up() || !s.cache_state().due(Instant::now(), every) {
            continue;
        }
        let Some(sample) = sample_cache(s, probes).await else { continue };
        let (blocks, warm) = s.cache_state().record(sample, Instant::now(), unix_ms());
        if let Some(blocks) = blocks {
            pg.add_blocks(&s.name, blocks);
        }
        s.log_warm(warm);
    }
}

/// `s`'s cache counters ([`CACHE_PROBE`]) read on its probe connection, if it has one. A
/// failure is not a failed probe: the server stays up, and only a connection left mid-query
/// (timed out, broken) is dropped, for the next probe to open anew.
async fn sample_cache(s: &Server, probes: &mut Conns) -> Option<Sample> {
    let conn = probes.get_mut(&s.index)?;
    match tokio::time::timeout(s.login.timeout, conn.query(CACHE_PROBE)).await {
        Ok(Ok(rows)) => {
            let sample = Sample::from_rows(&rows);
            if sample.is_none() {
                tracing::debug!(server = %s.name, "postgres server cache sample: no row for the database");
            }
            sample
        }
        Ok(Err(PgError::Server(e))) => {
            tracing::debug!(server = %s.name, error = ?e.message(), "postgres server cache sample refused");
            None
        }
        Ok(Err(e)) => {
            tracing::debug!(server = %s.name, "postgres server cache sample failed: {e}");
            probes.remove(&s.index);
            None
        }
        Err(_) => {
            tracing::debug!(server = %s.name, "postgres server cache sample timed out");
            probes.remove(&s.index);
            None
        }
    }
}

/// The primary's probe: its WAL position.
const PRIMARY_PROBE: &str = "SELECT pg_current_wal_lsn()::text, 0";

/// A replica's probe: its position ([`replica_lsn`]), and its replay delay in milliseconds,
/// measured on the replica as `now() - pg_last_xact_replay_timestamp()` but only while it has
/// received WAL it has not replayed yet (`pg_last_wal_receive_lsn() > pg_last_wal_replay_lsn()`;
/// never on a logical replica, where both are NULL). An idle replica that has replayed
/// everything is not lagging however old its last replayed commit is; one that has replayed no
/// commit since it started counts 0.
pub(crate) const REPLICA_PROBE: &str = concat!(
    "SELECT ",
    replica_lsn!(),
    ", CASE WHEN pg_last_wal_receive_lsn() > pg_last_wal_replay_lsn() \
     THEN greatest(0, coalesce((extract(epoch FROM now() - pg_last_xact_replay_timestamp()) * 1000)::bigint, 0)) \
     ELSE 0 END"
);

/// (WAL position, replay delay in ms) if the server answered.
async fn probe_one(s: &Server, probes: &mut Conns) -> Option<(u64, u64)> {
    let conn = connected(s, probes).await?;
    let sql = match s.role {
        PgRole::Primary => PRIMARY_PROBE,
        PgRole::Replica => REPLICA_PROBE,
    };
    let rows = tokio::time::timeout(s.login.timeout, conn.query(sql)).await.ok()?.ok()?;
    let row = rows.into_iter().next()?;
    let lsn = parse_lsn(row.first()?.as_deref()?)?;
    let lag_ms = row.get(1).and_then(|v| v.as_deref()).and_then(|v| v.parse().ok()).unwrap_or(0);
    if s.role == PgRole::Replica && !s.holds_fixed {
        let rows = tokio::time::timeout(s.login.timeout, conn.query(TABLES_PROBE)).await.ok()?.ok()?;
        s.set_holds(holds_from_rows(&rows));
    }
    Some((lsn, lag_ms))
}

/// `s`'s connection in `conns`, connected first if need be.
async fn connected<'a>(s: &Server, conns: &'a mut Conns) -> Option<&'a mut ServerConn> {
    match conns.entry(s.index) {
        std::collections::hash_map::Entry::Occupied(e) => Some(e.into_mut()),
        std::collections::hash_map::Entry::Vacant(e) => {
            Some(e.insert(ServerConn::connect(s.addr(), &s.login).await.ok()?))
        }
    }
}
