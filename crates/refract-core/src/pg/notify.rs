//! LISTEN/NOTIFY in transaction mode without pinning: refract LISTENs once per channel on a
//! dedicated connection to the primary ([`Notifier`]'s task) and hands each NotificationResponse
//! to the clients that listen on its channel ([`Listening`]), also while they are idle.
//! A client's LISTEN/UNLISTEN (simple or extended protocol) is answered by refract.

use super::bind::streamed_from_client;
use super::config::PoolMode;
use super::error::PgError;
use super::server::ServerConn;
use super::servers::Servers;
use super::session::Session;
use super::wire::{Frame, Incoming};
use bytes::{Bytes, BytesMut};
use refract_pg::classify::Statement;
use refract_pg::frontend::Target;
use refract_pg::notice::sqlstate;
use refract_pg::session::Origin;
use refract_pg::{reply, BackendMessage, FrontendMessage, TxStatus};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

type Subscribers = HashMap<String, HashMap<u64, mpsc::UnboundedSender<Bytes>>>;

/// The channels clients listen on, and the task that listens on the primary for them.
#[derive(Debug, Default)]
pub(super) struct Notifier {
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
}

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
        if let Some(tx) = self.task.lock().unwrap_or_else(PoisonError::into_inner).as_ref() {
            let _ = tx.send(Cmd::Unlisten(channel));
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
pub(super) struct Listening {
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
    /// Whether a queued notification is still wanted (the client may have unlistened since).
    fn wants(&self, frame: &Bytes) -> bool {
        match BackendMessage::decode(b'A', &frame[5..]) {
            Ok(BackendMessage::NotificationResponse { channel, .. }) => self.channels.contains(&channel),
            _ => false,
        }
    }
}

impl Session {
    /// The client's next message (or the head of a large Bind, relayed in pieces by `bind`);
    /// while it is idle between transactions, notifications for its channels are sent to it as
    /// they come.
    pub(super) async fn recv_client(&mut self) -> Result<Incoming, PgError> {
        loop {
            let idle = self.batch.is_empty() && self.state.tx.status() == TxStatus::Idle;
            let Some(l) = self.held.listening.as_mut().filter(|_| idle) else {
                return self.wire.recv_unless_large(streamed_from_client).await;
            };
            while let Ok(n) = l.rx.try_recv() {
                if l.wants(&n) {
                    self.out.extend_from_slice(&n);
                }
            }
            if !self.out.is_empty() {
                self.wire.send(&self.out).await?;
                self.out.clear();
                continue;
            }
            tokio::select! {
                biased;
                f = self.wire.recv_unless_large(streamed_from_client) => return f,
                n = l.rx.recv() => {
                    if let Some(n) = n.filter(|n| l.wants(n)) {
                        self.wire.send(&n).await?;
                    }
                }
            }
        }
    }

    /// A query made only of LISTEN/UNLISTEN, in transaction mode: answered by refract.
    pub(super) async fn answer_listen(&mut self, statements: &[Statement]) -> Result<bool, PgError> {
        if !self.listens_locally() || !is_listen_only(statements) {
            return Ok(false);
        }
        for st in statements {
            match self.listen_statement(st).await {
                Ok(tag) => self.out.extend_from_slice(&BackendMessage::CommandComplete(tag.into()).to_bytes()),
                Err(e) => {
                    self.out.extend_from_slice(&reply::error(sqlstate::CONNECTION_FAILURE, &e.to_string()));
                    break;
                }
            }
        }
        self.out.extend_from_slice(&reply::ready_for_query(self.state.tx.status()));
        self.flush().await?;
        Ok(true)
    }

    fn listens_locally(&self) -> bool {
        self.pool_mode == PoolMode::Transaction && self.state.tx.status() != TxStatus::Failed
    }

    /// Runs one LISTEN/UNLISTEN for this client; the CommandComplete tag.
    async fn listen_statement(&mut self, st: &Statement) -> Result<&'static str, PgError> {
        match st {
            Statement::Listen { channel } => {
                self.listen(channel).await?;
                Ok("LISTEN")
            }
            Statement::Unlisten { channel } => {
                self.unlisten(channel.as_deref());
                Ok("UNLISTEN")
            }
            _ => Err(PgError::Unavailable("internal: not a LISTEN".into())),
        }
    }

    async fn listen(&mut self, channel: &str) -> Result<(), PgError> {
        let notifier = self.shared.notifier.clone();
        let id = self.client.info.id;
        let l = self.held.listening.get_or_insert_with(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            Listening { client: id, notifier: notifier.clone(), tx, rx, channels: BTreeSet::new() }
        });
        if l.channels.contains(channel) {
            return Ok(());
        }
        notifier.subscribers().entry(channel.to_owned()).or_default().insert(id, l.tx.clone());
        l.channels.insert(channel.to_owned());
        let (done, answer) = oneshot::channel();
        let task = notifier.task(&self.shared.servers, &self.shared.stop);
        let result = match task.send(Cmd::Listen(channel.to_owned(), done)) {
            Ok(()) => answer.await.unwrap_or_else(|_| Err("the listener stopped".into())),
            Err(_) => Err("the listener stopped".into()),
        };
        if let Err(e) = result {
            self.unlisten(Some(channel));
            return Err(PgError::Unavailable(format!("refract: could not LISTEN on the primary: {e}")));
        }
        Ok(())
    }

    fn unlisten(&mut self, channel: Option<&str>) {
        let Some(l) = self.held.listening.as_mut() else { return };
        let gone: Vec<String> = match channel {
            Some(c) => l.channels.take(c).into_iter().collect(),
            None => std::mem::take(&mut l.channels).into_iter().collect(),
        };
        for channel in gone {
            if self.shared.notifier.remove(&channel, l.client) {
                self.shared.notifier.unlisten_later(channel);
            }
        }
    }

    /// An extended-protocol batch that only parses, binds, describes and executes LISTEN or
    /// UNLISTEN, in transaction mode: answered by refract. `Some(msgs)` gives a batch back
    /// for the server.
    pub(super) async fn listen_batch(
        &mut self,
        msgs: Vec<FrontendMessage>,
    ) -> Result<Option<Vec<FrontendMessage>>, PgError> {
        if !self.listens_locally() || self.skip_until_sync || self.unsynced {
            return Ok(Some(msgs));
        }
        let Some(portals) = self.listen_portals(&msgs) else { return Ok(Some(msgs)) };
        let synced = matches!(msgs.last(), Some(FrontendMessage::Sync));
        for msg in msgs {
            let answer = match msg {
                FrontendMessage::Parse { name, query, param_types } => {
                    self.state.prepared.parse(&name, &query, &param_types, false);
                    BackendMessage::ParseComplete.to_bytes()
                }
                FrontendMessage::Bind(_) => BackendMessage::BindComplete.to_bytes(),
                FrontendMessage::Describe(Target::Statement, _) => {
                    self.out.extend_from_slice(&BackendMessage::ParameterDescription(vec![]).to_bytes());
                    BackendMessage::NoData.to_bytes()
                }
                FrontendMessage::Describe(Target::Portal, _) => BackendMessage::NoData.to_bytes(),
                FrontendMessage::Close(target, name) => {
                    if target == Target::Statement {
                        self.state.prepared.close(&name);
                    }
                    BackendMessage::CloseComplete.to_bytes()
                }
                FrontendMessage::Execute { portal, .. } => {
                    let st = portals.get(&portal).cloned().unwrap_or(Statement::Write);
                    match self.listen_statement(&st).await {
                        Ok(tag) => BackendMessage::CommandComplete(tag.into()).to_bytes(),
                        Err(e) => {
                            self.refuse(e, synced).await?;
                            return Ok(None);
                        }
                    }
                }
                FrontendMessage::Sync => reply::ready_for_query(self.state.tx.status()),
                _ => continue,
            };
            self.out.extend_from_slice(&answer);
        }
        self.flush().await?;
        Ok(None)
    }

    /// The LISTEN/UNLISTEN each portal of a batch runs, if the batch does nothing else.
    fn listen_portals(&self, msgs: &[FrontendMessage]) -> Option<HashMap<String, Statement>> {
        let mut statements: HashMap<&str, Statement> = HashMap::new();
        let mut portals = HashMap::new();
        let mut any = false;
        for msg in msgs {
            match msg {
                // A name the client has already: the server path answers 42P05.
                FrontendMessage::Parse { name, .. } if !name.is_empty() && self.state.prepared.get(name).is_some() => {
                    return None
                }
                FrontendMessage::Parse { name, query, .. } => {
                    statements.insert(name.as_str(), self.listen_query(query)?);
                    any = true;
                }
                FrontendMessage::Bind(b) => {
                    let st = match statements.get(b.statement.as_str()) {
                        Some(st) => st.clone(),
                        None => match &self.state.prepared.get(&b.statement)?.origin {
                            Origin::Protocol { query, .. } => self.listen_query(query)?,
                            Origin::Sql { .. } => return None,
                        },
                    };
                    portals.insert(b.portal.clone(), st);
                    any = true;
                }
                FrontendMessage::Describe(Target::Statement, n) if statements.contains_key(n.as_str()) => {}
                FrontendMessage::Describe(Target::Portal, p) | FrontendMessage::Execute { portal: p, .. }
                    if portals.contains_key(p) => {}
                FrontendMessage::Close(..) | FrontendMessage::Sync | FrontendMessage::Flush => {}
                _ => return None,
            }
        }
        any.then_some(portals)
    }

    fn listen_query(&self, query: &str) -> Option<Statement> {
        match self.classify_text(query).0.statements.as_slice() {
            [st @ (Statement::Listen { .. } | Statement::Unlisten { .. })] => Some(st.clone()),
            _ => None,
        }
    }
}

fn is_listen_only(statements: &[Statement]) -> bool {
    !statements.is_empty()
        && statements.iter().all(|s| matches!(s, Statement::Listen { .. } | Statement::Unlisten { .. }))
}
