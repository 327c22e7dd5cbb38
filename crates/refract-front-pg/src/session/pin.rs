//! Pinning a transaction-mode client to its server connection while session state it left
//! there lasts (temporary objects, session advisory locks, `WITH HOLD` cursors, LISTEN,
//! settings refract does not track): after a statement that may create or release such state,
//! refract asks the server what is left, and keeps the connection bound until nothing is.

use super::held::{Check, Pins};
use super::Session;
use refract_pg::classify::Classification;

/// What session state a server connection carries: temporary relations, types, functions or
/// any other object in the temporary schema (statistics, collations, operators: whatever
/// depends on it);
/// advisory locks (only session ones outlive a transaction, and refract asks between
/// transactions); holdable cursors; LISTEN channels; parameters set in the session (compared
/// with the ones refract tracks); SQL-level prepared statements (compared with the number
/// refract put there).
const PROBE: &str = "SELECT \
    EXISTS (SELECT 1 FROM pg_catalog.pg_class WHERE relnamespace = pg_catalog.pg_my_temp_schema()) \
    OR EXISTS (SELECT 1 FROM pg_catalog.pg_proc WHERE pronamespace = pg_catalog.pg_my_temp_schema()) \
    OR EXISTS (SELECT 1 FROM pg_catalog.pg_type WHERE typnamespace = pg_catalog.pg_my_temp_schema()) \
    OR EXISTS (SELECT 1 FROM pg_catalog.pg_depend WHERE refclassid = 'pg_catalog.pg_namespace'::pg_catalog.regclass \
    AND refobjid = pg_catalog.pg_my_temp_schema()), \
    EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid()), \
    EXISTS (SELECT 1 FROM pg_catalog.pg_cursors WHERE is_holdable), \
    EXISTS (SELECT 1 FROM pg_catalog.pg_listening_channels()), \
    pg_catalog.array_to_string(ARRAY(SELECT pg_catalog.lower(name) FROM pg_catalog.pg_settings \
    WHERE source = 'session'), ','), \
    (SELECT pg_catalog.count(*) FROM pg_catalog.pg_prepared_statements WHERE from_sql), \
    pg_catalog.current_setting('role'), \
    session_user";

impl Session {
    /// Notes a statement about to run: one that may create state, or (when pinned) any that is
    /// not a plain read, makes refract check the connection when the transaction ends.
    pub(crate) fn note_state(&mut self, c: &Classification) {
        self.held.note_statement(c);
    }

    /// Between transactions in transaction mode: whether the bound connection must stay bound
    /// because of session state on it (asking the server when a statement may have changed it).
    pub(crate) async fn keep_pinned(&mut self) -> bool {
        if self.held.take_check() == Check::Clean {
            return self.held.pinned();
        }
        let Some(b) = self.bound.as_mut() else { return false };
        let known = b.guard.sql_prepared.len();
        let pins = match b.guard.query(PROBE).await {
            Ok(rows) => self.read_probe(rows.first(), known),
            Err(e) => {
                tracing::debug!(error = %e, "checking a server connection's session state failed");
                Pins(Pins::UNKNOWN)
            }
        };
        self.held.pins = pins;
        self.client.info.set_pinned(pins.0);
        self.held.pinned()
    }

    /// The pins a probe's row shows; `known`: how many SQL-level statements refract put on the
    /// connection.
    fn read_probe(&self, row: Option<&Vec<Option<String>>>, known: usize) -> Pins {
        let Some(row) = row.filter(|r| r.len() == 8) else { return Pins(Pins::UNKNOWN) };
        let mut bits = self.held.set_config_pins();
        for (i, bit) in [Pins::TEMP, Pins::ADVISORY, Pins::CURSORS, Pins::LISTEN].into_iter().enumerate() {
            if row[i].as_deref() == Some("t") {
                bits |= bit;
            }
        }
        let settings = row[4].as_deref().unwrap_or_default();
        let tracked: Vec<&str> = self.state.params.params().map(|(name, _)| name).collect();
        if settings.split(',').any(|s| !s.is_empty() && !tracked.contains(&s)) {
            bits |= Pins::SETTINGS;
        }
        let role_set = row[6].as_deref() != Some("none");
        let session_user_set = row[7].as_deref() != Some(self.shared.cfg.server_user.as_str());
        if (role_set && self.state.params.current("role").is_none())
            || (session_user_set && self.state.params.current("session_authorization").is_none())
        {
            bits |= Pins::SETTINGS;
        }
        match row[5].as_deref().map(str::parse::<usize>) {
            Some(Ok(n)) if n <= known => {}
            _ => bits |= Pins::PREPARED,
        }
        Pins(bits)
    }
}
