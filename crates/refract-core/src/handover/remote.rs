//! The cross-host move over the control channel (HANDOVER.md "Hand-off D → A", `always` mode):
//! quiesce, snapshot the client socket (TCP_REPAIR), unhash it silently, send `HandOff` with
//! the pending bytes; the agent restores and serves; on `HandBack` restore the socket here.
//!
//! With `[handover] interface` set, the flow is FROZEN before the snapshot, STEERED to the agent
//! right after `HandOff`, and released once the socket is back here (HANDOVER.md order). Without
//! it this is correct only where the agent's socket lives in the same kernel and a guard drops
//! the client's segments during the two gaps (the tests).

use super::{steer, Session};
use crate::conn::ClientConn;
use refract_handover::control::{ChannelOptions, ControlChannel, ControlKey, Msg, Transfer};
use refract_handover::{discard_in_place, restore, snapshot, unacked, FlowKey, TcpState};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

/// Bound on the client acknowledging everything sent before a hand-off (else relay).
const QUIESCE: Duration = Duration::from_millis(50);
/// Bound on reaching and authenticating the agent (a dead agent host costs the request this
/// much before it is relayed).
const HANDSHAKE: Duration = Duration::from_millis(500);
/// Bound on the agent's answer to `HandOff`.
const ANSWER: Duration = Duration::from_secs(5);
/// How long a flow the agent closed stays steered (its retransmitted FINs still reach it).
const LINGER: Duration = Duration::from_secs(1);

/// Moves the connection to the agent at `agent`; see [`super::local::hand_over`] for the
/// meaning of the result. Until `HandOffOk`, any failure restores the socket here.
pub(super) async fn hand_over(
    conn: &mut ClientConn,
    s: &mut Session,
    agent: SocketAddr,
    key_file: &Path,
    steer: Option<(&str, u32)>,
    pending: Vec<u8>,
) -> Result<bool, String> {
    let flow = flow_of(&conn.stream)?;
    let key = read_key(key_file)?;
    let opts = ChannelOptions { handshake_timeout: HANDSHAKE, ..ChannelOptions::default() };
    let mut ch = ControlChannel::connect(agent, &key, opts).await.map_err(|e| e.to_string())?;
    let target = match (steer, agent) {
        (Some((iface, _)), SocketAddr::V4(a)) => Some(steer::target(iface, *a.ip())?),
        (Some(_), SocketAddr::V6(_)) => return Err("steering needs an IPv4 agent".into()),
        (None, _) => None,
    };
    let fl = Flow { key: flow, steer };
    quiesce(&conn.stream).await?;
    fl.set(|m| m.freeze(flow))?;
    let tcp_state = match snapshot(&conn.stream) {
        Ok(st) => st,
        Err(e) => {
            fl.release();
            return Err(format!("snapshot: {e}"));
        }
    };
    if let Err(e) = discard_in_place(&conn.stream) {
        resume_here(conn, &tcp_state)?;
        fl.release();
        return Err(format!("discard: {e}"));
    }
    let epoch = s.epochs.advance(s.id);
    let t =
        Transfer { conn: s.id, flow, epoch, tcp_state: tcp_state.clone(), pending_bytes: pending, app_state: vec![] };
    let answer = match ch.send(&Msg::HandOff(Box::new(t))).await {
        Ok(()) => {
            // STEER at once: the agent's guard drops what arrives before its socket exists.
            let steered = target.map_or(Ok(()), |tg| fl.set(|m| m.steer(flow, tg, epoch)));
            match steered {
                Ok(()) => timeout(ANSWER, ch.recv()).await.map_err(|_| "no answer".to_string()),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e.to_string()),
    };
    let refused = match answer {
        Ok(Ok(Msg::HandOffOk { conn: c, epoch: e })) if c == s.id && s.epochs.check(c, e).is_ok() => None,
        Ok(Ok(Msg::HandOffErr { reason, .. })) => Some(reason),
        other => Some(format!("agent: {other:?}")),
    };
    if let Some(reason) = refused {
        // By HANDOVER.md's failure table, D still holds the snapshot: restore it, un-steer, relay.
        let restored = resume_here(conn, &tcp_state);
        fl.release();
        return restored.and(Err(reason));
    }
    conn.buf.clear();
    match take_back(&mut ch, conn, s).await {
        Back::Here => {
            fl.release();
            Ok(true)
        }
        Back::Closed => {
            fl.linger();
            Ok(false)
        }
        Back::Lost => {
            // The client's next segment meets this stack and is reset: it sees an error now.
            fl.release();
            Ok(false)
        }
    }
}

/// How the agent's ownership ended.
enum Back {
    /// Handed back; the socket is restored here.
    Here,
    /// The agent closed the connection (client gone, or the exchange asked for close).
    Closed,
    /// The agent or the channel failed, or the hand-back could not be restored.
    Lost,
}

/// A flow's entry in the ingress map, if this dispatcher steers.
struct Flow<'a> {
    key: FlowKey,
    steer: Option<(&'a str, u32)>,
}

impl Flow<'_> {
    fn set(
        &self,
        f: impl FnOnce(&mut refract_handover::Steering) -> refract_handover::Result<()>,
    ) -> Result<(), String> {
        match self.steer {
            Some((iface, cap)) => steer::with(iface, cap, f),
            None => Ok(()),
        }
    }

    fn release(&self) {
        if let Some((iface, cap)) = self.steer {
            steer::release(iface, cap, &self.key);
        }
    }

    /// Keeps the entry a while for retransmitted FINs (the agent closed), then removes it.
    fn linger(&self) {
        if let Some((iface, cap)) = self.steer {
            let (iface, key) = (iface.to_string(), self.key);
            tokio::spawn(async move {
                tokio::time::sleep(LINGER).await;
                steer::release(&iface, cap, &key);
            });
        }
    }
}

/// Waits for `HandBack` (or `Closed`) and restores the socket here.
async fn take_back(ch: &mut ControlChannel, conn: &mut ClientConn, s: &mut Session) -> Back {
    let t = match ch.recv().await {
        Ok(Msg::HandBack(t)) if t.conn == s.id => t,
        Ok(Msg::Closed { .. }) => return Back::Closed,
        other => {
            tracing::warn!("agent lost while it owned the connection ({other:?}); the client's next segment is reset");
            return Back::Lost;
        }
    };
    if let Err(e) = s.epochs.observe(t.conn, t.epoch) {
        tracing::warn!("hand-back refused: {e}");
        return Back::Lost;
    }
    if let Err(e) = resume_here(conn, &t.tcp_state) {
        tracing::warn!("hand-back restore failed: {e}");
        return Back::Lost;
    }
    let _ = ch.send(&Msg::HandBackOk { conn: t.conn, epoch: t.epoch }).await;
    conn.buf.extend_from_slice(&t.pending_bytes);
    Back::Here
}

/// Restores `state` here and makes it the session's socket (the old one, unhashed, closes silently).
fn resume_here(conn: &mut ClientConn, state: &TcpState) -> Result<(), String> {
    let fd = restore(state).map_err(|e| format!("restore here: {e}"))?;
    let stream = to_tokio(fd).map_err(|e| format!("restore here: {e}"))?;
    drop(std::mem::replace(&mut conn.stream, stream));
    Ok(())
}

fn to_tokio(fd: OwnedFd) -> std::io::Result<TcpStream> {
    let std = std::net::TcpStream::from(fd);
    std.set_nonblocking(true)?;
    TcpStream::from_std(std)
}

/// The flow as the steering map keys it (IPv4 only).
fn flow_of(s: &TcpStream) -> Result<FlowKey, String> {
    match (s.peer_addr(), s.local_addr()) {
        (Ok(SocketAddr::V4(client)), Ok(SocketAddr::V4(vip))) => Ok(FlowKey::new(client, vip)),
        _ => Err("only IPv4 flows move across hosts".into()),
    }
}

fn read_key(path: &Path) -> Result<ControlKey, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("key_file {}: {e}", path.display()))?;
    ControlKey::try_new(text.trim_end_matches(['\n', '\r']).as_bytes().to_vec()).map_err(|e| e.to_string())
}

/// HANDOVER.md I3: everything sent is acknowledged, within a bound; else relay.
async fn quiesce(s: &TcpStream) -> Result<(), String> {
    let deadline = Instant::now() + QUIESCE;
    loop {
        match unacked(s) {
            Ok(0) => return Ok(()),
            Ok(n) if Instant::now() >= deadline => return Err(format!("not quiescent: {n} bytes unacknowledged")),
            Ok(_) => tokio::time::sleep(Duration::from_millis(1)).await,
            Err(e) => return Err(e.to_string()),
        }
    }
}
