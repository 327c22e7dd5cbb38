//! refract's PostgreSQL v3 wire protocol layer. It frames and decodes the messages of both
//! directions, authenticates clients and logs into servers (SCRAM-SHA-256, md5, trust),
//! classifies SQL with PostgreSQL's own parser (`pg_query`) and keeps the session state a
//! transaction-pooling proxy must carry between server connections. It is pure: nothing here
//! awaits or opens a socket; the session loop in `refract-front-pg` owns the I/O. Sharding's
//! arithmetic (partitioning, shard keys, COPY rows, scatter-gather) is `refract-shard`.
//!
//! # Layout
//! - [`frame`]: where a message ends ([`frame::peek`]), size [`Limits`]; unknown types pass.
//! - [`stream`]: [`stream::Splitter`], large messages as head and body pieces, for relaying.
//! - [`startup`]: the untyped first message (StartupMessage, SSLRequest, CancelRequest, ...).
//! - [`text`]: message text in any client encoding, held losslessly (non-UTF-8 bytes escaped).
//! - [`frontend`]: typed client messages ([`FrontendMessage`]).
//! - [`backend`]: typed server messages ([`BackendMessage`]).
//! - [`hybrid`]: the in-band signals of the result hand-over between refract and an agent.
//! - [`notice`]: ErrorResponse/NoticeResponse fields and SQLSTATE codes.
//! - [`auth`]: SCRAM-SHA-256, md5 and trust, as server ([`auth::ServerAuth`]) and client ([`auth::ClientAuth`]).
//! - [`classify`]: read or write, and session statements, by PostgreSQL's parser; cached.
//! - [`reply`]: encoders for what refract answers itself (errors, auth requests, login).
//! - [`session`]: SET parameters, prepared statements and transaction state to carry across servers.
//! - [`error`]: the crate's error type.

pub mod auth;
pub mod backend;
pub mod classify;
pub mod error;
pub mod frame;
pub mod frontend;
pub mod hybrid;
pub mod notice;
pub mod peer_cancel;
pub mod reply;
pub mod session;
pub mod startup;
pub mod stream;
pub mod text;
mod wire;

pub use backend::{Authentication, BackendMessage, TxStatus};
pub use error::{peer, Error, Side};
pub use frame::Limits;
pub use frontend::FrontendMessage;
pub use notice::ErrorFields;
pub use startup::{Startup, StartupPacket};
