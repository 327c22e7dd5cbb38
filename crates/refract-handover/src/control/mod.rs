//! Control messages dispatcher ↔ agent: codec, epochs, authentication and the channel.
//!
//! # Layout
//! - [`Msg`], [`parse`], [`encode`] (`msg.rs`): the pure length-prefixed binary codec; [`AppState`]:
//!   the agent's serving options inside a `HandOff`.
//! - `wire.rs`: field encoding (integers, byte strings, addresses, [`crate::TcpState`]).
//! - [`EpochTracker`] (`epoch.rs`): per-connection transfer epochs; stale messages refused.
//! - [`ControlKey`], [`NonceCache`] (`auth.rs`): HMAC-SHA256 challenge–response both ways.
//! - [`ControlChannel`] (`channel.rs`): the authenticated TCP channel with heartbeats.

mod auth;
mod channel;
mod epoch;
mod msg;
pub(crate) mod wire;

pub use auth::{ControlKey, NonceCache};
pub use channel::{ChannelOptions, ControlChannel};
pub use epoch::EpochTracker;
pub use msg::{encode, parse, AppState, Msg, Transfer, MAX_FRAME, NONCE_LEN, VERSION};
