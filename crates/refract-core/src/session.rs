//! The client session loop: read a request head, classify, forward to a backend (retrying a
//! read once elsewhere if nothing reached the client), relay the response, repeat. Requests
//! are served one at a time in arrival order, so pipelined responses keep their order and the
//! connection is quiescent at every request boundary (where a hand-over can happen later).

use crate::backend::Backend;
use crate::conn::ClientConn;
use crate::dispatcher::Ctx;
use crate::error::Error;
use crate::fanout;
use crate::relay::{self, Sink};
use bytes::Bytes;
use refract_http::chunked::decode_all;
use refract_http::{reply, BodyKind, RequestHead, RouteClass};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

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
        if serve(&ctx, &mut conn, head).await == Next::Close || ctx.stop.is_cancelled() {
            break;
        }
    }
    conn.close_gracefully().await;
}

async fn serve(ctx: &Ctx, conn: &mut ClientConn, head: RequestHead) -> Next {
    let head_bytes = conn.buf.split_to(head.len).freeze();
    let started = Instant::now();
    let (class, body) = match prepare(ctx, conn, &head).await {
        Ok(x) => x,
        Err(e) => return reply_error(ctx, conn, &e, false).await,
    };
    let result = match &body {
        ReqBody::Buffered(b) if class == RouteClass::All => fanout::run(ctx, conn, &head_bytes, &head, b).await,
        _ => forward(ctx, conn, class, &head_bytes, &head, &body).await,
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
    if let Error::ClientIo(_) = err {
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

/// Forwards to one backend of `class`; a read is retried once on another backend when the
/// failure left the client untouched and the body can be sent again. Writes never are.
async fn forward(
    ctx: &Ctx,
    conn: &mut ClientConn,
    class: RouteClass,
    head_bytes: &Bytes,
    head: &RequestHead,
    body: &ReqBody,
) -> Result<bool, Failure> {
    let mut tried: Vec<Arc<Backend>> = Vec::new();
    let mut last = None;
    loop {
        let Some(b) = ctx.members.pick(class, &tried) else {
            return Err(last.unwrap_or(Failure::untouched(Error::NoBackend(class.as_str()))));
        };
        match exchange(ctx, conn, &b, head_bytes, head, body).await {
            Ok(go_on) => {
                b.record(true);
                b.counters.request(class);
                return Ok(go_on);
            }
            Err(f) => {
                b.record(false);
                if f.err.marks_down() && b.set_up(false) {
                    tracing::warn!(backend = %b.name, error = %f.err, "backend marked down");
                }
                let again = class == RouteClass::Read
                    && tried.is_empty()
                    && !f.touched
                    && matches!(body, ReqBody::Buffered(_))
                    && f.err.is_retryable();
                if !again {
                    return Err(f);
                }
                tracing::debug!(backend = %b.name, error = %f.err, "read failed; retrying on another backend");
                ctx.metrics.error(f.err.kind());
                ctx.metrics.error("retry");
                tried.push(b);
                last = Some(f);
            }
        }
    }
}

/// One request/response exchange with one backend. `Ok(go_on)` says whether the client
/// connection can carry another request (not after a response delimited by close).
async fn exchange(
    ctx: &Ctx,
    conn: &mut ClientConn,
    b: &Arc<Backend>,
    head_bytes: &Bytes,
    head: &RequestHead,
    body: &ReqBody,
) -> Result<bool, Failure> {
    let _inflight = b.begin();
    let t = &ctx.cfg.timeouts;
    let mut bc = b.checkout(Duration::from_millis(t.connect_ms)).await.map_err(Failure::untouched)?;
    let sent = send_request(conn, &mut bc, &b.name, head_bytes, body).await.map_err(Failure::untouched)?;
    ctx.metrics.bytes_to_backend.inc_by(sent);
    let timeout = Duration::from_millis(t.request_ms);
    let mut sink = Sink::new(&mut conn.stream);
    let result = async {
        loop {
            let rh = relay::response_head(&mut bc, timeout, &b.name, head.is_head()).await?;
            if !rh.is_interim() {
                let reuse = sink.response(&mut bc, &rh, timeout, &b.name).await?;
                return Ok((rh, reuse));
            }
            sink.pass(&mut bc, rh.len).await?;
        }
    }
    .await;
    ctx.metrics.bytes_to_client.inc_by(sink.written);
    let (rh, reuse) = result.map_err(|err| Failure { err, touched: sink.written > 0 })?;
    if reuse {
        b.checkin(bc);
    }
    Ok(rh.body != BodyKind::UntilClose)
}

async fn send_request(
    conn: &mut ClientConn,
    bc: &mut crate::backend::BackendConn,
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
    Ok((head_bytes.len() + body_len(body)) as u64)
}

fn body_len(body: &ReqBody) -> usize {
    match body {
        ReqBody::Buffered(b) => b.len(),
        ReqBody::Stream(_) => 0,
    }
}
