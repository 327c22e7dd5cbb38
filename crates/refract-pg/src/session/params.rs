//! [`ParamTracker`]: the SET parameters of a client session, to replay on whichever server
//! connection runs its next transaction.

use crate::classify::Statement;

/// Changes made inside the open transaction; they count only if it commits.
#[derive(Debug, Clone, Default)]
struct Pending {
    reset_all: bool,
    /// `None` means RESET.
    changes: Vec<(String, Option<String>)>,
}

/// Session-level SET parameters, as statement texts, in the order first set.
///
/// Feed it every session statement that ran successfully ([`ParamTracker::apply`]) and every
/// end of transaction ([`ParamTracker::end_transaction`]). `SET LOCAL` and `SET TRANSACTION`
/// are ignored: they end with the transaction, which stays on one server anyway.
#[derive(Debug, Clone, Default)]
pub struct ParamTracker {
    session: Vec<(String, String)>,
    /// The session's defaults, from its startup packet: what RESET and RESET ALL go back to,
    /// as on PostgreSQL (whose reset values include the client's startup parameters).
    startup: Vec<(String, String)>,
    pending: Option<Pending>,
    generation: u64,
}

impl ParamTracker {
    /// An empty tracker (a fresh session).
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a parameter of the client's startup packet, as its SET: in force now, and what
    /// RESET of it (or RESET ALL, DISCARD ALL) goes back to.
    pub fn set_startup(&mut self, name: &str, text: &str) {
        self.startup.retain(|(n, _)| n != name);
        self.startup.push((name.to_owned(), text.to_owned()));
        self.commit(Change::One(name.to_owned(), Some(text.to_owned())));
    }

    /// Whether `stmt` resets a parameter the client set at startup: on the server it goes back
    /// to the server connection's own startup value, not the client's, so the client's SET must
    /// be applied again.
    pub fn resets_startup(&self, stmt: &Statement) -> bool {
        match stmt {
            Statement::Reset { name: Some(name) } => self.startup_text(name).is_some(),
            Statement::Reset { name: None } | Statement::Discard { all: true } => !self.startup.is_empty(),
            _ => false,
        }
    }

    /// The startup SET of `name`, if the client gave one.
    fn startup_text(&self, name: &str) -> Option<&str> {
        self.startup.iter().find(|(n, _)| n == name).map(|(_, t)| t.as_str())
    }

    /// Records a statement that succeeded; `in_transaction` says whether it ran inside an
    /// explicit transaction block (then it counts only once that commits).
    pub fn apply(&mut self, stmt: &Statement, in_transaction: bool) {
        let change = match stmt {
            Statement::Set { local: true, .. } => return,
            Statement::Set { name, text, .. } => Change::One(name.clone(), Some(text.clone())),
            Statement::Reset { name: Some(name) } => Change::One(name.clone(), None),
            Statement::Reset { name: None } | Statement::Discard { all: true } => Change::All,
            _ => return,
        };
        if in_transaction {
            self.stage(change);
        } else {
            self.commit(change);
        }
    }

    fn stage(&mut self, change: Change) {
        let pending = self.pending.get_or_insert_with(Pending::default);
        match change {
            Change::All => *pending = Pending { reset_all: true, changes: vec![] },
            Change::One(name, text) => pending.changes.push((name, text)),
        }
    }

    fn commit(&mut self, change: Change) {
        self.generation += 1;
        match change {
            Change::All => self.session = self.startup.clone(),
            Change::One(name, None) => match self.startup_text(&name).map(str::to_owned) {
                Some(text) => self.commit_set(name, text),
                None => self.session.retain(|(n, _)| *n != name),
            },
            Change::One(name, Some(text)) => self.commit_set(name, text),
        }
    }

    fn commit_set(&mut self, name: String, text: String) {
        match self.session.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = text,
            None => self.session.push((name, text)),
        }
    }

    /// The open transaction ended; its changes stay only if it committed.
    pub fn end_transaction(&mut self, committed: bool) {
        let Some(pending) = self.pending.take() else { return };
        if !committed {
            return;
        }
        if pending.reset_all {
            self.commit(Change::All);
        }
        for (name, text) in pending.changes {
            self.commit(Change::One(name, text));
        }
    }

    /// The SQL that puts a server connection (fresh or reset) into this session's state, e.g.
    /// `SET search_path = a; SET TIME ZONE 'UTC'`; `None` if there is nothing to set.
    pub fn replay_sql(&self) -> Option<String> {
        if self.session.is_empty() {
            return None;
        }
        Some(self.session.iter().map(|(_, text)| text.as_str()).collect::<Vec<_>>().join("; "))
    }

    /// The SET statement in force for `name` right now, changes of the open transaction
    /// included (they apply on its server connection until it ends); `None`: the default.
    pub fn current(&self, name: &str) -> Option<&str> {
        if let Some(p) = &self.pending {
            if let Some((_, text)) = p.changes.iter().rev().find(|(n, _)| n == name) {
                return text.as_deref().or_else(|| self.startup_text(name));
            }
            if p.reset_all {
                return self.startup_text(name);
            }
        }
        self.session.iter().find(|(n, _)| n == name).map(|(_, t)| t.as_str())
    }

    /// Parameter names with their SET statements, in order.
    pub fn params(&self) -> impl Iterator<Item = (&str, &str)> {
        self.session.iter().map(|(n, t)| (n.as_str(), t.as_str()))
    }

    /// Changes whenever the committed state changes: a server connection that last replayed
    /// this generation needs nothing.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

enum Change {
    All,
    One(String, Option<String>),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(name: &str, value: &str) -> Statement {
        Statement::Set { name: name.into(), local: false, text: format!("SET {name} = {value}") }
    }

    #[test]
    fn tracks_sets_and_resets() {
        let mut p = ParamTracker::new();
        assert_eq!(p.replay_sql(), None);
        p.apply(&set("a", "1"), false);
        p.apply(&set("b", "2"), false);
        p.apply(&set("a", "3"), false);
        assert_eq!(p.replay_sql().as_deref(), Some("SET a = 3; SET b = 2"));
        p.apply(&Statement::Reset { name: Some("a".into()) }, false);
        assert_eq!(p.replay_sql().as_deref(), Some("SET b = 2"));
        let g = p.generation();
        p.apply(&Statement::Set { name: "c".into(), local: true, text: "SET LOCAL c = 1".into() }, false);
        p.apply(&Statement::Read, false);
        assert_eq!(p.generation(), g, "local and non-SET statements change nothing");
        p.apply(&Statement::Discard { all: true }, false);
        assert_eq!(p.replay_sql(), None);
    }

    #[test]
    fn transactional_changes() {
        let mut p = ParamTracker::new();
        p.apply(&set("a", "1"), false);
        p.apply(&set("a", "2"), true);
        p.apply(&set("b", "1"), true);
        assert_eq!(p.replay_sql().as_deref(), Some("SET a = 1"), "not before commit");
        p.end_transaction(false);
        assert_eq!(p.replay_sql().as_deref(), Some("SET a = 1"), "rolled back");
        p.apply(&Statement::Reset { name: None }, true);
        p.apply(&set("b", "1"), true);
        p.end_transaction(true);
        assert_eq!(p.replay_sql().as_deref(), Some("SET b = 1"), "RESET ALL then SET, committed");
        p.end_transaction(true);
        assert_eq!(p.replay_sql().as_deref(), Some("SET b = 1"));
    }

    #[test]
    fn current_value_includes_the_open_transaction() {
        let mut p = ParamTracker::new();
        p.apply(&set("search_path", "a"), false);
        assert_eq!(p.current("search_path"), Some("SET search_path = a"));
        p.apply(&set("search_path", "b"), true);
        assert_eq!(p.current("search_path"), Some("SET search_path = b"), "in force on the server");
        p.end_transaction(false);
        assert_eq!(p.current("search_path"), Some("SET search_path = a"));
        p.apply(&Statement::Reset { name: None }, true);
        assert_eq!(p.current("search_path"), None);
        p.apply(&set("search_path", "c"), true);
        assert_eq!(p.current("search_path"), Some("SET search_path = c"));
        assert_eq!(p.current("other"), None);
    }

    #[test]
    fn reset_goes_back_to_the_startup_value() {
        let mut p = ParamTracker::new();
        p.set_startup("application_name", "SET application_name = 'app'");
        assert_eq!(p.current("application_name"), Some("SET application_name = 'app'"));
        p.apply(&set("application_name", "'x'"), false);
        p.apply(&set("search_path", "s"), false);
        let reset = Statement::Reset { name: Some("application_name".into()) };
        assert!(p.resets_startup(&reset));
        assert!(!p.resets_startup(&Statement::Reset { name: Some("search_path".into()) }));
        p.apply(&reset, true);
        assert_eq!(p.current("application_name"), Some("SET application_name = 'app'"), "in the transaction");
        p.end_transaction(true);
        assert_eq!(p.current("application_name"), Some("SET application_name = 'app'"));
        p.apply(&Statement::Reset { name: None }, false);
        let all: Vec<_> = p.params().collect();
        assert_eq!(all, [("application_name", "SET application_name = 'app'")], "RESET ALL keeps the startup SETs");
    }
}
