//! Forwarding one request to one backend of its class: admission (the backend's adaptive
//! limit and queue, bounded by the request's deadline), the exchange itself, and what the
//! outcome teaches the limit, the latency estimate and the ejection counter. A read may be
//! retried once, on another backend, within the retry budget, if nothing reached the client;
//! writes never are. A client that stops reading while others wait for its backend gives the
//! slot up (`relay.rs`): the rest of its response goes to it from a spill after the slot is
//! back, or its connection is reset.

use crate::conn::ClientConn;
use crate::error::Error;
use crate::relay::{self, Sink, Watch};
use crate::request::{scope, Failure, ReqBody, Request};
use bytes::Bytes;
use refract_core::backend::{Backend, BackendConn};
use refract_core::ctx::Ctx;
use refract_core::overload::{Outcome, Permit, Refusal, Spill};
use refract_http::{BodyKind, RouteClass};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

/// How an exchange ended: whether the client connection can go on, the status sent, and the
/// rest of the response still to write when the client had stopped reading.
struct Done {
    go_on: bool,
    status: u16,
    spill: Option<Spill>,
}

/// Forwards `req`; `Ok(go_on)` says whether the client connection can carry another request.
pub(crate) async fn forward(ctx: &Ctx, conn: &mut ClientConn, req: &Request<'_>) -> Result<bool, Failure> {
    ctx.budget.deposit();
    let mut tried: Vec<Arc<Backend>> = Vec::new();
    let mut saturated: Vec<Arc<Backend>> = Vec::new();
    let mut last = None;
    loop {
        let Some(first) = ctx.members.pick_in(req.class, scope(ctx, req.tables, req.key), &tried, &saturated) else {
            return Err(last.unwrap_or(Failure::untouched(Error::NoBackend(req.class.as_str()))));
        };
        let (b, permit) = match admit_now(ctx, req, first, &tried, &saturated) {
            Ok(x) => x,
            // A client that goes away while queued gives up its place at once.
            Err(q) => match tokio::select! {
                r = q.admission.acquire_by(req.client, req.priority, req.deadline, req.arrival) => r,
                () = client_gone(conn, ctx.cfg.limits.max_head_bytes) => return Err(Failure::untouched(Error::ClientGone)),
            } {
                Ok(p) => (q, p),
                // A read refused by one replica's admission may still be admitted by another:
                // nothing was sent, so this is balancing, not a retry (no budget is spent).
                Err(r) if req.class == RouteClass::Read => {
                    saturated.push(q.clone());
                    last = Some(refused(&q, r));
                    continue;
                }
                Err(r) => return Err(refused(&q, r)),
            },
        };
        let started = Instant::now();
        let result = exchange(ctx, conn, &b, req, &permit).await;
        let f = match result {
            Ok(done) => return complete(ctx, conn, &b, req.class, permit, started, done).await,
            Err(f) => f,
        };
        permit.finish(outcome_of(&f.err));
        if let Error::ClientStalled { contended: true, .. } = f.err {
            ctx.metrics.stall_yield(&b.name, "cut");
        }
        if f.err.side() == crate::error::Side::Backend {
            learn(ctx, &b, req.class, Some(started.elapsed()), false);
        }
        if f.err.marks_down() && b.set_up(false) {
            tracing::warn!(backend = %b.name, error = %f.err, "backend marked down");
        }
        if !may_retry(ctx, req, &f, tried.is_empty()) {
            return Err(f);
        }
        tracing::debug!(backend = %b.name, error = %f.err, "read failed; retrying on another backend");
        ctx.metrics.error(f.err.kind());
        ctx.metrics.error("retry");
        tried.push(b);
        last = Some(f);
    }
}

/// Where a request goes: a slot free right now on the balancer's choice or, for a read, on
/// another replica (a read should not queue at one replica while another has a slot free);
/// else the queue with the shortest expected wait among them (`Err`).
fn admit_now(
    ctx: &Ctx,
    req: &Request<'_>,
    first: Arc<Backend>,
    failed: &[Arc<Backend>],
    saturated: &[Arc<Backend>],
) -> Result<(Arc<Backend>, Permit), Arc<Backend>> {
    if let Some(p) = first.admission.try_acquire_by(req.client, req.arrival) {
        return Ok((first, p));
    }
    if req.class != RouteClass::Read {
        return Err(first);
    }
    let mut busy: Vec<Arc<Backend>> = saturated.iter().cloned().chain([first.clone()]).collect();
    let mut best = (first.admission.expected_wait(), first);
    let scope = scope(ctx, req.tables, req.key);
    while let Some(b) = ctx.members.pick_in(req.class, scope, failed, &busy) {
        if let Some(p) = b.admission.try_acquire_by(req.client, req.arrival) {
            return Ok((b, p));
        }
        if b.admission.expected_wait() < best.0 {
            best = (b.admission.expected_wait(), b.clone());
        }
        busy.push(b);
    }
    Err(best.1)
}

fn refused(b: &Backend, r: Refusal) -> Failure {
    let reason = match r {
        Refusal::QueueFull => "queue full",
        Refusal::Shed => "shed by queue management",
        Refusal::Deadline => "cannot finish before the request's deadline",
        Refusal::WaitTooLong => "waited in the queue as long as max_queue_wait_ms allows",
    };
    Failure::untouched(Error::Overloaded { backend: b.name.clone(), reason })
}

/// What a failed exchange teaches the concurrency limit.
fn outcome_of(err: &Error) -> Outcome {
    match err {
        Error::ResponseTimeout { .. } | Error::ConnectTimeout { .. } => Outcome::Overloaded,
        // Includes `DeadlineExceeded`: the client's budget ran out, not the backend's capacity.
        _ => Outcome::Ignore,
    }
}

/// Books an exchange that ended with a response, gives its slot back, then writes the rest of
/// a response spilled for a client that had stopped reading (bounded by `write_stall_ms`).
async fn complete(
    ctx: &Ctx,
    conn: &mut ClientConn,
    b: &Backend,
    class: RouteClass,
    permit: Permit,
    started: Instant,
    done: Done,
) -> Result<bool, Failure> {
    let overloaded = done.status == 503 || done.status == 429;
    let ok = !overloaded && done.status < 500;
    let Some(spill) = done.spill else {
        permit.finish(if overloaded { Outcome::Overloaded } else { Outcome::Success });
        learn(ctx, b, class, Some(started.elapsed()), ok);
        return Ok(done.go_on);
    };
    // The time it took was the client's: it teaches neither the limit nor the balancer.
    permit.finish(Outcome::Ignore);
    learn(ctx, b, class, None, ok);
    ctx.metrics.stall_yield(&b.name, "spilled");
    conn.reply(spill.bytes()).await.map_err(|err| Failure { err, touched: true })?;
    ctx.metrics.bytes_to_client.inc_by(spill.bytes().len() as u64);
    Ok(done.go_on)
}

/// Books an exchange: counters, latency (`took`, when it says something of the backend),
/// failure streak (and ejection).
fn learn(ctx: &Ctx, b: &Backend, class: RouteClass, took: Option<Duration>, ok: bool) {
    b.record(ok);
    if ok {
        b.counters.request(class);
        if let Some(t) = took {
            b.observe(t);
        }
    } else {
        // A failure costs as much as the request timeout: the balancer should avoid it.
        b.observe(took.unwrap_or_default().max(Duration::from_millis(ctx.cfg.timeouts.request_ms.min(1000))));
    }
    let o = &ctx.cfg.overload;
    if b.note_outcome(ok, o.eject_after_failures) {
        ctx.members.try_eject(b, o.eject_ms);
    }
}

/// Only reads, only once, only if nothing reached the client, the body can be sent again,
/// the failure was the backend's transport (not an answer), and the budget allows it.
fn may_retry(ctx: &Ctx, req: &Request<'_>, f: &Failure, first: bool) -> bool {
    req.class == RouteClass::Read
        && first
        && !f.touched
        && matches!(req.body, ReqBody::Buffered(_))
        && f.err.is_retryable()
        && req.deadline.is_none_or(|d| Instant::now() < d)
        && ctx.budget.try_withdraw()
}

/// One request/response exchange with one backend, holding `permit`.
async fn exchange(
    ctx: &Ctx,
    conn: &mut ClientConn,
    b: &Arc<Backend>,
    req: &Request<'_>,
    permit: &Permit,
) -> Result<Done, Failure> {
    let _inflight = b.begin();
    let t = &ctx.cfg.timeouts;
    let mut timeout = Duration::from_millis(t.request_ms);
    let mut connect = Duration::from_millis(t.connect_ms);
    let mut head_bytes = req.head_bytes.clone();
    let mut by_deadline = false;
    if let Some(d) = req.deadline {
        let left = d.saturating_duration_since(Instant::now());
        by_deadline = left < timeout || left < connect;
        (timeout, connect) = (timeout.min(left), connect.min(left));
        head_bytes = with_deadline_header(req.head_bytes, left);
    }
    // A timeout cut short by the request's own deadline is not the backend's failure.
    let blame = |err: Error| match err {
        Error::ResponseTimeout { backend } | Error::ConnectTimeout { backend } if by_deadline => {
            Error::DeadlineExceeded { backend }
        }
        e => e,
    };
    exchange_within(ctx, conn, b, req, permit, &head_bytes, (timeout, connect))
        .await
        .map_err(|f| Failure { err: blame(f.err), touched: f.touched })
}

async fn exchange_within(
    ctx: &Ctx,
    conn: &mut ClientConn,
    b: &Arc<Backend>,
    req: &Request<'_>,
    permit: &Permit,
    head_bytes: &Bytes,
    (timeout, connect): (Duration, Duration),
) -> Result<Done, Failure> {
    let mut bc = b.checkout(connect).await.map_err(|e| Failure::untouched(e.into()))?;
    let sent = send_request(conn, &mut bc, &b.name, head_bytes, req.body).await.map_err(Failure::untouched)?;
    ctx.metrics.bytes_to_backend.inc_by(sent);
    let mut written = 0u64;
    let rh = loop {
        let rh = tokio::select! {
            r = relay::response_head(&mut bc, timeout, &b.name, req.head.is_head()) => r,
            () = client_gone(conn, ctx.cfg.limits.max_head_bytes) => Err(Error::ClientGone),
        };
        let rh = rh.map_err(|err| Failure { err, touched: written > 0 })?;
        if !rh.is_interim() {
            break rh;
        }
        let mut sink = Sink::client(&mut conn.stream, conn.timeouts.write, None);
        sink.pass(&mut bc, rh.len).await.map_err(|err| Failure { err, touched: true })?;
        written += sink.written;
    };
    let limits = &ctx.cfg.limits;
    let watch = Watch {
        permit,
        after: conn.timeouts.contended,
        budget: &ctx.spill,
        max: limits.spill_bytes,
        total: limits.spill_total_bytes,
    };
    let mut sink = Sink::client(&mut conn.stream, conn.timeouts.write, Some(watch));
    // Draining: this is the connection's last response, and its head says so.
    let closing = ctx.stop.is_cancelled();
    let result = if closing {
        sink.response_closing(&mut bc, &rh, timeout, &b.name).await
    } else {
        sink.response(&mut bc, &rh, timeout, &b.name).await
    };
    written += sink.written;
    let spill = sink.into_spill();
    ctx.metrics.bytes_to_client.inc_by(written);
    let reuse = result.map_err(|err| Failure { err, touched: written > 0 || spill.is_some() })?;
    let spilled = spill.as_ref().map_or(0, |s| s.bytes().len() as u64);
    crate::handover::relayed_directly(ctx, req.class, head_bytes, req.body, written + spilled);
    if reuse {
        b.checkin(bc);
    }
    // refract relays no tunnel: after a 101 the client's next bytes are not HTTP to it.
    Ok(Done { go_on: rh.body != BodyKind::UntilClose && rh.status != 101 && !closing, status: rh.status, spill })
}

/// Resolves when the client has closed its side (or failed) while its request is being
/// served, so the backend work can be abandoned. Pipelined bytes it sends meanwhile are kept
/// in the client buffer (up to `max` bytes; past that, the client is no longer watched).
async fn client_gone(conn: &mut ClientConn, max: usize) {
    loop {
        if conn.buf.len() > max || conn.stream.readable().await.is_err() {
            return std::future::pending().await;
        }
        conn.buf.reserve(4096);
        match conn.stream.try_read_buf(&mut conn.buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

/// The head with `x-refract-deadline-ms` (time left) added, so the backend can give up too.
fn with_deadline_header(head: &Bytes, left: Duration) -> Bytes {
    let end = head.len().saturating_sub(2);
    let mut out = Vec::with_capacity(head.len() + 40);
    out.extend_from_slice(&head[..end]);
    out.extend_from_slice(format!("x-refract-deadline-ms: {}\r\n\r\n", left.as_millis()).as_bytes());
    Bytes::from(out)
}

async fn send_request(
    conn: &mut ClientConn,
    bc: &mut BackendConn,
    backend: &str,
    head_bytes: &Bytes,
    body: &ReqBody,
) -> Result<u64, Error> {
    let io = |source| Error::BackendIo { backend: backend.to_string(), source };
    match body {
        ReqBody::Buffered(b) if b.is_empty() => bc.stream.write_all(head_bytes).await.map_err(io)?,
        ReqBody::Buffered(b) => bc.stream.write_all(&[&head_bytes[..], &b[..]].concat()).await.map_err(io)?,
        ReqBody::Stream(kind) => {
            bc.stream.write_all(head_bytes).await.map_err(io)?;
            let n = relay::request_body(conn, bc, *kind, backend).await?;
            return Ok(head_bytes.len() as u64 + n);
        }
    }
    let body_len = if let ReqBody::Buffered(b) = body { b.len() } else { 0 };
    Ok((head_bytes.len() + body_len) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_header_goes_before_the_blank_line() {
        let head = Bytes::from_static(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n");
        let out = with_deadline_header(&head, Duration::from_millis(250));
        assert_eq!(&out[..], b"GET / HTTP/1.1\r\nhost: x\r\nx-refract-deadline-ms: 250\r\n\r\n");
    }
}
