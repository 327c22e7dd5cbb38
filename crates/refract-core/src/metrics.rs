//! Prometheus metrics. Hot-path handles (per backend and class) are created once and cached,
//! so that counting a request is an atomic add, not a label lookup.

use crate::overload::AdmissionView;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use refract_vocab::RouteClass;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    class: String,
    backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabel {
    class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabel {
    backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShardLabel {
    shard: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerLabel {
    worker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandoverLabels {
    backend: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndLabels {
    backend: String,
    end: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HowLabels {
    backend: String,
    how: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

/// The dispatcher's metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    requests: Family<RequestLabels, Counter>,
    errors: Family<KindLabel, Counter>,
    latency: [Histogram; 4],
    /// Body and head bytes sent to backends.
    pub bytes_to_backend: Counter,
    /// Bytes relayed to clients.
    pub bytes_to_client: Counter,
    /// Client connections accepted.
    pub connections: Counter,
    open_connections: Family<WorkerLabel, Gauge>,
    /// Time the event loops spent busy polling (`[listen] busy_poll_us`).
    pub busy_poll_seconds: Counter<f64, AtomicU64>,
    backend_up: Family<BackendLabel, Gauge>,
    backend_drained: Family<BackendLabel, Gauge>,
    backend_inflight: Family<BackendLabel, Gauge>,
    backend_limit: Family<BackendLabel, Gauge>,
    backend_queued: Family<BackendLabel, Gauge>,
    pg_replica_lag: Family<BackendLabel, Gauge>,
    pg_replica_lag_seconds: Family<BackendLabel, Gauge<f64, AtomicU64>>,
    pg_pool_idle: Family<BackendLabel, Gauge>,
    pg_pool_busy: Family<BackendLabel, Gauge>,
    pg_pool_waiting: Family<BackendLabel, Gauge>,
    pg_clients: Family<StateLabel, Gauge>,
    pg_pinned_clients: Gauge,
    pg_shard_statements: Family<ShardLabel, Counter>,
    pg_shard_rows: Family<ShardLabel, Counter>,
    pg_scatter: Counter,
    pg_shard_refused: Counter,
    handover: Family<HandoverLabels, Counter>,
    handback: Family<BackendLabel, Counter>,
    handover_kept: Family<BackendLabel, Counter>,
    handover_forwarded: Family<BackendLabel, Counter>,
    handover_ended: Family<EndLabels, Counter>,
    handover_seconds: Histogram,
    handover_frozen_seconds: Histogram,
    bytes_direct: Family<BackendLabel, Counter>,
    steering_entries: Gauge,
    steering_capacity: Gauge,
    steering_packets: Family<KindLabel, Counter>,
    log_dropped: Counter,
    stall_yields: Family<HowLabels, Counter>,
}

/// Per-backend handles, one request counter per route class.
#[derive(Clone, Debug)]
pub struct BackendCounters {
    requests: [Counter; 4],
}

impl BackendCounters {
    /// Counts one request of `class`.
    pub fn request(&self, class: RouteClass) {
        self.requests[class_index(class)].inc();
    }
}

fn class_index(class: RouteClass) -> usize {
    RouteClass::ALL.iter().position(|c| *c == class).unwrap_or(0)
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Self {
        let mut reg = Registry::with_prefix("refract");
        let requests = Family::<RequestLabels, Counter>::default();
        reg.register("requests", "Requests forwarded, by route class and backend", requests.clone());
        let errors = Family::<KindLabel, Counter>::default();
        reg.register("errors", "Failed requests, by kind", errors.clone());
        let latency_family = Family::<ClassLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.00005, 2.0, 20))
        });
        reg.register("request_duration_seconds", "Time from request head to response end", latency_family.clone());
        let latency =
            RouteClass::ALL.map(|c| latency_family.get_or_create(&ClassLabel { class: c.as_str().into() }).clone());
        let bytes = Family::<DirectionLabel, Counter>::default();
        reg.register("bytes", "Bytes relayed", bytes.clone());
        let dir = |d: &str| bytes.get_or_create(&DirectionLabel { direction: d.into() }).clone();
        let connections = Counter::default();
        reg.register("client_connections", "Client connections accepted", connections.clone());
        let open_connections = Family::<WorkerLabel, Gauge>::default();
        reg.register(
            "client_connections_open",
            "Open client connections (HTTP and PostgreSQL) per worker (event loop)",
            open_connections.clone(),
        );
        let busy_poll_seconds = Counter::<f64, AtomicU64>::default();
        reg.register(
            "busy_poll_seconds",
            "Time the event loops spent polling for work instead of sleeping ([listen] busy_poll_us)",
            busy_poll_seconds.clone(),
        );
        let backend_up = Family::<BackendLabel, Gauge>::default();
        reg.register("backend_up", "1 when the backend is taking requests", backend_up.clone());
        let backend_drained = Family::<BackendLabel, Gauge>::default();
        reg.register("backend_drained", "1 when an operator drained the backend", backend_drained.clone());
        let backend_inflight = Family::<BackendLabel, Gauge>::default();
        reg.register("backend_in_flight", "Requests in flight per backend", backend_inflight.clone());
        let backend_limit = Family::<BackendLabel, Gauge>::default();
        reg.register(
            "backend_concurrency_limit",
            "Admission control's adaptive concurrency limit per backend (PostgreSQL servers: pg:NAME)",
            backend_limit.clone(),
        );
        let backend_queued = Family::<BackendLabel, Gauge>::default();
        reg.register(
            "backend_queued",
            "Requests waiting in admission control's queue per backend",
            backend_queued.clone(),
        );
        let pg_replica_lag = Family::<BackendLabel, Gauge>::default();
        reg.register(
            "pg_replica_lag_bytes",
            "PostgreSQL replica WAL replay lag behind the primary",
            pg_replica_lag.clone(),
        );
        let pg_replica_lag_seconds = Family::<BackendLabel, Gauge<f64, AtomicU64>>::default();
        reg.register(
            "pg_replica_lag_seconds",
            "PostgreSQL replica replay delay (0 when it has replayed all it received)",
            pg_replica_lag_seconds.clone(),
        );
        let pg_pool_idle = Family::<BackendLabel, Gauge>::default();
        reg.register("pg_pool_idle", "Idle PostgreSQL server connections per server", pg_pool_idle.clone());
        let pg_pool_busy = Family::<BackendLabel, Gauge>::default();
        reg.register("pg_pool_busy", "PostgreSQL server connections checked out per server", pg_pool_busy.clone());
        let pg_pool_waiting = Family::<BackendLabel, Gauge>::default();
        reg.register("pg_pool_waiting", "Statements waiting for a server connection", pg_pool_waiting.clone());
        let pg_clients = Family::<StateLabel, Gauge>::default();
        reg.register("pg_clients", "Logged-in PostgreSQL clients by state", pg_clients.clone());
        let pg_pinned_clients = Gauge::default();
        reg.register(
            "pg_pinned_clients",
            "PostgreSQL clients in transaction mode pinned to their server connection by session state",
            pg_pinned_clients.clone(),
        );
        let pg_shard_statements = Family::<ShardLabel, Counter>::default();
        reg.register(
            "pg_shard_statements",
            "Statements sent to each shard of a sharded PostgreSQL cluster (alone or as part of a fan-out)",
            pg_shard_statements.clone(),
        );
        let pg_shard_rows = Family::<ShardLabel, Counter>::default();
        reg.register("pg_shard_rows", "INSERT rows refract placed on each shard by their key", pg_shard_rows.clone());
        let pg_scatter = Counter::default();
        reg.register(
            "pg_scatter",
            "Statements run on several shards (scatter-gather reads, writes on several shards)",
            pg_scatter.clone(),
        );
        let pg_shard_refused = Counter::default();
        reg.register(
            "pg_shard_refused",
            "Statements refused because refract cannot run them exactly across shards (0A000)",
            pg_shard_refused.clone(),
        );
        let handover = Family::<HandoverLabels, Counter>::default();
        reg.register(
            "handover",
            "Hand-over attempts by backend and result (ok, or why the request was relayed or the connection lost)",
            handover.clone(),
        );
        let handback = Family::<BackendLabel, Counter>::default();
        reg.register("handback", "Connections handed back by the agent", handback.clone());
        let handover_kept = Family::<BackendLabel, Counter>::default();
        reg.register(
            "handover_kept",
            "Further requests an agent was let to serve on a connection it owned (reads for its backend)",
            handover_kept.clone(),
        );
        let handover_forwarded = Family::<BackendLabel, Counter>::default();
        reg.register(
            "handover_forwarded",
            "Reads forwarded through the agent (hybrid: results not known to be small)",
            handover_forwarded.clone(),
        );
        let handover_ended = Family::<EndLabels, Counter>::default();
        reg.register(
            "handover_ended",
            "Handed-over connections not handed back: ended at the agent (closed), with it (lost), or taken back when it died with the client idle (taken_back)",
            handover_ended.clone(),
        );
        let handover_seconds = Histogram::new(exponential_buckets(0.00001, 2.0, 20));
        reg.register(
            "handover_seconds",
            "Hand-over latency in the dispatcher: from sending the socket (same host) or FREEZE (cross host) to the agent's acceptance",
            handover_seconds.clone(),
        );
        let handover_frozen_seconds = Histogram::new(exponential_buckets(0.000002, 2.0, 20));
        reg.register(
            "handover_frozen_seconds",
            "Cross host: from FREEZE to STEER of a flow in the ingress map",
            handover_frozen_seconds.clone(),
        );
        let bytes_direct = Family::<BackendLabel, Counter>::default();
        reg.register(
            "bytes_direct",
            "Bytes agents sent straight to clients (compare refract_bytes_total{direction=\"to_client\"}, relayed)",
            bytes_direct.clone(),
        );
        let steering_entries = Gauge::default();
        reg.register(
            "steering_entries",
            "Flows with an entry in the ingress (FREEZE/STEER) map",
            steering_entries.clone(),
        );
        let steering_capacity = Gauge::default();
        reg.register("steering_capacity", "Flows the ingress map can hold", steering_capacity.clone());
        let steering_packets = Family::<KindLabel, Counter>::default();
        reg.register(
            "steering_packets",
            "Packets the ingress program handled since attach: frozen_dropped, steered, redirect_error",
            steering_packets.clone(),
        );
        let log_dropped = Counter::default();
        reg.register(
            "log_lines_dropped",
            "Log lines dropped because stderr's reader was slow or gone (docs/operations.md, Logs)",
            log_dropped.clone(),
        );
        let stall_yields = Family::<HowLabels, Counter>::default();
        reg.register(
            "stall_yields",
            "Backends let go for a client that stopped reading while others waited: spilled, cut",
            stall_yields.clone(),
        );
        Metrics {
            log_dropped,
            registry: Mutex::new(reg),
            requests,
            errors,
            latency,
            bytes_to_backend: dir("to_backend"),
            bytes_to_client: dir("to_client"),
            connections,
            open_connections,
            busy_poll_seconds,
            backend_up,
            backend_drained,
            backend_inflight,
            backend_limit,
            backend_queued,
            pg_replica_lag,
            pg_replica_lag_seconds,
            pg_pool_idle,
            pg_pool_busy,
            pg_pool_waiting,
            pg_clients,
            pg_pinned_clients,
            pg_shard_statements,
            pg_shard_rows,
            pg_scatter,
            pg_shard_refused,
            handover,
            handback,
            handover_kept,
            handover_forwarded,
            handover_ended,
            handover_seconds,
            handover_frozen_seconds,
            bytes_direct,
            steering_entries,
            steering_capacity,
            steering_packets,
            stall_yields,
        }
    }

    /// Handles for a backend's counters.
    pub fn backend(&self, name: &str) -> BackendCounters {
        let get = |c: RouteClass| {
            self.requests.get_or_create(&RequestLabels { class: c.as_str().into(), backend: name.into() }).clone()
        };
        BackendCounters { requests: RouteClass::ALL.map(get) }
    }

    /// Counts an error of `kind`.
    pub fn error(&self, kind: &str) {
        self.errors.get_or_create(&KindLabel { kind: kind.into() }).inc();
    }

    /// Records how long a request of `class` took.
    pub fn observe(&self, class: RouteClass, seconds: f64) {
        self.latency[class_index(class)].observe(seconds);
    }

    /// Sets a backend's state gauges (called at scrape time).
    pub fn set_backend(&self, name: &str, up: bool, inflight: usize) {
        let l = BackendLabel { backend: name.into() };
        drop(self.backend_drained.get_or_create(&l));
        self.backend_up.get_or_create(&l).set(i64::from(up));
        self.backend_inflight.get_or_create(&l).set(inflight as i64);
    }

    /// Sets a backend's admission gauges: its concurrency limit and its queue.
    pub fn set_admission(&self, name: &str, v: &AdmissionView) {
        let l = BackendLabel { backend: name.into() };
        self.backend_limit.get_or_create(&l).set(v.limit as i64);
        self.backend_queued.get_or_create(&l).set(v.queued as i64);
    }

    /// Sets whether backend `name` is drained (`refract_backend_drained`).
    pub fn set_drained(&self, name: &str, drained: bool) {
        self.backend_drained.get_or_create(&BackendLabel { backend: name.into() }).set(i64::from(drained));
    }

    /// Sets a PostgreSQL replica's lag gauge (WAL bytes behind the primary).
    pub fn set_pg_lag(&self, name: &str, bytes: u64) {
        self.pg_replica_lag.get_or_create(&BackendLabel { backend: name.into() }).set(bytes as i64);
    }

    /// Sets a PostgreSQL replica's replay delay gauge.
    pub fn set_pg_lag_seconds(&self, name: &str, seconds: f64) {
        self.pg_replica_lag_seconds.get_or_create(&BackendLabel { backend: name.into() }).set(seconds);
    }

    /// Sets a PostgreSQL server's pool gauges.
    pub fn set_pg_pool(&self, name: &str, idle: usize, busy: usize, waiting: usize) {
        let l = BackendLabel { backend: name.into() };
        self.pg_pool_idle.get_or_create(&l).set(idle as i64);
        self.pg_pool_busy.get_or_create(&l).set(busy as i64);
        self.pg_pool_waiting.get_or_create(&l).set(waiting as i64);
    }

    /// Sets how many PostgreSQL clients are in `state`.
    pub fn set_pg_clients(&self, state: &str, n: usize) {
        self.pg_clients.get_or_create(&StateLabel { state: state.into() }).set(n as i64);
    }

    /// Sets how many PostgreSQL clients are pinned to their server connection.
    /// Counts a statement sent to `shard`.
    pub fn pg_shard_statement(&self, shard: &str) {
        self.pg_shard_statements.get_or_create(&ShardLabel { shard: shard.into() }).inc();
    }

    /// Counts `n` INSERT rows placed on `shard`.
    pub fn pg_shard_rows(&self, shard: &str, n: u64) {
        self.pg_shard_rows.get_or_create(&ShardLabel { shard: shard.into() }).inc_by(n);
    }

    /// Counts a statement run on several shards.
    pub fn pg_scatter(&self) {
        self.pg_scatter.inc();
    }

    /// Counts a statement refused as not answerable exactly across shards.
    pub fn pg_shard_refused(&self) {
        self.pg_shard_refused.inc();
    }

    pub fn set_pg_pinned_clients(&self, n: usize) {
        self.pg_pinned_clients.set(n as i64);
    }

    /// The gauge of open client connections on worker `worker`.
    pub fn open_connections(&self, worker: usize) -> Gauge {
        self.open_connections.get_or_create(&WorkerLabel { worker: worker.to_string() }).clone()
    }

    /// Counts a hand-over attempt for `backend`: `result` is `ok` or the reason it failed.
    pub fn handover(&self, backend: &str, result: &str) {
        self.handover.get_or_create(&HandoverLabels { backend: backend.into(), result: result.into() }).inc();
    }

    /// Records how long a hand-over took until the agent accepted it.
    pub fn handover_latency(&self, seconds: f64) {
        self.handover_seconds.observe(seconds);
    }

    /// Records how long a flow stayed frozen before it was steered.
    pub fn handover_frozen(&self, seconds: f64) {
        self.handover_frozen_seconds.observe(seconds);
    }

    /// Counts a hand-back from `backend`'s agent.
    pub fn handback(&self, backend: &str) {
        self.handback.get_or_create(&BackendLabel { backend: backend.into() }).inc();
    }

    /// Counts a further request `backend`'s agent was let to serve on a connection it owned.
    pub fn handover_kept(&self, backend: &str) {
        self.handover_kept.get_or_create(&BackendLabel { backend: backend.into() }).inc();
    }

    /// Counts a read forwarded through `backend`'s agent (hybrid).
    pub fn handover_forwarded(&self, backend: &str) {
        self.handover_forwarded.get_or_create(&BackendLabel { backend: backend.into() }).inc();
    }

    /// Counts a handed-over connection that ended without a hand-back (`closed` or `lost`).
    pub fn handover_ended(&self, backend: &str, end: &str) {
        self.handover_ended.get_or_create(&EndLabels { backend: backend.into(), end: end.into() }).inc();
    }

    /// Counts a backend let go for a client that stopped reading while others waited for it:
    /// `how` is `spilled` (the rest of the response kept for the client) or `cut` (its
    /// connection reset).
    pub fn stall_yield(&self, backend: &str, how: &str) {
        self.stall_yields.get_or_create(&HowLabels { backend: backend.into(), how: how.into() }).inc();
    }

    /// Adds bytes `backend`'s agent sent straight to a client.
    pub fn bytes_direct(&self, backend: &str, n: u64) {
        self.bytes_direct.get_or_create(&BackendLabel { backend: backend.into() }).inc_by(n);
    }

    /// Sets the ingress map's gauges and brings its packet counters up to the program's totals
    /// (called at scrape time).
    pub fn set_steering(&self, entries: usize, capacity: u32, packets: [(&str, u64); 3]) {
        self.steering_entries.set(entries as i64);
        self.steering_capacity.set(i64::from(capacity));
        for (kind, total) in packets {
            let c = self.steering_packets.get_or_create(&KindLabel { kind: kind.into() });
            let seen = c.get();
            if total > seen {
                c.inc_by(total - seen);
            }
        }
    }

    /// A backend's hand-over totals for the admin view: hand-overs, hand-backs, direct bytes.
    pub fn handover_view(&self, backend: &str) -> serde_json::Value {
        let b = BackendLabel { backend: backend.into() };
        let ok = HandoverLabels { backend: backend.into(), result: "ok".into() };
        serde_json::json!({
            "handovers": self.handover.get_or_create(&ok).get(),
            "handbacks": self.handback.get_or_create(&b).get(),
            "bytes_direct": self.bytes_direct.get_or_create(&b).get(),
        })
    }

    /// Forgets a removed backend's gauges.
    pub fn remove_backend(&self, name: &str) {
        let l = BackendLabel { backend: name.into() };
        self.backend_up.remove(&l);
        self.backend_drained.remove(&l);
        self.backend_inflight.remove(&l);
        self.backend_limit.remove(&l);
        self.backend_queued.remove(&l);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let reg = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        // The count lives in the log writer; brought up to date here, under the registry lock.
        let seen = self.log_dropped.get();
        self.log_dropped.inc_by(refract_process::log::dropped().saturating_sub(seen));
        if encode(&mut out, &reg).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counted_values() {
        let m = Metrics::new();
        m.backend("b1").request(RouteClass::Read);
        m.error("connect");
        m.observe(RouteClass::Read, 0.001);
        m.set_backend("b1", true, 2);
        m.stall_yield("b1", "spilled");
        let text = m.render();
        assert!(text.contains(r#"refract_stall_yields_total{backend="b1",how="spilled"} 1"#), "{text}");
        assert!(text.contains(r#"refract_requests_total{class="read",backend="b1"} 1"#), "{text}");
        assert!(text.contains(r#"refract_errors_total{kind="connect"} 1"#), "{text}");
        assert!(text.contains(r#"refract_backend_in_flight{backend="b1"} 2"#), "{text}");
        assert!(text.contains("refract_request_duration_seconds_count{class=\"read\"} 1"), "{text}");
    }

    #[test]
    fn renders_hand_over_metrics() {
        let m = Metrics::new();
        m.handover("b2", "ok");
        m.handover("b2", "unreachable");
        m.handover_latency(0.0002);
        m.handback("b2");
        m.handover_kept("b2");
        m.bytes_direct("b2", 1000);
        m.handover_ended("b2", "lost");
        m.set_steering(3, 4096, [("frozen_dropped", 5), ("steered", 7), ("redirect_error", 0)]);
        m.set_steering(2, 4096, [("frozen_dropped", 6), ("steered", 7), ("redirect_error", 0)]);
        let text = m.render();
        for line in [
            r#"refract_handover_total{backend="b2",result="ok"} 1"#,
            r#"refract_handover_total{backend="b2",result="unreachable"} 1"#,
            r#"refract_handback_total{backend="b2"} 1"#,
            r#"refract_handover_kept_total{backend="b2"} 1"#,
            r#"refract_bytes_direct_total{backend="b2"} 1000"#,
            r#"refract_handover_ended_total{backend="b2",end="lost"} 1"#,
            "refract_handover_seconds_count 1",
            "refract_steering_entries 2",
            "refract_steering_capacity 4096",
            r#"refract_steering_packets_total{kind="frozen_dropped"} 6"#,
            r#"refract_steering_packets_total{kind="steered"} 7"#,
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        let v = m.handover_view("b2");
        assert_eq!(v, serde_json::json!({"handovers": 1, "handbacks": 1, "bytes_direct": 1000}));
    }
}
