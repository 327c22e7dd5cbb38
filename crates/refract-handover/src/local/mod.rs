//! Same-host hand-over: the dispatcher and an agent on one host move a client socket between
//! them over a Unix stream (SCM_RIGHTS) instead of TCP_REPAIR, with the same epochs.
//!
//! # Layout
//! - [`LocalMsg`], [`parse`], [`encode`] (`msg.rs`): the pure codec of the link's messages.
//! - [`LocalLink`] (`link.rs`): one async Unix-stream link; a frame may carry a descriptor.

mod link;
mod msg;

pub use link::LocalLink;
pub use msg::{encode, parse, LocalMsg, MAX_LOCAL_FRAME};
