//! [`ParamTracker`]: the SET parameters of a client session, to replay on whichever server
//! connection runs its next transaction.

use crate::classify::Statement;
use crate::notice::ErrorFields;

/// Parameters `RESET ALL` leaves alone (PostgreSQL's `GUC_NO_RESET_ALL`): who the session
/// is and acts as. Only `DISCARD ALL` (`SET SESSION AUTHORIZATION DEFAULT`) and their own
/// RESET take them back.
pub const NO_RESET_ALL: [&str; 2] = ["session_authorization", "role"];

/// The statements that take a server connection back to its defaults, the ones `RESET ALL`
/// leaves alone included ([`NO_RESET_ALL`]): what a server connection gets before another
/// client's SETs when it carries settings that client does not want.
pub const BACK_TO_DEFAULTS: &str = "RESET SESSION AUTHORIZATION; RESET ROLE; RESET ALL";

/// Parameters whose SET a server checks against more than its own value (the catalog, the
/// role): a SET that worked on one connection may be refused on another (the role or text
/// search configuration was dropped since, a SUSET parameter after a `SET ROLE`).
const CHECKED_ELSEWHERE: [&str; 6] = [
    "role",
    "session_authorization",
    "default_text_search_config",
    "default_tablespace",
    "temp_tablespaces",
    "default_table_access_method",
];

/// SQLSTATE `42602` invalid_name: how PostgreSQL refuses (`ERROR`) or drops (`WARNING`, when
/// the library loads) a custom parameter whose prefix a library has reserved.
const INVALID_NAME: &str = "42602";

/// Changes made inside the open transaction; they count only if it commits.
#[derive(Debug, Clone, Default)]
struct Pending {
    reset_all: Option<All>,
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
        self.generation += 1;
        self.commit_set(name.to_owned(), text.to_owned());
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
            Statement::Reset { name: None } => Change::All(All::Reset),
            Statement::Discard { all: true } => Change::All(All::Discard),
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
            Change::All(all) => *pending = Pending { reset_all: Some(all), changes: vec![] },
            Change::One(name, text) => pending.changes.push((name, text)),
        }
    }

    fn commit(&mut self, change: Change) {
        self.generation += 1;
        match change {
            Change::All(all) => self.commit_all(all),
            Change::One(name, None) => {
                if NO_RESET_ALL.contains(&name.as_str()) {
                    self.reset_identity(&name);
                }
                match self.startup_text(&name).map(str::to_owned) {
                    Some(text) => self.commit_set(name, text),
                    // A custom parameter stays defined (empty) once set: its RESET defines it
                    // on another connection too, so SHOW answers there as here.
                    None if name.contains('.') => {
                        let text = format!("RESET {}", quote_name(&name));
                        self.commit_set(name, text)
                    }
                    None => self.session.retain(|(n, _)| *n != name),
                }
            }
            Change::One(name, Some(text)) => {
                if name == "session_authorization" {
                    self.reset_identity(&name);
                }
                let text = match name.as_str() {
                    "datestyle" => self.datestyle_text(text),
                    _ => text,
                };
                self.commit_set(name, text)
            }
        }
    }

    /// `RESET ALL` or `DISCARD ALL`: the startup SETs again. `RESET ALL` keeps the session's
    /// identity ([`NO_RESET_ALL`]); neither undefines a custom parameter.
    fn commit_all(&mut self, all: All) {
        let mut kept: Vec<(String, String)> = vec![];
        for (name, text) in std::mem::take(&mut self.session) {
            if all == All::Reset && NO_RESET_ALL.contains(&name.as_str()) {
                kept.push((name, text));
            } else if name.contains('.') && self.startup_text(&name).is_none() {
                kept.push((name.clone(), format!("RESET {}", quote_name(&name))));
            }
        }
        self.session = self.startup.clone();
        self.session.extend(kept);
    }

    /// `SET SESSION AUTHORIZATION` (any form) also ends a `SET ROLE`.
    fn reset_identity(&mut self, name: &str) {
        if name == "session_authorization" {
            self.session.retain(|(n, _)| n != "role");
        }
    }

    /// A `SET datestyle` that names only the output style or only the field order changes
    /// only that part of the value in force: the text kept for it is the chain that gives the
    /// same value on a connection at its defaults (the startup value or `DEFAULT`, then the
    /// last partial SET of each part). A complete SET stands alone.
    fn datestyle_text(&self, text: String) -> String {
        let (style, order) = datestyle_parts(&text);
        if style == order {
            return text; // both parts, or DEFAULT (or nothing refract can read: as sent)
        }
        let current = self.session.iter().find(|(n, _)| n == "datestyle").map(|(_, t)| t.clone());
        let chain = current
            .or_else(|| self.startup_text("datestyle").map(str::to_owned))
            .unwrap_or_else(|| "SET datestyle TO DEFAULT".to_owned());
        let mut parts: Vec<&str> = chain.split("; ").collect();
        let base = parts.remove(0);
        let mut kept: Vec<&str> = vec![base];
        kept.extend(parts.into_iter().filter(|p| datestyle_parts(p) != (style, order)));
        kept.push(&text);
        kept.join("; ")
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
        if let Some(all) = pending.reset_all {
            self.commit(Change::All(all));
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
            if p.reset_all.is_some() && !NO_RESET_ALL.contains(&name) {
                return self.startup_text(name);
            }
        }
        self.session.iter().find(|(n, _)| n == name).map(|(_, t)| t.as_str())
    }

    /// Parameter names with their SET statements, in order.
    pub fn params(&self) -> impl Iterator<Item = (&str, &str)> {
        self.session.iter().map(|(n, t)| (n.as_str(), t.as_str()))
    }

    /// Whether replaying this session's SETs on another connection may fail where they worked
    /// before: it has a custom parameter (`a.b`: a library that reserves `a` may be loaded in
    /// that server process) or one in [`CHECKED_ELSEWHERE`]. Such a replay must run on its own,
    /// before the client's statement, so that the statement never runs without its settings.
    pub fn replay_may_fail(&self) -> bool {
        self.session.iter().any(|(n, _)| n.contains('.') || CHECKED_ELSEWHERE.contains(&n.as_str()))
    }

    /// The custom parameter of this session that `e` names if it is PostgreSQL's refusal or
    /// removal of a placeholder whose prefix a library reserved (`42602`, `invalid
    /// configuration parameter name "plpgsql.x"`, in any message language: the name is quoted).
    pub fn reserved_placeholder(&self, e: &ErrorFields) -> Option<String> {
        if e.code() != Some(INVALID_NAME) {
            return None;
        }
        let message = e.message()?;
        let named = |n: &str| n.contains('.') && message.contains(&format!("\"{n}\""));
        let session = self.session.iter().map(|(n, _)| n);
        let pending = self.pending.iter().flat_map(|p| p.changes.iter().map(|(n, _)| n));
        session.chain(pending).find(|n| named(n)).cloned()
    }

    /// Drops a parameter from the session: a custom one PostgreSQL no longer keeps (a library
    /// that reserved its prefix was loaded, [`Self::reserved_placeholder`]), or one a server
    /// refused when it was replayed.
    pub fn forget(&mut self, name: &str) {
        self.session.retain(|(n, _)| n != name);
        self.startup.retain(|(n, _)| n != name);
        if let Some(p) = &mut self.pending {
            p.changes.retain(|(n, _)| n != name);
        }
        self.generation += 1;
    }

    /// Changes whenever the committed state changes: a server connection that last replayed
    /// this generation needs nothing.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

enum Change {
    All(All),
    One(String, Option<String>),
}

/// Which statement resets every parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum All {
    /// `RESET ALL`.
    Reset,
    /// `DISCARD ALL`.
    Discard,
}

/// A parameter name as an identifier (quoted: custom names may hold anything).
fn quote_name(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Whether a `SET datestyle` statement sets the output style and the field order
/// (PostgreSQL's `check_datestyle` words; `DEFAULT` and `GERMAN` set both).
fn datestyle_parts(text: &str) -> (bool, bool) {
    let lower = text.to_ascii_lowercase();
    let value = lower.split_once("datestyle").map_or(lower.as_str(), |(_, v)| v);
    let (mut style, mut order) = (false, false);
    for word in value.split(|c: char| !c.is_ascii_alphanumeric()) {
        match word {
            "iso" | "sql" | "postgres" => style = true,
            // GERMAN sets DMY too, unless the order is given.
            "german" | "default" => (style, order) = (true, true),
            "ymd" | "dmy" | "mdy" | "us" | "noneuropean" | "noneuro" | "european" | "euro" => order = true,
            _ => {}
        }
    }
    (style, order)
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

    #[test]
    fn reset_all_keeps_the_session_identity_discard_all_does_not() {
        let mut p = ParamTracker::new();
        p.apply(&set("role", "regress_x"), false);
        p.apply(&set("search_path", "s"), false);
        p.apply(&Statement::Reset { name: None }, false);
        assert_eq!(p.replay_sql().as_deref(), Some("SET role = regress_x"), "RESET ALL leaves the role");
        p.apply(&Statement::Reset { name: None }, true);
        assert_eq!(p.current("role"), Some("SET role = regress_x"), "also inside a transaction");
        p.end_transaction(true);
        p.apply(&Statement::Discard { all: true }, false);
        assert_eq!(p.replay_sql(), None, "DISCARD ALL resets the session authorization and the role");
    }

    #[test]
    fn session_authorization_ends_a_role() {
        let mut p = ParamTracker::new();
        p.apply(&set("role", "a"), false);
        p.apply(&set("session_authorization", "b"), false);
        assert_eq!(p.replay_sql().as_deref(), Some("SET session_authorization = b"));
        p.apply(&set("role", "c"), false);
        p.apply(&Statement::Reset { name: Some("session_authorization".into()) }, false);
        assert_eq!(p.replay_sql(), None, "RESET SESSION AUTHORIZATION ends the role too");
    }

    #[test]
    fn a_partial_datestyle_is_replayed_after_what_it_changes() {
        let mut p = ParamTracker::new();
        p.apply(&set("datestyle", "ymd"), false);
        assert_eq!(p.replay_sql().as_deref(), Some("SET datestyle TO DEFAULT; SET datestyle = ymd"));
        p.apply(&set("datestyle", "Postgres"), false);
        p.apply(&set("datestyle", "dmy"), false);
        p.apply(&set("datestyle", "sql"), false);
        assert_eq!(
            p.replay_sql().as_deref(),
            Some("SET datestyle TO DEFAULT; SET datestyle = dmy; SET datestyle = sql"),
            "the last SET of each part, no longer chain"
        );
        p.apply(&set("datestyle", "'ISO, MDY'"), false);
        assert_eq!(p.replay_sql().as_deref(), Some("SET datestyle = 'ISO, MDY'"), "a complete SET stands alone");
        let mut q = ParamTracker::new();
        q.set_startup("datestyle", "SET datestyle = 'sql, dmy'");
        q.apply(&set("datestyle", "iso"), false);
        assert_eq!(q.current("datestyle"), Some("SET datestyle = 'sql, dmy'; SET datestyle = iso"));
    }

    #[test]
    fn a_custom_parameter_stays_defined_after_its_reset() {
        let mut p = ParamTracker::new();
        p.apply(&set("custom.x", "1"), false);
        p.apply(&Statement::Reset { name: Some("custom.x".into()) }, false);
        assert_eq!(p.replay_sql().as_deref(), Some("RESET \"custom.x\""));
        p.apply(&set("my.y", "2"), false);
        p.apply(&Statement::Reset { name: None }, false);
        assert_eq!(p.replay_sql().as_deref(), Some("RESET \"custom.x\"; RESET \"my.y\""));
    }

    #[test]
    fn a_placeholder_a_library_reserved_is_forgotten() {
        let mut p = ParamTracker::new();
        p.apply(&set("work_mem", "'2MB'"), false);
        assert!(!p.replay_may_fail(), "a built-in parameter checked by its value alone");
        p.apply(&set("plpgsql.extra_foo_warnings", "true"), false);
        assert!(p.replay_may_fail(), "a custom parameter may be refused once its prefix is reserved");
        let refused =
            ErrorFields::new("ERROR", "42602", "invalid configuration parameter name \"plpgsql.extra_foo_warnings\"");
        let other =
            ErrorFields::new("ERROR", "42704", "unrecognized configuration parameter \"plpgsql.extra_foo_warnings\"");
        assert_eq!(p.reserved_placeholder(&other), None, "only 42602");
        let name = p.reserved_placeholder(&refused).expect("named");
        assert_eq!(name, "plpgsql.extra_foo_warnings");
        p.forget(&name);
        assert_eq!(p.replay_sql().as_deref(), Some("SET work_mem = '2MB'"));
        assert!(!p.replay_may_fail());
        assert_eq!(p.reserved_placeholder(&refused), None, "no longer the session's");
    }

    #[test]
    fn a_role_makes_the_replay_one_that_may_fail() {
        let mut p = ParamTracker::new();
        p.apply(&set("role", "regress_x"), false);
        assert!(p.replay_may_fail());
    }
}
