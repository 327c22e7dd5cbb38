//! Keeping a connection at the agent while the client keeps reading (connection affinity), with
//! routing authority left here: the agent asks with `Next` about every request after the one it
//! was handed the connection for, and serves it only if told `Serve`. This module is that
//! decision: a read whose backend — the agent's — may take reads now, holds the tables a
//! Hyrise-R plan reads, and whose admission control would admit it without queueing is served
//! there; anything else (a write, a fan-out,
//! a procedure, a read the balancer could not send there, a request that does not parse) is
//! `Return`ed: the agent hands the connection back with the request pending and the session
//! routes it as usual.

use super::Rec;
use crate::config::HttpConfig;
use refract_core::backend::Backend;
use refract_core::config::Role;
use refract_core::ctx::Ctx;
use refract_http::{BodyKind, PlanTables, RequestHead, RouteClass};
use std::sync::Arc;

/// What the dispatcher knows about a further request on a connection an agent owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Facts {
    /// Its route class; `None` when it does not parse or classify (the session answers it).
    pub class: Option<RouteClass>,
    /// Whether the agent's backend is in the read set (a replica, or a primary that reads go to).
    pub reader: bool,
    /// Whether the agent's backend is up (and neither ejected nor removed).
    pub up: bool,
    /// Whether its admission control would admit a request now, without queueing.
    pub admits: bool,
    /// Whether the agent's backend holds every table the request reads (a Hyrise-R plan; any
    /// other request: yes).
    pub holds: bool,
}

/// The answer to `Next`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The agent serves the request from its backend.
    Serve,
    /// The agent hands the connection back with the request pending (why, for logs).
    Return(&'static str),
}

/// The keep-serving rule (pure): serve reads the agent's backend may take now, return the rest.
pub(crate) fn decide(f: Facts) -> Verdict {
    match f.class {
        None => Verdict::Return("the request does not parse or classify"),
        Some(RouteClass::Read) if !f.reader => Verdict::Return("its backend is not in the read set"),
        Some(RouteClass::Read) if !f.up => Verdict::Return("its backend is not available"),
        Some(RouteClass::Read) if !f.admits => Verdict::Return("its backend's admission is saturated"),
        Some(RouteClass::Read) if !f.holds => Verdict::Return("its backend does not hold the tables the plan reads"),
        Some(RouteClass::Read) => Verdict::Serve,
        Some(_) => Verdict::Return("not a read"),
    }
}

/// Routes request `bytes` (head and body) that the agent of `rec`'s backend read on a
/// connection it owns; a request let to be served there is counted like one the dispatcher
/// forwarded (`refract_handover_kept_total`, the backend's request counter).
pub(super) fn judge(rec: Rec<'_>, bytes: &[u8]) -> Verdict {
    let (ctx, b) = (rec.ctx, rec.b);
    let req = request(ctx, bytes);
    let facts = Facts {
        class: req.as_ref().map(|r| r.class),
        reader: in_read_set(ctx, b),
        up: b.is_available(),
        admits: admits_now(ctx, b),
        holds: req.as_ref().and_then(|r| r.tables.as_ref()).is_none_or(|t| b.holds.covers(t.as_slice())),
    };
    let verdict = decide(facts);
    if verdict != Verdict::Serve {
        return verdict;
    }
    // Last, so that a returned request does not spend the user's token twice.
    if let Some(user) = req.and_then(|r| r.user).filter(|u| !ctx.users.admit(u)) {
        tracing::debug!(user, "rate limited: the session answers it");
        return Verdict::Return("rate limited");
    }
    rec.kept();
    verdict
}

/// What the session would route a request by.
struct Routed {
    class: RouteClass,
    user: Option<String>,
    tables: Option<PlanTables>,
}

/// The request's class, user and plan tables, if it is one the session would route as it stands.
fn request(ctx: &Ctx, bytes: &[u8]) -> Option<Routed> {
    let head = RequestHead::parse(bytes, ctx.cfg.limits.max_head_bytes).ok()??;
    let body = bytes.get(head.len..)?;
    let valid_priority = matches!(head.priority.as_deref(), None | Some("high" | "normal" | "low"));
    // The agent sends the client's bytes as they are: a head the session would rewrite
    // (absolute form, leading empty lines) comes back here to be rewritten.
    let rewritten = head.absolute_form || head.skipped > 0;
    if head.body == BodyKind::Chunked || body.len() > ctx.cfg.limits.max_buffered_body || !valid_priority || rewritten {
        return None;
    }
    let (class, tables) = HttpConfig::of(&ctx.cfg).classifier.classify_with_tables(&head, body).ok()?;
    Some(Routed { class, user: head.user, tables })
}

/// Whether the balancer may pick `b` for a read now (`Membership::pick`'s read set): a replica,
/// or the primary when reads go to it or fall back to it with no replica available.
fn in_read_set(ctx: &Ctx, b: &Arc<Backend>) -> bool {
    let list = ctx.members.snapshot();
    if !list.iter().any(|x| Arc::ptr_eq(x, b)) {
        return false; // removed (or replaced) meanwhile
    }
    let balance = &ctx.cfg.balance;
    let reads = |x: &Backend| x.role == Role::Replica || balance.read_from_primary;
    if reads(b) {
        return true;
    }
    b.role == Role::Primary && balance.read_fallback_to_primary && !list.iter().any(|x| x.is_available() && reads(x))
}

/// Whether `b`'s admission control would grant a slot at once (no queue, under the limit).
fn admits_now(ctx: &Ctx, b: &Backend) -> bool {
    if !ctx.cfg.overload.enabled {
        return true;
    }
    let v = b.admission.view();
    v.queued == 0 && v.inflight < v.limit
}

#[cfg(test)]
mod tests {
    use super::*;

    const READ: Facts = Facts { class: Some(RouteClass::Read), reader: true, up: true, admits: true, holds: true };

    #[test]
    fn only_reads_the_agents_backend_may_take_now_are_served() {
        assert_eq!(decide(READ), Verdict::Serve);
        for class in [RouteClass::Write, RouteClass::All, RouteClass::Procedure] {
            assert_eq!(decide(Facts { class: Some(class), ..READ }), Verdict::Return("not a read"), "{class:?}");
        }
        assert!(matches!(decide(Facts { class: None, ..READ }), Verdict::Return(_)));
        assert!(matches!(decide(Facts { reader: false, ..READ }), Verdict::Return(_)));
        assert!(matches!(decide(Facts { up: false, ..READ }), Verdict::Return(_)));
        assert_eq!(decide(Facts { admits: false, ..READ }), Verdict::Return("its backend's admission is saturated"));
        let lacks = Verdict::Return("its backend does not hold the tables the plan reads");
        assert_eq!(decide(Facts { holds: false, ..READ }), lacks);
        // A write is returned whatever the backend's state.
        let w = Facts { class: Some(RouteClass::Write), reader: false, up: false, admits: false, holds: false };
        assert_eq!(decide(w), Verdict::Return("not a read"));
    }
}
