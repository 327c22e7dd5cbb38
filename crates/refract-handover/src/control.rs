//! The cross-host carrier: authentication and the TCP channel dispatcher ↔ agent.
//!
//! # Layout
//! - [`ControlKey`], [`NonceCache`] (`auth.rs`): HMAC-SHA256 challenge–response both ways.
//! - [`ControlChannel`] (`channel.rs`): the authenticated TCP channel with heartbeats, a
//!   [`crate::Carrier`].

mod auth;
mod channel;

pub use auth::{ControlKey, NonceCache};
pub use channel::{ChannelOptions, ControlChannel};
