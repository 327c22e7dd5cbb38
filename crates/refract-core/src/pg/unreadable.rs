//! Simple queries whose text is not UTF-8 (a `client_encoding` such as LATIN1 or WIN1252 with
//! non-ASCII characters): relayed byte for byte, as PostgreSQL reads them in the session's
//! encoding. refract classifies a lossy UTF-8 reading only to learn the statement kinds, so it
//! decides conservatively: the primary serves (unless the session asked for a route), and
//! statements whose text refract would have to replay (SET, PREPARE, ...) are not tracked; the
//! server connection is marked as carrying untracked state, so its next client starts with
//! `RESET ALL` and no client sees another's settings.

use super::error::PgError;
use super::session::Session;
use bytes::Bytes;
use refract_pg::classify::{Classification, Route, Statement};

/// Whether the body of a Query message is a well-formed C string that is not UTF-8.
pub(super) fn is_unreadable_query(body: &[u8]) -> bool {
    match body.split_last() {
        Some((0, text)) => !text.contains(&0) && std::str::from_utf8(text).is_err(),
        _ => false,
    }
}

/// The classification refract acts on for a text it could only read lossily, and whether it
/// held statements refract does not track this way.
pub(super) fn conservative(c: &Classification) -> (Classification, bool) {
    let mut untracked = c.parse_error.is_some();
    let statements = c
        .statements
        .iter()
        .map(|s| match s {
            Statement::Read
            | Statement::Write
            | Statement::Begin { .. }
            | Statement::Commit
            | Statement::Rollback
            | Statement::Savepoint => s.clone(),
            Statement::Execute { name } if !name.contains(char::REPLACEMENT_CHARACTER) => s.clone(),
            _ => {
                untracked = true;
                Statement::Write
            }
        })
        .collect();
    let c = Classification {
        route: Route::Write,
        statements,
        hint: c.hint,
        parse_error: None,
        stateful: c.stateful || c.parse_error.is_some(),
        set_config: c.set_config,
    };
    (c, untracked)
}

impl Session {
    /// Runs a simple Query whose text is not UTF-8 (see the module header).
    pub(super) async fn simple_unreadable(&mut self, frame: Bytes) -> Result<(), PgError> {
        let lossy = String::from_utf8_lossy(&frame[5..frame.len() - 1]).into_owned();
        let (c, untracked) = conservative(&self.shared.classifier.classify_uncached(&lossy));
        self.note_state(&c);
        let route = c.target(self.state.route);
        if let Err(e) = self.bind(route).await {
            return self.refuse(e, true).await;
        }
        if untracked {
            self.note_untracked();
        }
        let result = self.run_simple(&c, frame, route).await;
        self.settle(result).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_pg::classify::Classifier;

    #[test]
    fn only_non_utf8_c_strings_are_unreadable() {
        assert!(is_unreadable_query(b"SELECT 'caf\xe9'\0"));
        assert!(!is_unreadable_query(b"SELECT 'caf\xc3\xa9'\0"), "UTF-8");
        assert!(!is_unreadable_query(b"SELECT '\xe9'"), "no terminator");
        assert!(!is_unreadable_query(b"SELECT '\xe9'\0x\0"), "trailing bytes");
        assert!(!is_unreadable_query(b""));
    }

    #[test]
    fn reads_go_to_the_primary_and_session_statements_are_not_tracked() {
        let classifier = Classifier::default();
        let read = classifier.classify_uncached(&String::from_utf8_lossy(b"SELECT 'caf\xe9'"));
        assert_eq!(read.route, Route::Read);
        let (c, untracked) = conservative(&read);
        assert_eq!((c.route, c.statements, untracked), (Route::Write, vec![Statement::Read], false));
        let set = classifier.classify_uncached(&String::from_utf8_lossy(b"BEGIN; SET application_name = '\xe9'"));
        let (c, untracked) = conservative(&set);
        let want = vec![Statement::Begin { read_only: false }, Statement::Write];
        assert_eq!((c.statements, untracked), (want, true));
        let garbage = classifier.classify_uncached(&String::from_utf8_lossy(b"\xe9\xe9 nonsense"));
        assert!(conservative(&garbage).1, "unparsed: anything may have changed");
    }
}
