//! Prometheus metrics. Hot-path handles (per backend and class) are created once and cached,
//! so that counting a request is an atomic add, not a label lookup.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use refract_http::RouteClass;
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
    backend_up: Family<BackendLabel, Gauge>,
    backend_inflight: Family<BackendLabel, Gauge>,
    pg_replica_lag: Family<BackendLabel, Gauge>,
    pg_replica_lag_seconds: Family<BackendLabel, Gauge<f64, AtomicU64>>,
    pg_pool_idle: Family<BackendLabel, Gauge>,
    pg_pool_busy: Family<BackendLabel, Gauge>,
    pg_pool_waiting: Family<BackendLabel, Gauge>,
    pg_clients: Family<StateLabel, Gauge>,
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
        let backend_up = Family::<BackendLabel, Gauge>::default();
        reg.register("backend_up", "1 when the backend is taking requests", backend_up.clone());
        let backend_inflight = Family::<BackendLabel, Gauge>::default();
        reg.register("backend_in_flight", "Requests in flight per backend", backend_inflight.clone());
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
        Metrics {
            registry: Mutex::new(reg),
            requests,
            errors,
            latency,
            bytes_to_backend: dir("to_backend"),
            bytes_to_client: dir("to_client"),
            connections,
            backend_up,
            backend_inflight,
            pg_replica_lag,
            pg_replica_lag_seconds,
            pg_pool_idle,
            pg_pool_busy,
            pg_pool_waiting,
            pg_clients,
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
        self.backend_up.get_or_create(&l).set(i64::from(up));
        self.backend_inflight.get_or_create(&l).set(inflight as i64);
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

    /// Forgets a removed backend's gauges.
    pub fn remove_backend(&self, name: &str) {
        let l = BackendLabel { backend: name.into() };
        self.backend_up.remove(&l);
        self.backend_inflight.remove(&l);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let reg = self.registry.lock().unwrap_or_else(|p| p.into_inner());
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
        let text = m.render();
        assert!(text.contains(r#"refract_requests_total{class="read",backend="b1"} 1"#), "{text}");
        assert!(text.contains(r#"refract_errors_total{kind="connect"} 1"#), "{text}");
        assert!(text.contains(r#"refract_backend_in_flight{backend="b1"} 2"#), "{text}");
        assert!(text.contains("refract_request_duration_seconds_count{class=\"read\"} 1"), "{text}");
    }
}
