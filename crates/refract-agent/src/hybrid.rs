//! Hybrid: requests the dispatcher forwards to this agent's backend. The agent sees the result's
//! size first: a small result goes back over the link for the dispatcher to relay; for a large
//! one the agent asks for the client's connection (`Want`), holds the result, and on `Adopt`
//! writes it straight to the client (HANDOVER.md, "Hand-off D → A").

use std::sync::Mutex;

use bytes::BytesMut;
use refract_handover::control::EpochTracker;
use refract_handover::local::{LocalLink, LocalMsg};
use refract_handover::{Error, Result};
use refract_http::{BodyKind, RequestHead, ResponseHead};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::exchange::{read_response_head, BodyReader, Held};
use crate::local::{adopt, connect_backend, Forwarded, LocalOptions, Offer};

/// Results at most this large may be relayed in one `Response` frame; larger ones always ask
/// for the connection (whatever the threshold says), so frames stay far below the limit.
const MAX_INLINE: u64 = 8 << 20;
/// Size of the `Response` frames of a relayed result.
const FRAME: usize = 256 * 1024;

/// Serves one forwarded request. An `Err` ends the link: the dispatcher then relays the request
/// itself if nothing reached the client yet, or closes the client connection.
pub(crate) async fn forward(
    link: &mut LocalLink,
    opts: &LocalOptions,
    epochs: &Mutex<EpochTracker>,
    backend: &mut Option<TcpStream>,
    fw: Forwarded,
) -> Result<()> {
    let req = RequestHead::parse(&fw.bytes, 64 * 1024).ok().flatten();
    let req = req.ok_or(Error::Codec("a forwarded request that does not parse"))?;
    let (mut be, buf, head_at, rh) = exchange(opts, backend.take(), &fw.bytes, req.is_head()).await?;
    let inline = fw.threshold.min(MAX_INLINE);
    let small = match rh.body {
        BodyKind::None => true,
        BodyKind::Length(n) => n < inline,
        BodyKind::Chunked | BodyKind::UntilClose => false,
    };
    if small {
        if relay(link, &fw, &mut be, buf, head_at, &rh, req.keep_alive, opts).await? {
            *backend = Some(be);
        }
        return Ok(());
    }
    link.send(&LocalMsg::Want { conn: fw.conn, request: fw.request }, None).await?;
    match link.recv().await? {
        (LocalMsg::Adopt { conn, epoch, backend: b, pending }, Some(fd)) if conn == fw.conn => {
            let held = Held { buf, head_at, head: rh, keep_alive: req.keep_alive };
            let offer = Offer { conn, epoch, backend: b, pending };
            adopt(link, opts, epochs, offer, fd, Some((held, &mut be))).await
        }
        (LocalMsg::RelayInstead { conn, .. }, None) if conn == fw.conn => {
            if relay(link, &fw, &mut be, buf, head_at, &rh, req.keep_alive, opts).await? {
                *backend = Some(be);
            }
            Ok(())
        }
        (other, _) => {
            tracing::warn!("expected Adopt or RelayInstead after Want, got {}", other.name());
            Err(Error::Codec("unexpected message after Want"))
        }
    }
}

/// Sends the request on a pooled backend connection (or a new one if that fails before any
/// response byte) and reads the response head.
async fn exchange(
    opts: &LocalOptions,
    pooled: Option<TcpStream>,
    request: &[u8],
    head_request: bool,
) -> Result<(TcpStream, BytesMut, usize, ResponseHead)> {
    if let Some(mut be) = pooled {
        if be.write_all(request).await.is_ok() {
            if let Ok((buf, at, rh)) = read_response_head(&mut be, opts.backend_timeout, head_request).await {
                return Ok((be, buf, at, rh));
            }
        }
    }
    let mut be = connect_backend(opts).await.map_err(|e| Error::Io(std::io::Error::other(e)))?;
    be.write_all(request).await?;
    let (buf, at, rh) = read_response_head(&mut be, opts.backend_timeout, head_request).await?;
    Ok((be, buf, at, rh))
}

/// Relays a response over the link in `Response` frames; returns whether the backend
/// connection may carry another request.
#[allow(clippy::too_many_arguments)]
async fn relay(
    link: &mut LocalLink,
    fw: &Forwarded,
    be: &mut TcpStream,
    mut buf: BytesMut,
    head_at: usize,
    rh: &ResponseHead,
    keep_alive: bool,
    opts: &LocalOptions,
) -> Result<bool> {
    let mut out = buf.split_to(head_at + rh.len).to_vec();
    let mut body = BodyReader::new(rh.body);
    let (conn, request) = (fw.conn, fw.request);
    while let Some(piece) = body.next(be, &mut buf, opts.backend_timeout).await? {
        out.extend_from_slice(&piece);
        if out.len() >= FRAME {
            let bytes = std::mem::take(&mut out);
            link.send(&LocalMsg::Response { conn, request, last: false, keep: false, bytes }, None).await?;
        }
    }
    let reusable = rh.keep_alive && rh.body != BodyKind::UntilClose && buf.is_empty();
    let keep = keep_alive && reusable;
    link.send(&LocalMsg::Response { conn, request, last: true, keep, bytes: out }, None).await?;
    Ok(reusable)
}
