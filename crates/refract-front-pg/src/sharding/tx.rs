//! A sharded session's transaction as refract follows it ([`ShardTx`]): the BEGIN refract
//! holds until a statement names a shard, and the BEGIN text each further shard the
//! transaction reaches is begun with. A closed state machine: every change is one
//! [`ShardTx::on`] of an [`Event`], here and nowhere else (the session's field is private to
//! `session.rs`, which only assigns it from `on`). Pure: no I/O, so each transition is tested
//! below.
//!
//! The transaction's connections on its other shards (`Session::parked`) and the session's
//! `SET refract.shard` are not part of it: the first are connections (I/O), the second is a
//! session setting that outlives transactions (`RESET ALL` clears it, a transaction's end does
//! not).

/// What the next binding begins, and what further shards are begun with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum ShardTx {
    /// No BEGIN text is known: no transaction, or one the server began inside a client's
    /// statement (a further shard is begun with a plain `BEGIN`).
    #[default]
    Idle,
    /// The transaction began with `begin` (the client's own text, options kept) on the
    /// shards it reached; also kept after refract answered its end, up to the next statement
    /// outside a transaction.
    Begun { begin: String },
    /// The next binding sends `send` first: refract answered the client's BEGIN, or the
    /// transaction moved to a shard it has no connection on. `begin`: the transaction's BEGIN
    /// text as for [`ShardTx::Begun`] (`None`: unknown, or forgotten when the server
    /// connection was lost while this was pending).
    Pending { send: String, begin: Option<String> },
}

/// What happens to a sharded session's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event<'a> {
    /// refract answered the client's BEGIN (this text) itself: it is held.
    HeldBegin(&'a str),
    /// A batch that starts a transaction binds, with this BEGIN text.
    BatchBegins(&'a str),
    /// The pending BEGIN went to the server (the binding, or every shard a read joined).
    Sent,
    /// refract answered the end (COMMIT or ROLLBACK) of a transaction that reached no shard.
    EndedHere,
    /// The transaction moved to a shard it has no connection on: the next binding begins it.
    Moved,
    /// A statement or batch arrives outside a transaction.
    OutsideTx,
    /// The server connection failed (`Session::settle`): the transaction's BEGIN is forgotten.
    ServerLost,
    /// The transaction ended on every shard it reached (committed, rolled back, or lost).
    Ended,
}

/// The BEGIN a further shard is begun with when the client's text is not known.
const BEGIN: &str = "BEGIN";

impl ShardTx {
    /// The transition function: the state after `event`.
    pub(crate) fn on(self, event: Event) -> ShardTx {
        match (self, event) {
            (_, Event::HeldBegin(sql)) => ShardTx::Pending { send: sql.to_owned(), begin: Some(sql.to_owned()) },
            (ShardTx::Pending { send, .. }, Event::BatchBegins(b)) => {
                ShardTx::Pending { send, begin: Some(b.to_owned()) }
            }
            (_, Event::BatchBegins(b)) => ShardTx::Begun { begin: b.to_owned() },
            (ShardTx::Pending { begin, .. }, Event::Sent | Event::EndedHere) => begun(begin),
            (tx, Event::Sent | Event::EndedHere) => tx,
            (tx, Event::Moved) => {
                let begin = tx.begin().map(str::to_owned);
                ShardTx::Pending { send: begin.clone().unwrap_or_else(|| BEGIN.into()), begin }
            }
            (ShardTx::Pending { send, .. }, Event::OutsideTx | Event::ServerLost) => {
                ShardTx::Pending { send, begin: None }
            }
            (_, Event::OutsideTx | Event::ServerLost | Event::Ended) => ShardTx::Idle,
        }
    }

    /// The BEGIN the next binding sends first, if any.
    pub(crate) fn pending(&self) -> Option<&str> {
        match self {
            ShardTx::Pending { send, .. } => Some(send),
            _ => None,
        }
    }

    /// The transaction's own BEGIN text, if known.
    fn begin(&self) -> Option<&str> {
        match self {
            ShardTx::Idle => None,
            ShardTx::Begun { begin } => Some(begin),
            ShardTx::Pending { begin, .. } => begin.as_deref(),
        }
    }

    /// The BEGIN a shard joining the transaction is sent: its own text, else the pending
    /// one, else a plain `BEGIN`.
    pub(crate) fn join_text(&self) -> String {
        self.begin().or(self.pending()).unwrap_or(BEGIN).to_owned()
    }
}

/// The state once nothing is pending.
fn begun(begin: Option<String>) -> ShardTx {
    match begin {
        Some(begin) => ShardTx::Begun { begin },
        None => ShardTx::Idle,
    }
}

/// How the client ends a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    Commit,
    Rollback,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(send: &str, begin: Option<&str>) -> ShardTx {
        ShardTx::Pending { send: send.into(), begin: begin.map(str::to_owned) }
    }

    fn begun(begin: &str) -> ShardTx {
        ShardTx::Begun { begin: begin.into() }
    }

    const RO: &str = "BEGIN READ ONLY";

    #[test]
    fn every_transition() {
        use Event::*;
        let idle = ShardTx::Idle;
        // (from, event, to)
        let table: Vec<(ShardTx, Event, ShardTx)> = vec![
            (idle.clone(), HeldBegin(RO), pending(RO, Some(RO))),
            (begun("BEGIN"), HeldBegin(RO), pending(RO, Some(RO))),
            (pending("x", None), HeldBegin(RO), pending(RO, Some(RO))),
            (idle.clone(), BatchBegins(RO), begun(RO)),
            (begun("BEGIN"), BatchBegins(RO), begun(RO)),
            (pending("x", None), BatchBegins(RO), pending("x", Some(RO))),
            (idle.clone(), Sent, idle.clone()),
            (begun(RO), Sent, begun(RO)),
            (pending(RO, Some(RO)), Sent, begun(RO)),
            (pending("BEGIN", None), Sent, idle.clone()),
            (idle.clone(), EndedHere, idle.clone()),
            (begun(RO), EndedHere, begun(RO)),
            (pending(RO, Some(RO)), EndedHere, begun(RO)),
            (pending(RO, None), EndedHere, idle.clone()),
            (idle.clone(), Moved, pending("BEGIN", None)),
            (begun(RO), Moved, pending(RO, Some(RO))),
            (pending("x", Some(RO)), Moved, pending(RO, Some(RO))),
            (pending("x", None), Moved, pending("BEGIN", None)),
            (idle.clone(), OutsideTx, idle.clone()),
            (begun(RO), OutsideTx, idle.clone()),
            (pending(RO, Some(RO)), OutsideTx, pending(RO, None)),
            (begun(RO), ServerLost, idle.clone()),
            (pending(RO, Some(RO)), ServerLost, pending(RO, None)),
            (idle.clone(), Ended, idle.clone()),
            (begun(RO), Ended, idle.clone()),
            (pending(RO, Some(RO)), Ended, idle.clone()),
        ];
        for (from, event, to) in table {
            assert_eq!(from.clone().on(event), to, "{from:?} on {event:?}");
        }
    }

    #[test]
    fn a_held_begin_is_sent_once_then_begins_further_shards() {
        let tx = ShardTx::Idle.on(Event::HeldBegin(RO));
        assert_eq!(tx.pending(), Some(RO));
        let tx = tx.on(Event::Sent);
        assert_eq!((tx.pending(), tx.join_text().as_str()), (None, RO));
        let tx = tx.on(Event::Moved);
        assert_eq!(tx.pending(), Some(RO), "the next shard is begun as the client began");
    }

    #[test]
    fn a_further_shard_joins_with_the_known_text_else_plain_begin() {
        assert_eq!(ShardTx::Idle.join_text(), "BEGIN");
        assert_eq!(begun(RO).join_text(), RO);
        assert_eq!(pending("x", None).join_text(), "x", "the pending text when the own is forgotten");
        assert_eq!(pending("x", Some(RO)).join_text(), RO);
    }
}
