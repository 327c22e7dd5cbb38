//! The same-host carrier: the dispatcher and an agent on one host move a client socket between
//! them over a Unix stream (SCM_RIGHTS) instead of TCP_REPAIR, with the same messages and epochs.
//!
//! # Layout
//! - [`LocalLink`] (`link.rs`): one async Unix-stream link, a [`crate::Carrier`]; a frame may
//!   carry a descriptor.

mod link;

pub use link::LocalLink;
