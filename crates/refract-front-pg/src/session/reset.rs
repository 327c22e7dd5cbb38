//! Giving a client's server connection back: [`Session::release`] after a transaction (or a
//! statement) in transaction mode, [`Session::give_back`] at the end of a client session,
//! which resets a session-mode connection with `DISCARD ALL` first.

use super::phase::{Event, SyncState};
use super::{Bound, Session, Wrote};
use crate::config::PgRole;
use crate::error::PgError;
use bytes::BytesMut;
use refract_pg::{BackendMessage, FrontendMessage, TxStatus};
use std::time::Duration;

impl Session {
    /// Returns the bound connection to its pool, noting the SET state it now carries. After a
    /// write (read-your-writes) this session's reads must wait for a replica past the primary's
    /// WAL position as polled after now (no query here: see `Servers::write_committed`).
    pub(crate) async fn release(&mut self) {
        let Some(b) = self.unbind() else { return };
        if b.wrote == Wrote::Yes && self.shared.cfg.read_your_writes {
            self.floors[self.shard].pending_write = Some(self.servers().write_committed());
        }
        b.release(&self.state.params);
    }

    /// Takes the bound connection, if any, out of the session: no longer shown bound, no
    /// longer what a cancel request reaches.
    fn unbind(&mut self) -> Option<Bound> {
        let b = self.bound.take()?;
        self.client.info.set_bound(None);
        self.key.set(None);
        Some(b)
    }

    /// Whether a write may leave the replica this session is bound to: outside a transaction,
    /// after a batch that ended with Flush and executed nothing (drivers describe a statement
    /// that way before running a write, e.g. asyncpg's `copy_records_to_table`), so that no
    /// work of the client's is in the replica's implicit transaction.
    pub(crate) fn may_leave_replica(&self) -> bool {
        let on_replica = self.bound.as_ref().is_some_and(|b| b.server.role == PgRole::Replica);
        let idle_flush = matches!(
            self.phase().sync(),
            SyncState::Unsynced { executed: false } | SyncState::Skipping { executed: false }
        );
        on_replica && idle_flush && self.batch.is_empty() && self.phase().tx() == TxStatus::Idle
    }

    /// Ends the replica's implicit transaction with a Sync (its ReadyForQuery is refract's, not
    /// relayed) and gives the connection back, so that the write binds the primary. The
    /// client's unnamed statement is parsed again wherever it is used next.
    pub(crate) async fn leave_replica(&mut self) -> Result<(), PgError> {
        let mut sync = BytesMut::new();
        FrontendMessage::Sync.encode(&mut sync);
        let conn = self.conn()?;
        conn.wire.send(&sync).await?;
        loop {
            if let BackendMessage::ReadyForQuery(_) = conn.recv_msg().await? {
                break;
            }
        }
        self.advance(Event::RefractSynced);
        self.release().await;
        Ok(())
    }

    /// The client left cleanly: a session-mode connection is reset (`DISCARD ALL`: temp tables,
    /// SETs, advisory locks, cursors, prepared statements, LISTENs) and goes back to the pool.
    /// A connection in an unknown state (an unsynced batch, a failed reset) is closed instead.
    pub(crate) async fn give_back(&mut self) {
        let Some(mut b) = self.unbind() else { return };
        // A COPY not ended (the client left inside one) leaves the connection as unknown as
        // an unsynced batch does.
        if self.phase().unsynced() || self.phase().copy().is_some() || !self.batch.is_empty() {
            return; // dropped, not released
        }
        let in_tx = self.phase().in_transaction();
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
                conn.applied = Some(vec![]);
                b.guard.release();
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "resetting a session-mode connection failed"),
            Err(_) => tracing::debug!("resetting a session-mode connection timed out"),
        }
    }
}
