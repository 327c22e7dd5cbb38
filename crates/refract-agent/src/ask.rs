//! [`AskOver`]: the dispatcher, asked over either carrier about each further request of an
//! adopted connection (`Next` → `Serve` / `Return`, and `Idle` where it means something).

use std::convert::Infallible;

use refract_handover::{Carrier, Error, Msg, Result};

use crate::exchange::Ask;

/// The link an adopted connection came over, as [`crate::exchange::Adopted`] asks it.
pub(crate) struct AskOver<'a, C> {
    /// The link.
    pub link: &'a mut C,
    /// The adopted connection.
    pub conn: u64,
}

impl<C: Carrier> Ask for AskOver<'_, C> {
    async fn next(&mut self, request: u64, bytes: &[u8]) -> Result<bool> {
        let conn = self.conn;
        self.link.send(&Msg::Next { conn, request, bytes: bytes.to_vec() }, None).await?;
        match self.link.recv().await? {
            (Msg::Serve { conn: c, request: r }, None) if (c, r) == (conn, request) => Ok(true),
            (Msg::Return { conn: c, request: r }, None) if (c, r) == (conn, request) => Ok(false),
            (other, _) => {
                tracing::warn!(conn, "expected Serve or Return, got {}", other.name());
                Err(Error::Codec("unexpected answer to Next"))
            }
        }
    }

    async fn idle(&mut self, request: u64) -> Result<()> {
        // Across hosts the connection dies with the agent (the dispatcher kept no descriptor):
        // there is nothing to say.
        if !C::SAME_HOST {
            return Ok(());
        }
        self.link.send(&Msg::Idle { conn: self.conn, request }, None).await
    }

    async fn beat(&mut self) -> Result<Infallible> {
        self.link.beat().await
    }
}
