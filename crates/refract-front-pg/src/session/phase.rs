//! Where a client session stands in the PostgreSQL protocol ([`Phase`]), as a closed state
//! machine: every change of it is one [`Phase::on`] of an [`Event`], here and nowhere else
//! (the session's field is private to `session.rs`, which only assigns it from `on`). Pure: no
//! I/O, so each transition is tested below.
//!
//! A phase has three parts, each an enum, so that only meaningful combinations exist:
//! - [`Phase::tx`], the transaction status of the last ReadyForQuery (PostgreSQL's `I`, `T`,
//!   `E`), followed by refract-pg's [`TxTracker`] (which also says whether a transaction
//!   ended committed);
//! - [`SyncState`], the extended protocol on the server connection: every message followed by a
//!   Sync, a batch ended by Flush (an implicit transaction may be open there), or an error
//!   since the last Sync (the server skips everything up to it);
//! - [`Flow`], what the client's stream is doing: messages read and served, messages dropped
//!   up to Sync after refract refused part of a batch, or a COPY in progress.

use refract_pg::session::{TxEvent, TxTracker};
use refract_pg::TxStatus;

/// The extended protocol on the server connection, relative to Sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum SyncState {
    /// Every batch sent ended with Sync: nothing is pending on the server.
    #[default]
    Synced,
    /// A batch ended with Flush: the server may hold an unsynced implicit transaction;
    /// `executed`: an Execute ran in it (the client's work is in it).
    Unsynced { executed: bool },
    /// The server failed a message of an unsynced batch: it ignores every message up to the
    /// next Sync (`executed` as for `Unsynced`).
    Skipping { executed: bool },
}

/// A COPY's direction (CopyInResponse `G`, CopyOutResponse `H`, CopyBothResponse `W`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyDir {
    In,
    Out,
    Both,
}

/// What the client's message stream is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Flow {
    /// Its messages are read and served.
    #[default]
    Serving,
    /// refract refused a batch the client had not synced: its messages are dropped up to its
    /// Sync, answered with ReadyForQuery (as PostgreSQL does after an error).
    Discarding,
    /// A COPY runs: CopyData flow until CopyDone, CopyFail or an ErrorResponse.
    Copy(CopyDir),
}

/// What happens to a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event<'a> {
    /// The client's batch goes to the server; `end`: how it ends (Flush covers a
    /// large Bind that follows it); `executes`: it holds an Execute.
    Batch { end: BatchEnd, executes: bool },
    /// The server answered CommandComplete with this tag.
    Completed(&'a str),
    /// The server answered a simple Query with ReadyForQuery. The extended-protocol state is
    /// left as it was (refract does not rely on a Query having closed a Flush's transaction).
    Ready(TxStatus),
    /// The server answered a Sync with ReadyForQuery.
    Synced(TxStatus),
    /// The server sent ErrorResponse during an extended batch; `sync_pending`: the batch has a
    /// Sync after the failed message (else the server skips up to a later one).
    BatchError { sync_pending: bool },
    /// The server sent ErrorResponse during a simple Query.
    QueryError,
    /// refract refused the client's unit of work, which the client ended with `end`.
    Refused { end: BatchEnd },
    /// The client sent Sync while its messages were being dropped.
    ClientSync,
    /// The server started a COPY.
    CopyStart(CopyDir),
    /// The COPY ended: the client's CopyDone or CopyFail (COPY IN), the server's CopyDone
    /// (COPY OUT).
    CopyEnd,
    /// refract synced the server itself (leaving a replica before a write).
    RefractSynced,
    /// The server connection failed: whatever ran on it is gone (the client gets an error and
    /// ReadyForQuery `I`).
    ServerLost,
}

/// How the client ended a batch of extended-protocol messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchEnd {
    /// With Sync: a ReadyForQuery is owed.
    Sync,
    /// With Flush (or not yet: a pipeline refract runs on its own).
    Flush,
}

impl BatchEnd {
    /// How `msgs` end.
    pub(crate) fn of(msgs: &[refract_pg::FrontendMessage]) -> BatchEnd {
        match msgs.last() {
            Some(refract_pg::FrontendMessage::Sync) => BatchEnd::Sync,
            _ => BatchEnd::Flush,
        }
    }
}

/// Whether the session is inside a transaction block (open or failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InTx {
    No,
    Yes,
}

/// Where a client session stands in the protocol (see the module header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Phase {
    tx: TxTracker,
    sync: SyncState,
    flow: Flow,
    /// What the ReadyForQuery of the last transition meant (`None`: that was no ReadyForQuery).
    ended: Option<TxEvent>,
}

impl Phase {
    /// The transition function: the phase after `event`.
    pub(crate) fn on(mut self, event: Event) -> Phase {
        self.ended = None;
        match event {
            Event::Batch { end: BatchEnd::Sync, .. } => {
                // A server skipping to Sync still does so until this batch's Sync.
                if !matches!(self.sync, SyncState::Skipping { .. }) {
                    self.sync = SyncState::Synced;
                }
            }
            Event::Batch { end: BatchEnd::Flush, executes } => {
                self.sync = match self.sync {
                    SyncState::Synced => SyncState::Unsynced { executed: executes },
                    SyncState::Unsynced { executed } => SyncState::Unsynced { executed: executed || executes },
                    SyncState::Skipping { executed } => SyncState::Skipping { executed: executed || executes },
                };
            }
            Event::Completed(tag) => self.tx.complete(tag),
            Event::Ready(status) => self.ready(status),
            Event::Synced(status) => {
                self.ready(status);
                self.sync = SyncState::Synced;
            }
            Event::BatchError { sync_pending } => {
                self.end_copy();
                self.sync = match (self.sync, sync_pending) {
                    (SyncState::Skipping { .. }, true) => SyncState::Synced,
                    (SyncState::Unsynced { executed } | SyncState::Skipping { executed }, false) => {
                        SyncState::Skipping { executed }
                    }
                    (SyncState::Synced, false) => SyncState::Skipping { executed: false },
                    (sync, true) => sync,
                };
            }
            Event::QueryError | Event::CopyEnd => self.end_copy(),
            Event::Refused { end: BatchEnd::Flush } => self.flow = Flow::Discarding,
            Event::Refused { end: BatchEnd::Sync } => {}
            Event::ClientSync if self.flow == Flow::Discarding => self.flow = Flow::Serving,
            Event::ClientSync => {}
            Event::CopyStart(dir) => self.flow = Flow::Copy(dir),
            Event::RefractSynced => self.sync = SyncState::Synced,
            Event::ServerLost => {
                self = Phase::default();
            }
        }
        self
    }

    fn ready(&mut self, status: TxStatus) {
        self.ended = Some(self.tx.ready(status));
        self.end_copy(); // ReadyForQuery always comes after a COPY is over
    }

    fn end_copy(&mut self) {
        if matches!(self.flow, Flow::Copy(_)) {
            self.flow = Flow::Serving;
        }
    }

    /// The transaction status, as the client's next ReadyForQuery says it.
    pub(crate) fn tx(&self) -> TxStatus {
        self.tx.status()
    }

    /// Whether a transaction block is open (failed or not).
    pub(crate) fn in_transaction(&self) -> bool {
        self.tx.in_transaction()
    }

    /// [`Phase::in_transaction`] as the fact it is.
    pub(crate) fn in_tx(&self) -> InTx {
        if self.in_transaction() {
            InTx::Yes
        } else {
            InTx::No
        }
    }

    /// What the ReadyForQuery of the last transition meant for the transaction.
    pub(crate) fn ended(&self) -> Option<TxEvent> {
        self.ended
    }

    /// The extended-protocol state of the server connection.
    pub(crate) fn sync(&self) -> SyncState {
        self.sync
    }

    /// Whether the server ignores messages up to the next Sync (an error since the last one).
    pub(crate) fn skipping(&self) -> bool {
        matches!(self.sync, SyncState::Skipping { .. })
    }

    /// Whether the server connection has messages since the last Sync (a Flush-ended batch,
    /// or one whose error it skips past): its state is not known until a Sync.
    pub(crate) fn unsynced(&self) -> bool {
        self.sync != SyncState::Synced
    }

    /// Whether refract drops the client's messages up to its Sync.
    pub(crate) fn discarding(&self) -> bool {
        self.flow == Flow::Discarding
    }

    /// The COPY in progress, if any.
    pub(crate) fn copy(&self) -> Option<CopyDir> {
        match self.flow {
            Flow::Copy(dir) => Some(dir),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(events: &[Event]) -> Phase {
        events.iter().fold(Phase::default(), |p, e| p.on(*e))
    }

    const BEGIN: [Event; 2] = [Event::Completed("BEGIN"), Event::Ready(TxStatus::InTransaction)];

    #[test]
    fn a_new_session_is_idle_synced_and_serving() {
        let p = Phase::default();
        assert_eq!((p.tx(), p.sync(), p.discarding(), p.copy()), (TxStatus::Idle, SyncState::Synced, false, None));
        assert!(!p.in_transaction() && !p.unsynced() && !p.skipping());
    }

    #[test]
    fn begin_commit_and_rollback() {
        let p = run(&BEGIN);
        assert_eq!((p.tx(), p.ended()), (TxStatus::InTransaction, Some(TxEvent::InTransaction)));
        let p = p.on(Event::Completed("COMMIT")).on(Event::Ready(TxStatus::Idle));
        assert_eq!((p.tx(), p.ended()), (TxStatus::Idle, Some(TxEvent::Ended { committed: true })));
        let p = run(&BEGIN).on(Event::Completed("ROLLBACK")).on(Event::Ready(TxStatus::Idle));
        assert_eq!((p.tx(), p.ended()), (TxStatus::Idle, Some(TxEvent::Ended { committed: false })));
        let p = Phase::default().on(Event::Completed("SELECT 1")).on(Event::Synced(TxStatus::Idle));
        assert_eq!(p.ended(), Some(TxEvent::Idle));
        assert_eq!(p.on(Event::Completed("SET")).ended(), None, "only a ReadyForQuery says");
    }

    #[test]
    fn ready_for_query_e_is_failed_until_rollback() {
        let p = run(&BEGIN).on(Event::QueryError).on(Event::Ready(TxStatus::Failed));
        assert_eq!((p.tx(), p.ended(), p.in_transaction()), (TxStatus::Failed, Some(TxEvent::Failed), true));
        // COMMIT of a failed transaction answers ROLLBACK: nothing was committed.
        let p = p.on(Event::Completed("ROLLBACK")).on(Event::Ready(TxStatus::Idle));
        assert_eq!((p.tx(), p.ended()), (TxStatus::Idle, Some(TxEvent::Ended { committed: false })));
    }

    #[test]
    fn a_flush_ended_batch_leaves_the_server_unsynced_until_sync() {
        let p = Phase::default().on(Event::Batch { end: BatchEnd::Flush, executes: false });
        assert_eq!(p.sync(), SyncState::Unsynced { executed: false });
        let p = p.on(Event::Batch { end: BatchEnd::Flush, executes: true });
        assert_eq!(p.sync(), SyncState::Unsynced { executed: true });
        let p = p.on(Event::Batch { end: BatchEnd::Flush, executes: false });
        assert_eq!(p.sync(), SyncState::Unsynced { executed: true }, "the work stays in the transaction");
        assert_eq!(p.on(Event::Batch { end: BatchEnd::Sync, executes: false }).sync(), SyncState::Synced);
        let p = p.on(Event::Synced(TxStatus::Idle));
        assert_eq!((p.sync(), p.unsynced()), (SyncState::Synced, false));
    }

    #[test]
    fn a_simple_query_leaves_the_extended_state_alone() {
        let p =
            Phase::default().on(Event::Batch { end: BatchEnd::Flush, executes: true }).on(Event::Ready(TxStatus::Idle));
        assert_eq!(p.sync(), SyncState::Unsynced { executed: true });
    }

    #[test]
    fn an_error_in_an_unsynced_batch_skips_to_sync() {
        let p = Phase::default().on(Event::Batch { end: BatchEnd::Flush, executes: true });
        let p = p.on(Event::BatchError { sync_pending: false });
        assert_eq!((p.sync(), p.skipping(), p.unsynced()), (SyncState::Skipping { executed: true }, true, true));
        // Further Flush-ended batches are skipped too; a synced one is skipped up to its Sync.
        let p = p.on(Event::Batch { end: BatchEnd::Flush, executes: false });
        assert_eq!(p.sync(), SyncState::Skipping { executed: true });
        let p = p.on(Event::Batch { end: BatchEnd::Sync, executes: false });
        assert!(p.skipping(), "until the server reaches the Sync");
        let p = p.on(Event::Synced(TxStatus::Idle));
        assert_eq!(p.sync(), SyncState::Synced);
    }

    #[test]
    fn an_error_before_a_pending_sync_does_not_skip_later_batches() {
        let p = Phase::default().on(Event::Batch { end: BatchEnd::Sync, executes: true });
        assert_eq!(p.on(Event::BatchError { sync_pending: true }).sync(), SyncState::Synced);
        let p =
            run(&[Event::Batch { end: BatchEnd::Flush, executes: false }, Event::BatchError { sync_pending: false }]);
        assert_eq!(p.on(Event::BatchError { sync_pending: true }).sync(), SyncState::Synced);
        let p = Phase::default().on(Event::BatchError { sync_pending: false });
        assert_eq!(p.sync(), SyncState::Skipping { executed: false });
    }

    #[test]
    fn an_error_in_a_transaction_batch_fails_the_transaction_at_sync() {
        let p = run(&BEGIN).on(Event::Batch { end: BatchEnd::Sync, executes: true });
        let p = p.on(Event::BatchError { sync_pending: true }).on(Event::Synced(TxStatus::Failed));
        assert_eq!((p.tx(), p.sync()), (TxStatus::Failed, SyncState::Synced));
    }

    #[test]
    fn a_refusal_discards_to_the_clients_sync() {
        let p = Phase::default().on(Event::Batch { end: BatchEnd::Flush, executes: true });
        let p = p.on(Event::Refused { end: BatchEnd::Flush });
        assert!(p.discarding());
        assert_eq!(p.sync(), SyncState::Unsynced { executed: true }, "the server's state is its own");
        let p = p.on(Event::ClientSync);
        assert!(!p.discarding());
        assert_eq!(p.sync(), SyncState::Unsynced { executed: true });
        let synced = Phase::default().on(Event::Refused { end: BatchEnd::Sync });
        assert_eq!(synced, Phase::default(), "a refused synced unit owes its ReadyForQuery only");
        assert_eq!(Phase::default().on(Event::ClientSync), Phase::default());
    }

    #[test]
    fn a_refusal_in_a_transaction_keeps_it() {
        let p = run(&BEGIN).on(Event::Refused { end: BatchEnd::Flush }).on(Event::ClientSync);
        assert_eq!(p.tx(), TxStatus::InTransaction);
    }

    #[test]
    fn copy_in_ends_with_the_clients_copy_done_or_copy_fail() {
        let p = Phase::default().on(Event::CopyStart(CopyDir::In));
        assert_eq!(p.copy(), Some(CopyDir::In));
        assert_eq!(p.on(Event::CopyEnd).copy(), None);
        let p = p.on(Event::CopyEnd).on(Event::QueryError).on(Event::Ready(TxStatus::Idle));
        assert_eq!((p.copy(), p.tx()), (None, TxStatus::Idle));
    }

    #[test]
    fn copy_out_ends_with_the_servers_copy_done() {
        let p = Phase::default().on(Event::CopyStart(CopyDir::Out));
        assert_eq!(p.copy(), Some(CopyDir::Out));
        let p = p.on(Event::CopyEnd).on(Event::Completed("COPY 3")).on(Event::Ready(TxStatus::Idle));
        assert_eq!((p.copy(), p.ended()), (None, Some(TxEvent::Idle)));
    }

    #[test]
    fn copy_ends_with_an_error_response() {
        for dir in [CopyDir::In, CopyDir::Out, CopyDir::Both] {
            let p = Phase::default().on(Event::CopyStart(dir));
            assert_eq!(p.on(Event::QueryError).copy(), None, "{dir:?}");
            let p = p.on(Event::Batch { end: BatchEnd::Flush, executes: true });
            assert_eq!(p.on(Event::BatchError { sync_pending: false }).copy(), None, "{dir:?}");
            assert_eq!(p.on(Event::Synced(TxStatus::Idle)).copy(), None, "{dir:?}: ReadyForQuery");
        }
    }

    #[test]
    fn copy_in_a_batch_keeps_the_batch_state() {
        let p = Phase::default()
            .on(Event::Batch { end: BatchEnd::Flush, executes: true })
            .on(Event::CopyStart(CopyDir::In));
        assert_eq!(p.on(Event::CopyEnd).sync(), SyncState::Unsynced { executed: true });
    }

    #[test]
    fn refract_syncing_the_server_clears_a_flush_or_a_skip() {
        let p = Phase::default().on(Event::Batch { end: BatchEnd::Flush, executes: false });
        assert_eq!(p.on(Event::RefractSynced).sync(), SyncState::Synced);
        let p = p.on(Event::BatchError { sync_pending: false });
        assert_eq!(p.on(Event::RefractSynced).sync(), SyncState::Synced);
    }

    #[test]
    fn a_lost_server_leaves_an_idle_synced_session() {
        let p = run(&BEGIN).on(Event::Batch { end: BatchEnd::Flush, executes: true });
        let p = p.on(Event::BatchError { sync_pending: false }).on(Event::CopyStart(CopyDir::In));
        assert_eq!(p.on(Event::ServerLost), Phase::default());
    }
}
