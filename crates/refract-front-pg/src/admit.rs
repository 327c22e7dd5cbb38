//! Admission control for PostgreSQL statements: the same per-server `Admission` (limit and
//! managed, deadline-aware queue) as HTTP backends (`overload/admission.rs`), built from
//! `[overload]`. Its limit starts at `pool_size`, is capped by it and adapts to the server
//! time of the statements run under it, each read against the no-load time of its kind of
//! statement (`Server::learn`, `baseline.rs`; `permit.rs` says why the permits themselves are
//! no samples).
//!
//! The unit admitted is the unit of work that holds a server connection in transaction
//! pooling: a transaction, or a statement (an extended batch up to Sync) outside one. Its
//! first statement takes a permit before it takes a server connection; the permit is held
//! until the ReadyForQuery that says idle. So a statement inside an open transaction never
//! waits and is never refused (its transaction holds the resource already, and a COMMIT or
//! ROLLBACK must not be kept from releasing it), as a PgBouncer user expects of a pool: the
//! wait, when there is one, comes before `BEGIN`. A session that already holds a connection
//! (session mode, or pinned) queues at high priority: it costs no connection; others at their
//! user's `priority` (`[[postgres.user]]`, normal by default).
//!
//! Refusals are ErrorResponses followed by ReadyForQuery; the session goes on: `53300`
//! (too_many_connections, as PgBouncer answers for a full pool) when overloaded, `57014`
//! (query_canceled, as `statement_timeout` gives) when the statement could not run before its
//! deadline. The deadline is the session's `statement_timeout` (set by SET or in the startup
//! packet), else `[overload] default_timeout_ms`, else none.

pub(crate) mod baseline;
pub(crate) mod lru;
pub(crate) mod permit;

use self::permit::Admitted;
use super::error::PgError;
use super::session::Session;
use crate::config::PgRole;
use crate::server::servers::Server;
use refract_core::overload::{Arrival, Priority, Refusal};
use refract_pg::notice::sqlstate;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The value of a `statement_timeout` SET as tracked (`SET statement_timeout = '2s'`,
/// `SET statement_timeout TO 500`, `SELECT pg_catalog.set_config('statement_timeout', '1min',
/// false)`); `None` for 0 (no timeout) or a text it cannot read.
pub(super) fn statement_timeout(set: &str) -> Option<Duration> {
    let lower = set.to_ascii_lowercase();
    let value = if lower.contains("set_config(") {
        set.split('\'').nth(3)?
    } else {
        let at = lower.rfind('=').map(|i| i + 1).or_else(|| lower.rfind(" to ").map(|i| i + 4))?;
        set[at..].trim().trim_end_matches(';').trim().trim_matches('\'')
    };
    parse_duration_ms(value.trim())
}

/// A PostgreSQL time setting in milliseconds by default (`500`, `2s`, `1.5min`).
fn parse_duration_ms(v: &str) -> Option<Duration> {
    let split = v.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: f64 = num.parse().ok()?;
    let ms = match unit.trim() {
        "" | "ms" => n,
        "us" => n / 1000.0,
        "s" => n * 1000.0,
        "min" => n * 60_000.0,
        "h" => n * 3_600_000.0,
        "d" => n * 86_400_000.0,
        _ => return None,
    };
    (ms >= 1.0).then(|| Duration::from_secs_f64(ms / 1000.0))
}

/// The error a refusal gets.
fn refused(server: &Server, r: Refusal, timeout: Option<Duration>) -> PgError {
    let why = match r {
        Refusal::QueueFull => "its queue is full",
        Refusal::Shed => "shed by queue management",
        Refusal::WaitTooLong => "waited as long as its queue allows",
        Refusal::Deadline => {
            let ms = timeout.map_or(0, |t| t.as_millis());
            let message = format!(
                "refract: canceling statement: it could not run on server {:?} within its deadline ({ms} ms) while that server is busy",
                server.name
            );
            return PgError::Refused { sqlstate: sqlstate::QUERY_CANCELED, message };
        }
    };
    let message = format!("refract: server {:?} is overloaded: {why}; try again later", server.name);
    PgError::Refused { sqlstate: sqlstate::TOO_MANY_CONNECTIONS, message }
}

/// The candidates a unit may run on, each once, in their order: the readers among them (the
/// replicas, and the primary when it takes reads), or when there is none the rest (the primary
/// for a write, or as the reads' fallback).
fn readers(candidates: &[Arc<Server>], read_from_primary: bool) -> Vec<&Arc<Server>> {
    let mut once: Vec<&Arc<Server>> = Vec::with_capacity(candidates.len());
    for s in candidates {
        if !once.iter().any(|o| Arc::ptr_eq(o, s)) {
            once.push(s);
        }
    }
    // The first candidate is the choice made for this read (a share may name the primary).
    let first = once.first().map(|s| Arc::as_ptr(s));
    let reads = |s: &&Arc<Server>| s.role == PgRole::Replica || read_from_primary || first == Some(Arc::as_ptr(s));
    if once.iter().any(reads) {
        once.retain(reads);
    }
    once
}

/// How full `s` is: units admitted and waiting per slot of its limit, in thousandths. The unit
/// queues where this is least (join the shortest queue): each server keeps its own queue, and
/// a server's free slot serves only its own waiters, so uneven queues would leave one server
/// idle while the other's waiters age (measured with the balancer's choice instead: p99 of
/// 860 ms at 3× load over a primary + replica, where one server had given 33 ms).
/// `expected_wait` cannot say this: it rests on a recent latency learnt from permits, which
/// PostgreSQL's do not give (`permit.rs`), and the statement samples the limit reads are of
/// mixed costs, no estimate of a unit's length.
fn backlog(s: &Server) -> usize {
    let v = s.member.admission.view();
    (v.inflight + v.queued) * 1000 / v.limit.max(1)
}

impl Session {
    /// This session's deadline budget: its `statement_timeout`, else `[overload]
    /// default_timeout_ms`.
    fn timeout(&self) -> Option<Duration> {
        if let Some(set) = self.state.params.current("statement_timeout") {
            return statement_timeout(set);
        }
        let ms = self.shared.default_timeout_ms;
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// A permit for a new unit of work among `candidates` (in preference order, the balancer's
    /// choice first): a free slot now, else the shortest queue. A read
    /// takes the primary's capacity only when it is a reader (`[balance] read_from_primary`)
    /// or no replica is a candidate (the primary follows as a fallback).
    pub(super) async fn admit(&mut self, candidates: &[Arc<Server>]) -> Result<(Arc<Server>, Admitted), PgError> {
        let choice = readers(candidates, self.servers().read_from_primary());
        for s in &choice {
            if let Some(p) = s.member.admission.try_acquire(Arrival::Fresh) {
                return Ok(((*s).clone(), Admitted::new(p, &s.member)));
            }
        }
        let Some(best) = choice.iter().min_by_key(|s| backlog(s)) else {
            return Err(PgError::Unavailable("refract: no server is available".into()));
        };
        self.queue(best, self.priority()).await.map(|a| ((*best).clone(), a))
    }

    /// Where this session's next unit waits: high when it holds a connection already (it
    /// costs none), else its user's `priority`.
    fn priority(&self) -> Priority {
        if self.bound.is_some() {
            return Priority::High;
        }
        self.shared.cfg.user(&self.client.info.user).map_or(Priority::Normal, |u| u.priority)
    }

    /// Waits in `server`'s queue.
    async fn queue(&mut self, server: &Server, prio: Priority) -> Result<Admitted, PgError> {
        let timeout = self.timeout();
        let deadline = timeout.map(|t| Instant::now() + t);
        match server.member.admission.acquire_as(prio, deadline, Arrival::Fresh).await {
            Ok(p) => Ok(Admitted::new(p, &server.member)),
            Err(r) => {
                tracing::debug!(server = %server.name, refusal = ?r, "postgres statement refused by admission");
                Err(refused(server, r, timeout))
            }
        }
    }

    /// A session that keeps its connection between units (session mode, pinned) takes a permit
    /// of that connection's server for its next unit if one is free; inside a unit it has one
    /// already. It never waits for one: it holds the connection admission guards, and waiting
    /// could deadlock with a client that holds the last permit while it waits in the pool for
    /// this very connection (`pg_encoding.rs` `a_sql_prepare_under_a_latin1_name_…`).
    pub(super) async fn admit_bound(&mut self) -> Result<(), PgError> {
        let Some(b) = self.bound.as_mut() else { return Ok(()) };
        if b.admitted.is_none() {
            let member = &b.server.member;
            b.admitted = member.admission.try_acquire(Arrival::Fresh).map(|p| Admitted::new(p, member));
        }
        Ok(())
    }

    /// A ReadyForQuery said idle: the unit of work ended (the connection may stay bound).
    pub(super) fn unit_done(&mut self) {
        if let Some(a) = self.bound.as_mut().and_then(|b| b.admitted.take()) {
            a.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PgConfig;
    use refract_core::config::Overload;

    #[test]
    fn statement_timeout_is_read_from_each_form_refract_tracks() {
        let ms = |s: &str| statement_timeout(s).map(|d| d.as_millis());
        assert_eq!(ms("SET statement_timeout = 300"), Some(300));
        assert_eq!(ms("SET statement_timeout TO '2s'"), Some(2000));
        assert_eq!(ms("set statement_timeout='1.5min';"), Some(90_000));
        assert_eq!(ms("SELECT pg_catalog.set_config('statement_timeout', '250ms', false)"), Some(250));
        assert_eq!(ms("SET statement_timeout = 0"), None, "0 means no timeout");
        assert_eq!(ms("SET statement_timeout = DEFAULT"), None);
        assert_eq!(ms("SET statement_timeout = '5 parsecs'"), None);
    }

    #[test]
    fn the_limit_is_capped_at_the_pool_size_and_the_wait_at_the_checkout_timeout() {
        let text = "listen = \"127.0.0.1:0\"\nserver_user = \"u\"\npool_size = 12\ncheckout_timeout_ms = 700\n\
                    [[server]]\nname = \"p\"\naddr = \"127.0.0.1:1\"\nrole = \"primary\"\n";
        let pg: PgConfig = toml::from_str(text).expect("[postgres]");
        let adm = crate::server::servers::admission_config(&Overload::default(), &pg);
        assert_eq!(
            (adm.limit.initial, adm.limit.max),
            (12.0, 12.0),
            "starts at the pool size, above initial_concurrency"
        );
        assert_eq!(adm.max_wait, Duration::from_millis(700));
    }
}
