//! Hybrid (HANDOVER.md "Hand-off D → A"): a read for a backend with an agent goes to the agent
//! with the connection id, hand-over allowed. The agent sees the result's head first: a small
//! result comes back as `Response` frames and is relayed here; for a large one it says `Want`
//! and holds the result, and the dispatcher moves the connection there (with any pipelined
//! bytes) at once — the request boundary is already quiescent, nothing else was written.

use super::{local, Declined, Rec, Session, Why};
use crate::conn::ClientConn;
use refract_handover::local::LocalMsg;
use std::net::SocketAddr;
use std::path::Path;

/// Forwards `request` (head and body) through the agent at `path`. `Err`: nothing reached the
/// client (relay as usual); `Ok(go_on)`: answered, by relay or by hand-over.
pub(super) async fn exchange(
    rec: Rec<'_>,
    conn: &mut ClientConn,
    s: &mut Session,
    path: &Path,
    backend: SocketAddr,
    threshold: u64,
    request: Vec<u8>,
) -> Result<bool, Declined> {
    let mut link = match s.link.take() {
        Some((p, l)) if p == path => l,
        _ => local::connect(path).await?,
    };
    s.requests += 1;
    let n = s.requests;
    let fw = LocalMsg::Forward { conn: s.id, request: n, threshold, bytes: request };
    link.send(&fw, None).await.map_err(|e| Declined::new(Why::AgentLost, format!("agent: {e}")))?;
    let mut touched = false;
    loop {
        let msg = match link.recv().await {
            Ok((m, None)) => m,
            Ok((m, Some(_))) => {
                return fail(touched, Why::Protocol, format!("unexpected descriptor with {}", m.name()))
            }
            Err(e) => return fail(touched, Why::AgentLost, format!("agent: {e}")),
        };
        match msg {
            LocalMsg::Response { conn: c, request: r, last, keep, bytes } if c == s.id && r == n => {
                touched = true;
                if conn.reply(&bytes).await.is_err() {
                    return Ok(false); // the client is gone; the link is dropped mid-response
                }
                rec.relayed(bytes.len());
                if last {
                    s.link = Some((path.to_path_buf(), link));
                    return Ok(keep);
                }
            }
            LocalMsg::Want { conn: c, request: r } if c == s.id && r == n && !touched => {
                let pending = conn.buf.to_vec();
                let r = local::adopt(rec, &mut link, conn, s, backend, pending).await;
                s.link = Some((path.to_path_buf(), link));
                return r;
            }
            other => return fail(touched, Why::Protocol, format!("unexpected {}", other.name())),
        }
    }
}

/// Ends an exchange that went wrong: relay if nothing reached the client, else close.
fn fail(touched: bool, why: Why, detail: String) -> Result<bool, Declined> {
    if touched {
        tracing::warn!("agent exchange failed mid-response ({detail}); closing the client connection");
        return Ok(false);
    }
    Err(Declined::new(why, detail))
}
