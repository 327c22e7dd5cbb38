//! A transaction-mode client's LISTEN/UNLISTEN (simple or extended protocol), answered by
//! refract through the shared listener (`notify`), and its notifications, sent to it while it
//! is idle between transactions and, as on PostgreSQL, before the ReadyForQuery that ends a
//! transaction: its own ones (the listener caught up first) and any others already in (put
//! there by [`Held::notifications_before_ready`](super::held::Held::notifications_before_ready)).

use super::bind::streamed_from_client;
use super::notify::Listening;
use super::phase::BatchEnd;
use super::Session;
use crate::client::wire::Incoming;
use crate::config::PoolMode;
use crate::error::PgError;
use refract_pg::classify::Statement;
use refract_pg::frontend::Target;
use refract_pg::notice::sqlstate;
use refract_pg::session::Origin;
use refract_pg::{reply, BackendMessage, FrontendMessage, TxStatus};
use std::collections::HashMap;

impl Session {
    /// The client's next message (or the head of a large Bind, relayed in pieces by `bind`);
    /// while it is idle between transactions, notifications for its channels are sent to it as
    /// they come.
    pub(crate) async fn recv_client(&mut self) -> Result<Incoming, PgError> {
        loop {
            let idle = self.batch.is_empty() && self.phase().tx() == TxStatus::Idle;
            let Some(l) = self.held.listening.as_mut().filter(|_| idle) else {
                return self.io.wire.recv_unless_large(streamed_from_client).await;
            };
            l.take_queued(&mut self.io.out);
            if !self.io.out.is_empty() {
                self.io.wire.send(&self.io.out).await?;
                self.io.out.clear();
                continue;
            }
            tokio::select! {
                biased;
                f = self.io.wire.recv_unless_large(streamed_from_client) => return f,
                n = l.next() => {
                    if let Some(n) = n {
                        self.io.wire.send(&n).await?;
                    }
                }
            }
        }
    }

    /// A query made only of LISTEN/UNLISTEN, in transaction mode: answered by refract.
    pub(crate) async fn answer_listen(&mut self, statements: &[Statement]) -> Result<bool, PgError> {
        if !self.listens_locally() || !is_listen_only(statements) {
            return Ok(false);
        }
        for st in statements {
            match self.listen_statement(st).await {
                Ok(tag) => self.io.out.extend_from_slice(&BackendMessage::CommandComplete(tag.into()).to_bytes()),
                Err(e) => {
                    self.io.out.extend_from_slice(&reply::error(sqlstate::CONNECTION_FAILURE, &e.to_string()));
                    break;
                }
            }
        }
        self.io.out.extend_from_slice(&reply::ready_for_query(self.phase().tx()));
        self.flush().await?;
        Ok(true)
    }

    fn listens_locally(&self) -> bool {
        self.pool_mode == PoolMode::Transaction && self.phase().tx() != TxStatus::Failed
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
        let shared = self.shared.clone();
        let id = self.client.info.id;
        let l = self.held.listening.get_or_insert_with(|| Listening::new(id, shared.notifier.clone()));
        l.listen(channel, &shared.servers, &shared.stop)
            .await
            .map_err(|e| PgError::Unavailable(format!("refract: could not LISTEN on the primary: {e}")))
    }

    fn unlisten(&mut self, channel: Option<&str>) {
        if let Some(l) = self.held.listening.as_mut() {
            l.unlisten(channel);
        }
    }

    /// An extended-protocol batch that only parses, binds, describes and executes LISTEN or
    /// UNLISTEN, in transaction mode: answered by refract. `Some(msgs)` gives a batch back
    /// for the server.
    pub(crate) async fn listen_batch(
        &mut self,
        msgs: Vec<FrontendMessage>,
    ) -> Result<Option<Vec<FrontendMessage>>, PgError> {
        if !self.listens_locally() || self.phase().unsynced() {
            return Ok(Some(msgs));
        }
        let Some(portals) = self.listen_portals(&msgs) else { return Ok(Some(msgs)) };
        let end = BatchEnd::of(&msgs);
        for msg in msgs {
            let answer = match msg {
                FrontendMessage::Parse { name, query, param_types } => {
                    self.state.prepared.parse(&name, &query, &param_types, false);
                    BackendMessage::ParseComplete.to_bytes()
                }
                FrontendMessage::Bind(_) => BackendMessage::BindComplete.to_bytes(),
                FrontendMessage::Describe(Target::Statement, _) => {
                    self.io.out.extend_from_slice(&BackendMessage::ParameterDescription(vec![]).to_bytes());
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
                            self.refuse(e, end).await?;
                            return Ok(None);
                        }
                    }
                }
                FrontendMessage::Sync => reply::ready_for_query(self.phase().tx()),
                _ => continue,
            };
            self.io.out.extend_from_slice(&answer);
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
