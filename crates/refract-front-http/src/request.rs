//! The types of one HTTP request on its way through refract: its body ([`ReqBody`]), the
//! request ready to forward ([`Request`]) and a failed exchange ([`Failure`]). Built by the
//! session loop, taken by forwarding, fan-out and hand-over, with what the balancer is told of a
//! read plan ([`scope`], [`affinity_key`]); below all of them.

use crate::config::HttpConfig;
use crate::error::Error;
use bytes::Bytes;
use refract_core::ctx::Ctx;
use refract_core::membership::ring::key_hash;
use refract_core::membership::Scope;
use refract_core::overload::{Arrival, Priority};
use refract_http::{BodyKind, PlanTables, ReadPlan, RequestHead, RouteClass};
use tokio::time::Instant;

/// A request body: already read (possibly empty), or still to stream from the client.
#[derive(Debug)]
pub(crate) enum ReqBody {
    Buffered(Bytes),
    Stream(BodyKind),
}

/// A failed exchange, and whether any byte of a response had reached the client.
#[derive(Debug)]
pub(crate) struct Failure {
    pub err: Error,
    pub touched: bool,
}

impl Failure {
    pub(crate) fn untouched(err: Error) -> Self {
        Failure { err, touched: false }
    }
}

/// A request ready to forward.
pub(crate) struct Request<'a> {
    pub class: RouteClass,
    pub head_bytes: &'a Bytes,
    pub head: &'a RequestHead,
    pub body: &'a ReqBody,
    pub deadline: Option<Instant>,
    pub priority: Priority,
    /// Whether it is new demand (or a pipelined request, paced by refract).
    pub arrival: Arrival,
    /// The client's address (its share of a backend's slots), when known.
    pub client: Option<std::net::IpAddr>,
    /// The tables a Hyrise-R read plan reads (only backends holding them all may serve it);
    /// `None`: no plan, any reader.
    pub tables: Option<&'a PlanTables>,
    /// A read plan's affinity key ([`affinity_key`]); `None`: balanced by load alone.
    pub key: Option<u64>,
}

/// What a read plan names, for the balancer: its tables, the configured shares and its
/// affinity key.
pub(crate) fn scope<'a>(ctx: &'a Ctx, tables: Option<&'a PlanTables>, key: Option<u64>) -> Option<Scope<'a>> {
    let shares = &HttpConfig::of(&ctx.cfg).shares;
    tables.map(|t| Scope { tables: t.as_slice(), shares, key })
}

/// A read plan's affinity key (`[balance] policy = "affinity"`): the stable hash of its tables
/// then the values its equality predicates look up (`key_hash(&[table, value])` for a read of
/// one table by one value, the key the PostgreSQL front end makes of a relation and a value);
/// `None` when the plan names no table or refract cannot name them all.
pub(crate) fn affinity_key(plan: &ReadPlan) -> Option<u64> {
    plan.key_parts().map(|parts| key_hash(&parts))
}
