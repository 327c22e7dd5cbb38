//! The session state refract keeps for a client ([`Held`]): why it is pinned to its server
//! connection ([`Pins`], set by `pin`), the channels it listens on and where its notifications
//! go before a ReadyForQuery (`notify`, `listen`), the
//! SETs run by Execute since the last Sync (`extended`). Data only: a field of the session,
//! below the modules that act on it.

use super::notify::Listening;
use refract_pg::classify::Statement;

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
    /// A statement since the last check may have created or released state.
    pub dirty: bool,
    /// A `set_config(..., false)` ran since the last `RESET ALL` / `DISCARD ALL`: the server
    /// does not show custom settings in `pg_settings`, so this pins until one of those.
    pub set_config: bool,
    /// Statements that Execute ran since the last Sync (session-relevant ones only).
    pub ext_done: Vec<Statement>,
    /// An error came since the last Sync.
    pub ext_failed: bool,
    /// The channels this client listens on (transaction mode).
    pub listening: Option<Listening>,
    /// SQL-prepared statements of the client's that could not be prepared again on the bound
    /// connection for the statement now running, with the server's error (`names`).
    pub failed_prepares: Vec<(String, bytes::Bytes)>,
    /// The batch running was held past the pipeline's quiet time (`Session::pipeline_flush`).
    pub quiet_flush: bool,
    /// DDL ran in the open transaction (the schema epoch advances again when it ends).
    pub schema_changed: bool,
    /// A listening client's ReadyForQuery that ends a transaction is in the session's output at
    /// this offset: its notifications go in before it (`listen`), after a round trip on the
    /// listener when `true` (the transaction ran on the primary, so it may have notified).
    pub ready_at: Option<(usize, bool)>,
}

impl Held {
    /// Whether the client is pinned to its server connection.
    pub fn pinned(&self) -> bool {
        !self.pins.is_empty()
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
