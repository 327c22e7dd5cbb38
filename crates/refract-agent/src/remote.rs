//! Cross-host adoption over the control channel: restore the client's TCP socket from the
//! `HandOff` state (TCP_REPAIR), serve the request from the backend straight to the client,
//! ask the dispatcher about each further one (`Next` → `Serve` / `Return`), wait at most the
//! `HandOff`'s `idle_ms` ([`refract_handover::Serving`]) for the next, then quiesce, snapshot
//! and send `HandBack`.
//!
//! This is the agent's half of docs/handover.md, "Hand-off D → A" / "Hand-back A → D": the
//! dispatcher steers the flow here; the guard (when the agent attached one) tombstones it while
//! it goes back.
//! The same adoption serves `always` (a `HandOff` out of the blue) and hybrid (a `HandOff`
//! answering this agent's `WantConnection`, with the result it holds; `hybrid.rs` asks).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use refract_handover::{discard, restore, snapshot, unacked, FlowKey, Guard, Result};
use refract_handover::{Carrier, EpochTracker, Msg, Serving, Socket, TcpState, Transfer};
use tokio::net::TcpStream;

use crate::ask::AskOver;
use crate::backend::{connect_backend, BackendStream};
use crate::exchange::{Adopted, Held, Served};
use crate::local::lock;
use crate::options::LocalOptions;

/// Bound on waiting for the client to acknowledge everything before a hand-back (I3).
const QUIESCE: Duration = Duration::from_secs(2);
/// How long a handed-back flow stays tombstoned here.
const GRACE: Duration = Duration::from_secs(1);

/// Adopts the connection in `t` (its epoch already accepted), serves it, and hands it back.
/// With `held` (hybrid: the agent asked for the connection), that response is finished first
/// and its backend connection serves the pipelined requests; else a new one does.
pub(crate) async fn adopt<C: Carrier>(
    ch: &mut C,
    epochs: &Mutex<EpochTracker>,
    t: Transfer,
    opts: &LocalOptions,
    held: Option<(Held, &mut BackendStream)>,
) -> Result<()> {
    let (conn, epoch) = (t.conn, t.epoch);
    let Socket::Repair { flow, tcp_state } = &t.socket else {
        return ch.send(&Msg::HandOffErr { conn, epoch, reason: "no TCP state to restore".into() }, None).await;
    };
    let (mut client, mut own) = match ready(*flow, tcp_state, t.serving, opts, held.is_none()).await {
        Ok(x) => x,
        Err(reason) => return ch.send(&Msg::HandOffErr { conn, epoch, reason }, None).await,
    };
    ch.send(&Msg::HandOffOk { conn, epoch }, None).await?;
    let (held, backend) = match (held, own.as_mut()) {
        (Some((h, b)), _) => (Some(h), b),
        (None, Some(b)) => (None, b),
        (None, None) => return Err(refract_handover::Error::Codec("no backend connection")),
    };
    let pending = BytesMut::from(&t.pending[..]);
    let idle = Duration::from_millis(t.serving.idle_ms.into());
    let adopted = Adopted::new(&mut client, backend, pending, opts.backend_timeout, idle, epoch, opts.pass_socket)
        .with_write_stall(opts.write_stall);
    // Heartbeats go on while serving and waiting (`AskOver::beat`): the dispatcher waits for
    // the hand-back with a dead bound.
    let (served, sent) = adopted.run(held, &mut AskOver { link: &mut *ch, conn }).await?;
    let closed = |reason: String| Msg::Closed { conn, epoch, sent, reason };
    match served {
        Served::Boundary(pending) => match hand_back_state(client, *flow, opts).await {
            Ok(tcp_state) => {
                let back = lock(epochs).advance(conn);
                let socket = Socket::Repair { flow: *flow, tcp_state };
                let t = Transfer { conn, epoch: back, socket, pending, serving: Serving::default(), sent };
                ch.send(&Msg::HandBack(Box::new(t)), None).await
            }
            Err(e) => {
                tracing::warn!(conn, "hand-back impossible ({e}); closing the connection");
                lock(epochs).remove(conn);
                ch.send(&closed(format!("no hand-back: {e}")), None).await
            }
        },
        Served::Close(reason) => {
            tracing::debug!(conn, "connection ends at the agent: {reason}");
            lock(epochs).remove(conn);
            ch.send(&closed(reason), None).await
        }
    }
}

/// Gets the sockets ready before answering: the backend first when `connect` (refusing after
/// the restore would need the socket discarded unseen), then the restored client socket.
/// `Err` is the refusal reason.
async fn ready(
    flow: FlowKey,
    state: &TcpState,
    serving: Serving,
    opts: &LocalOptions,
    connect: bool,
) -> Result<(TcpStream, Option<BackendStream>), String> {
    opts.fronts(serving.backend)?;
    let backend = if connect { Some(connect_backend(opts).await?) } else { None };
    if let Some(guard) = &opts.guard {
        // The flow may come back within the grace of its last hand-back from here: its
        // tombstone would drop every segment of the adopted connection until it expired.
        lift(guard, flow);
    }
    let client = restore(state).and_then(|fd| Ok(to_tokio(fd)?)).map_err(|e| format!("restore: {e}"))?;
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
async fn hand_back_state(client: TcpStream, flow: FlowKey, opts: &LocalOptions) -> Result<TcpState> {
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
