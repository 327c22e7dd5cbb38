//! Large messages relayed in pieces rather than whole: DataRow and CopyData from the bound
//! server to the client, CopyData from the client to the server during COPY FROM STDIN. Both
//! are passed on unread, so refract only needs their type; see [`Wire::pipe_large`].
//!
//! [`Wire::pipe_large`]: crate::client::wire::Wire::pipe_large

use super::{Bound, Session};
use crate::error::PgError;

/// Answers refract relays unread: DataRow, CopyData.
fn answer_unread(tag: u8) -> bool {
    matches!(tag, b'D' | b'd')
}

/// What the client sends during COPY FROM STDIN that refract passes on unread: CopyData.
fn copy_data(tag: u8) -> bool {
    tag == b'd'
}

impl Session {
    /// If the bound server's next message is a large DataRow or CopyData, streams it to the
    /// client and returns `true`. Pending output must have been flushed (order).
    pub(crate) async fn stream_from_server(&mut self) -> Result<bool, PgError> {
        let b = bound(&mut self.bound)?;
        b.guard.wire.pipe_large(&mut self.wire, answer_unread).await
    }

    /// If the client's next message is a large CopyData, streams it to the bound server and
    /// returns `true`. Pending input must have been sent on (order).
    pub(crate) async fn stream_to_server(&mut self) -> Result<bool, PgError> {
        let b = bound(&mut self.bound)?;
        self.wire.pipe_large(&mut b.guard.wire, copy_data).await
    }
}

fn bound(b: &mut Option<Bound>) -> Result<&mut Bound, PgError> {
    b.as_mut().ok_or_else(|| PgError::Unavailable("internal: no server bound".into()))
}
