//! Prometheus metrics: the engine's families (requests, connections, backends, admission,
//! overload) in the dispatcher's one registry, and [`Metrics::families`], through which a
//! front end or the hand-over registers its own. Hot-path handles (per backend and class) are
//! created once and cached, so that counting a request is an atomic add, not a label lookup.

use crate::overload::AdmissionView;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use refract_vocab::{FrontKind, MemberName, RouteClass};
use std::any::Any;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct RequestLabels {
    class: String,
    member: BackendLabel,
}

impl EncodeLabelSet for RequestLabels {
    fn encode(&self, encoder: LabelSetEncoder) -> std::fmt::Result {
        let labels: Vec<_> = std::iter::once(("class", self.class.as_str())).chain(self.member.pairs()).collect();
        EncodeLabelSet::encode(&labels.as_slice(), encoder)
    }
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

/// A member's labels: `backend` (its plain name), and `front` on a PostgreSQL server's series
/// (the families are both front ends': [`FrontKind::label`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct BackendLabel {
    backend: String,
    front: FrontKind,
}

impl BackendLabel {
    fn of(m: MemberName<'_>) -> Self {
        BackendLabel { backend: m.name.into(), front: m.front }
    }

    fn pairs(&self) -> impl Iterator<Item = (&'static str, &str)> {
        std::iter::once(("backend", self.backend.as_str())).chain(self.front.label().map(|f| ("front", f)))
    }
}

impl EncodeLabelSet for BackendLabel {
    fn encode(&self, encoder: LabelSetEncoder) -> std::fmt::Result {
        let labels: Vec<_> = self.pairs().collect();
        EncodeLabelSet::encode(&labels.as_slice(), encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerLabel {
    worker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct HowLabels {
    member: BackendLabel,
    how: String,
}

impl EncodeLabelSet for HowLabels {
    fn encode(&self, encoder: LabelSetEncoder) -> std::fmt::Result {
        let labels: Vec<_> = self.member.pairs().chain(std::iter::once(("how", self.how.as_str()))).collect();
        EncodeLabelSet::encode(&labels.as_slice(), encoder)
    }
}

/// The affinity policy's outcome, and `front` on the PostgreSQL front end's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct OutcomeLabels {
    outcome: &'static str,
    front: FrontKind,
}

impl EncodeLabelSet for OutcomeLabels {
    fn encode(&self, encoder: LabelSetEncoder) -> std::fmt::Result {
        let front = self.front.label().map(|f| ("front", f));
        let labels: Vec<_> = std::iter::once(("outcome", self.outcome)).chain(front).collect();
        EncodeLabelSet::encode(&labels.as_slice(), encoder)
    }
}

/// The dispatcher's metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// The families registered through [`Metrics::families`], one of each type.
    families: Mutex<Vec<Arc<dyn Any + Send + Sync>>>,
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
    log_dropped: Counter,
    stall_yields: Family<HowLabels, Counter>,
    balance_affinity: Family<OutcomeLabels, Counter>,
}

/// One front end's handles for the affinity policy's choices (`[balance] policy = "affinity"`).
#[derive(Clone, Debug)]
pub struct AffinityCounters {
    owner: Counter,
    spilled: Counter,
}

impl AffinityCounters {
    /// Counts a read that went to its key's owner, or (`spilled`) past it to the next member
    /// on the ring because the owner was at its bound.
    pub fn count(&self, spilled: bool) {
        if spilled { &self.spilled } else { &self.owner }.inc();
    }
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
            "Admission control's adaptive concurrency limit per backend",
            backend_limit.clone(),
        );
        let backend_queued = Family::<BackendLabel, Gauge>::default();
        reg.register(
            "backend_queued",
            "Requests waiting in admission control's queue per backend",
            backend_queued.clone(),
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
        let balance_affinity = Family::<OutcomeLabels, Counter>::default();
        reg.register(
            "balance_affinity",
            "Reads with an affinity key ([balance] policy = \"affinity\"): to the key's owner, or spilled past it (owner at its bound)",
            balance_affinity.clone(),
        );
        Metrics {
            balance_affinity,
            log_dropped,
            registry: Mutex::new(reg),
            families: Mutex::new(Vec::new()),
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
            stall_yields,
        }
    }

    /// The metric families of type `F` (a front end's, the hand-over's), registered into this
    /// registry by `register` the first time they are asked for, the same ones after that.
    pub fn families<F: Send + Sync + 'static>(&self, register: fn(&mut Registry) -> F) -> Arc<F> {
        let mut known = self.families.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = known.iter().find_map(|f| f.clone().downcast::<F>().ok()) {
            return f;
        }
        let f = Arc::new(register(&mut self.registry.lock().unwrap_or_else(|p| p.into_inner())));
        known.push(f.clone());
        f
    }

    /// Handles for a member's counters.
    pub fn backend<'a>(&self, member: impl Into<MemberName<'a>>) -> BackendCounters {
        let member = BackendLabel::of(member.into());
        let get = |c: RouteClass| {
            let labels = RequestLabels { class: c.as_str().into(), member: member.clone() };
            self.requests.get_or_create(&labels).clone()
        };
        BackendCounters { requests: RouteClass::ALL.map(get) }
    }

    /// Handles for counting the affinity policy's choices among `front`'s members.
    pub fn affinity(&self, front: FrontKind) -> AffinityCounters {
        let get = |outcome| self.balance_affinity.get_or_create(&OutcomeLabels { outcome, front }).clone();
        AffinityCounters { owner: get("owner"), spilled: get("spilled") }
    }

    /// Counts an error of `kind`.
    pub fn error(&self, kind: &str) {
        self.errors.get_or_create(&KindLabel { kind: kind.into() }).inc();
    }

    /// Records how long a request of `class` took.
    pub fn observe(&self, class: RouteClass, seconds: f64) {
        self.latency[class_index(class)].observe(seconds);
    }

    /// Sets a member's state gauges (called at scrape time).
    pub fn set_backend<'a>(&self, member: impl Into<MemberName<'a>>, up: bool, inflight: usize) {
        let l = BackendLabel::of(member.into());
        drop(self.backend_drained.get_or_create(&l));
        self.backend_up.get_or_create(&l).set(i64::from(up));
        self.backend_inflight.get_or_create(&l).set(inflight as i64);
    }

    /// Sets a member's admission gauges: its concurrency limit and its queue.
    pub fn set_admission<'a>(&self, member: impl Into<MemberName<'a>>, v: &AdmissionView) {
        let l = BackendLabel::of(member.into());
        self.backend_limit.get_or_create(&l).set(v.limit as i64);
        self.backend_queued.get_or_create(&l).set(v.queued as i64);
    }

    /// Sets whether a member is drained (`refract_backend_drained`).
    pub fn set_drained<'a>(&self, member: impl Into<MemberName<'a>>, drained: bool) {
        self.backend_drained.get_or_create(&BackendLabel::of(member.into())).set(i64::from(drained));
    }

    /// The gauge of open client connections on worker `worker`.
    pub fn open_connections(&self, worker: usize) -> Gauge {
        self.open_connections.get_or_create(&WorkerLabel { worker: worker.to_string() }).clone()
    }

    /// Counts a backend let go for a client that stopped reading while others waited for it:
    /// `how` is `spilled` (the rest of the response kept for the client) or `cut` (its
    /// connection reset).
    pub fn stall_yield<'a>(&self, backend: impl Into<MemberName<'a>>, how: &str) {
        let labels = HowLabels { member: BackendLabel::of(backend.into()), how: how.into() };
        self.stall_yields.get_or_create(&labels).inc();
    }

    /// Forgets a removed member's gauges.
    pub fn remove_backend<'a>(&self, member: impl Into<MemberName<'a>>) {
        let l = BackendLabel::of(member.into());
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
        m.affinity(FrontKind::Http).count(true);
        m.affinity(FrontKind::Postgres).count(false);
        let text = m.render();
        assert!(text.contains(r#"refract_balance_affinity_total{outcome="spilled"} 1"#), "{text}");
        assert!(text.contains(r#"refract_balance_affinity_total{outcome="owner"} 0"#), "{text}");
        assert!(text.contains(r#"refract_balance_affinity_total{outcome="owner",front="postgres"} 1"#), "{text}");
        assert!(text.contains(r#"refract_stall_yields_total{backend="b1",how="spilled"} 1"#), "{text}");
        assert!(text.contains(r#"refract_requests_total{class="read",backend="b1"} 1"#), "{text}");
        assert!(text.contains(r#"refract_errors_total{kind="connect"} 1"#), "{text}");
        assert!(text.contains(r#"refract_backend_in_flight{backend="b1"} 2"#), "{text}");
        assert!(text.contains("refract_request_duration_seconds_count{class=\"read\"} 1"), "{text}");
    }

    #[test]
    fn a_postgres_servers_series_carry_its_plain_name_and_front() {
        let m = Metrics::new();
        let pg = MemberName::postgres("b1");
        m.backend(pg).request(RouteClass::Write);
        m.set_backend("b1", true, 0);
        m.set_backend(pg, false, 3);
        let text = m.render();
        assert!(text.contains(r#"refract_backend_up{backend="b1"} 1"#), "{text}");
        assert!(text.contains(r#"refract_backend_up{backend="b1",front="postgres"} 0"#), "{text}");
        assert!(text.contains(r#"refract_backend_in_flight{backend="b1",front="postgres"} 3"#), "{text}");
        assert!(text.contains(r#"refract_requests_total{class="write",backend="b1",front="postgres"} 1"#), "{text}");
        m.remove_backend(pg);
        let text = m.render();
        assert!(!text.contains(r#"refract_backend_up{backend="b1",front="postgres"}"#), "{text}");
        assert!(text.contains(r#"refract_backend_up{backend="b1"} 1"#), "the HTTP backend's stays: {text}");
    }

    struct Extra(Counter);

    fn extra(reg: &mut Registry) -> Extra {
        let c = Counter::default();
        reg.register("extra", "A front end's family", c.clone());
        Extra(c)
    }

    #[test]
    fn families_are_registered_once_into_the_one_registry() {
        let m = Metrics::new();
        m.families(extra).0.inc();
        m.families(extra).0.inc();
        let text = m.render();
        assert!(text.contains("refract_extra_total 2"), "{text}");
        assert_eq!(text.matches("# TYPE refract_extra counter").count(), 1, "{text}");
    }
}
