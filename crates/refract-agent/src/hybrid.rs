//! Hybrid: requests the dispatcher forwards to this agent's backend. The agent sees the result's
//! size first: a small result goes back over the link for the dispatcher to relay; for a large
//! one the agent asks for the client's connection, holds the result, and once the connection is
//! here writes it straight to the client (docs/handover.md, "Hand-off D → A").
//!
//! The logic is one over both carriers ([`Over`]): `WantConnection`, then a `HandOff` (adopted by
//! the one `adopt.rs`, whichever way its socket comes), or `RelayInstead`.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Mutex;

use refract_handover::{EpochTracker, Error, Msg, Result};
use refract_http::{defer, BodyKind, RequestHead};
use tokio::io::AsyncWriteExt;

use crate::adopt::{adopt, Move};
use crate::backend::{connect_backend, BackendStream};
use crate::exchange::{read_response_head, to_backend, BodyReader, Held};
use crate::options::LocalOptions;

/// Results at most this large may be relayed in one `Response` frame; larger ones always ask
/// for the connection (whatever the threshold says), so frames stay far below the limit.
const MAX_INLINE: u64 = 8 << 20;
/// Size of the `Response` frames of a relayed result.
const FRAME: usize = 256 * 1024;

/// A request forwarded by the dispatcher.
pub(crate) struct Forwarded {
    pub conn: u64,
    pub request: u64,
    pub threshold: u64,
    pub bytes: Vec<u8>,
}

/// The link a forwarded request came over, as the hybrid logic needs it.
pub(crate) trait Link {
    /// Sends one piece of a relayed result.
    fn respond(&mut self, fw: &Forwarded, last: bool, keep: bool, bytes: Vec<u8>) -> impl Future<Output = Result<()>>;

    /// Asks for the client's connection and takes the dispatcher's answer: adopts it and
    /// finishes `held` (read from `be`) straight to the client, then `None`; or, if told to
    /// relay instead, gives `held` back.
    fn want(
        &mut self,
        fw: &Forwarded,
        held: Held,
        be: &mut BackendStream,
    ) -> impl Future<Output = Result<Option<Held>>>;

    /// Keeps the link alive while the agent waits on its backend; returns only on failure.
    fn beat(&mut self) -> impl Future<Output = Result<Infallible>>;
}

/// Whether a result whose body is `body` is relayed over the link (else the agent asks for the
/// connection): a known length below the threshold (capped by [`MAX_INLINE`]), or no body.
pub(crate) fn is_small(body: BodyKind, threshold: u64) -> bool {
    match body {
        BodyKind::None => true,
        BodyKind::Length(n) => n < threshold.min(MAX_INLINE),
        BodyKind::Chunked | BodyKind::UntilClose => false,
    }
}

/// Serves one forwarded request, with `backend` the link's kept backend connection. An `Err`
/// ends the link: the dispatcher then relays the request itself if nothing reached the client
/// yet, or closes the client connection.
pub(crate) async fn forward<L: Link>(
    link: &mut L,
    opts: &LocalOptions,
    backend: &mut Option<BackendStream>,
    fw: Forwarded,
) -> Result<()> {
    let req = RequestHead::parse(&fw.bytes, 64 * 1024).ok().flatten();
    let req = req.ok_or(Error::Codec("a forwarded request that does not parse"))?;
    let at_least = fw.threshold.min(MAX_INLINE);
    let request = to_backend(opts.pass_socket, &fw.bytes, req.len, at_least);
    let (mut be, held) = beating(link, exchange(opts, backend.take(), &request, &req)).await?;
    let held = if is_small(held.head.body, fw.threshold) {
        held
    } else {
        match link.want(&fw, held, &mut be).await? {
            Some(held) => held, // relay instead
            None => return Ok(()),
        }
    };
    if relay(link, &fw, &mut be, held, opts).await? {
        *backend = Some(be);
    }
    Ok(())
}

/// Runs `work` while the link sends heartbeats.
async fn beating<L: Link, T>(link: &mut L, work: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::select! {
        r = work => r,
        r = link.beat() => match r {
            Err(e) => Err(e),
            Ok(never) => match never {},
        },
    }
}

/// Sends the request on a pooled backend connection (or a new one if that fails before any
/// response byte) and reads the response head.
async fn exchange(
    opts: &LocalOptions,
    pooled: Option<BackendStream>,
    request: &[u8],
    req: &RequestHead,
) -> Result<(BackendStream, Held)> {
    let held = |(buf, head_at, head)| Held::new(buf, head_at, head, req.keep_alive);
    if let Some(mut be) = pooled {
        if be.write_all(request).await.is_ok() {
            if let Ok(r) = read_response_head(&mut be, opts.backend_timeout, req.is_head()).await {
                return Ok((be, held(r)));
            }
        }
    }
    let mut be = connect_backend(opts).await.map_err(|e| Error::Io(std::io::Error::other(e)))?;
    be.write_all(request).await?;
    let r = read_response_head(&mut be, opts.backend_timeout, req.is_head()).await?;
    Ok((be, held(r)))
}

/// Relays a response over the link in frames of about [`FRAME`] bytes; returns whether the
/// backend connection may carry another request.
async fn relay<L: Link>(
    link: &mut L,
    fw: &Forwarded,
    be: &mut BackendStream,
    held: Held,
    opts: &LocalOptions,
) -> Result<bool> {
    let Held { mut buf, head_at, head, keep_alive, deferred } = held;
    if deferred {
        be.write_all(&defer::HERE).await?; // the body comes here after all
    }
    let mut out = buf.split_to(head_at + head.len).to_vec();
    let mut body = BodyReader::new(head.body);
    while let Some(piece) = body.next(be, &mut buf, opts.backend_timeout).await? {
        out.extend_from_slice(&piece);
        if out.len() >= FRAME {
            link.respond(fw, false, false, std::mem::take(&mut out)).await?;
        }
    }
    let reusable = head.keep_alive && head.body != BodyKind::UntilClose && buf.is_empty();
    link.respond(fw, true, keep_alive && reusable, out).await?;
    Ok(reusable)
}

/// A link over either carrier as forwarded requests use it.
pub(crate) struct Over<'a, C> {
    pub link: &'a mut C,
    pub opts: &'a LocalOptions,
    pub epochs: &'a Mutex<EpochTracker>,
}

impl<C: Move> Link for Over<'_, C> {
    async fn respond(&mut self, fw: &Forwarded, last: bool, keep: bool, bytes: Vec<u8>) -> Result<()> {
        let (conn, request) = (fw.conn, fw.request);
        self.link.send(&Msg::Response { conn, request, last, keep, bytes }, None).await
    }

    async fn want(&mut self, fw: &Forwarded, held: Held, be: &mut BackendStream) -> Result<Option<Held>> {
        self.link.send(&Msg::WantConnection { conn: fw.conn, request: fw.request }, None).await?;
        let (opts, epochs) = (self.opts, self.epochs);
        match self.link.recv().await? {
            (Msg::HandOff(t), fd) if t.conn == fw.conn => {
                adopt(self.link, opts, epochs, *t, fd, Some((held, be))).await.map(|()| None)
            }
            (Msg::RelayInstead { conn, reason, .. }, None) if conn == fw.conn => {
                tracing::debug!(conn, "relaying a large result: {reason}");
                Ok(Some(held))
            }
            (other, _) => Err(unexpected_after_want(other.name())),
        }
    }

    async fn beat(&mut self) -> Result<Infallible> {
        self.link.beat().await
    }
}

/// The error for an answer to `WantConnection` that is neither a hand-off nor `RelayInstead`
/// (logged with its name): the link cannot go on.
fn unexpected_after_want(name: &str) -> Error {
    tracing::warn!("expected a hand-off or RelayInstead after asking for the connection, got {name}");
    Error::Codec("unexpected message after asking for the connection")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_means_below_the_threshold_and_the_inline_cap() {
        assert!(is_small(BodyKind::None, 1));
        assert!(is_small(BodyKind::Length(0), 1));
        assert!(!is_small(BodyKind::Length(1), 1), "at the threshold: large");
        assert!(is_small(BodyKind::Length(65535), 64 << 10));
        assert!(!is_small(BodyKind::Length(64 << 10), 64 << 10));
        assert!(!is_small(BodyKind::Length(MAX_INLINE), u64::MAX), "capped by MAX_INLINE");
        assert!(is_small(BodyKind::Length(MAX_INLINE - 1), u64::MAX));
        assert!(!is_small(BodyKind::Chunked, u64::MAX));
        assert!(!is_small(BodyKind::UntilClose, u64::MAX));
    }
}
