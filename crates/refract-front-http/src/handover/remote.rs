//! The cross-host move over the control channel (docs/handover.md, "Hand-off D → A"): quiesce,
//! snapshot the client socket (TCP_REPAIR), unhash it silently, send `HandOff` with the pending
//! bytes; the agent restores and serves; on `HandBack` restore the socket here. `always` calls
//! [`hand_over`]; hybrid calls [`freeze`] and [`hand_off`] when the agent asks for the
//! connection. The session keeps its control channel across requests ([`channel`], [`keep`]).
//!
//! With `[handover] interface` set, the flow is FROZEN before the snapshot, STEERED to the agent
//! just before `HandOff` leaves (docs/handover.md: "steer before the target sends"), and released
//! once the socket is back here. Without it this is correct only where the agent's socket lives in
//! the same kernel and a guard drops the client's segments during the two gaps (the tests).

use super::cut::{declined, settle, Cut, Land, Landed};
use super::{steer, Declined, Rec, Session, Why};
use crate::conn::ClientConn;
use refract_handover::control::{ChannelOptions, ControlChannel, ControlKey};
use refract_handover::seam::{self, Offer, Refusal};
use refract_handover::{discard_in_place, restore, snapshot, unacked, FlowKey, SteerTarget, TcpState};
use refract_handover::{Msg, Serving, Socket, Transfer};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Bound on the client acknowledging everything sent before a hand-off (else relay).
/// Linux clients may delay an ACK up to 200 ms (40 ms at least): a shorter bound declined
/// hand-overs behind a small relayed response whenever that client delayed its ACK and the
/// machine was busy.
const QUIESCE: Duration = Duration::from_millis(200);
/// Bound on reaching and authenticating the agent (a dead agent host costs the request this
/// much before it is relayed).
const HANDSHAKE: Duration = Duration::from_millis(500);
/// Bound on the agent's answer to `HandOff`.
const ANSWER: Duration = Duration::from_secs(5);
/// How long a flow the agent closed stays steered (its retransmitted FINs still reach it).
const LINGER: Duration = Duration::from_secs(1);

/// An agent at `IP:port`, as `[handover]` names it.
pub(super) struct Agent<'a> {
    pub addr: SocketAddr,
    pub key_file: &'a Path,
    /// `[handover] interface` and `map_capacity`, when this dispatcher steers.
    pub steer: Option<(&'a str, u32)>,
}

/// `always`: moves the connection to `agent` for the request `ahead` (and any read behind it); see
/// [`super::local::hand_over`] for the meaning of the result. Until `HandOffOk`, any failure
/// restores the socket here.
pub(super) async fn hand_over(
    rec: Rec<'_>,
    conn: &mut ClientConn,
    s: &mut Session,
    agent: &Agent<'_>,
    ahead: Vec<u8>,
) -> Result<bool, Declined> {
    let ch = channel(s, agent).await?;
    let frozen = match freeze(conn, agent).await {
        Ok(f) => f,
        Err(declined) => {
            keep(s, agent, ch); // nothing was said on it
            return Err(declined);
        }
    };
    hand_off(rec, ch, conn, s, agent, frozen, ahead).await
}

/// The session's control channel to `agent` if it is still good (see
/// [`ControlChannel::refresh`]), else a new one (connected and authenticated within
/// [`HANDSHAKE`]; this also resolves the agent's MAC for STEER).
pub(super) async fn channel(s: &mut Session, agent: &Agent<'_>) -> Result<ControlChannel, Declined> {
    if let Some((addr, mut ch)) = s.channel.take() {
        match ch.refresh() {
            Ok(()) if addr == agent.addr => return Ok(ch),
            Ok(()) => {}
            Err(e) => tracing::debug!(agent = %addr, "control channel not reusable ({e}); reconnecting"),
        }
    }
    let key = read_key(agent.key_file)?;
    let opts = ChannelOptions { handshake_timeout: HANDSHAKE, ..ChannelOptions::default() };
    let connected = ControlChannel::connect(agent.addr, &key, opts).await;
    connected.map_err(|e| Declined::new(Why::Unreachable, format!("agent {}: {e}", agent.addr)))
}

/// Keeps `ch` in the session for its next request (its framing is in step).
pub(super) fn keep(s: &mut Session, agent: &Agent<'_>, ch: ControlChannel) {
    s.channel = Some((agent.addr, ch));
}

/// A client socket snapshotted and unhashed here (frozen in the ingress map when steering):
/// what follows is `HandOff`, or a restore here.
pub(super) struct Frozen<'a> {
    fl: Flow<'a>,
    target: Option<SteerTarget>,
    tcp_state: TcpState,
    started: std::time::Instant,
}

/// The source side of docs/handover.md, "Snapshot", steps 1–9: quiesce (I3), FREEZE, snapshot,
/// unhash silently. `Err`: nothing changed (the socket is still ours and live).
pub(super) async fn freeze<'a>(conn: &mut ClientConn, agent: &Agent<'a>) -> Result<Frozen<'a>, Declined> {
    let flow = flow_of(&conn.stream)?;
    let target = match (agent.steer, agent.addr) {
        (Some((iface, _)), SocketAddr::V4(a)) => Some(steer::target(iface, *a.ip())?),
        (Some(_), SocketAddr::V6(_)) => return Err(Declined::new(Why::Unsupported, "steering needs an IPv4 agent")),
        (None, _) => None,
    };
    let fl = Flow { key: flow, steer: agent.steer };
    quiesce(&conn.stream).await?;
    let started = std::time::Instant::now();
    fl.set(|m| m.freeze(flow))?;
    let tcp_state = match snapshot(&conn.stream) {
        Ok(st) => st,
        Err(e) => {
            fl.release();
            return Err(Declined::new(Why::Snapshot, format!("snapshot: {e}")));
        }
    };
    if let Err(e) = discard_in_place(&conn.stream) {
        resume_here(conn, &tcp_state)?;
        fl.release();
        return Err(Declined::new(Why::Snapshot, format!("discard: {e}")));
    }
    Ok(Frozen { fl, target, tcp_state, started })
}

/// STEERs, sends `HandOff` (with `ahead`, the request the agent has not seen, if any, and every
/// byte read behind it), waits for `HandOffOk` and then for the connection to come back
/// (docs/handover.md, "Hand-off D → A" steps 4–6, "Hand-back A → D" step 3). A refusal or no
/// answer restores the snapshot here (`Err`: relay). The channel stays in the session when its
/// framing is still in step.
pub(super) async fn hand_off(
    rec: Rec<'_>,
    mut ch: ControlChannel,
    conn: &mut ClientConn,
    s: &mut Session,
    agent: &Agent<'_>,
    frozen: Frozen<'_>,
    ahead: Vec<u8>,
) -> Result<bool, Declined> {
    let Frozen { fl, target, tcp_state, started } = frozen;
    let mut cut = Cut { rec, conn, ahead };
    if let Err((declined, in_step)) = answer(&mut cut, &mut ch, s, &fl, target, &tcp_state, started).await {
        // By docs/handover.md's failure table, D still holds the snapshot: restore it, un-steer,
        // relay.
        let restored = resume_here(cut.conn, &tcp_state);
        fl.release();
        if in_step {
            keep(s, agent, ch); // `HandOffErr`: the agent waits for the next request
        }
        return restored.and(Err(declined));
    }
    rec.accepted(started);
    match settle(&mut cut, &mut ch, s).await {
        Landed::Here => {
            fl.release();
            keep(s, agent, ch);
            Ok(true)
        }
        Landed::Closed => {
            fl.linger();
            Ok(false)
        }
        Landed::Lost => {
            // The client's next segment meets this stack and is reset: it sees an error now.
            fl.release();
            Ok(false)
        }
    }
}

/// STEERs, sends `HandOff` and waits for `HandOffOk`. `Err` says why not and whether
/// the channel is still in step (only after `HandOffErr`: the agent answered and waits).
async fn answer(
    cut: &mut Cut<'_, '_>,
    ch: &mut ControlChannel,
    s: &mut Session,
    fl: &Flow<'_>,
    target: Option<SteerTarget>,
    tcp_state: &TcpState,
    started: std::time::Instant,
) -> Result<(), (Declined, bool)> {
    let (flow, epoch) = (fl.key, s.epochs.advance(s.id));
    // STEER before `HandOff` leaves: the agent writes to the client as soon as it has restored the
    // socket, and an ACK of that first flight meeting FREEZE here would be lost, which costs the
    // cold restored socket a whole initial RTO (1 s) — docs/handover.md: "steer before the target
    // sends". What arrives at the agent before its socket exists, its guard drops.
    if let Some(tg) = target {
        fl.set(|m| m.steer(flow, tg, epoch)).map_err(|d| (d, false))?;
        cut.rec.metrics().handover_frozen(started.elapsed().as_secs_f64());
    }
    let offer = Offer {
        conn: s.id,
        epoch,
        socket: Socket::Repair { flow, tcp_state: tcp_state.clone() },
        // The agent serves the backend it fronts: this dispatcher names none.
        serving: Serving { idle_ms: cut.rec.idle_ms(), backend: None },
        answer: ANSWER,
    };
    seam::hand_off(ch, cut, &s.epochs, offer).await.map_err(|r| (declined(&r), matches!(r, Refusal::Refused(_))))
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
    ) -> Result<(), Declined> {
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

impl Land for ControlChannel {
    /// Restores the `HandBack`'s TCP state here and acknowledges it (`HandBackOk`).
    async fn land(&mut self, conn: &mut ClientConn, t: &Transfer) -> Result<(), String> {
        let Socket::Repair { tcp_state, .. } = &t.socket else {
            return Err("a hand-back without its TCP state".into());
        };
        resume_here(conn, tcp_state).map_err(|e| e.to_string())?;
        let _ = self.send(&Msg::HandBackOk { conn: t.conn, epoch: t.epoch }).await;
        Ok(())
    }
}

/// Restores `state` here and makes it the session's socket (the old one, unhashed, closes silently).
fn resume_here(conn: &mut ClientConn, state: &TcpState) -> Result<(), Declined> {
    let failed = |e: &dyn std::fmt::Display| Declined::new(Why::Snapshot, format!("restore here: {e}"));
    let fd = restore(state).map_err(|e| failed(&e))?;
    let stream = to_tokio(fd).map_err(|e| failed(&e))?;
    drop(std::mem::replace(&mut conn.stream, stream));
    Ok(())
}

fn to_tokio(fd: OwnedFd) -> std::io::Result<TcpStream> {
    let std = std::net::TcpStream::from(fd);
    std.set_nonblocking(true)?;
    TcpStream::from_std(std)
}

/// The flow as the steering map keys it (IPv4 only).
fn flow_of(s: &TcpStream) -> Result<FlowKey, Declined> {
    match (s.peer_addr(), s.local_addr()) {
        (Ok(SocketAddr::V4(client)), Ok(SocketAddr::V4(vip))) => Ok(FlowKey::new(client, vip)),
        _ => Err(Declined::new(Why::Unsupported, "only IPv4 flows move across hosts")),
    }
}

fn read_key(path: &Path) -> Result<ControlKey, Declined> {
    let bad = |e: String| Declined::new(Why::Unsupported, format!("key_file {}: {e}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    ControlKey::try_new(text.trim_end_matches(['\n', '\r']).as_bytes().to_vec()).map_err(|e| bad(e.to_string()))
}

/// docs/handover.md, I3: everything sent is acknowledged, within a bound; else relay.
async fn quiesce(s: &TcpStream) -> Result<(), Declined> {
    let deadline = Instant::now() + QUIESCE;
    loop {
        match unacked(s) {
            Ok(0) => return Ok(()),
            Ok(n) if Instant::now() >= deadline => {
                return Err(Declined::new(Why::NotQuiescent, format!("not quiescent: {n} bytes unacknowledged")))
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(1)).await,
            Err(e) => return Err(Declined::new(Why::Snapshot, e.to_string())),
        }
    }
}
