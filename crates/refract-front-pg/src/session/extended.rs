//! SET, RESET and DISCARD run through the extended protocol (Parse/Bind/Execute, as pgjdbc
//! sends every statement): each Execute's statement is known from its portal, and the session
//! statements that completed are applied to the session's state at Sync, if nothing failed
//! before it (a failure rolls back the implicit transaction, SETs included).

use super::held::Outcome;
use super::{Bound, Session};
use refract_pg::classify::{Classification, Statement};
use refract_pg::session::Origin;
use std::collections::HashMap;
use std::sync::Arc;

impl Session {
    /// The classification of the statement a Bind names: parsed earlier in this batch
    /// (`parsed`), or registered by an earlier Parse (text refract cannot read may change
    /// parameters it does not track: the connection is marked so).
    pub(crate) fn bound_statement(
        &mut self,
        name: &str,
        parsed: &HashMap<String, Arc<Classification>>,
    ) -> Option<Arc<Classification>> {
        if let Some(c) = parsed.get(name) {
            return Some(c.clone());
        }
        let Origin::Protocol { query, .. } = &self.state.prepared.get(name)?.origin else { return None };
        let (c, untracked) = self.classify_text(query);
        if untracked {
            self.bound.iter_mut().for_each(Bound::untrack);
        }
        Some(c)
    }

    /// An Execute completed (CommandComplete) the statement of `c`.
    pub(crate) fn executed(&mut self, c: &Classification) {
        self.note_schema(c);
        for st in &c.statements {
            if let Err(e) = self.sql_name_executed(st) {
                tracing::debug!(error = %e, "no connection to note a prepared name on");
            }
            match st {
                Statement::Set { .. }
                | Statement::Reset { .. }
                | Statement::Discard { .. }
                | Statement::Begin { .. }
                | Statement::Commit
                | Statement::Rollback => self.held.ext_done.push(st.clone()),
                _ => {}
            }
            if let (Statement::Discard { all: true }, Some(b)) = (st, self.bound.as_mut()) {
                // The server forgot every prepared statement: so does the connection's record.
                b.guard.prepared.clear();
                b.guard.sql_prepared.clear();
            }
        }
    }

    /// At a Sync's ReadyForQuery (before the transaction tracker sees it): applies the SETs
    /// Execute ran since the last Sync, in order with the transaction control around them.
    pub(crate) fn synced(&mut self) {
        let (done, outcome) = self.held.take_ext();
        if !done
            .iter()
            .any(|s| matches!(s, Statement::Set { .. } | Statement::Reset { .. } | Statement::Discard { .. }))
        {
            return;
        }
        if let Some(b) = self.bound.as_mut() {
            b.touch();
            if outcome == Outcome::Failed {
                // Rolled back with the implicit transaction, unless a COMMIT came before the
                // error: whoever comes next starts with RESET ALL.
                b.untrack();
                return;
            }
        }
        let mut in_tx = self.phase().in_transaction();
        for st in &done {
            match st {
                Statement::Begin { .. } => in_tx = true,
                Statement::Commit | Statement::Rollback => {
                    self.state.params.end_transaction(matches!(st, Statement::Commit));
                    in_tx = false;
                }
                Statement::Discard { all: true } => {
                    self.state.prepared.clear();
                    self.state.params.apply(st, in_tx);
                }
                _ => {
                    if let (true, Some(b)) = (self.state.params.resets_startup(st), self.bound.as_mut()) {
                        b.resync_startup();
                    }
                    self.state.params.apply(st, in_tx)
                }
            }
        }
    }
}
