//! The hand-over's metric families, shared by both front ends: registered once into the
//! dispatcher's one registry (`refract_core::metrics::Metrics::families`), counted wherever a
//! connection is handed over, handed back or steered.

use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use refract_vocab::{FrontKind, MemberName};

/// A member's labels: `backend` (its plain name), and `front` on a PostgreSQL server's series
/// (the families are both front ends': [`FrontKind::label`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct BackendLabel {
    backend: String,
    front: FrontKind,
}

impl BackendLabel {
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
struct KindLabel {
    kind: String,
}

/// A member's labels and one more (`result`, `end`).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct AndLabel {
    member: BackendLabel,
    key: &'static str,
    value: String,
}

impl EncodeLabelSet for AndLabel {
    fn encode(&self, encoder: LabelSetEncoder) -> std::fmt::Result {
        let labels: Vec<_> = self.member.pairs().chain(std::iter::once((self.key, self.value.as_str()))).collect();
        EncodeLabelSet::encode(&labels.as_slice(), encoder)
    }
}

/// The hand-over's metrics (`refract_handover_*`, `refract_handback`, `refract_bytes_direct`,
/// `refract_steering_*`).
pub struct HandoverMetrics {
    handover: Family<AndLabel, Counter>,
    handback: Family<BackendLabel, Counter>,
    kept: Family<BackendLabel, Counter>,
    forwarded: Family<BackendLabel, Counter>,
    ended: Family<AndLabel, Counter>,
    seconds: Histogram,
    frozen_seconds: Histogram,
    bytes_direct: Family<BackendLabel, Counter>,
    steering_entries: Gauge,
    steering_capacity: Gauge,
    steering_packets: Family<KindLabel, Counter>,
}

impl HandoverMetrics {
    /// Registers the families into `reg` (the dispatcher's registry, prefix `refract`).
    pub fn register(reg: &mut Registry) -> Self {
        let m = HandoverMetrics {
            handover: Family::default(),
            handback: Family::default(),
            kept: Family::default(),
            forwarded: Family::default(),
            ended: Family::default(),
            seconds: Histogram::new(exponential_buckets(0.00001, 2.0, 20)),
            frozen_seconds: Histogram::new(exponential_buckets(0.000002, 2.0, 20)),
            bytes_direct: Family::default(),
            steering_entries: Gauge::default(),
            steering_capacity: Gauge::default(),
            steering_packets: Family::default(),
        };
        m.register_counters(reg);
        m.register_rest(reg);
        m
    }

    fn register_counters(&self, reg: &mut Registry) {
        reg.register(
            "handover",
            "Hand-over attempts by backend and result (ok, or why the request was relayed or the connection lost)",
            self.handover.clone(),
        );
        reg.register("handback", "Connections handed back by the agent", self.handback.clone());
        reg.register(
            "handover_kept",
            "Further requests an agent was let to serve on a connection it owned (reads for its backend)",
            self.kept.clone(),
        );
        reg.register(
            "handover_forwarded",
            "Reads forwarded through the agent (hybrid: results not known to be small)",
            self.forwarded.clone(),
        );
        reg.register(
            "handover_ended",
            "Handed-over connections not handed back: ended at the agent (closed), with it (lost), or taken back when it died with the client idle (taken_back)",
            self.ended.clone(),
        );
    }

    fn register_rest(&self, reg: &mut Registry) {
        reg.register(
            "handover_seconds",
            "Hand-over latency in the dispatcher: from sending the socket (same host) or FREEZE (cross host) to the agent's acceptance",
            self.seconds.clone(),
        );
        reg.register(
            "handover_frozen_seconds",
            "Cross host: from FREEZE to STEER of a flow in the ingress map",
            self.frozen_seconds.clone(),
        );
        reg.register(
            "bytes_direct",
            "Bytes agents sent straight to clients (compare refract_bytes_total{direction=\"to_client\"}, relayed)",
            self.bytes_direct.clone(),
        );
        reg.register(
            "steering_entries",
            "Flows with an entry in the ingress (FREEZE/STEER) map",
            self.steering_entries.clone(),
        );
        reg.register("steering_capacity", "Flows the ingress map can hold", self.steering_capacity.clone());
        reg.register(
            "steering_packets",
            "Packets the ingress program handled since attach: frozen_dropped, steered, redirect_error",
            self.steering_packets.clone(),
        );
    }

    /// Counts a hand-over attempt for `backend`: `result` is `ok` or the reason it failed.
    pub fn handover<'a>(&self, backend: impl Into<MemberName<'a>>, result: &str) {
        self.handover.get_or_create(&and(backend.into(), "result", result)).inc();
    }

    /// Records how long a hand-over took until the agent accepted it.
    pub fn handover_latency(&self, seconds: f64) {
        self.seconds.observe(seconds);
    }

    /// Records how long a flow stayed frozen before it was steered.
    pub fn handover_frozen(&self, seconds: f64) {
        self.frozen_seconds.observe(seconds);
    }

    /// Counts a hand-back from `backend`'s agent.
    pub fn handback<'a>(&self, backend: impl Into<MemberName<'a>>) {
        self.handback.get_or_create(&label(backend)).inc();
    }

    /// Counts a further request `backend`'s agent was let to serve on a connection it owned.
    pub fn handover_kept<'a>(&self, backend: impl Into<MemberName<'a>>) {
        self.kept.get_or_create(&label(backend)).inc();
    }

    /// Counts a read forwarded through `backend`'s agent (hybrid).
    pub fn handover_forwarded<'a>(&self, backend: impl Into<MemberName<'a>>) {
        self.forwarded.get_or_create(&label(backend)).inc();
    }

    /// Counts a handed-over connection that ended without a hand-back (`closed`, `lost` or
    /// `taken_back`).
    pub fn handover_ended<'a>(&self, backend: impl Into<MemberName<'a>>, end: &str) {
        self.ended.get_or_create(&and(backend.into(), "end", end)).inc();
    }

    /// Adds bytes `backend`'s agent sent straight to a client.
    pub fn bytes_direct<'a>(&self, backend: impl Into<MemberName<'a>>, n: u64) {
        self.bytes_direct.get_or_create(&label(backend)).inc_by(n);
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

    /// A member's hand-over totals for the admin view.
    pub fn totals<'a>(&self, backend: impl Into<MemberName<'a>>) -> Totals {
        let backend = backend.into();
        let ok = and(backend, "result", "ok");
        Totals {
            handovers: self.handover.get_or_create(&ok).get(),
            handbacks: self.handback.get_or_create(&label(backend)).get(),
            bytes_direct: self.bytes_direct.get_or_create(&label(backend)).get(),
        }
    }
}

/// A backend's hand-over totals (the admin API's `handover` object).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    /// Hand-overs the agent accepted.
    pub handovers: u64,
    /// Connections the agent handed back.
    pub handbacks: u64,
    /// Bytes the agent sent straight to clients.
    pub bytes_direct: u64,
}

fn label<'a>(m: impl Into<MemberName<'a>>) -> BackendLabel {
    let m = m.into();
    BackendLabel { backend: m.name.into(), front: m.front }
}

fn and(m: MemberName<'_>, key: &'static str, value: &str) -> AndLabel {
    AndLabel { member: label(m), key, value: value.into() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn renders_hand_over_metrics() {
        let mut reg = Registry::with_prefix("refract");
        let m = HandoverMetrics::register(&mut reg);
        m.handover("b2", "ok");
        m.handover("b2", "unreachable");
        m.handover_latency(0.0002);
        m.handback("b2");
        m.handover_kept("b2");
        m.bytes_direct("b2", 1000);
        m.handover_ended("b2", "lost");
        m.set_steering(3, 4096, [("frozen_dropped", 5), ("steered", 7), ("redirect_error", 0)]);
        m.set_steering(2, 4096, [("frozen_dropped", 6), ("steered", 7), ("redirect_error", 0)]);
        let mut text = String::new();
        encode(&mut text, &reg).unwrap();
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
        assert_eq!(m.totals("b2"), Totals { handovers: 1, handbacks: 1, bytes_direct: 1000 });
    }

    #[test]
    fn a_postgres_servers_series_carry_its_front() {
        let mut reg = Registry::with_prefix("refract");
        let m = HandoverMetrics::register(&mut reg);
        let pg = MemberName::postgres("b2");
        m.handover(pg, "ok");
        m.handover_ended(pg, "closed");
        m.handover_forwarded(pg);
        m.bytes_direct(pg, 10);
        m.bytes_direct("b2", 1);
        let mut text = String::new();
        encode(&mut text, &reg).unwrap();
        for line in [
            r#"refract_handover_total{backend="b2",front="postgres",result="ok"} 1"#,
            r#"refract_handover_ended_total{backend="b2",front="postgres",end="closed"} 1"#,
            r#"refract_handover_forwarded_total{backend="b2",front="postgres"} 1"#,
            r#"refract_bytes_direct_total{backend="b2",front="postgres"} 10"#,
            r#"refract_bytes_direct_total{backend="b2"} 1"#,
        ] {
            assert!(
                text.contains(line),
                "{line} missing from
{text}"
            );
        }
        assert_eq!(m.totals(pg).bytes_direct, 10);
        assert_eq!(m.totals("b2").bytes_direct, 1);
    }
}
