//! LISTEN/NOTIFY in transaction mode without pinning: refract LISTENs once per channel on a
//! dedicated connection to the primary ([`Notifier`]'s task) and hands each NotificationResponse
//! to the clients that listen on its channel ([`Listening`], a client's part, kept in its
//! session's `held` state). The session's side, answering a client's LISTEN/UNLISTEN and
//! delivering its notifications, is `listen`.
//!
//! A listening client's own notifications must reach it before the ReadyForQuery of the
//! transaction that sent them, as on PostgreSQL, but they come on the listener connection,
//! after the client's own connection has answered. [`Listening::catch_up`] closes that gap
//! with a round trip on the listener connection: a committing backend signals the listeners
//! before its ReadyForQuery, and a listening backend sends what it was signalled before it
//! reads its next query, so once an empty query has been answered there, every notification
//! committed before it has been dispatched.

use crate::client::wire::Frame;
use crate::error::PgError;
use crate::server::servers::Servers;
use crate::server::ServerConn;
use bytes::{Bytes, BytesMut};
use refract_pg::{BackendMessage, FrontendMessage};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

type Subscribers = HashMap<String, HashMap<u64, mpsc::UnboundedSender<Bytes>>>;

/// The channels clients listen on, and the task that listens on the primary for them.
#[derive(Debug, Default)]
pub(crate) struct Notifier {
    subscribers: Mutex<Subscribers>,
    task: Mutex<Option<mpsc::UnboundedSender<Cmd>>>,
}

/// What the listener task is asked to do.
#[derive(Debug)]
enum Cmd {
    /// LISTEN on the server unless it already does; answer once it does.
    Listen(String, oneshot::Sender<Result<(), String>>),
    /// UNLISTEN on the server if no client listens any more.
    Unlisten(String),
    /// Answer once everything committed so far has been dispatched (a round trip).
    CatchUp(oneshot::Sender<()>),
}

/// The longest a ReadyForQuery waits for the listener to catch up (a listener connection that
/// is slow or reconnecting delays the client no further; its notifications then come after).
const CATCH_UP_LIMIT: Duration = Duration::from_secs(1);

impl Notifier {
    fn subscribers(&self) -> std::sync::MutexGuard<'_, Subscribers> {
        self.subscribers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The listener task's mailbox, starting it (on this event loop) at first use.
    fn task(self: &Arc<Self>, servers: &Arc<Servers>, stop: &CancellationToken) -> mpsc::UnboundedSender<Cmd> {
        let mut slot = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(tx) = slot.as_ref().filter(|tx| !tx.is_closed()) {
            return tx.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let task =
            ListenerTask { notifier: self.clone(), servers: servers.clone(), conn: None, listened: BTreeSet::new() };
        tokio::spawn(task.run(rx, stop.clone()));
        *slot = Some(tx.clone());
        tx
    }

    /// Hands a NotificationResponse to every client listening on its channel.
    fn dispatch(&self, frame: Bytes) {
        let Ok(BackendMessage::NotificationResponse { channel, .. }) = BackendMessage::decode(b'A', &frame[5..]) else {
            return;
        };
        if let Some(subs) = self.subscribers().get(&channel) {
            for tx in subs.values() {
                let _ = tx.send(frame.clone());
            }
        }
    }

    /// Asks a running listener task to UNLISTEN `channel` (if nobody listens again meanwhile).
    fn unlisten_later(&self, channel: String) {
        self.send(Cmd::Unlisten(channel));
    }

    /// Sends `cmd` to the listener task if it runs; whether it does.
    fn send(&self, cmd: Cmd) -> bool {
        match self.task.lock().unwrap_or_else(PoisonError::into_inner).as_ref() {
            Some(tx) => tx.send(cmd).is_ok(),
            None => false,
        }
    }

    fn listened_by_anyone(&self, channel: &str) -> bool {
        self.subscribers().get(channel).is_some_and(|s| !s.is_empty())
    }

    fn channels(&self) -> Vec<String> {
        self.subscribers().iter().filter(|(_, s)| !s.is_empty()).map(|(c, _)| c.clone()).collect()
    }

    /// Removes `client` from `channel`; true when nobody listens on it any more.
    fn remove(&self, channel: &str, client: u64) -> bool {
        let mut subs = self.subscribers();
        let Some(s) = subs.get_mut(channel) else { return false };
        s.remove(&client);
        if s.is_empty() {
            subs.remove(channel);
            return true;
        }
        false
    }
}

/// The dedicated connection to the primary and the channels it listens on.
struct ListenerTask {
    notifier: Arc<Notifier>,
    servers: Arc<Servers>,
    conn: Option<ServerConn>,
    listened: BTreeSet<String>,
}

impl ListenerTask {
    async fn run(mut self, mut cmds: mpsc::UnboundedReceiver<Cmd>, stop: CancellationToken) {
        loop {
            if self.conn.is_none() && !self.notifier.channels().is_empty() {
                // The connection broke while clients listen: listen again (what was notified
                // meanwhile is lost), retrying every second.
                if let Err(e) = self.connect().await {
                    tracing::debug!(error = %e, "LISTEN connection to the primary failed");
                }
            }
            let retry = self.conn.is_none() && !self.notifier.channels().is_empty();
            let cmd = tokio::select! {
                _ = stop.cancelled() => return,
                cmd = cmds.recv() => match cmd {
                    Some(cmd) => cmd,
                    None => return,
                },
                frame = next_frame(&mut self.conn) => {
                    match frame {
                        Ok((b'A', f)) => self.notifier.dispatch(f),
                        Ok(_) => {}
                        Err(e) => {
                            tracing::debug!(error = %e, "LISTEN connection to the primary lost");
                            self.conn = None;
                        }
                    }
                    continue;
                }
                _ = tokio::time::sleep(Duration::from_secs(1)), if retry => continue,
            };
            self.handle(cmd).await;
        }
    }

    async fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Listen(channel, done) => {
                let r = self.listen(&channel).await.map_err(|e| e.to_string());
                let _ = done.send(r);
            }
            Cmd::Unlisten(channel) => {
                if !self.notifier.listened_by_anyone(&channel) && self.listened.remove(&channel) {
                    if let Err(e) = self.exec(&format!("UNLISTEN {}", quote(&channel))).await {
                        tracing::debug!(error = %e, "UNLISTEN on the primary failed");
                    }
                }
            }
            Cmd::CatchUp(done) => {
                // Not connected: nothing can arrive before a new connection listens again.
                if self.conn.is_some() {
                    if let Err(e) = self.exec("").await {
                        tracing::debug!(error = %e, "listener round trip failed");
                    }
                }
                let _ = done.send(());
            }
        }
    }

    async fn listen(&mut self, channel: &str) -> Result<(), PgError> {
        if self.conn.is_none() {
            self.connect().await?;
        }
        if self.listened.contains(channel) {
            return Ok(());
        }
        self.exec(&format!("LISTEN {}", quote(channel))).await?;
        self.listened.insert(channel.to_owned());
        Ok(())
    }

    /// Opens the connection and listens on every channel a client listens on.
    async fn connect(&mut self) -> Result<(), PgError> {
        let primary =
            self.servers.primary().ok_or_else(|| PgError::Unavailable("no primary server is available".into()))?;
        self.conn = Some(ServerConn::connect(primary.pool.addr(), primary.pool.login()).await?);
        self.listened.clear();
        for channel in self.notifier.channels() {
            self.exec(&format!("LISTEN {}", quote(&channel))).await?;
            self.listened.insert(channel);
        }
        Ok(())
    }

    /// Runs `sql`, dispatching notifications that arrive meanwhile.
    async fn exec(&mut self, sql: &str) -> Result<(), PgError> {
        let result = self.exec_inner(sql).await;
        if matches!(result, Err(PgError::Io { .. } | PgError::Closed(_))) {
            self.conn = None;
        }
        result
    }

    async fn exec_inner(&mut self, sql: &str) -> Result<(), PgError> {
        let Some(conn) = self.conn.as_mut() else { return Err(PgError::Unavailable("not connected".into())) };
        let mut out = BytesMut::new();
        FrontendMessage::Query(sql.to_owned()).encode(&mut out);
        conn.wire.send(&out).await?;
        let mut error = None;
        loop {
            let (tag, frame) = conn.wire.recv().await?;
            match tag {
                b'A' => self.notifier.dispatch(frame),
                b'E' => error = Some(BackendMessage::decode(tag, &frame[5..])?),
                b'Z' => break,
                _ => {}
            }
        }
        match error {
            Some(BackendMessage::ErrorResponse(e)) => Err(PgError::Server(e)),
            _ => Ok(()),
        }
    }
}

/// The next message on the listener connection; never ready without one.
async fn next_frame(conn: &mut Option<ServerConn>) -> Result<Frame, PgError> {
    match conn {
        Some(c) => c.wire.recv().await,
        None => std::future::pending().await,
    }
}

/// `name` as a quoted identifier.
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// One client's channels and the notifications queued for it; leaves them all on drop.
#[derive(Debug)]
pub(crate) struct Listening {
    client: u64,
    notifier: Arc<Notifier>,
    tx: mpsc::UnboundedSender<Bytes>,
    rx: mpsc::UnboundedReceiver<Bytes>,
    channels: BTreeSet<String>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        for channel in std::mem::take(&mut self.channels) {
            if self.notifier.remove(&channel, self.client) {
                self.notifier.unlisten_later(channel);
            }
        }
    }
}

impl Listening {
    /// Client `client`'s channels, none yet.
    pub(crate) fn new(client: u64, notifier: Arc<Notifier>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Listening { client, notifier, tx, rx, channels: BTreeSet::new() }
    }

    /// Whether a queued notification is still wanted (the client may have unlistened since).
    fn wants(&self, frame: &Bytes) -> bool {
        match BackendMessage::decode(b'A', &frame[5..]) {
            Ok(BackendMessage::NotificationResponse { channel, .. }) => self.channels.contains(&channel),
            _ => false,
        }
    }

    /// Appends the notifications already queued (and still wanted) to `out`.
    pub(crate) fn take_queued(&mut self, out: &mut BytesMut) {
        while let Ok(n) = self.rx.try_recv() {
            if self.wants(&n) {
                out.extend_from_slice(&n);
            }
        }
    }

    /// Whether the client listens on any channel.
    pub(crate) fn listens(&self) -> bool {
        !self.channels.is_empty()
    }

    /// Waits (at most `CATCH_UP_LIMIT`) until the listener has dispatched every notification
    /// committed before now, so [`Listening::take_queued`] finds them (see the module's text).
    pub(crate) async fn catch_up(&self) {
        let (done, answer) = oneshot::channel();
        if self.notifier.send(Cmd::CatchUp(done)) {
            let _ = tokio::time::timeout(CATCH_UP_LIMIT, answer).await;
        }
    }

    /// Waits for the next notification; `None` when it is no longer wanted.
    pub(crate) async fn next(&mut self) -> Option<Bytes> {
        let n = self.rx.recv().await;
        n.filter(|n| self.wants(n))
    }

    /// Listens on `channel` (once the listener task, started on first use, listens on the
    /// primary); on failure the client does not listen on it.
    pub(crate) async fn listen(
        &mut self,
        channel: &str,
        servers: &Arc<Servers>,
        stop: &CancellationToken,
    ) -> Result<(), String> {
        if self.channels.contains(channel) {
            return Ok(());
        }
        let notifier = self.notifier.clone();
        notifier.subscribers().entry(channel.to_owned()).or_default().insert(self.client, self.tx.clone());
        self.channels.insert(channel.to_owned());
        let (done, answer) = oneshot::channel();
        let task = notifier.task(servers, stop);
        let result = match task.send(Cmd::Listen(channel.to_owned(), done)) {
            Ok(()) => answer.await.unwrap_or_else(|_| Err("the listener stopped".into())),
            Err(_) => Err("the listener stopped".into()),
        };
        if result.is_err() {
            self.unlisten(Some(channel));
        }
        result
    }

    /// Stops listening on `channel` (every channel: `None`).
    pub(crate) fn unlisten(&mut self, channel: Option<&str>) {
        let gone: Vec<String> = match channel {
            Some(c) => self.channels.take(c).into_iter().collect(),
            None => std::mem::take(&mut self.channels).into_iter().collect(),
        };
        for channel in gone {
            if self.notifier.remove(&channel, self.client) {
                self.notifier.unlisten_later(channel);
            }
        }
    }
}
