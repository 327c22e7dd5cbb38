//! [`TxTracker`]: a server connection's transaction state, from ReadyForQuery.

use crate::backend::{BackendMessage, TxStatus};

/// What a ReadyForQuery meant for the transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxEvent {
    /// Idle before and after: a statement ran outside any transaction block. In transaction
    /// pooling the server connection may go back to the pool.
    Idle,
    /// A transaction block is open (it just began, or goes on).
    InTransaction,
    /// The transaction block failed; only ROLLBACK (or COMMIT, which rolls back) is accepted.
    Failed,
    /// A transaction block ended; the server connection may go back to the pool.
    Ended {
        /// It committed (its SETs stay); otherwise it rolled back.
        committed: bool,
    },
}

/// Follows the messages a server sends to know its transaction state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxTracker {
    status: TxStatus,
    last_tag_commit: bool,
}

impl Default for TxTracker {
    fn default() -> Self {
        TxTracker { status: TxStatus::Idle, last_tag_commit: false }
    }
}

impl TxTracker {
    /// A tracker for a connection that is idle.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds a server message; returns an event on ReadyForQuery.
    pub fn observe(&mut self, msg: &BackendMessage) -> Option<TxEvent> {
        match msg {
            BackendMessage::CommandComplete(tag) => {
                self.complete(tag);
                None
            }
            BackendMessage::ReadyForQuery(status) => Some(self.ready(*status)),
            _ => None,
        }
    }

    /// A CommandComplete with this tag came.
    pub fn complete(&mut self, tag: &str) {
        // COMMIT of a failed transaction answers "ROLLBACK"; PREPARE TRANSACTION ends one too.
        self.last_tag_commit = tag == "COMMIT" || tag == "PREPARE TRANSACTION";
    }

    /// A ReadyForQuery with this status came: what it meant for the transaction.
    pub fn ready(&mut self, status: TxStatus) -> TxEvent {
        let was = std::mem::replace(&mut self.status, status);
        let committed = std::mem::take(&mut self.last_tag_commit);
        match (was, status) {
            (_, TxStatus::InTransaction) => TxEvent::InTransaction,
            (_, TxStatus::Failed) => TxEvent::Failed,
            (TxStatus::Idle, TxStatus::Idle) => TxEvent::Idle,
            (TxStatus::InTransaction, TxStatus::Idle) => TxEvent::Ended { committed },
            (TxStatus::Failed, TxStatus::Idle) => TxEvent::Ended { committed: false },
        }
    }

    /// The status from the last ReadyForQuery.
    pub fn status(&self) -> TxStatus {
        self.status
    }

    /// Whether a transaction block is open (failed or not): the connection is pinned.
    pub fn in_transaction(&self) -> bool {
        self.status != TxStatus::Idle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(t: &mut TxTracker, tag: &str, status: TxStatus) -> Option<TxEvent> {
        t.observe(&BackendMessage::CommandComplete(tag.into()));
        t.observe(&BackendMessage::ReadyForQuery(status))
    }

    #[test]
    fn follows_transactions() {
        let mut t = TxTracker::new();
        assert_eq!(run(&mut t, "SELECT 1", TxStatus::Idle), Some(TxEvent::Idle));
        assert_eq!(run(&mut t, "BEGIN", TxStatus::InTransaction), Some(TxEvent::InTransaction));
        assert!(t.in_transaction());
        assert_eq!(run(&mut t, "INSERT 0 1", TxStatus::InTransaction), Some(TxEvent::InTransaction));
        assert_eq!(run(&mut t, "COMMIT", TxStatus::Idle), Some(TxEvent::Ended { committed: true }));
        assert!(!t.in_transaction());
        run(&mut t, "BEGIN", TxStatus::InTransaction);
        assert_eq!(t.observe(&BackendMessage::ReadyForQuery(TxStatus::Failed)), Some(TxEvent::Failed));
        assert_eq!(run(&mut t, "ROLLBACK", TxStatus::Idle), Some(TxEvent::Ended { committed: false }));
        run(&mut t, "BEGIN", TxStatus::InTransaction);
        assert_eq!(run(&mut t, "ROLLBACK", TxStatus::Idle), Some(TxEvent::Ended { committed: false }));
        assert_eq!(t.observe(&BackendMessage::ParseComplete), None);
    }
}
