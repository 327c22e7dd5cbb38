//! refract's HTTP/1.1 codec: it frames requests and responses, classifies requests into route
//! classes (including Hyrise-R JSON query plans) and builds error replies. It is pure: nothing
//! here awaits or opens a socket, so the session loop in `refract-core` and the test backend in
//! `refract-blob` share it, and every parser is tested with byte literals and property tests.
//!
//! # Layout
//! - [`head`]: request and response heads (`parse(&[u8]) -> Result<Option<(Head, usize)>>`).
//! - [`chunked`]: a chunked-transfer state machine that finds the end of a body it passes through.
//! - `strict` (private): what refract refuses in a request head, so that no parser after it
//!   frames a request differently (request smuggling).
//! - [`classify`]: route classes and the rules that pick one for a request.
//! - [`reply`]: canned responses (errors with JSON bodies, plain OK replies).
//! - [`error`]: the crate's error type.

pub mod chunked;
pub mod classify;
pub mod defer;
pub mod error;
pub mod head;
pub mod reply;
mod strict;

pub use chunked::ChunkedDecoder;
pub use classify::{Classifier, PlanTables, ReadPlan, RouteClass, RouteRule};
pub use error::Error;
pub use head::{BodyKind, RequestHead, ResponseHead};
