//! The client session loop: read a request head, classify, forward to a backend (retrying a
//! read once elsewhere if nothing reached the client), relay the response, repeat. Requests
//! are served one at a time in arrival order, so pipelined responses keep their order and the
//! connection is quiescent at every request boundary (where a hand-over can happen later).

use crate::conn::ClientConn;
use crate::dispatcher::Ctx;
use crate::error::Error;
use crate::fanout;
use crate::forward::{self, Request};
use crate::overload::{Arrival, Priority};
use bytes::Bytes;
use refract_http::chunked::decode_all;
use refract_http::{reply, BodyKind, RequestHead, RouteClass};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// What the session does after a request.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    Continue,
    Close,
}

/// A request body: already read (possibly empty), or still to stream from the client.
#[derive(Debug)]
pub(crate) enum ReqBody {
    Buffered(Bytes),
    Stream(BodyKind),
}

/// A failed exchange, and whether any byte of a response had reached the client.
#[derive(Debug)]
pub(crate) struct Failure {
    pub err: Error,
    pub touched: bool,
}

impl Failure {
    pub(crate) fn untouched(err: Error) -> Self {
        Failure { err, touched: false }
    }
}

/// Serves one client connection until it closes, idles out, fails, or the dispatcher drains.
pub async fn run(ctx: Arc<Ctx>, stream: TcpStream) {
    let mut conn = ClientConn::new(stream);
    let mut handover = crate::handover::Session::new();
    // Whether the next request was already pipelined behind the last one: refract reads it
    // only when that exchange ended, so its arrival is paced by refract, not new demand.
    let mut paced = false;
    let limits = &ctx.cfg.limits;
    let idle = Duration::from_millis(ctx.cfg.timeouts.client_idle_ms);
    loop {
        let head = match conn.read_head(limits.max_head_bytes, idle, &ctx.stop).await {
            Ok(Ok(h)) => h,
            Ok(Err(_)) => break,
            Err(e) => {
                reply_error(&ctx, &mut conn, &e, false).await;
                break;
            }
        };
        let arrival = if paced { Arrival::Paced } else { Arrival::Fresh };
        let next = serve(&ctx, &mut conn, &mut handover, head, arrival).await;
        if next == Next::Close || ctx.stop.is_cancelled() {
            break;
        }
        paced = !conn.buf.is_empty();
    }
    conn.close_gracefully().await;
}

async fn serve(
    ctx: &Ctx,
    conn: &mut ClientConn,
    ho: &mut crate::handover::Session,
    head: RequestHead,
    arrival: Arrival,
) -> Next {
    let mut head_bytes = conn.buf.split_to(head.len).freeze();
    if head.internal {
        // Only refract's own hops set these (a client's deadline header would be taken for
        // the dispatcher's by the backend): dropped, like HAProxy's `del-header`.
        if let Some(clean) = refract_http::head::without_internal_headers(&head_bytes) {
            head_bytes = clean.into();
        }
    }
    let started = Instant::now();
    let (class, body) = match prepare(ctx, conn, &head).await {
        Ok(x) => x,
        Err(e) => return reply_error(ctx, conn, &e, false).await,
    };
    let priority = match priority(&head) {
        Ok(p) => p,
        Err(e) => return reply_error(ctx, conn, &e, false).await,
    };
    if let Some(user) = head.user.as_deref().filter(|u| !ctx.users.admit(u)) {
        let keep = head.keep_alive && matches!(body, ReqBody::Buffered(_));
        return reply_error(ctx, conn, &Error::RateLimited(user.to_string()), keep).await;
    }
    let offered = crate::handover::Offered { class, head_bytes: &head_bytes, body: &body };
    if let Some(go_on) = crate::handover::offer(ctx, conn, ho, &offered).await {
        return if go_on { Next::Continue } else { Next::Close };
    }
    let timeout_ms = head.timeout_ms.or(Some(ctx.cfg.overload.default_timeout_ms).filter(|&ms| ms > 0));
    let deadline = timeout_ms.map(|ms| started + Duration::from_millis(ms));
    let result = match &body {
        ReqBody::Buffered(b) if class == RouteClass::All => fanout::run(ctx, conn, &head_bytes, &head, b).await,
        _ => {
            let req = Request { class, head_bytes: &head_bytes, head: &head, body: &body, deadline, priority, arrival };
            forward::forward(ctx, conn, &req).await
        }
    };
    ctx.metrics.observe(class, started.elapsed().as_secs_f64());
    match result {
        Ok(true) if head.keep_alive => Next::Continue,
        Ok(_) => Next::Close,
        Err(f) if f.touched => {
            tracing::warn!(error = %f.err, "response cut short; closing the client connection");
            ctx.metrics.error(f.err.kind());
            Next::Close
        }
        Err(f) => {
            let keep = head.keep_alive && matches!(body, ReqBody::Buffered(_));
            reply_error(ctx, conn, &f.err, keep).await
        }
    }
}

/// The request's priority class (`x-refract-priority`, default normal).
fn priority(head: &RequestHead) -> Result<Priority, Error> {
    match head.priority.as_deref() {
        None | Some("normal") => Ok(Priority::Normal),
        Some("high") => Ok(Priority::High),
        Some("low") => Ok(Priority::Low),
        Some(other) => Err(Error::Request(refract_http::Error::BadHeader {
            name: "x-refract-priority",
            reason: format!("{other:?} is not one of high, normal, low"),
        })),
    }
}

/// Reads what classification needs, classifies, and buffers the body of a fan-out.
async fn prepare(ctx: &Ctx, conn: &mut ClientConn, head: &RequestHead) -> Result<(RouteClass, ReqBody), Error> {
    let limit = ctx.cfg.limits.max_buffered_body;
    let mut body = match head.body {
        BodyKind::None => ReqBody::Buffered(Bytes::new()),
        kind if ctx.classifier.needs_body(head) => ReqBody::Buffered(conn.read_body(kind, limit).await?),
        kind => ReqBody::Stream(kind),
    };
    let class = match &body {
        ReqBody::Buffered(raw) if head.body == BodyKind::Chunked => ctx.classifier.classify(head, &decode_all(raw))?,
        ReqBody::Buffered(raw) => ctx.classifier.classify(head, raw)?,
        ReqBody::Stream(_) => ctx.classifier.classify(head, &[])?,
    };
    if let (RouteClass::All, ReqBody::Stream(kind)) = (class, &body) {
        body = ReqBody::Buffered(conn.read_body(*kind, limit).await?);
    }
    Ok((class, body))
}

/// Sends an error reply (unless the client itself failed) and says whether to go on.
async fn reply_error(ctx: &Ctx, conn: &mut ClientConn, err: &Error, keep: bool) -> Next {
    ctx.metrics.error(err.kind());
    if let Error::ClientIo(_) | Error::ClientGone = err {
        return Next::Close;
    }
    match err.backend() {
        Some(b) => tracing::warn!(backend = b, error = %err, "request failed"),
        None => tracing::debug!(error = %err, "request refused"),
    }
    let extra: Vec<(&str, &str)> = err.backend().map(|b| ("backend", b)).into_iter().collect();
    let bytes = reply::error(err.status(), &err.to_string(), &extra, !keep);
    match conn.reply(&bytes).await {
        Ok(()) if keep => Next::Continue,
        _ => Next::Close,
    }
}
