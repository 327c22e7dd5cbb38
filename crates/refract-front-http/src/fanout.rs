//! Fan-out of class `all` (e.g. a Hyrise-R TableLoad): the request goes to every backend at
//! once; the client gets the primary's response only if every backend succeeded, otherwise a
//! 502 naming the backend that failed.

use crate::conn::ClientConn;
use crate::error::Error;
use crate::relay::{self, Sink};
use crate::request::Failure;
use bytes::{Buf, Bytes};
use refract_core::backend::Backend;
use refract_core::config::Role;
use refract_core::ctx::Ctx;
use refract_http::{BodyKind, RequestHead, ResponseHead, RouteClass};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::task::JoinSet;

/// Runs a fan-out; `Ok(go_on)` as for a single exchange.
pub(crate) async fn run(
    ctx: &Ctx,
    conn: &mut ClientConn,
    head_bytes: &Bytes,
    head: &RequestHead,
    body: &Bytes,
) -> Result<bool, Failure> {
    let members = ctx.members.snapshot();
    let Some(primary) = members.iter().find(|b| b.role == Role::Primary).cloned() else {
        return Err(Failure::untouched(Error::NoBackend("all")));
    };
    let request = Bytes::from([&head_bytes[..], &body[..]].concat());
    let t = &ctx.cfg.timeouts;
    let (connect, timeout) = (Duration::from_millis(t.connect_ms), Duration::from_millis(t.request_ms));
    let mut set = JoinSet::new();
    for b in members.iter().cloned() {
        let req = request.clone();
        let head_req = head.is_head();
        set.spawn(async move {
            let r = fetch(&b, req, connect, timeout, head_req).await;
            (b, r)
        });
        ctx.metrics.bytes_to_backend.inc_by(request.len() as u64);
    }
    let mut answer = None;
    let mut failure = None;
    while let Some(joined) = set.join_next().await {
        let Ok((b, result)) = joined else { continue };
        match judge(&b, result) {
            Ok(resp) if Arc::ptr_eq(&b, &primary) => answer = Some(resp),
            Ok(_) => {}
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    }
    let (rh, bytes) = match (failure, answer) {
        (Some(err), _) => return Err(Failure::untouched(err)),
        (None, None) => return Err(Failure::untouched(Error::NoBackend("all"))),
        (None, Some(a)) => a,
    };
    conn.reply(&bytes).await.map_err(|err| Failure { err, touched: true })?;
    ctx.metrics.bytes_to_client.inc_by(bytes.len() as u64);
    Ok(rh.body != BodyKind::UntilClose)
}

/// Counts the outcome of one backend's part; a 5xx is a failure.
fn judge(b: &Backend, result: Result<(ResponseHead, Vec<u8>), Error>) -> Result<(ResponseHead, Vec<u8>), Error> {
    let outcome = result.and_then(|(rh, bytes)| {
        if rh.status >= 500 {
            Err(Error::BackendStatus { backend: b.name.clone(), status: rh.status })
        } else {
            Ok((rh, bytes))
        }
    });
    b.record(outcome.is_ok());
    match &outcome {
        Ok(_) => b.counters.request(RouteClass::All),
        Err(e) if e.marks_down() => {
            b.set_up(false);
        }
        Err(_) => {}
    }
    outcome
}

/// Sends a whole request to one backend and reads its whole response.
async fn fetch(
    b: &Arc<Backend>,
    request: Bytes,
    connect: Duration,
    timeout: Duration,
    head_request: bool,
) -> Result<(ResponseHead, Vec<u8>), Error> {
    let _inflight = b.begin();
    let mut bc = b.checkout(connect).await?;
    bc.stream.write_all(&request).await.map_err(|source| Error::BackendIo { backend: b.name.clone(), source })?;
    let rh = loop {
        let rh = relay::response_head(&mut bc, timeout, &b.name, head_request).await?;
        if !rh.is_interim() {
            break rh;
        }
        bc.buf.advance(rh.len);
    };
    let mut out = Vec::new();
    let reuse = Sink::new(&mut out).response(&mut bc, &rh, timeout, &b.name).await?;
    if reuse {
        b.checkin(bc);
    }
    Ok((rh, out))
}
