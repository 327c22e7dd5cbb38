//! The PostgreSQL front end's metric families (`refract_pg_*`), registered into the
//! dispatcher's one registry (`refract_core::metrics::Metrics::families`). Only servers are in
//! them: a server's series are labelled by its plain name (`backend="NAME"`), with no `front`.
//! Kept beside the servers, which set most of them; the clients and the sharding layer set
//! theirs (`client::clients`, `sharding`).

use super::cache::Blocks;
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
#[derive(Debug)]
pub(crate) struct PgMetrics {
    replica_lag: Family<BackendLabel, Gauge>,
    replica_lag_seconds: Family<BackendLabel, Gauge<f64, AtomicU64>>,
    pool_idle: Family<BackendLabel, Gauge>,
    pool_busy: Family<BackendLabel, Gauge>,
    pool_waiting: Family<BackendLabel, Gauge>,
    cache_hit_ratio: Family<BackendLabel, Gauge<f64, AtomicU64>>,
    blocks_hit: Family<BackendLabel, Counter>,
    blocks_read: Family<BackendLabel, Counter>,
    cache_warming: Family<BackendLabel, Gauge>,
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
            cache_hit_ratio: Family::default(),
            blocks_hit: Family::default(),
            blocks_read: Family::default(),
            cache_warming: Family::default(),
            clients: Family::default(),
            pinned_clients: Gauge::default(),
            shard_statements: Family::default(),
            shard_rows: Family::default(),
            scatter: Counter::default(),
            shard_refused: Counter::default(),
        };
        m.register_servers(reg);
        m.register_caches(reg);
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

    fn register_caches(&self, reg: &mut Registry) {
        reg.register(
            "pg_server_cache_hit_ratio",
            "Share of the blocks a PostgreSQL server's database touched over the last cache sample interval \
             that were found in its shared buffers (absent when that interval touched none)",
            self.cache_hit_ratio.clone(),
        );
        reg.register(
            "pg_server_blocks_hit",
            "Blocks a PostgreSQL server's database found in its shared buffers (pg_stat_database.blks_hit), \
             counted between cache samples",
            self.blocks_hit.clone(),
        );
        reg.register(
            "pg_server_blocks_read",
            "Blocks a PostgreSQL server's database read from outside its shared buffers \
             (pg_stat_database.blks_read), counted between cache samples",
            self.blocks_read.clone(),
        );
        reg.register(
            "pg_server_cache_warming",
            "1 while a PostgreSQL server's cache is warming (it joined, came back up or was undrained)",
            self.cache_warming.clone(),
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

    /// Counts a server's database blocks over one cache sample interval.
    pub(crate) fn add_blocks(&self, name: &str, blocks: Blocks) {
        let l = BackendLabel { backend: name.into() };
        self.blocks_hit.get_or_create(&l).inc_by(blocks.hit);
        self.blocks_read.get_or_create(&l).inc_by(blocks.read);
    }

    /// Sets a server's cache gauges: its hit ratio over the last interval (`None`: the
    /// interval touched no block, or there is none yet: no series) and whether it is warming.
    pub(crate) fn set_cache(&self, name: &str, interval_hit_ratio: Option<f64>, warming: bool) {
        let l = BackendLabel { backend: name.into() };
        match interval_hit_ratio {
            Some(r) => {
                self.cache_hit_ratio.get_or_create(&l).set(r);
            }
            None => {
                self.cache_hit_ratio.remove(&l);
            }
        }
        self.cache_warming.get_or_create(&l).set(i64::from(warming));
    }

    /// Drops the series of a server that left.
    pub(crate) fn forget_server(&self, name: &str) {
        let l = BackendLabel { backend: name.into() };
        for family in [&self.replica_lag, &self.pool_idle, &self.pool_busy, &self.pool_waiting, &self.cache_warming] {
            family.remove(&l);
        }
        self.replica_lag_seconds.remove(&l);
        self.cache_hit_ratio.remove(&l);
        self.blocks_hit.remove(&l);
        self.blocks_read.remove(&l);
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
        pg.add_blocks("r", Blocks { hit: 90, read: 10 });
        pg.add_blocks("r", Blocks { hit: 9, read: 1 });
        pg.set_cache("r", Some(0.9), true);
        let text = m.render();
        for line in [
            r#"refract_pg_pool_idle{backend="p"} 2"#,
            r#"refract_pg_replica_lag_bytes{backend="r"} 100"#,
            r#"refract_pg_shard_statements_total{shard="s0"} 1"#,
            "refract_pg_scatter_total 1",
            r#"refract_pg_server_blocks_hit_total{backend="r"} 99"#,
            r#"refract_pg_server_blocks_read_total{backend="r"} 11"#,
            r#"refract_pg_server_cache_hit_ratio{backend="r"} 0.9"#,
            r#"refract_pg_server_cache_warming{backend="r"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }

    #[test]
    fn an_idle_interval_has_no_ratio_and_a_server_that_left_no_series() {
        let m = Metrics::new();
        let pg = PgMetrics::of(&m);
        pg.set_cache("r", Some(0.5), false);
        pg.set_cache("r", None, false);
        let text = m.render();
        assert!(!text.contains(r#"refract_pg_server_cache_hit_ratio{backend="r"}"#), "{text}");
        assert!(text.contains(r#"refract_pg_server_cache_warming{backend="r"} 0"#), "{text}");
        pg.set_pool("r", 1, 0, 0);
        pg.add_blocks("r", Blocks { hit: 1, read: 0 });
        pg.forget_server("r");
        let text = m.render();
        assert!(!text.contains(r#"backend="r""#), "{text}");
    }
}
