//! The hand-over façade of the session loop: at a request boundary, decide whether the agent in
//! front of the chosen backend should answer the client itself, move the connection there and
//! take it back. Any failure before the agent adopts the connection means: relay as usual.
//!
//! # Layout
//! - [`offer`] (this file): the decision (mode, class, body, backend with an agent).
//! - `local.rs`: the same-host move (SCM_RIGHTS over the agent's Unix socket), with epochs.
//! - `remote.rs`: the TCP_REPAIR move over the control channel (`always` only; no steering yet).
//! - `steer.rs`: the ingress map (FREEZE, STEER) on `[handover] interface`.
//! - `hybrid.rs`: reads go through the agent, which asks for the connection when a result is
//!   large.

mod hybrid;
mod local;
mod remote;
mod steer;

use crate::config::{AgentAddr, HandoverMode};
use crate::conn::ClientConn;
use crate::dispatcher::Ctx;
use crate::session::ReqBody;
use bytes::Bytes;
use refract_handover::control::EpochTracker;
use refract_handover::local::LocalLink;
use refract_http::RouteClass;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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
}

impl Session {
    /// A session with a fresh id (epoch 0: never moved).
    pub(crate) fn new() -> Self {
        Session { id: NEXT_CONN.fetch_add(1, Relaxed), epochs: EpochTracker::new(), requests: 0, link: None }
    }
}

/// A request at a boundary, as the session loop holds it.
pub(crate) struct Offered<'a> {
    pub class: RouteClass,
    pub head_bytes: &'a Bytes,
    pub body: &'a ReqBody,
}

/// Hands the connection over for this request if the configuration says so and the agent
/// takes it. `None`: not handed over, nothing was sent to the client (relay as usual).
/// `Some(go_on)`: the agent answered; `go_on` says whether the session continues (the
/// connection is back, with any bytes the agent read beyond its last response in `conn.buf`).
pub(crate) async fn offer(ctx: &Ctx, conn: &mut ClientConn, s: &mut Session, req: &Offered<'_>) -> Option<bool> {
    let cfg = ctx.cfg.handover.as_ref()?;
    if cfg.mode == HandoverMode::Off || req.class != RouteClass::Read {
        return None;
    }
    let ReqBody::Buffered(body) = req.body else { return None };
    let b = ctx.members.pick(req.class, &[])?;
    let agent = cfg.agents.get(&b.name)?;
    let mut request = Vec::with_capacity(req.head_bytes.len() + body.len() + conn.buf.len());
    request.extend_from_slice(req.head_bytes);
    request.extend_from_slice(body);
    let _inflight = b.begin();
    let result = match (agent, cfg.mode, &cfg.key_file) {
        (AgentAddr::Unix(path), HandoverMode::Always, _) => {
            request.extend_from_slice(&conn.buf);
            local::hand_over(conn, s, path, b.addr, request).await
        }
        (AgentAddr::Unix(path), _, _) => hybrid::exchange(conn, s, path, b.addr, cfg.threshold, request).await,
        (AgentAddr::Tcp(addr), HandoverMode::Always, Some(key)) => {
            request.extend_from_slice(&conn.buf);
            let steer = cfg.interface.as_deref().map(|i| (i, cfg.map_capacity));
            remote::hand_over(conn, s, *addr, key, steer, request).await
        }
        // Cross-host hybrid (a backend link to the agent): not yet.
        (AgentAddr::Tcp(_), _, _) => return None,
    };
    match result {
        Ok(go_on) => {
            b.record(true);
            Some(go_on)
        }
        Err(reason) => {
            tracing::debug!(backend = %b.name, "hand-over declined, relaying: {reason}");
            ctx.metrics.error("handover_declined");
            None
        }
    }
}
