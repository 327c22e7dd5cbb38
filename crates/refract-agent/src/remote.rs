//! The cross-host way in and out of an adoption ([`Move`] for [`ControlChannel`]): the client's
//! TCP socket is restored from the `HandOff`'s state (TCP_REPAIR) and, at the hand-back,
//! quiesced, tombstoned, snapshotted and discarded silently.
//!
//! This is the agent's half of docs/handover.md, "Hand-off D → A" / "Hand-back A → D": the
//! dispatcher steers the flow here; the guard (when the agent attached one) tombstones it while
//! it goes back.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use refract_handover::control::ControlChannel;
use refract_handover::{discard, quiesce, restore, snapshot, FlowKey, Guard, Result};
use refract_handover::{Socket, TcpState, Transfer};
use tokio::net::TcpStream;

use crate::adopt::{to_tokio, Move};
use crate::options::LocalOptions;

/// Bound on waiting for the client to acknowledge everything before a hand-back (I3).
const QUIESCE: Duration = Duration::from_secs(2);
/// How long a handed-back flow stays tombstoned here.
const GRACE: Duration = Duration::from_secs(1);

impl Move for ControlChannel {
    fn arrive(t: &Transfer, _: Option<OwnedFd>, opts: &LocalOptions) -> std::result::Result<TcpStream, String> {
        let Socket::Repair { flow, tcp_state } = &t.socket else { return Err("no TCP state to restore".into()) };
        if let Some(guard) = &opts.guard {
            // The flow may come back within the grace of its last hand-back from here: its
            // tombstone would drop every segment of the adopted connection until it expired.
            lift(guard, *flow);
        }
        restore(tcp_state).and_then(|fd| Ok(to_tokio(fd)?)).map_err(|e| format!("restore: {e}"))
    }

    async fn leave(client: TcpStream, t: &Transfer, opts: &LocalOptions) -> Result<(Socket, Option<OwnedFd>)> {
        let Socket::Repair { flow, .. } = t.socket else {
            return Err(refract_handover::Error::Codec("no flow to hand back"));
        };
        let tcp_state = hand_back_state(client, flow, opts).await?;
        Ok((Socket::Repair { flow, tcp_state }, None))
    }
}

/// Waits until everything sent is acknowledged (bounded), tombstones the flow in the guard (the
/// client's segments are dropped, not ACKed by the repaired socket nor reset once it is gone;
/// removed after a grace period), snapshots, and discards the socket silently. On error the
/// socket is closed normally by the caller's drop (FIN).
async fn hand_back_state(client: TcpStream, flow: FlowKey, opts: &LocalOptions) -> Result<TcpState> {
    // The last bytes written (a ReadyForQuery, a response's tail) are often one short segment
    // whose ACK the client holds back: `quiesce` asks for it.
    quiesce(&client, QUIESCE).await?;
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
