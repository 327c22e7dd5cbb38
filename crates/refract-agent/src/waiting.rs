//! [`Waiting`]: the PostgreSQL server connections that stopped at a large result and wait for
//! the hand-over link's verdict (`pg/`), shared by the PostgreSQL listener and the links.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// What a waiting connection is told by the hand-over link.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// The hand-off was refused or failed before the socket was taken: forward the rest to
    /// refract (it relays).
    Relay,
    /// Write the rest of the result to `client`, then report on `done`.
    Serve { client: TcpStream, done: oneshot::Sender<Served> },
}

/// How the pump ended its part.
#[derive(Debug)]
pub(crate) enum Served {
    /// At a message boundary (after ReadyForQuery, or before a COPY FROM/BOTH start): the
    /// socket goes back; `sent` bytes were written to it.
    Boundary { client: TcpStream, sent: u64 },
    /// The client connection must end (it went away or stalled); the server connection ends
    /// too (its query cancelled).
    Close { sent: u64, reason: String },
}

/// The connections waiting for a verdict, by id (shared by the listener and the links).
#[derive(Debug, Clone, Default)]
pub struct Waiting(Arc<Mutex<HashMap<u64, oneshot::Sender<Verdict>>>>);

impl Waiting {
    pub(crate) fn insert(&self, id: u64, tx: oneshot::Sender<Verdict>) {
        self.lock().insert(id, tx);
    }

    pub(crate) fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// The waiting connection `id`, taken out (a hand-off names it once).
    pub(crate) fn take(&self, id: u64) -> Option<oneshot::Sender<Verdict>> {
        self.lock().remove(&id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<Verdict>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
