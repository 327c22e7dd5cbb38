//! Giving a client's server connection back: [`Session::release`] after a transaction (or a
//! statement) in transaction mode, [`Session::give_back`] at the end of a client session,
//! which resets a session-mode connection with `DISCARD ALL` first.

use super::server::parse_lsn;
use super::session::Session;
use refract_pg::TxStatus;
use std::time::Duration;

impl Session {
    /// Returns the bound connection to its pool; after a write (read-your-writes) first asks
    /// the primary for its WAL position, which this session's reads must then wait for.
    pub(super) async fn release(&mut self) {
        let Some(mut b) = self.bound.take() else { return };
        self.client.info.set_bound(None);
        self.key.set(None);
        if b.wrote && self.shared.cfg.read_your_writes {
            match b.guard.query_one("SELECT pg_current_wal_lsn()::text").await {
                Ok(Some(lsn)) => self.min_lsn = parse_lsn(&lsn).or(self.min_lsn),
                _ => b.guard.broken = true,
            }
        }
        b.guard.release();
    }

    /// The client left cleanly: a session-mode connection is reset (`DISCARD ALL`: temp tables,
    /// SETs, advisory locks, cursors, prepared statements, LISTENs) and goes back to the pool.
    /// A connection in an unknown state (an unsynced batch, a failed reset) is closed instead.
    pub(super) async fn give_back(&mut self) {
        let Some(mut b) = self.bound.take() else { return };
        self.client.info.set_bound(None);
        self.key.set(None);
        if self.unsynced || self.skip_until_sync || !self.batch.is_empty() {
            return; // dropped, not released
        }
        let in_tx = self.state.tx.status() != TxStatus::Idle;
        let reset = async {
            if in_tx {
                b.guard.query("ROLLBACK").await?;
            }
            b.guard.query("DISCARD ALL").await
        };
        let timeout = Duration::from_millis(self.shared.cfg.connect_timeout_ms);
        match tokio::time::timeout(timeout, reset).await {
            Ok(Ok(_)) => {
                let conn = &mut *b.guard;
                conn.prepared.clear();
                conn.sql_prepared.clear();
                conn.state_of = None;
                b.guard.release();
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "resetting a session-mode connection failed"),
            Err(_) => tracing::debug!("resetting a session-mode connection timed out"),
        }
    }
}
