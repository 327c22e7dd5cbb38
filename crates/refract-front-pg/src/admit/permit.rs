//! [`Admitted`]: the permit of a server's admission control a session holds for one unit of
//! work (a transaction, or a statement outside one); taken in `admit.rs`, kept by the session.

use refract_core::backend::{Backend, InflightGuard};
use refract_core::overload::{Outcome, Permit};
use std::sync::Arc;

/// A permit held by a session for its unit of work.
///
/// It teaches the limit nothing (`Outcome::Ignore`): the permit's lifetime is no sample, since
/// for a transaction it spans the client's round trips between statements. The limit learns
/// from the statements run under it instead: each one's server time, read against the no-load
/// time of its kind of statement (`Server::learn`, `baseline.rs`). Against a single minimum
/// latency, as for HTTP, a mix of statement costs reads as queueing: measured with the bench's
/// 20 ms statements, the `SELECT 1` of a readiness probe set the no-load latency to 0.1 ms and
/// the limit fell to 1 (46 statements/s where PgBouncer served 142).
#[derive(Debug)]
pub(crate) struct Admitted {
    permit: Permit,
    /// Counts the unit in its server's in-flight requests while it runs: the balancer's cost
    /// (peak-EWMA latency × (in flight + 1)) weighs it, as it does an HTTP request.
    _inflight: InflightGuard,
}

impl Admitted {
    /// The permit of a unit that runs on `member`.
    pub(crate) fn new(permit: Permit, member: &Arc<Backend>) -> Self {
        Admitted { permit, _inflight: member.begin() }
    }

    /// The unit ended with its ReadyForQuery.
    pub(crate) fn finish(self) {
        self.permit.finish(Outcome::Ignore);
    }
}
