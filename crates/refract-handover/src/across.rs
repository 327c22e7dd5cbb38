//! The dispatcher's side of the cross-host move, for any protocol (docs/handover.md, "Hand-off
//! D → A", "Hand-back A → D"): reach and authenticate the agent ([`channel`]); quiesce, FREEZE,
//! snapshot and unhash the client socket ([`freeze`]); STEER and send `HandOff` ([`offer`]);
//! restore a `HandBack`'s socket and acknowledge it ([`land`]); release or linger the flow's
//! steering entry ([`Frozen`]). What a protocol decides (when to offer, what travels, when the
//! connection comes back) stays behind [`crate::seam::Seam`].
//!
//! With a steering interface, the flow is FROZEN before the snapshot, STEERED to the agent
//! just before `HandOff` leaves ("steer before the target sends"), and released once the socket
//! is back here. Without it this is correct only where the agent's socket lives in the same
//! kernel and a guard drops the client's segments during the two gaps (the tests).

pub mod steer;

use crate::control::{ChannelOptions, ControlChannel, ControlKey};
use crate::seam::{self, Offer, Refusal, Seam};
use crate::{discard_in_place, restore, snapshot, FlowKey, SteerTarget, TcpState};
use crate::{EpochTracker, Msg, Serving, Socket, Transfer};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;
use tokio::net::TcpStream;

/// Why a hand-over failed: the `result` label of `refract_handover_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// The agent's socket or control port could not be reached (or authenticated) in time.
    Unreachable,
    /// The agent answered `HandOffErr` (foreign backend, its backend down, restore failed).
    Refused,
    /// An epoch did not match (the agent's refusal, or its acceptance of another epoch).
    StaleEpoch,
    /// The link or channel to the agent ended before it answered.
    AgentLost,
    /// The client had not acknowledged everything within the bound (cross host).
    NotQuiescent,
    /// The ingress map had no room for the flow.
    MapFull,
    /// The ingress program could not be attached or set, or the agent's MAC is unknown.
    Steering,
    /// Snapshot, silent unhash or restore of the client socket failed here.
    Snapshot,
    /// No answer to the hand-off within the bound.
    Timeout,
    /// The agent said something out of order.
    Protocol,
    /// Not possible for this connection or configuration (IPv6 flow, key file, TLS, ...).
    Unsupported,
}

impl Why {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Unreachable => "unreachable",
            Why::Refused => "refused",
            Why::StaleEpoch => "stale_epoch",
            Why::AgentLost => "agent_lost",
            Why::NotQuiescent => "not_quiescent",
            Why::MapFull => "map_full",
            Why::Steering => "steering",
            Why::Snapshot => "snapshot",
            Why::Timeout => "timeout",
            Why::Protocol => "protocol",
            Why::Unsupported => "unsupported",
        }
    }

    /// How an agent's refusal reads: a stale epoch or anything else.
    pub fn of_refusal(reason: &str) -> Why {
        if reason.starts_with("stale epoch") {
            Why::StaleEpoch
        } else {
            Why::Refused
        }
    }
}

/// A hand-over that did not happen (nothing reached the client: relay instead).
#[derive(Debug)]
pub struct Declined {
    /// Why, as the metrics label it.
    pub why: Why,
    /// For the log.
    pub detail: String,
}

impl Declined {
    /// A refusal for `why`.
    pub fn new(why: Why, detail: impl Into<String>) -> Self {
        Declined { why, detail: detail.into() }
    }

    /// The label and detail of an offer the agent did not take.
    pub fn of(r: &Refusal) -> Declined {
        let why = match r {
            Refusal::Refused(reason) => Why::of_refusal(reason),
            Refusal::Lost(_) => Why::AgentLost,
            Refusal::Stale(_) => Why::StaleEpoch,
            Refusal::Unexpected(_) => Why::Protocol,
            Refusal::Timeout => Why::Timeout,
        };
        Declined::new(why, r.to_string())
    }
}

impl std::fmt::Display for Declined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.detail, self.why.as_str())
    }
}

/// Bound on the client acknowledging everything sent before a hand-off (else relay).
/// Linux clients may delay an ACK up to 200 ms (40 ms at least): a shorter bound declined
/// hand-overs behind a small relayed response whenever that client delayed its ACK and the
/// machine was busy. [`crate::quiesce`] asks for a held-back ACK, so the bound is rarely reached.
const QUIESCE: Duration = Duration::from_millis(200);
/// Bound on reaching and authenticating the agent (a dead agent host costs the request this
/// much before it is relayed).
const HANDSHAKE: Duration = Duration::from_millis(500);
/// Bound on the agent's answer to `HandOff`.
const ANSWER: Duration = Duration::from_secs(5);
/// How long a flow the agent closed stays steered (its retransmitted FINs still reach it).
const LINGER: Duration = Duration::from_secs(1);

/// An agent at `IP:port`.
#[derive(Debug, Clone, Copy)]
pub struct Agent<'a> {
    /// Its control listener.
    pub addr: SocketAddr,
    /// The file holding the shared control key.
    pub key_file: &'a Path,
    /// The steering interface and map capacity, when this dispatcher steers.
    pub steer: Option<(&'a str, u32)>,
}

/// `kept`, the caller's channel to `agent`, if it is still good (see
/// [`ControlChannel::refresh`]), else a new one (connected and authenticated within
/// [`HANDSHAKE`]; this also resolves the agent's MAC for STEER).
pub async fn channel(
    kept: Option<(SocketAddr, ControlChannel)>,
    agent: &Agent<'_>,
) -> Result<ControlChannel, Declined> {
    if let Some((addr, mut ch)) = kept {
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

/// A client socket snapshotted and unhashed here (frozen in the ingress map when steering):
/// what follows is `HandOff` ([`offer`]), or a restore here ([`Frozen::restore_here`]).
pub struct Frozen<'a> {
    flow: Flow<'a>,
    target: Option<SteerTarget>,
    tcp_state: TcpState,
    /// When the snapshot started.
    pub started: std::time::Instant,
}

/// The source side of docs/handover.md, "Snapshot", steps 1–9: quiesce (I3), FREEZE, snapshot,
/// unhash silently. `Err`: nothing changed (the socket is still `stream`, live).
pub async fn freeze<'a>(stream: &mut TcpStream, agent: &Agent<'a>) -> Result<Frozen<'a>, Declined> {
    let key = flow_of(stream)?;
    let target = match (agent.steer, agent.addr) {
        (Some((iface, _)), SocketAddr::V4(a)) => Some(steer::target(iface, *a.ip())?),
        (Some(_), SocketAddr::V6(_)) => return Err(Declined::new(Why::Unsupported, "steering needs an IPv4 agent")),
        (None, _) => None,
    };
    let flow = Flow { key, steer: agent.steer };
    quiesce(stream).await?;
    let started = std::time::Instant::now();
    flow.set(|m| m.freeze(key))?;
    let tcp_state = match snapshot(&*stream) {
        Ok(st) => st,
        Err(e) => {
            flow.release();
            return Err(Declined::new(Why::Snapshot, format!("snapshot: {e}")));
        }
    };
    if let Err(e) = discard_in_place(&*stream) {
        resume_here(stream, &tcp_state)?;
        flow.release();
        return Err(Declined::new(Why::Snapshot, format!("discard: {e}")));
    }
    Ok(Frozen { flow, target, tcp_state, started })
}

impl Frozen<'_> {
    /// The offer was not taken: the socket lives here again (restored into `stream`), un-steered.
    pub fn restore_here(&self, stream: &mut TcpStream) -> Result<(), Declined> {
        let restored = resume_here(stream, &self.tcp_state);
        self.flow.release();
        restored
    }

    /// The connection is back here (or gone with an error): its packets reach this host again.
    pub fn release(&self) {
        self.flow.release();
    }

    /// The agent closed the connection: its entry stays a while for retransmitted FINs.
    pub fn linger(&self) {
        self.flow.linger();
    }
}

/// STEERs, sends `HandOff` for connection `conn` (`seam` says what travels) and waits for
/// `HandOffOk` (docs/handover.md, "Hand-off D → A" steps 4–6). `steered` is told how long the
/// flow was frozen. `Err` says why not and whether the channel is still in step (only after
/// `HandOffErr`: the agent answered and waits); the caller then restores the socket
/// ([`Frozen::restore_here`]) and relays.
pub async fn offer<S: Seam>(
    ch: &mut ControlChannel,
    seam: &mut S,
    epochs: &mut EpochTracker,
    conn: u64,
    frozen: &Frozen<'_>,
    serving: Serving,
    steered: impl FnOnce(Duration),
) -> Result<(), (Declined, bool)> {
    let (flow, epoch) = (frozen.flow.key, epochs.advance(conn));
    // STEER before `HandOff` leaves: the agent writes to the client as soon as it has restored the
    // socket, and an ACK of that first flight meeting FREEZE here would be lost, which costs the
    // cold restored socket a whole initial RTO (1 s) — docs/handover.md: "steer before the target
    // sends". What arrives at the agent before its socket exists, its guard drops.
    if let Some(tg) = frozen.target {
        frozen.flow.set(|m| m.steer(flow, tg, epoch)).map_err(|d| (d, false))?;
        steered(frozen.started.elapsed());
    }
    let offer = Offer {
        conn,
        epoch,
        socket: Socket::Repair { flow, tcp_state: frozen.tcp_state.clone() },
        serving,
        answer: ANSWER,
    };
    seam::hand_off(ch, seam, epochs, offer).await.map_err(|r| (Declined::of(&r), matches!(r, Refusal::Refused(_))))
}

/// Restores the `HandBack`'s TCP state into `stream` and acknowledges it (`HandBackOk`).
/// `Err`: the connection cannot go on.
pub async fn land(ch: &mut ControlChannel, stream: &mut TcpStream, t: &Transfer) -> Result<(), String> {
    let Socket::Repair { tcp_state, .. } = &t.socket else {
        return Err("a hand-back without its TCP state".into());
    };
    resume_here(stream, tcp_state).map_err(|e| e.to_string())?;
    let _ = ch.send(&Msg::HandBackOk { conn: t.conn, epoch: t.epoch }).await;
    Ok(())
}

/// A flow's entry in the ingress map, if this dispatcher steers.
struct Flow<'a> {
    key: FlowKey,
    steer: Option<(&'a str, u32)>,
}

impl Flow<'_> {
    fn set(&self, f: impl FnOnce(&mut crate::Steering) -> crate::Result<()>) -> Result<(), Declined> {
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

/// Restores `state` here and makes it `stream` (the old one, unhashed, closes silently).
fn resume_here(stream: &mut TcpStream, state: &TcpState) -> Result<(), Declined> {
    let failed = |e: &dyn std::fmt::Display| Declined::new(Why::Snapshot, format!("restore here: {e}"));
    let fd = restore(state).map_err(|e| failed(&e))?;
    let restored = to_tokio(fd).map_err(|e| failed(&e))?;
    drop(std::mem::replace(stream, restored));
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
    crate::quiesce(s, QUIESCE).await.map_err(|e| match e {
        crate::Error::NotQuiescent(n) => {
            Declined::new(Why::NotQuiescent, format!("not quiescent: {n} bytes unacknowledged"))
        }
        e => Declined::new(Why::Snapshot, e.to_string()),
    })
}
