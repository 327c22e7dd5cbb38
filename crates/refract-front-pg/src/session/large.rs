//! Large messages relayed in pieces rather than whole, by the bound connection ([`Bound`]):
//! DataRow and CopyData from the server to the client, CopyData from the client to the server
//! during COPY FROM STDIN. Both are passed on unread, so refract only needs their type; see
//! [`Wire::pipe_large`].
//!
//! [`Wire::pipe_large`]: crate::client::wire::Wire::pipe_large

use super::Bound;
use crate::client::wire::Wire;
use crate::error::PgError;

/// Answers refract relays unread: DataRow, CopyData.
fn answer_unread(tag: u8) -> bool {
    matches!(tag, b'D' | b'd')
}

/// What the client sends during COPY FROM STDIN that refract passes on unread: CopyData.
fn copy_data(tag: u8) -> bool {
    tag == b'd'
}

impl Bound {
    /// If the server's next message is a large DataRow or CopyData, streams it to the client's
    /// `wire` and returns `true`. Pending output must have been flushed (order).
    pub(crate) async fn stream_to_client(&mut self, client: &mut Wire) -> Result<bool, PgError> {
        self.guard.wire.pipe_large(client, answer_unread).await
    }

    /// If the client's next message (on `client`) is a large CopyData, streams it to the server
    /// and returns `true`. Pending input must have been sent on (order).
    pub(crate) async fn stream_from_client(&mut self, client: &mut Wire) -> Result<bool, PgError> {
        client.pipe_large(&mut self.guard.wire, copy_data).await
    }
}
