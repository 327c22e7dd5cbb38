//! Session state a transaction-pooling proxy must carry from one server connection to the
//! next: SET parameters (also from startup `options`) and prepared statements; and
//! [`TxTracker`], where the transaction stands (kept by the session's protocol state machine,
//! which tells [`SessionState::transaction`] what each ReadyForQuery meant).

mod options;
mod params;
mod prepared;
mod transaction;

pub use options::{parse_options, OptionsError};
pub use params::{ParamTracker, BACK_TO_DEFAULTS, NO_RESET_ALL};
pub use prepared::{Origin, PreparedRegistry, PreparedStatement};
pub use transaction::{TxEvent, TxTracker};

use crate::classify::{RouteHint, Statement};

/// One client session's state, fed with the statements it ran and the server's replies.
#[derive(Debug, Clone)]
pub struct SessionState {
    /// SET parameters to replay.
    pub params: ParamTracker,
    /// Named prepared statements to re-prepare.
    pub prepared: PreparedRegistry,
    /// `SET refract.route`.
    pub route: RouteHint,
}

impl Default for SessionState {
    fn default() -> Self {
        SessionState { params: ParamTracker::new(), prepared: PreparedRegistry::new(), route: RouteHint::Auto }
    }
}

impl SessionState {
    /// A fresh session.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a statement that succeeded on the server (or, for `RouteSetting`, that refract
    /// answered itself); `in_tx`: it ran inside a transaction block (its SETs are staged).
    pub fn statement_done(&mut self, stmt: &Statement, in_tx: bool) {
        match stmt {
            Statement::RouteSetting(h) => self.route = *h,
            Statement::Prepare { name, text, read } => drop(self.prepared.sql_prepare(name, text, *read)),
            Statement::Deallocate { name: Some(name) } => drop(self.prepared.close(name)),
            Statement::Deallocate { name: None } => self.prepared.clear(),
            Statement::Discard { all: true } => {
                self.prepared.clear();
                self.params.apply(stmt, in_tx);
            }
            _ => self.params.apply(stmt, in_tx),
        }
    }

    /// What a ReadyForQuery meant ([`TxTracker`]): a transaction that ended commits or drops
    /// the SETs staged in it.
    pub fn transaction(&mut self, event: TxEvent) {
        if let TxEvent::Ended { committed } = event {
            self.params.end_transaction(committed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BackendMessage, TxStatus};
    use crate::classify::Classifier;

    #[test]
    fn a_session_in_transaction_mode() {
        let c = Classifier::default();
        let mut s = SessionState::new();
        let mut tx = TxTracker::new();
        let mut run = |s: &mut SessionState, sql: &str, tag: &str, status: TxStatus| {
            for stmt in &c.classify(sql).statements {
                s.statement_done(stmt, tx.in_transaction());
            }
            tx.observe(&BackendMessage::CommandComplete(tag.into()));
            let event = tx.observe(&BackendMessage::ReadyForQuery(status));
            event.into_iter().for_each(|e| s.transaction(e));
            event
        };
        assert_eq!(run(&mut s, "SET search_path = app", "SET", TxStatus::Idle), Some(TxEvent::Idle));
        run(&mut s, "BEGIN", "BEGIN", TxStatus::InTransaction);
        run(&mut s, "SET statement_timeout = 100", "SET", TxStatus::InTransaction);
        assert_eq!(run(&mut s, "ROLLBACK", "ROLLBACK", TxStatus::Idle), Some(TxEvent::Ended { committed: false }));
        assert_eq!(s.params.replay_sql().as_deref(), Some("SET search_path = app"));
        run(&mut s, "PREPARE q AS SELECT 1", "PREPARE", TxStatus::Idle);
        assert!(s.prepared.get("q").unwrap().read);
        run(&mut s, "SET refract.route = 'replica'", "SET", TxStatus::Idle);
        assert_eq!(s.route, RouteHint::Replica);
        run(&mut s, "DISCARD ALL", "DISCARD ALL", TxStatus::Idle);
        assert!(s.prepared.is_empty());
        assert_eq!(s.params.replay_sql(), None);
    }
}
