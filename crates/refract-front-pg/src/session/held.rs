//! The session state refract keeps for a client ([`Held`]): why it is pinned to its server
//! connection ([`Pins`], set by `pin`), the channels it listens on and where its notifications
//! go before a ReadyForQuery (`notify`, `listen`; noted and put there by [`Held::note_ready`]
//! and [`Held::notifications_before_ready`]), the
//! SETs run by Execute since the last Sync (`extended`). A field of the session, below the
//! modules that act on it; what touches only it is here ([`Held::note_statement`], the taking
//! of what a check, a transaction's end or a Sync consumes), and its facts are small enums
//! ([`Check`], [`BatchStart`], [`CatchUp`], [`Outcome`]), not bools.

use super::notify::Listening;
use crate::config::PgRole;
use bytes::BytesMut;
use refract_pg::classify::{Classification, Statement};
use refract_pg::TxStatus;

/// Why a client is pinned, as bits (shown in `/pg/clients`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Pins(pub u8);

impl Pins {
    pub(crate) const TEMP: u8 = 1;
    pub(crate) const ADVISORY: u8 = 2;
    pub(crate) const CURSORS: u8 = 4;
    pub(crate) const LISTEN: u8 = 8;
    pub(crate) const SETTINGS: u8 = 16;
    /// The check itself failed: pinned until the client leaves or the check succeeds.
    pub(crate) const UNKNOWN: u8 = 32;
    /// SQL-level prepared statements refract does not know of (a `PREPARE` whose text it could
    /// not read, `unreadable`): another client must never `EXECUTE` them.
    pub(crate) const PREPARED: u8 = 64;
    const NAMES: [(u8, &'static str); 7] = [
        (Pins::TEMP, "temp_objects"),
        (Pins::ADVISORY, "advisory_locks"),
        (Pins::CURSORS, "cursors"),
        (Pins::LISTEN, "listen"),
        (Pins::SETTINGS, "settings"),
        (Pins::UNKNOWN, "unknown"),
        (Pins::PREPARED, "sql_prepared"),
    ];

    /// The reasons' names.
    pub fn names(self) -> Vec<&'static str> {
        Pins::NAMES.iter().filter(|(bit, _)| self.0 & bit != 0).map(|(_, name)| *name).collect()
    }

    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// A client's session state that refract keeps for it: why it is pinned, and (`listen`) the
/// channels it listens on, (`extended`) the SETs run by Execute since the last Sync.
#[derive(Debug, Default)]
pub(crate) struct Held {
    pub pins: Pins,
    /// Whether a statement since the last check may have created or released state.
    check: Check,
    /// Whether a `set_config(..., false)` ran since the last `RESET ALL` / `DISCARD ALL`: the
    /// server does not show custom settings in `pg_settings`, so this pins until one of those.
    set_config: SetConfig,
    /// Statements that Execute ran since the last Sync (session-relevant ones only).
    pub ext_done: Vec<Statement>,
    /// Whether an error came since the last Sync.
    pub ext_outcome: Outcome,
    /// The channels this client listens on (transaction mode).
    pub listening: Option<Listening>,
    /// SQL-prepared statements of the client's that could not be prepared again on the bound
    /// connection for the statement now running, with the server's error (`names`).
    pub failed_prepares: Vec<(String, bytes::Bytes)>,
    /// What started the batch running: the client, or the pipeline's quiet time
    /// (`Session::pipeline_flush`).
    pub batch_start: BatchStart,
    /// Whether DDL ran in the open transaction (the schema epoch advances again when it ends).
    schema: Schema,
    /// A listening client's ReadyForQuery that ends a transaction is in the session's output at
    /// this offset: its notifications go in before it (`listen`), after a round trip on the
    /// listener when [`CatchUp::Needed`] (the transaction ran on the primary, so it may have
    /// notified).
    pub ready_at: Option<(usize, CatchUp)>,
}

/// Whether the connection's session state is to be checked when the transaction ends.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    #[default]
    Clean,
    /// A statement may have created or released state.
    Due,
}

/// Whether a `set_config(..., false)` ran since the last `RESET ALL` / `DISCARD ALL`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum SetConfig {
    #[default]
    None,
    Ran,
}

/// Whether DDL ran in the open transaction.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Schema {
    #[default]
    Same,
    Changed,
}

/// What started a batch running.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchStart {
    /// The client's Sync or Flush.
    #[default]
    Client,
    /// The client sent nothing more for the pipeline's quiet time: refract's own Flush.
    QuietTime,
}

/// Whether the listener must catch up with the primary before a client's notifications go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CatchUp {
    /// The transaction ran on a replica: it notified nobody.
    NotNeeded,
    /// The transaction ran on the primary: it may have notified.
    Needed,
}

impl CatchUp {
    /// After a transaction on a server of `role` (`None`: none bound).
    pub(crate) fn after(role: Option<PgRole>) -> CatchUp {
        // A transaction on a replica notified nobody: what is queued is all there is.
        if role == Some(PgRole::Primary) {
            CatchUp::Needed
        } else {
            CatchUp::NotNeeded
        }
    }
}

pub(crate) use crate::server::sizes::Outcome;

impl Held {
    /// Whether the client is pinned to its server connection.
    pub fn pinned(&self) -> bool {
        !self.pins.is_empty()
    }

    /// Notes a statement about to run: one that may create state, or (when pinned) any that is
    /// not a plain read, makes refract check the connection when the transaction ends.
    pub(crate) fn note_statement(&mut self, c: &Classification) {
        let not_read = c.statements.is_empty() || c.statements.iter().any(|s| *s != Statement::Read);
        if c.stateful || (self.pinned() && not_read) {
            self.check = Check::Due;
        }
        let resets = c
            .statements
            .iter()
            .any(|s| matches!(s, Statement::Reset { name: None } | Statement::Discard { all: true }));
        if c.set_config {
            self.set_config = SetConfig::Ran;
        } else if resets {
            self.set_config = SetConfig::None;
        }
    }

    /// Whether the connection is to be checked, now that it is (or is not).
    pub(crate) fn take_check(&mut self) -> Check {
        std::mem::take(&mut self.check)
    }

    /// The pins a `set_config(..., false)` since the last reset gives.
    pub(crate) fn set_config_pins(&self) -> u8 {
        match self.set_config {
            SetConfig::Ran => Pins::SETTINGS,
            SetConfig::None => 0,
        }
    }

    /// DDL ran (or tried to).
    pub(crate) fn note_schema_change(&mut self) {
        self.schema = Schema::Changed;
    }

    /// Whether DDL ran in the transaction that just ended, now that it is noted.
    pub(crate) fn take_schema_change(&mut self) -> bool {
        std::mem::take(&mut self.schema) == Schema::Changed
    }

    /// At a ReadyForQuery from the server that leaves the client `tx`, about to be added to
    /// the client's output at offset `at`: when it leaves a listening client idle, notes where
    /// it goes, for [`Held::notifications_before_ready`]; `catch_up`: whether the transaction
    /// may have notified.
    pub(crate) fn note_ready(&mut self, tx: TxStatus, catch_up: CatchUp, at: usize) {
        let listens = self.listening.as_ref().is_some_and(Listening::listens);
        if !listens || tx != TxStatus::Idle {
            return;
        }
        self.ready_at = Some((at, catch_up));
    }

    /// Puts the client's notifications into its output `out`, before the ReadyForQuery noted
    /// by [`Held::note_ready`]: after a transaction on the primary, once the listener has caught
    /// up with it, so that the client's own notifications are there, as PostgreSQL delivers a
    /// session's own before the ReadyForQuery of the transaction that committed them.
    pub(crate) async fn notifications_before_ready(&mut self, out: &mut BytesMut) {
        let Some((at, catch_up)) = self.ready_at.take() else { return };
        let Some(l) = self.listening.as_mut() else { return };
        if catch_up == CatchUp::Needed {
            l.catch_up().await;
        }
        let mut queued = BytesMut::new();
        l.take_queued(&mut queued);
        if !queued.is_empty() {
            let tail = out.split_off(at.min(out.len()));
            out.extend_from_slice(&queued);
            out.extend_from_slice(&tail);
        }
    }

    /// At a Sync's ReadyForQuery: what Execute ran since the last Sync, and whether an error
    /// came; both start again.
    pub(crate) fn take_ext(&mut self) -> (Vec<Statement>, Outcome) {
        (std::mem::take(&mut self.ext_done), std::mem::take(&mut self.ext_outcome))
    }
}

#[cfg(test)]
mod tests {
    use super::Pins;

    #[test]
    fn names() {
        assert_eq!(Pins(0).names(), Vec::<&str>::new());
        assert_eq!(Pins(Pins::TEMP | Pins::SETTINGS).names(), vec!["temp_objects", "settings"]);
    }
}
