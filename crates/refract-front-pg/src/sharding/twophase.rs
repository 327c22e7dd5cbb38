//! Two-phase commit over shards: every shard of the transaction runs `PREPARE TRANSACTION`;
//! only when all have prepared does refract record the decision to commit in its decision log
//! (`[postgres] twophase_log`, appended and `fsync`ed) and run `COMMIT PREPARED` on each; any
//! failure before the record rolls every shard back. After a crash, [`recover`] resolves the
//! prepared transactions refract left (their ids start with [`GID_PREFIX`]): committed where
//! the log holds the decision, rolled back where it does not, so a transaction is committed on
//! every shard or on none.
//!
//! Several dispatchers (`[cluster]`, [`SharedDecisions`]): the decision lives in etcd instead
//! of the file, and ids carry the deciding dispatcher's node id (`refract:NODE:STAMP:N`). The
//! outcome of an id is whichever is recorded first, the decider's commit or anyone's
//! rollback, so a dispatcher that finds another's prepared transaction after that one's lease
//! lapsed finishes it (commits if the decision was recorded) or rolls it back (recording the
//! rollback first, so that the decider, should it still be running, cannot commit it). Every
//! dispatcher looks for such transactions every half second while it runs.

use crate::error::PgError;
use crate::server::pool::Guard;
use crate::server::servers::Servers;
use crate::server::sizes::Path as ConnPath;
use refract_pg::{BackendMessage, ErrorFields, FrontendMessage};
use std::collections::HashSet;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The prefix of refract's prepared-transaction ids.
pub(crate) const GID_PREFIX: &str = "refract:";

type Boxed<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Two-phase decisions shared by several dispatchers (etcd).
pub trait SharedDecisions: Send + Sync {
    /// This dispatcher's node id (in every id it makes).
    fn node_id(&self) -> String;
    /// Records `gid`'s outcome (`commit`) unless one is recorded already; the outcome in force.
    fn decide<'a>(&'a self, gid: &'a str, commit: bool) -> Boxed<'a, Result<bool, String>>;
    /// Forgets `gid`'s outcome: it is carried out on every shard.
    fn forget<'a>(&'a self, gid: &'a str) -> Boxed<'a, ()>;
    /// Whether dispatcher `node_id` is registered (its lease alive).
    fn is_alive(&self, node_id: &str) -> bool;
}

/// The dispatcher that made `gid` (`refract:NODE:STAMP:N`); `None` for a file-log id.
fn owner(gid: &str) -> Option<&str> {
    let mut parts = gid.strip_prefix(GID_PREFIX)?.split(':');
    let node = parts.next()?;
    (parts.count() == 2).then_some(node)
}

/// The decision log and the transactions this process has in flight.
pub(crate) struct DecisionLog {
    path: PathBuf,
    /// The file log (`None` when only shared decisions are kept).
    file: Option<Mutex<std::fs::File>>,
    /// With several dispatchers: the decisions in etcd, once joined.
    shared: std::sync::OnceLock<Arc<dyn SharedDecisions>>,
    /// Decided to commit, not known to be committed everywhere yet.
    committed: Mutex<HashSet<String>>,
    /// Prepared (or preparing) by this process and not finished: recovery leaves them alone.
    in_flight: Mutex<HashSet<String>>,
    /// Makes ids unique across restarts (start time) and within this run (counter).
    stamp: u64,
    next: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl DecisionLog {
    /// Opens (creates) the log and reads the decisions not marked done.
    pub(crate) fn open(path: &Path) -> std::io::Result<DecisionLog> {
        let mut committed = HashSet::new();
        if let Ok(f) = std::fs::File::open(path) {
            for line in std::io::BufReader::new(f).lines() {
                let line = line?;
                match line.split_once(' ') {
                    Some(("commit", gid)) => {
                        committed.insert(gid.to_owned());
                    }
                    Some(("done", gid)) => {
                        committed.remove(gid);
                    }
                    _ => {} // a torn last line: its decision was not recorded
                }
            }
        }
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        Ok(DecisionLog::new(path.to_owned(), Some(file), committed))
    }

    /// A log without a file, for decisions shared through etcd ([`DecisionLog::share`]): until
    /// then no decision can be recorded.
    pub(crate) fn shared_only() -> DecisionLog {
        DecisionLog::new(PathBuf::from("etcd"), None, HashSet::new())
    }

    fn new(path: PathBuf, file: Option<std::fs::File>, committed: HashSet<String>) -> DecisionLog {
        let stamp =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
        DecisionLog {
            path,
            file: file.map(Mutex::new),
            shared: std::sync::OnceLock::new(),
            committed: Mutex::new(committed),
            in_flight: Mutex::default(),
            stamp,
            next: AtomicU64::new(1),
        }
    }

    /// Decisions are recorded in `shared` from now on. Once; `false` if already shared.
    pub(crate) fn share(&self, shared: Arc<dyn SharedDecisions>) -> bool {
        self.shared.set(shared).is_ok()
    }

    /// A fresh transaction id, in flight until [`DecisionLog::done`].
    fn new_gid(&self) -> String {
        let n = self.next.fetch_add(1, Relaxed);
        let gid = match self.shared.get() {
            Some(s) => format!("{GID_PREFIX}{}:{:x}:{n}", s.node_id(), self.stamp),
            None => format!("{GID_PREFIX}{:x}:{n}", self.stamp),
        };
        lock(&self.in_flight).insert(gid.clone());
        gid
    }

    /// Records the decision to commit `gid`, durably.
    fn decide_commit(&self, gid: &str) -> std::io::Result<()> {
        let Some(file) = &self.file else { return Err(std::io::Error::other("no decision log")) };
        let mut f = lock(file);
        f.write_all(format!("commit {gid}\n").as_bytes())?;
        f.sync_data()?;
        lock(&self.committed).insert(gid.to_owned());
        Ok(())
    }

    /// `gid` is resolved on every shard.
    fn done(&self, gid: &str) {
        if let Some(file) = &self.file {
            if let Err(e) = lock(file).write_all(format!("done {gid}\n").as_bytes()) {
                tracing::warn!(log = %self.path.display(), "two-phase log: {e}");
            }
        }
        lock(&self.committed).remove(gid);
        lock(&self.in_flight).remove(gid);
    }

    /// `gid` is no longer this process's to finish (recovery resolves it from the log).
    fn abandon(&self, gid: &str) {
        lock(&self.in_flight).remove(gid);
    }

    /// After a complete recovery: every recorded decision not in flight is carried out on
    /// every shard; the log starts afresh once nothing in it is needed.
    fn compact(&self) {
        let settled: Vec<String> = {
            let flying = lock(&self.in_flight);
            lock(&self.committed).iter().filter(|g| !flying.contains(*g)).cloned().collect()
        };
        for gid in settled {
            self.done(&gid);
        }
        if lock(&self.committed).is_empty() && lock(&self.in_flight).is_empty() {
            if let Some(Err(e)) = self.file.as_ref().map(|f| lock(f).set_len(0)) {
                tracing::warn!(log = %self.path.display(), "two-phase log: {e}");
            }
        }
    }
}

/// A test hook: `REFRACT_FAILPOINT=<name>` makes the process abort at that point (how the
/// tests kill refract between the two phases).
fn failpoint(name: &str) {
    if refract_process::failpoint::is(name) {
        tracing::error!("failpoint {name}: aborting");
        refract_process::log::flush(std::time::Duration::from_millis(200));
        std::process::abort();
    }
}

/// Runs `sql` on `g` to its ReadyForQuery: the command tag, or the server's error.
pub(crate) async fn exec(g: &mut Guard, sql: &str) -> Result<Result<String, ErrorFields>, PgError> {
    let mut out = bytes::BytesMut::new();
    FrontendMessage::Query(sql.to_owned()).encode(&mut out);
    g.unnamed = None;
    g.wire.send(&out).await?;
    let mut answer = Ok(String::new());
    loop {
        let (tag, frame) = g.wire.recv().await?;
        match BackendMessage::decode(tag, &frame[5..])? {
            BackendMessage::CommandComplete(t) => answer = answer.map(|_| t),
            BackendMessage::ErrorResponse(e) => answer = Err(e),
            BackendMessage::ReadyForQuery(_) => return Ok(answer),
            _ => {}
        }
    }
}

/// An error for the client, from a failed phase.
fn error(message: String) -> ErrorFields {
    ErrorFields::new("ERROR", refract_pg::notice::sqlstate::INTERNAL_ERROR, message)
}

/// Commits the open transaction of every connection in `conns` atomically (see the module
/// doc). `Err`: it was rolled back everywhere (the reason for the client); the connections
/// are then in a known idle state unless an I/O error said otherwise (`Err` of the outer
/// result: drop them).
pub(crate) async fn commit(
    log: &Arc<DecisionLog>,
    conns: &mut [&mut Guard],
) -> Result<Result<(), ErrorFields>, PgError> {
    let gid = log.new_gid();
    let mut prepared = 0;
    let mut failure = None;
    for g in conns.iter_mut() {
        match exec(g, &format!("PREPARE TRANSACTION '{gid}'")).await {
            Ok(Ok(tag)) if tag == "PREPARE TRANSACTION" => prepared += 1,
            // PREPARE of a transaction that had failed rolls it back.
            Ok(Ok(tag)) => failure = Some(error(format!("a shard could not prepare the transaction ({tag})"))),
            Ok(Err(e)) => failure = Some(e),
            Err(e) => failure = Some(error(format!("a shard was lost while preparing: {e}"))),
        }
        if failure.is_some() {
            break;
        }
    }
    if failure.is_none() {
        failpoint("2pc-before-decision");
        if let Err(e) = record_commit(log, &gid).await {
            failure = Some(error(format!("the two-phase decision could not be recorded: {e}")));
        }
    }
    if let Some(f) = failure {
        for (i, g) in conns.iter_mut().enumerate() {
            let undo = if i < prepared { format!("ROLLBACK PREPARED '{gid}'") } else { "ROLLBACK".into() };
            if let Err(e) = exec(g, &undo).await {
                // Recovery rolls back what stays prepared (no decision was recorded).
                log.abandon(&gid);
                return Err(e);
            }
        }
        log.done(&gid);
        return Ok(Err(f));
    }
    failpoint("2pc-after-decision");
    for g in conns.iter_mut() {
        match exec(g, &format!("COMMIT PREPARED '{gid}'")).await {
            Ok(Ok(_)) => {}
            // The decision is recorded: recovery commits the rest; the client's commit stands.
            Ok(Err(e)) => {
                tracing::warn!(gid, error = ?e.message(), "COMMIT PREPARED failed; recovery will finish it");
                log.abandon(&gid);
                return Ok(Ok(()));
            }
            Err(e) => {
                tracing::warn!(gid, "COMMIT PREPARED: {e}; recovery will finish it");
                log.abandon(&gid);
                return Err(e);
            }
        }
    }
    if let Some(shared) = log.shared.get() {
        shared.forget(&gid).await;
    }
    log.done(&gid);
    Ok(Ok(()))
}

/// Records the decision to commit `gid`: in etcd with several dispatchers (refused if a
/// rollback was recorded first), else in the file (its fsync off the event loop).
async fn record_commit(log: &Arc<DecisionLog>, gid: &str) -> Result<(), String> {
    if let Some(shared) = log.shared.get() {
        return match shared.decide(gid, true).await? {
            true => Ok(()),
            false => Err("another dispatcher rolled it back".into()),
        };
    }
    if log.file.is_none() {
        return Err("the shared decisions are not reachable yet".into());
    }
    let (l, g) = (log.clone(), gid.to_owned());
    let recorded = tokio::task::spawn_blocking(move || l.decide_commit(&g)).await;
    recorded.unwrap_or_else(|e| Err(std::io::Error::other(e.to_string()))).map_err(|e| e.to_string())
}

/// Resolves the prepared transactions refract left on `shards` (each shard's primary): commits
/// those the log decided to commit, rolls back the others (not this process's in-flight ones).
/// Retries every `interval` until every shard answered, then compacts the log.
pub(crate) async fn recover(
    log: Arc<DecisionLog>,
    shards: Vec<Arc<Servers>>,
    interval: Duration,
    stop: CancellationToken,
) {
    loop {
        let mut complete = true;
        for servers in &shards {
            if let Err(e) = recover_shard(&log, servers).await {
                tracing::debug!("two-phase recovery: {e}; trying again");
                complete = false;
            }
        }
        if complete && log.file.is_some() {
            log.compact();
        }
        // With several dispatchers recovery never ends: another's lease may lapse any time.
        if complete && log.shared.get().is_none() {
            return;
        }
        let interval = if log.shared.get().is_some() { SHARED_INTERVAL.min(interval) } else { interval };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// How often a dispatcher among several looks for prepared transactions to finish.
const SHARED_INTERVAL: Duration = Duration::from_millis(500);

/// What recovery does with a prepared transaction it found: `None` leaves it (its dispatcher
/// is running it), else whether to commit it.
async fn verdict(log: &DecisionLog, gid: &str) -> Result<Option<bool>, String> {
    let Some(shared) = log.shared.get() else {
        if lock(&log.in_flight).contains(gid) {
            return Ok(None);
        }
        return Ok(Some(lock(&log.committed).contains(gid)));
    };
    match owner(gid) {
        Some(node) if node == shared.node_id() && lock(&log.in_flight).contains(gid) => Ok(None),
        Some(node) if node != shared.node_id() && shared.is_alive(node) => Ok(None),
        Some(_) => shared.decide(gid, false).await.map(Some),
        // A file-log id: the file's decision if there is a file, else left alone.
        None if log.file.is_some() && !lock(&log.in_flight).contains(gid) => {
            Ok(Some(lock(&log.committed).contains(gid)))
        }
        None => Ok(None),
    }
}

async fn recover_shard(log: &DecisionLog, servers: &Servers) -> Result<(), String> {
    let primary = servers.primary().ok_or("no primary")?;
    let mut g = primary.pool.get(ConnPath::Direct).await.map_err(|e| e.to_string())?;
    let q =
        format!("select gid from pg_prepared_xacts where gid like '{GID_PREFIX}%' and database = current_database()");
    let gids = g.query(&q).await.map_err(|e| e.to_string())?;
    for gid in gids.into_iter().filter_map(|r| r.into_iter().next().flatten()) {
        let Some(commit) = verdict(log, &gid).await? else { continue };
        let sql = if commit { format!("COMMIT PREPARED '{gid}'") } else { format!("ROLLBACK PREPARED '{gid}'") };
        match exec(&mut g, &sql).await.map_err(|e| e.to_string())? {
            Ok(_) => tracing::info!(gid, commit, "two-phase recovery resolved a prepared transaction"),
            Err(e) => return Err(format!("{sql}: {}", e.message().unwrap_or("an error"))),
        }
    }
    g.release();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_id_names_its_dispatcher() {
        assert_eq!(owner("refract:d1:18c0ffee:7"), Some("d1"));
        assert_eq!(owner("refract:18c0ffee:7"), None, "a file-log id");
        assert_eq!(owner("other:d1:1:2"), None);
    }

    #[test]
    fn the_log_keeps_decisions_until_done_and_ignores_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("2pc.log");
        let log = DecisionLog::open(&path).unwrap();
        let (a, b) = (log.new_gid(), log.new_gid());
        assert!(a.starts_with(GID_PREFIX) && a != b);
        log.decide_commit(&a).unwrap();
        log.decide_commit(&b).unwrap();
        log.done(&b);
        drop(log);
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"comm").unwrap();
        let again = DecisionLog::open(&path).unwrap();
        assert!(lock(&again.committed).contains(&a));
        assert!(!lock(&again.committed).contains(&b));
        assert!(lock(&again.in_flight).is_empty(), "a new process has nothing in flight");
        again.done(&a);
        again.compact();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    }
}
