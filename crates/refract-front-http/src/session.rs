//! The client session loop: read a request head, classify, forward to a backend (retrying a
//! read once elsewhere if nothing reached the client), relay the response, repeat. Requests
//! are served one at a time in arrival order, so pipelined responses keep their order and the
//! connection is quiescent at every request boundary (where a hand-over can happen later).

use crate::config::HttpConfig;
use crate::conn::{ClientConn, ClientTimeouts};
use crate::error::Error;
use crate::fanout;
use crate::forward;
use crate::request::{ReqBody, Request};
use bytes::Bytes;
use refract_core::ctx::Ctx;
use refract_core::overload::{Arrival, Priority};
use refract_http::chunked::decode_all;
use refract_http::{reply, BodyKind, ReadPlan, RequestHead, RouteClass};
use std::net::IpAddr;
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

/// Serves one client connection until it closes, idles out, fails, or the dispatcher drains.
/// The connection's timeouts are the configuration's when it starts.
///
/// An idle connection costs only this future, its socket and its hand-over state: between
/// requests the client buffer is released, and serving a request (a large future: forward,
/// fan-out, hand-over) is boxed, allocated only while a request is served.
pub async fn run(ctx: Arc<Ctx>, stream: TcpStream, peer: IpAddr) {
    let mut conn = ClientConn::with_timeouts(stream, ClientTimeouts::of(&ctx.cfg.timeouts));
    conn.peer = Some(peer);
    // Hand-over state exists only once a hand-over is considered (`[handover]` set).
    let mut handover: Option<Box<crate::handover::Session>> = None;
    let max_head = ctx.cfg.limits.max_head_bytes;
    // Whether the next request was already pipelined behind the last one: refract reads it
    // only when that exchange ended, so its arrival is paced by refract, not new demand.
    let mut paced = false;
    loop {
        let head = match conn.read_head(max_head, conn.timeouts.idle, &ctx.stop).await {
            Ok(Ok(h)) => h,
            Ok(Err(_)) => break,
            Err(e) => {
                Box::pin(reply_error(&ctx, &mut conn, &e, false)).await;
                break;
            }
        };
        let arrival = if paced { Arrival::Paced } else { Arrival::Fresh };
        let next = Box::pin(serve(&ctx, &mut conn, &mut handover, head, arrival)).await;
        if next == Next::Close || ctx.stop.is_cancelled() {
            break;
        }
        paced = !conn.buf.is_empty();
    }
    Box::pin(conn.close_gracefully()).await;
}

async fn serve(
    ctx: &Ctx,
    conn: &mut ClientConn,
    ho: &mut Option<Box<crate::handover::Session>>,
    head: RequestHead,
    arrival: Arrival,
) -> Next {
    let mut head_bytes = conn.buf.split_to(head.len).freeze();
    // Origin form, no leading empty lines, and no header only refract's own hops set (a
    // client's deadline header would be taken for the dispatcher's): like HAProxy's
    // `del-header`, and so that the backend reads the path the rules routed.
    if let Some(clean) = head.forwarded(&head_bytes) {
        head_bytes = clean.into();
    }
    let started = Instant::now();
    let (class, plan, body) = match prepare(ctx, conn, &head).await {
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
    let tables = plan.as_ref().map(|p| &p.tables);
    let key = plan.as_ref().and_then(crate::request::affinity_key);
    let offered = crate::handover::Offered { class, head_bytes: &head_bytes, body: &body, tables, key };
    if HttpConfig::of(&ctx.cfg).handover.is_some() {
        let ho = ho.get_or_insert_with(|| Box::new(crate::handover::Session::new()));
        if let Some(go_on) = crate::handover::offer(ctx, conn, ho, &offered).await {
            return if go_on { Next::Continue } else { Next::Close };
        }
    }
    let timeout_ms = head.timeout_ms.or(Some(ctx.cfg.overload.default_timeout_ms).filter(|&ms| ms > 0));
    let deadline = timeout_ms.map(|ms| started + Duration::from_millis(ms));
    let result = match &body {
        ReqBody::Buffered(b) if class == RouteClass::All => fanout::run(ctx, conn, &head_bytes, &head, b).await,
        _ => {
            let req = Request {
                class,
                head_bytes: &head_bytes,
                head: &head,
                body: &body,
                deadline,
                priority,
                arrival,
                client: conn.peer,
                tables,
                key,
            };
            forward::forward(ctx, conn, &req).await
        }
    };
    ctx.metrics.observe(class, started.elapsed().as_secs_f64());
    match result {
        Ok(true) if head.keep_alive => Next::Continue,
        Ok(_) => Next::Close,
        Err(f) if f.touched => {
            conn.note(&f.err);
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

/// Reads what classification needs, classifies (with what a read plan reads), and buffers the
/// body of a fan-out.
async fn prepare(
    ctx: &Ctx,
    conn: &mut ClientConn,
    head: &RequestHead,
) -> Result<(RouteClass, Option<ReadPlan>, ReqBody), Error> {
    let limit = ctx.cfg.limits.max_buffered_body;
    go_ahead(conn, head).await?;
    let mut body = match head.body {
        BodyKind::None => ReqBody::Buffered(Bytes::new()),
        kind if HttpConfig::of(&ctx.cfg).classifier.needs_body(head) => {
            ReqBody::Buffered(conn.read_body(kind, limit).await?)
        }
        kind => ReqBody::Stream(kind),
    };
    let classifier = &HttpConfig::of(&ctx.cfg).classifier;
    let (class, plan) = match &body {
        ReqBody::Buffered(raw) if head.body == BodyKind::Chunked => classifier.classify_read(head, &decode_all(raw))?,
        ReqBody::Buffered(raw) => classifier.classify_read(head, raw)?,
        ReqBody::Stream(_) => classifier.classify_read(head, &[])?,
    };
    match (class, &body) {
        (RouteClass::All, ReqBody::Stream(kind)) => body = ReqBody::Buffered(conn.read_body(*kind, limit).await?),
        // Before any backend slot is taken: a stalled body then holds none (unless it is
        // larger than what may be buffered; it then holds one for at most `body_ms`).
        (_, ReqBody::Stream(kind)) => conn.read_ahead(*kind, limit).await?,
        _ => {}
    }
    Ok((class, plan, body))
}

/// `Expect: 100-continue`: the client holds its body back until it gets `100 Continue` (curl
/// does for bodies over 1 KiB, for up to a second). refract reads a body before it picks a
/// backend, so it gives the go-ahead itself, unless the body has started to arrive anyway. A
/// backend that also answers `100 Continue` to the forwarded header adds a second interim
/// response, which clients read past (RFC 9110 §15.2).
async fn go_ahead(conn: &mut ClientConn, head: &RequestHead) -> Result<(), Error> {
    if head.expect_continue && head.body != BodyKind::None && conn.buf.is_empty() {
        conn.reply(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
    }
    Ok(())
}

/// Sends an error reply (unless the client itself failed) and says whether to go on.
async fn reply_error(ctx: &Ctx, conn: &mut ClientConn, err: &Error, keep: bool) -> Next {
    ctx.metrics.error(err.kind());
    conn.note(err);
    if let Error::ClientIo(_) | Error::ClientGone | Error::ClientStalled { .. } = err {
        return Next::Close;
    }
    // A request that timed out may be half read: nothing after it can be framed.
    let keep = keep && !matches!(err, Error::ClientTimeout { .. });
    match err.backend() {
        // Refused by admission control: counted (`refract_errors_total{kind="overloaded"}`),
        // not logged one line each, or an overload would also flood the log.
        Some(b) if matches!(err, Error::Overloaded { .. }) => tracing::debug!(backend = b, error = %err, "refused"),
        Some(b) => tracing::warn!(backend = b, error = %err, "request failed"),
        None => tracing::debug!(error = %err, "request refused"),
    }
    let extra: Vec<(&str, &str)> = err.backend().map(|b| ("backend", b)).into_iter().collect();
    let keep = keep && !ctx.stop.is_cancelled();
    let bytes = reply::error(err.status(), &err.to_string(), &extra, !keep);
    match conn.reply(&bytes).await {
        Ok(()) if keep => Next::Continue,
        _ => Next::Close,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_core::Config;

    /// Every idle connection holds this future: it must stay small (the state of serving a
    /// request, several KiB, is boxed and lives only while a request is served).
    #[tokio::test]
    async fn an_idle_session_is_small() {
        let ctx = refract_core::ctx::Ctx::new(Config::parse(
            "[listen]\nhttp = \"127.0.0.1:0\"\n[[backend]]\nname = \"b\"\naddr = \"127.0.0.1:1\"\nrole = \"primary\"\n",
        )
        .unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let session = run(ctx, stream, IpAddr::from([127, 0, 0, 1]));
        let size = std::mem::size_of_val(&session);
        assert!(size <= 1024, "a session future takes {size} bytes");
    }
}
