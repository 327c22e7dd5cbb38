//! The hand-over façade of the session loop: at a request boundary, decide whether the agent in
//! front of the chosen backend should answer the client itself, move the connection there and
//! take it back. Any failure before the agent adopts the connection means: relay as usual.
//!
//! # Layout
//! - [`offer`] (this file): the decision (mode, class, body, backend with an agent).
//! - `cut.rs`: HTTP's side of the protocol-neutral hand-over client (`refract_handover::seam`):
//!   what travels at the cut, the `Next` verdict; and the one settling of how the agent's
//!   ownership ended, whichever way the socket comes back (`Land`).
//! - `local.rs`: the same-host move (SCM_RIGHTS over the agent's Unix socket), with epochs.
//! - `remote.rs`: the TCP_REPAIR move over the control channel kept by the session.
//! - the ingress map (FREEZE, STEER) on `[handover] interface` is `refract_handover::across::steer`.
//! - `hybrid.rs`: reads go through the agent (same host or across hosts), which asks for the
//!   connection when a result is large.
//! - `keep.rs`: while an agent owns the connection, it asks (`Next`) about each further
//!   request; reads its backend may take now are served there, the rest come back.
//!
//! Every attempt is counted in `refract_handover_total{backend, result}` ([`Why`] names the
//! failures), hand-backs, direct bytes and latency through [`Rec`] (docs/handover.md,
//! "Observability").

mod cut;
mod hybrid;
mod keep;
mod local;
mod remote;
mod sizes;

use crate::config::{AgentAddr, HandoverMode, HttpConfig};
use crate::conn::ClientConn;
use crate::request::ReqBody;
use bytes::Bytes;
use refract_core::backend::Backend;
use refract_core::ctx::Ctx;
use refract_handover::control::ControlChannel;
use refract_handover::local::LocalLink;
use refract_handover::metrics::HandoverMetrics;
use refract_handover::EpochTracker;
use refract_http::{PlanTables, RouteClass};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

pub(crate) use refract_handover::across::{Declined, Why};

/// One hand-over's context: the dispatcher (its routing of the requests the agent asks about,
/// its metrics) and the backend whose agent was asked (its series of the metrics).
#[derive(Clone, Copy)]
pub(crate) struct Rec<'a> {
    pub ctx: &'a Ctx,
    pub b: &'a Arc<Backend>,
    /// What this read's result turned out to be (hybrid learns from it, `sizes.rs`).
    pub seen: &'a sizes::Seen,
}

impl Rec<'_> {
    fn metrics(&self) -> Arc<HandoverMetrics> {
        families(self.ctx)
    }

    fn backend(&self) -> &str {
        &self.b.name
    }

    /// `[handover] idle_ms`: how long the agent waits for the client's next request.
    fn idle_ms(&self) -> u32 {
        HttpConfig::of(&self.ctx.cfg).handover.as_ref().map_or(0, |h| h.idle_ms)
    }

    /// The agent was let to serve a further request (counted like a forwarded read).
    fn kept(&self) {
        self.metrics().handover_kept(self.backend());
        self.b.counters.request(RouteClass::Read);
        self.b.record(true);
    }

    /// The agent accepted the connection; the hand-over started at `since`.
    fn accepted(&self, since: Instant) {
        self.metrics().handover(self.backend(), "ok");
        self.metrics().handover_latency(since.elapsed().as_secs_f64());
    }

    /// The hand-over failed for `why`.
    fn failed(&self, why: Why) {
        self.metrics().handover(self.backend(), why.as_str());
    }

    /// The connection came back; the agent wrote `sent` bytes to the client.
    fn handed_back(&self, sent: u64) {
        self.metrics().handback(self.backend());
        self.metrics().bytes_direct(self.backend(), sent);
    }

    /// The hand-over did not happen for `why` (also counted as a declined error).
    fn declined(&self, why: Why) {
        self.failed(why);
        self.ctx.metrics.error("handover_declined");
    }

    /// The connection ended at the agent (`sent`: what it wrote, if it said) or with it.
    fn ended(&self, sent: Option<u64>) {
        match sent {
            Some(n) => {
                self.metrics().handover_ended(self.backend(), "closed");
                self.metrics().bytes_direct(self.backend(), n);
            }
            None => self.metrics().handover_ended(self.backend(), "lost"),
        }
    }

    /// The agent was lost while the client was idle there: the connection is back here.
    fn taken_back(&self) {
        self.metrics().handover_ended(self.backend(), "taken_back");
    }

    /// Bytes the dispatcher relayed to the client for the agent (hybrid, small results).
    fn relayed(&self, n: usize) {
        self.ctx.metrics.bytes_to_client.inc_by(n as u64);
        self.seen.relayed.fetch_add(n as u64, Relaxed);
    }

    /// The agent asked for the connection: the result is large.
    fn wanted(&self) {
        self.seen.large.store(true, Relaxed);
    }
}

/// A read relayed without the agent (hybrid): remembers its result's size, so that it goes
/// through the agent again only once its result is large (`sizes.rs`).
pub(crate) fn relayed_directly(ctx: &Ctx, class: RouteClass, head_bytes: &[u8], body: &ReqBody, bytes: u64) {
    let hybrid = HttpConfig::of(&ctx.cfg).handover.as_ref().is_some_and(|h| h.mode == HandoverMode::Hybrid);
    if let (true, RouteClass::Read, ReqBody::Buffered(body)) = (hybrid, class, body) {
        sizes::learn(sizes::key(head_bytes, body), bytes);
    }
}

/// Attaches the ingress program at start when `[handover] interface` is set, so that the first
/// hand-over does not pay for loading it (≈ 18 ms in the lab). A failure is logged here; every
/// hand-over then relays with `result="steering"`, as before.
pub(crate) fn prepare(ctx: &Ctx) {
    let Some(cfg) = HttpConfig::of(&ctx.cfg).handover.as_ref().filter(|h| h.mode != HandoverMode::Off) else { return };
    if let Some(iface) = cfg.interface.as_deref() {
        match refract_handover::across::steer::with(iface, cfg.map_capacity, |_| Ok(())) {
            Ok(()) => tracing::info!(interface = iface, "hand-over steering attached"),
            Err(e) => tracing::warn!("hand-over steering unavailable, hand-overs will relay: {e}"),
        }
    }
}

/// Publishes the ingress map's entry count and packet counters (at scrape time; nothing when
/// no steering program is attached).
pub(crate) fn publish_metrics(ctx: &Ctx) {
    match refract_handover::across::steer::view() {
        None => {}
        Some(Ok((n, capacity, st))) => families(ctx).set_steering(
            n,
            capacity,
            [("frozen_dropped", st.frozen_drops), ("steered", st.steered), ("redirect_error", st.redirect_errors)],
        ),
        Some(Err(e)) => tracing::warn!("steering metrics unavailable: {e}"),
    }
}

/// The hand-over's metric families in the dispatcher's registry (registered by the first
/// front end that asks).
pub(crate) fn families(ctx: &Ctx) -> Arc<HandoverMetrics> {
    ctx.metrics.families(HandoverMetrics::register)
}

/// Ids of client connections, as the agents see them.
static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// The hand-over state of one client session: its id and its transfer epochs.
#[derive(Debug)]
pub(crate) struct Session {
    id: u64,
    epochs: EpochTracker,
    /// Requests forwarded through an agent so far (hybrid).
    requests: u64,
    /// The link to the agent used last (hybrid), kept for the session's next reads.
    link: Option<(PathBuf, LocalLink)>,
    /// The control channel to the `IP:port` agent used last, kept for the next requests.
    channel: Option<(SocketAddr, ControlChannel)>,
}

impl Session {
    /// A session with a fresh id (epoch 0: never moved).
    pub(crate) fn new() -> Self {
        Session {
            id: NEXT_CONN.fetch_add(1, Relaxed),
            epochs: EpochTracker::new(),
            requests: 0,
            link: None,
            channel: None,
        }
    }
}

/// A request at a boundary, as the session loop holds it.
pub(crate) struct Offered<'a> {
    pub class: RouteClass,
    pub head_bytes: &'a Bytes,
    pub body: &'a ReqBody,
    /// A read plan's tables (see `Request::tables`).
    pub tables: Option<&'a PlanTables>,
    /// A read plan's affinity key (see `Request::key`).
    pub key: Option<u64>,
}

/// Hands the connection over for this request if the configuration says so and the agent
/// takes it. `None`: not handed over, nothing was sent to the client (relay as usual).
/// `Some(go_on)`: the agent answered; `go_on` says whether the session continues (the
/// connection is back, with any bytes the agent read beyond its last response in `conn.buf`).
pub(crate) async fn offer(ctx: &Ctx, conn: &mut ClientConn, s: &mut Session, req: &Offered<'_>) -> Option<bool> {
    let cfg = HttpConfig::of(&ctx.cfg).handover.as_ref()?;
    if cfg.mode == HandoverMode::Off || req.class != RouteClass::Read {
        return None;
    }
    let ReqBody::Buffered(body) = req.body else { return None };
    let learned = (cfg.mode == HandoverMode::Hybrid).then(|| sizes::key(req.head_bytes, body));
    if learned.and_then(sizes::get).is_some_and(|n| n < cfg.threshold) {
        return None; // small last time: straight to the backend, no hop through the agent
    }
    let b = ctx.members.pick_in(req.class, crate::request::scope(ctx, req.tables, req.key), &[], &[])?;
    let agent = cfg.agents.get(&b.name)?;
    let mut request = Vec::with_capacity(req.head_bytes.len() + body.len());
    request.extend_from_slice(req.head_bytes);
    request.extend_from_slice(body);
    let _inflight = b.begin();
    let seen = sizes::Seen::default();
    let rec = Rec { ctx, b: &b, seen: &seen };
    let result = match (agent, cfg.mode, &cfg.key_file) {
        (AgentAddr::Unix(path), HandoverMode::Always, _) => local::hand_over(rec, conn, s, path, b.addr, request).await,
        (AgentAddr::Unix(path), _, _) => hybrid::exchange(rec, conn, s, path, b.addr, cfg.threshold, request).await,
        (AgentAddr::Tcp(addr), mode, Some(key_file)) => {
            let steer = cfg.interface.as_deref().map(|i| (i, cfg.map_capacity));
            let agent = remote::Agent { addr: *addr, key_file, steer };
            if mode == HandoverMode::Always {
                remote::hand_over(rec, conn, s, &agent, request).await
            } else {
                hybrid::exchange_remote(rec, conn, s, &agent, cfg.threshold, request).await
            }
        }
        // `validate` refuses `IP:port` agents without a key file.
        (AgentAddr::Tcp(_), _, None) => return None,
    };
    if let Some(key) = learned {
        seen.learn(key);
    }
    match result {
        Ok(go_on) => {
            b.record(true);
            Some(go_on)
        }
        Err(declined) => {
            tracing::debug!(backend = %b.name, "hand-over declined, relaying: {declined}");
            rec.declined(declined.why);
            None
        }
    }
}
