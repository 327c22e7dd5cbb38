//! Bind messages longer than the streaming bound ([`STREAM_ABOVE`], as for DataRow and
//! CopyData in `large`) relayed in pieces, never held whole: a 50 MiB parameter costs refract a
//! read buffer, not 50 MiB.
//!
//! Such a Bind is a dispatch point, as a Flush is. The messages queued before it run first as a
//! Flush-ended batch on the connection the Bind will use (their answers relayed, so that no
//! answer of theirs waits behind the Bind's bytes). The Bind is planned like any other (the
//! client's statement name becomes the server's, its statement prepared there first if
//! missing) and its head sent with that name; its parameter bytes follow from the client's
//! socket to the server's as they arrive; a Flush refract adds brings its BindComplete (or
//! error) back. The batch then goes on on that connection until Sync, as after a Flush.
//!
//! Routing: refract cannot see what follows the Bind in its batch, and a write after a read
//! bound on a replica could not run there, so a batch with a large Bind goes to the primary
//! (or stays on the connection it is bound to, as after a Flush).
//!
//! A client that leaves in the middle of the Bind ends its session; the server connection,
//! holding half a message, is dropped (closed), never given back to the pool.

use super::phase::{BatchEnd, Event};
use super::{Session, Wrote};
use crate::client::wire::STREAM_ABOVE;
use crate::error::PgError;
use bytes::BytesMut;
use refract_pg::classify::Route;
use refract_pg::frame::Header;
use refract_pg::frontend::{bind_names, encode_bind_head, Bind};
use refract_pg::stream::HEAD_LEN;
use refract_pg::{Error, FrontendMessage, Side};

/// The client messages refract relays in pieces when large (see [`STREAM_ABOVE`]): Bind.
pub(crate) fn streamed_from_client(tag: u8) -> bool {
    tag == b'B'
}

impl Session {
    /// Relays the large Bind whose header `h` is at the front of the client's buffer.
    pub(crate) async fn large_bind(&mut self, h: Header) -> Result<(), PgError> {
        let (portal, statement, names) = self.read_bind_names(h).await?;
        let rest = h.total - HEAD_LEN - names;
        if self.phase().discarding() {
            return self.io.wire.pass_on(None, rest).await;
        }
        let queued = std::mem::take(&mut self.batch);
        if let Err(e) = self.bind(Route::Write, None, &[], None).await {
            self.io.wire.pass_on(None, rest).await?;
            return self.refuse(e, BatchEnd::Flush).await;
        }
        let bind = FrontendMessage::Bind(Bind { portal, statement, ..Bind::default() });
        let queued_writes = self.batch_route(&queued) == Route::Write;
        let result = match self.before_bind(queued).await {
            Ok(()) => {
                let writes = queued_writes || self.batch_route(std::slice::from_ref(&bind)) == Route::Write;
                self.note_write(if writes { Wrote::Yes } else { Wrote::No });
                self.stream_bind(bind, rest).await
            }
            Err(e) => self.io.wire.pass_on(None, rest).await.and(Err(e)),
        };
        self.settle(result).await
    }

    /// Read-your-writes: the batch writes on the primary (its Sync's route does not say so,
    /// since the Bind is not part of what follows it).
    fn note_write(&mut self, wrote: Wrote) {
        if let Some(b) = self.bound.as_mut() {
            b.note_write(wrote);
        }
    }

    /// Reads a large Bind's head and its portal and statement names (which must come within
    /// the first [`STREAM_ABOVE`] bytes), and consumes them.
    async fn read_bind_names(&mut self, h: Header) -> Result<(String, String, usize), PgError> {
        loop {
            let buf = self.io.wire.buffered();
            let body = &buf[HEAD_LEN..buf.len().min(h.total)];
            if let Some((portal, statement, len)) = bind_names(body)? {
                let _ = buf.split_to(HEAD_LEN + len);
                return Ok((portal, statement, len));
            }
            if body.len() >= STREAM_ABOVE {
                let reason = "Bind: portal and statement names longer than 64 KiB".into();
                return Err(Error::Malformed { from: Side::Client, reason }.into());
            }
            self.io.wire.fill().await?;
        }
    }

    /// The batch's messages before the Bind run as a Flush-ended batch on the bound connection.
    async fn before_bind(&mut self, mut queued: Vec<FrontendMessage>) -> Result<(), PgError> {
        let executes = queued.iter().any(|m| matches!(m, FrontendMessage::Execute { .. }));
        self.advance(Event::Batch { end: BatchEnd::Flush, executes });
        if queued.is_empty() {
            return Ok(());
        }
        queued.push(FrontendMessage::Flush);
        let key = self.batch_key(&queued);
        self.run_bound_batch(queued, BatchEnd::Flush, Route::Write, key).await
    }

    /// Sends the Bind's head (after whatever its statement needs), then its `rest` bytes as
    /// they arrive, then a Flush, and relays the answers.
    async fn stream_bind(&mut self, bind: FrontendMessage, rest: usize) -> Result<(), PgError> {
        let mut out = BytesMut::new();
        let head = self.mirror_batch_names(std::slice::from_ref(&bind)).await.and_then(|()| {
            let prefixed = self.params_prefix(&mut out)?;
            let plan = self.bind_plan(bind, rest)?;
            out.extend_from_slice(&plan.out);
            Ok((prefixed, plan.expect))
        });
        let (prefixed, expect) = match head {
            Ok(head) => head,
            Err(e) => return self.io.wire.pass_on(None, rest).await.and(Err(e)),
        };
        let b = self.bound.as_mut().ok_or_else(|| PgError::Unavailable("internal: no server bound".into()))?;
        let sent = b.guard.wire.send(&out).await;
        let to = if sent.is_ok() { Some(&mut b.guard.wire) } else { None };
        self.io.wire.pass_on(to, rest).await?;
        sent?;
        let mut flush = BytesMut::new();
        FrontendMessage::Flush.encode(&mut flush);
        self.conn()?.wire.send(&flush).await?;
        if prefixed {
            self.drain_prefix().await?;
        }
        self.relay_batch(expect).await.map(drop)
    }

    /// The Bind planned for the bound connection, its encoding cut back to a head announcing
    /// `rest` bytes more.
    fn bind_plan(&mut self, bind: FrontendMessage, rest: usize) -> Result<super::batch::Plan, PgError> {
        let mut plan = self.plan(vec![bind])?;
        let at = plan.bind_at.ok_or_else(|| PgError::Unavailable("internal: Bind not planned".into()))?;
        let planned = plan.out.split_off(at);
        let Some((portal, statement, _)) = bind_names(&planned[HEAD_LEN..])? else {
            return Err(PgError::Unavailable("internal: Bind planned without names".into()));
        };
        encode_bind_head(&portal, &statement, rest, &mut plan.out);
        Ok(plan)
    }
}
