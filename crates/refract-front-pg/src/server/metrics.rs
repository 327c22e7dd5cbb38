//! The PostgreSQL front end's metric families (`refract_pg_*`), registered into the
//! dispatcher's one registry (`refract_core::metrics::Metrics::families`). Only servers are in
//! them: a server's series are labelled by its plain name (`backend="NAME"`), with no `front`.
//! Kept beside the servers, which set most of them; the clients and the sharding layer set
//! theirs (`client::clients`, `sharding`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use refract_core::metrics::Metrics;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabel {
    backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShardLabel {
    shard: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

/// The PostgreSQL front end's metrics.
pub(crate) struct PgMetrics {
    replica_lag: Family<BackendLabel, Gauge>,
    replica_lag_seconds: Family<BackendLabel, Gauge<f64, AtomicU64>>,
    pool_idle: Family<BackendLabel, Gauge>,
    pool_busy: Family<BackendLabel, Gauge>,
    pool_waiting: Family<BackendLabel, Gauge>,
    clients: Family<StateLabel, Gauge>,
    pinned_clients: Gauge,
    shard_statements: Family<ShardLabel, Counter>,
    shard_rows: Family<ShardLabel, Counter>,
    scatter: Counter,
    shard_refused: Counter,
}

impl PgMetrics {
    /// The families in `metrics`' registry (registered the first time).
    pub(crate) fn of(metrics: &Metrics) -> Arc<PgMetrics> {
        metrics.families(PgMetrics::register)
    }

    fn register(reg: &mut Registry) -> PgMetrics {
        let m = PgMetrics {
            replica_lag: Family::default(),
            replica_lag_seconds: Family::default(),
            pool_idle: Family::default(),
            pool_busy: Family::default(),
            pool_waiting: Family::default(),
            clients: Family::default(),
            pinned_clients: Gauge::default(),
            shard_statements: Family::default(),
            shard_rows: Family::default(),
            scatter: Counter::default(),
            shard_refused: Counter::default(),
        };
        m.register_servers(reg);
        m.register_shards(reg);
        m
    }

    fn register_servers(&self, reg: &mut Registry) {
        reg.register(
            "pg_replica_lag_bytes",
            "PostgreSQL replica WAL replay lag behind the primary",
            self.replica_lag.clone(),
        );
        reg.register(
            "pg_replica_lag_seconds",
            "PostgreSQL replica replay delay (0 when it has replayed all it received)",
            self.replica_lag_seconds.clone(),
        );
        reg.register("pg_pool_idle", "Idle PostgreSQL server connections per server", self.pool_idle.clone());
        reg.register("pg_pool_busy", "PostgreSQL server connections checked out per server", self.pool_busy.clone());
        reg.register("pg_pool_waiting", "Statements waiting for a server connection", self.pool_waiting.clone());
        reg.register("pg_clients", "Logged-in PostgreSQL clients by state", self.clients.clone());
        reg.register(
            "pg_pinned_clients",
            "PostgreSQL clients in transaction mode pinned to their server connection by session state",
            self.pinned_clients.clone(),
        );
    }

    fn register_shards(&self, reg: &mut Registry) {
        reg.register(
            "pg_shard_statements",
            "Statements sent to each shard of a sharded PostgreSQL cluster (alone or as part of a fan-out)",
            self.shard_statements.clone(),
        );
        reg.register("pg_shard_rows", "INSERT rows refract placed on each shard by their key", self.shard_rows.clone());
        reg.register(
            "pg_scatter",
            "Statements run on several shards (scatter-gather reads, writes on several shards)",
            self.scatter.clone(),
        );
        reg.register(
            "pg_shard_refused",
            "Statements refused because refract cannot run them exactly across shards (0A000)",
            self.shard_refused.clone(),
        );
    }

    /// Sets a replica's lag gauges: WAL bytes behind the primary, replay delay.
    pub(crate) fn set_lag(&self, name: &str, bytes: u64, seconds: f64) {
        let l = BackendLabel { backend: name.into() };
        self.replica_lag.get_or_create(&l).set(bytes as i64);
        self.replica_lag_seconds.get_or_create(&l).set(seconds);
    }

    /// Sets a server's pool gauges.
    pub(crate) fn set_pool(&self, name: &str, idle: usize, busy: usize, waiting: usize) {
        let l = BackendLabel { backend: name.into() };
        self.pool_idle.get_or_create(&l).set(idle as i64);
        self.pool_busy.get_or_create(&l).set(busy as i64);
        self.pool_waiting.get_or_create(&l).set(waiting as i64);
    }

    /// Sets how many clients are in `state`.
    pub(crate) fn set_clients(&self, state: &str, n: usize) {
        self.clients.get_or_create(&StateLabel { state: state.into() }).set(n as i64);
    }

    /// Sets how many clients are pinned to their server connection.
    pub(crate) fn set_pinned_clients(&self, n: usize) {
        self.pinned_clients.set(n as i64);
    }

    /// Counts a statement sent to `shard`.
    pub(crate) fn shard_statement(&self, shard: &str) {
        self.shard_statements.get_or_create(&ShardLabel { shard: shard.into() }).inc();
    }

    /// Counts `n` INSERT rows placed on `shard`.
    pub(crate) fn shard_rows(&self, shard: &str, n: u64) {
        self.shard_rows.get_or_create(&ShardLabel { shard: shard.into() }).inc_by(n);
    }

    /// Counts a statement run on several shards.
    pub(crate) fn scatter(&self) {
        self.scatter.inc();
    }

    /// Counts a statement refused as not answerable exactly across shards.
    pub(crate) fn shard_refused(&self) {
        self.shard_refused.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_in_the_dispatchers_registry() {
        let m = Metrics::new();
        let pg = PgMetrics::of(&m);
        pg.set_pool("p", 2, 1, 0);
        pg.set_lag("r", 100, 0.5);
        pg.shard_statement("s0");
        pg.scatter();
        let text = m.render();
        for line in [
            r#"refract_pg_pool_idle{backend="p"} 2"#,
            r#"refract_pg_replica_lag_bytes{backend="r"} 100"#,
            r#"refract_pg_shard_statements_total{shard="s0"} 1"#,
            "refract_pg_scatter_total 1",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
