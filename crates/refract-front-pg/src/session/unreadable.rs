//! Text that is not UTF-8 (a `client_encoding` such as LATIN1 or WIN1252 with non-ASCII
//! characters) in a simple Query or a Parse: relayed byte for byte (refract-pg keeps the bytes,
//! `refract_pg::text`), as PostgreSQL reads it in the session's encoding. refract classifies
//! it only to learn the statement kinds, and decides conservatively, since in some encodings
//! (SJIS, BIG5, GBK ...) a byte of a character may look like a quote or a backslash: the primary
//! serves (unless the session asked for a route), and statements whose text refract would have
//! to replay (SET, PREPARE, ...) are not tracked; the server connection is marked as carrying
//! untracked state, so its next client starts with `RESET ALL` and no client sees another's
//! settings; the connection is also checked for state left on it (`pin`), so that a SQL
//! `PREPARE` under a name refract cannot read pins its client and no other client can
//! `EXECUTE` it. A statement so prepared is prepared again under the client's encoding
//! wherever it runs (its identity includes the encoding: `names`).

use super::phase::BatchEnd;
use super::{Bound, Session};
use crate::error::PgError;
use bytes::Bytes;
use refract_pg::classify::{Classification, Route, Statement};
use refract_pg::text;
use std::sync::Arc;

/// The classification refract acts on for a text it could only read lossily, and whether it
/// held statements refract does not track this way.
pub(crate) fn conservative(c: &Classification) -> (Classification, bool) {
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
            Statement::Execute { name } if !text::is_raw(name) => s.clone(),
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
        // A PREPARE refract cannot track is checked for on the server when the transaction
        // ends (`pin`): it pins the client until it is gone. An untracked SET is undone by the
        // `RESET ALL` the connection's next client starts with.
        stateful: c.stateful
            || c.parse_error.is_some()
            || c.statements.iter().any(|s| matches!(s, Statement::Prepare { .. })),
        set_config: c.set_config,
        nested_executes: c.nested_executes.iter().filter(|n| !text::is_raw(n)).cloned().collect(),
        changes_schema: c.changes_schema || c.parse_error.is_some(),
        tables: c.tables.clone(),
    };
    (c, untracked)
}

impl Session {
    /// The classification of a client's statement text, and whether it may change state refract
    /// does not track (raw text, classified conservatively: see the module header).
    pub(crate) fn classify_text(&self, sql: &str) -> (Arc<Classification>, bool) {
        if !text::is_raw(sql) {
            return (self.shared.classifier.classify(sql), false);
        }
        let (c, untracked) = conservative(&self.shared.classifier.classify_uncached(sql));
        (Arc::new(c), untracked)
    }

    /// Runs a simple Query whose text is not UTF-8 (see the module header).
    pub(crate) async fn simple_unreadable(&mut self, sql: &str, frame: Bytes) -> Result<(), PgError> {
        let (c, untracked) = self.classify_text(sql);
        self.state.prepared.close(""); // a simple query drops the unnamed statement
        self.note_state(&c);
        let route = c.target(self.state.route);
        let key = refract_pg::classify::fingerprint(sql);
        if let Err(e) = self.bind(route, Some(key), &c.tables, None).await {
            return self.refuse(e, BatchEnd::Sync).await;
        }
        if untracked {
            self.bound.iter_mut().for_each(Bound::untrack);
        }
        let result = self.run_simple(&c, frame, route, key).await;
        self.settle(result).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_pg::classify::Classifier;

    #[test]
    fn reads_go_to_the_primary_and_session_statements_are_not_tracked() {
        let classifier = Classifier::default();
        let read = classifier.classify_uncached(&text::decode(b"SELECT 'caf\xe9'"));
        assert_eq!(read.route, Route::Read);
        let (c, untracked) = conservative(&read);
        assert_eq!((c.route, c.statements, untracked), (Route::Write, vec![Statement::Read], false));
        let set = classifier.classify_uncached(&text::decode(b"BEGIN; SET application_name = '\xe9'"));
        let (c, untracked) = conservative(&set);
        let want = vec![Statement::Begin { read_only: false }, Statement::Write];
        assert_eq!((c.statements, untracked), (want, true));
        let garbage = classifier.classify_uncached(&text::decode(b"\xe9\xe9 nonsense"));
        assert!(conservative(&garbage).1, "unparsed: anything may have changed");
    }
}
