//! The cross-host move over the control channel, HTTP's use of `refract_handover::across`
//! (docs/handover.md, "Hand-off D → A"): quiesce, snapshot the client socket (TCP_REPAIR),
//! unhash it silently, send `HandOff` with the pending bytes; the agent restores and serves; on
//! `HandBack` restore the socket here. `always` calls [`hand_over`]; hybrid calls [`freeze`] and
//! [`hand_off`] when the agent asks for the connection. The session keeps its control channel
//! across requests ([`channel`], [`keep`]).

use super::cut::{settle, Cut, Land, Landed};
use super::{Declined, Rec, Session};
use crate::conn::ClientConn;
use refract_handover::across::{self, Frozen};
use refract_handover::control::ControlChannel;
use refract_handover::{Serving, Transfer};

/// An agent at `IP:port`, as `[handover]` names it.
pub(super) use refract_handover::across::Agent;

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

/// The session's control channel to `agent` if it is still good, else a new one.
pub(super) async fn channel(s: &mut Session, agent: &Agent<'_>) -> Result<ControlChannel, Declined> {
    across::channel(s.channel.take(), agent).await
}

/// Keeps `ch` in the session for its next request (its framing is in step).
pub(super) fn keep(s: &mut Session, agent: &Agent<'_>, ch: ControlChannel) {
    s.channel = Some((agent.addr, ch));
}

/// Quiesces, FREEZEs, snapshots and unhashes the client socket (`Err`: nothing changed).
pub(super) async fn freeze<'a>(conn: &mut ClientConn, agent: &Agent<'a>) -> Result<Frozen<'a>, Declined> {
    across::freeze(&mut conn.stream, agent).await
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
    let mut cut = Cut { rec, conn, ahead };
    // The agent serves the backend it fronts: this dispatcher names none.
    let serving = Serving { idle_ms: rec.idle_ms(), backend: None };
    let steered = |d: std::time::Duration| rec.metrics().handover_frozen(d.as_secs_f64());
    let offered = across::offer(&mut ch, &mut cut, &mut s.epochs, s.id, &frozen, serving, steered).await;
    if let Err((declined, in_step)) = offered {
        // By docs/handover.md's failure table, D still holds the snapshot: restore it, un-steer,
        // relay.
        let restored = frozen.restore_here(&mut cut.conn.stream);
        if in_step {
            keep(s, agent, ch); // `HandOffErr`: the agent waits for the next request
        }
        return restored.and(Err(declined));
    }
    rec.accepted(frozen.started);
    match settle(&mut cut, &mut ch, s).await {
        Landed::Here => {
            frozen.release();
            keep(s, agent, ch);
            Ok(true)
        }
        Landed::Closed => {
            frozen.linger();
            Ok(false)
        }
        Landed::Lost => {
            // The client's next segment meets this stack and is reset: it sees an error now.
            frozen.release();
            Ok(false)
        }
    }
}

impl Land for ControlChannel {
    /// Restores the `HandBack`'s TCP state here and acknowledges it (`HandBackOk`).
    async fn land(&mut self, conn: &mut ClientConn, t: &Transfer) -> Result<(), String> {
        across::land(self, &mut conn.stream, t).await
    }
}
