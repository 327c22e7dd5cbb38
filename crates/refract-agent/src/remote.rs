//! Cross-host adoption over the control channel: restore the client's TCP socket from the
//! `HandOff` state (TCP_REPAIR), serve the request from the backend straight to the client,
//! ask the dispatcher about each further one (`Next` → `Serve` / `Return`), wait at most the
//! `HandOff`'s `idle_ms` ([`AppState`]) for the next, then quiesce, snapshot and send
//! `HandBack`.
//!
//! This is the agent's half of docs/handover.md, "Hand-off D → A" / "Hand-back A → D": the
//! dispatcher steers the flow here; the guard (when the agent attached one) tombstones it while
//! it goes back.
//! The same adoption serves `always` (a `HandOff` out of the blue) and hybrid (a `HandOff`
//! answering this agent's `WantConnection`, with the result it holds; [`HybridLink`] asks).

use std::collections::HashMap;
use std::convert::Infallible;
use std::os::fd::OwnedFd;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use refract_handover::control::{AppState, ControlChannel, EpochTracker, Msg, Transfer};
use refract_handover::{discard, restore, snapshot, unacked, FlowKey, Guard, Result};
use tokio::net::TcpStream;

use crate::backend::{connect_backend, BackendStream};
use crate::exchange::{Adopted, Ask, Held, Served};
use crate::hybrid::{unexpected_after_want, Forwarded, Link};
use crate::options::LocalOptions;

/// Bound on waiting for the client to acknowledge everything before a hand-back (I3).
const QUIESCE: Duration = Duration::from_secs(2);
/// How long a handed-back flow stays tombstoned here.
const GRACE: Duration = Duration::from_secs(1);

/// Adopts the connection in `t` (its epoch already accepted), serves it, and hands it back.
/// With `held` (hybrid: the agent asked for the connection), that response is finished first
/// and its backend connection serves the pipelined requests; else a new one does.
pub(crate) async fn adopt(
    ch: &mut ControlChannel,
    epochs: &mut EpochTracker,
    t: Transfer,
    opts: &LocalOptions,
    held: Option<(Held, &mut BackendStream)>,
) -> Result<()> {
    let (conn, epoch) = (t.conn, t.epoch);
    let app = match AppState::parse(&t.app_state) {
        Ok(a) => a,
        Err(e) => return ch.send(&Msg::HandOffErr { conn, epoch, reason: format!("app state: {e}") }).await,
    };
    let (mut client, mut own) = match ready(&t, opts, held.is_none()).await {
        Ok(x) => x,
        Err(reason) => return ch.send(&Msg::HandOffErr { conn, epoch, reason }).await,
    };
    ch.send(&Msg::HandOffOk { conn, epoch }).await?;
    let (held, backend) = match (held, own.as_mut()) {
        (Some((h, b)), _) => (Some(h), b),
        (None, Some(b)) => (None, b),
        (None, None) => return Err(refract_handover::Error::Codec("no backend connection")),
    };
    let pending = BytesMut::from(&t.pending_bytes[..]);
    let idle = Duration::from_millis(app.idle_ms.into());
    let adopted = Adopted::new(&mut client, backend, pending, opts.backend_timeout, idle, epoch, opts.pass_socket)
        .with_write_stall(opts.write_stall);
    // Heartbeats go on while serving and waiting (`AskChannel::beat`): the dispatcher waits for
    // the hand-back with a dead bound.
    let (served, sent) = adopted.run(held, &mut AskChannel { ch: &mut *ch, conn }).await?;
    match served {
        Served::Boundary(pending) => match hand_back_state(client, t.flow, opts).await {
            Ok(tcp_state) => {
                let back = epochs.advance(conn);
                let (flow, pending_bytes) = (t.flow, pending);
                let t = Transfer { conn, flow, epoch: back, tcp_state, pending_bytes, app_state: vec![], sent };
                ch.send(&Msg::HandBack(Box::new(t))).await
            }
            Err(e) => {
                tracing::warn!(conn, "hand-back impossible ({e}); closing the connection");
                epochs.remove(conn);
                ch.send(&Msg::Closed { conn, epoch, sent }).await
            }
        },
        Served::Close(reason) => {
            tracing::debug!(conn, "connection ends at the agent: {reason}");
            epochs.remove(conn);
            ch.send(&Msg::Closed { conn, epoch, sent }).await
        }
    }
}

/// The control channel, asked about each further request of an adopted connection.
struct AskChannel<'a> {
    ch: &'a mut ControlChannel,
    conn: u64,
}

impl Ask for AskChannel<'_> {
    async fn idle(&mut self, _request: u64) -> Result<()> {
        Ok(()) // across hosts the connection dies with the agent (no descriptor kept here)
    }

    async fn next(&mut self, request: u64, bytes: &[u8]) -> Result<bool> {
        let conn = self.conn;
        self.ch.send(&Msg::Next { conn, request, bytes: bytes.to_vec() }).await?;
        match self.ch.recv().await? {
            Msg::Serve { conn: c, request: r } if (c, r) == (conn, request) => Ok(true),
            Msg::Return { conn: c, request: r } if (c, r) == (conn, request) => Ok(false),
            other => {
                tracing::warn!(conn, "expected Serve or Return, got {}", other.name());
                Err(refract_handover::Error::Codec("unexpected answer to Next"))
            }
        }
    }

    async fn beat(&mut self) -> Result<std::convert::Infallible> {
        self.ch.heartbeats().await
    }
}

/// The control channel as forwarded requests use it (hybrid): `WantConnection`, then
/// `HandOff` with the client's TCP state.
pub(crate) struct HybridLink<'a> {
    pub ch: &'a mut ControlChannel,
    pub opts: &'a LocalOptions,
    pub epochs: &'a mut EpochTracker,
}

impl Link for HybridLink<'_> {
    async fn respond(&mut self, fw: &Forwarded, last: bool, keep: bool, bytes: Vec<u8>) -> Result<()> {
        self.ch.send(&Msg::Response { conn: fw.conn, request: fw.request, last, keep, bytes }).await
    }

    async fn want(&mut self, fw: &Forwarded, held: Held, be: &mut BackendStream) -> Result<Option<Held>> {
        self.ch.send(&Msg::WantConnection { conn: fw.conn, request: fw.request }).await?;
        match self.ch.recv().await? {
            Msg::HandOff(t) if t.conn == fw.conn => {
                if let Err(e) = self.epochs.observe(t.conn, t.epoch) {
                    let reason = e.to_string();
                    tracing::warn!(conn = t.conn, "HandOff refused: {reason}");
                    return self
                        .ch
                        .send(&Msg::HandOffErr { conn: t.conn, epoch: t.epoch, reason })
                        .await
                        .map(|()| None);
                }
                let adopted = adopt(self.ch, self.epochs, *t, self.opts, Some((held, be)));
                adopted.await.map(|()| None)
            }
            Msg::RelayInstead { conn, reason, .. } if conn == fw.conn => {
                tracing::debug!(conn, "relaying a large result: {reason}");
                Ok(Some(held))
            }
            other => Err(unexpected_after_want(other.name())),
        }
    }

    async fn beat(&mut self) -> Result<Infallible> {
        self.ch.heartbeats().await
    }
}

/// Gets the sockets ready before answering: the backend first when `connect` (refusing after
/// the restore would need the socket discarded unseen), then the restored client socket.
/// `Err` is the refusal reason.
async fn ready(t: &Transfer, opts: &LocalOptions, connect: bool) -> Result<(TcpStream, Option<BackendStream>), String> {
    let backend = if connect { Some(connect_backend(opts).await?) } else { None };
    if let Some(guard) = &opts.guard {
        // The flow may come back within the grace of its last hand-back from here: its
        // tombstone would drop every segment of the adopted connection until it expired.
        lift(guard, t.flow);
    }
    let client = restore(&t.tcp_state).and_then(|fd| Ok(to_tokio(fd)?)).map_err(|e| format!("restore: {e}"))?;
    Ok((client, backend))
}

fn to_tokio(fd: OwnedFd) -> std::io::Result<TcpStream> {
    let std = std::net::TcpStream::from(fd);
    std.set_nonblocking(true)?;
    TcpStream::from_std(std)
}

/// Waits until everything sent is acknowledged (bounded), tombstones the flow in the guard (the
/// client's segments are dropped, not ACKed by the repaired socket nor reset once it is gone;
/// removed after a grace period), snapshots, and discards the socket silently. On error the
/// socket is closed normally by the caller's drop (FIN).
async fn hand_back_state(client: TcpStream, flow: FlowKey, opts: &LocalOptions) -> Result<refract_handover::TcpState> {
    let deadline = tokio::time::Instant::now() + QUIESCE;
    loop {
        let left = unacked(&client)?;
        if left == 0 {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(refract_handover::Error::NotQuiescent(left));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    if let Some(guard) = &opts.guard {
        tombstone(guard.clone(), flow);
    }
    let fd = OwnedFd::from(client.into_std()?);
    let state = snapshot(&fd)?;
    discard(fd)?;
    Ok(state)
}

/// The generation of each flow's tombstone on this host: a tombstone's timer removes it only
/// if no later hand-back tombstoned the flow again (and no adoption lifted it) meanwhile.
static TOMBSTONES: LazyLock<Mutex<TombstoneGens>> = LazyLock::new(Mutex::default);

#[derive(Default)]
struct TombstoneGens {
    next: u64,
    live: HashMap<FlowKey, u64>,
}

fn gens() -> std::sync::MutexGuard<'static, TombstoneGens> {
    TOMBSTONES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Tombstones `flow` now and removes it after [`GRACE`] (docs/handover.md, "Hand-back A → D"
/// steps 1 and 4), unless the flow was tombstoned again or adopted meanwhile. A full map is
/// logged: the guard's socket lookup still drops the flow once its socket is gone.
fn tombstone(guard: Arc<Mutex<Guard>>, flow: FlowKey) {
    let lock = |g: &Mutex<Guard>| g.lock().unwrap_or_else(|p| p.into_inner()).tombstone(flow);
    if let Err(e) = lock(&guard) {
        tracing::warn!("no tombstone for a hand-back: {e}");
        return;
    }
    let generation = {
        let mut g = gens();
        g.next += 1;
        let n = g.next;
        g.live.insert(flow, n);
        n
    };
    tokio::spawn(async move {
        tokio::time::sleep(GRACE).await;
        let mut g = gens();
        if g.live.get(&flow) == Some(&generation) {
            g.live.remove(&flow);
            let _ = guard.lock().unwrap_or_else(|p| p.into_inner()).remove(&flow);
        }
    });
}

/// Lifts `flow`'s tombstone, if any (the flow is being adopted here again).
fn lift(guard: &Mutex<Guard>, flow: FlowKey) {
    let mut g = gens();
    if g.live.remove(&flow).is_some() {
        if let Err(e) = guard.lock().unwrap_or_else(|p| p.into_inner()).remove(&flow) {
            tracing::warn!("could not lift the tombstone of an adopted flow: {e}");
        }
    }
}
