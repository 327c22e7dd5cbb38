//! Extended-protocol batches (Parse/Bind/Describe/Execute/Close up to Sync or Flush): routed
//! as a whole, named statements renamed to refract's global names and prepared again on
//! whichever server connection runs them; answers relayed in order, with the answers refract
//! owes for messages it did not need to send (ParseComplete, CloseComplete) put in place.

use super::handover::Rest;
use super::held::{BatchStart, Outcome};
use super::phase::{BatchEnd, Event};
use super::relay::ReadyFor;
use super::{Bound, Session, Wrote, FLUSH_AT};
use crate::error::PgError;
use crate::sharding::Placed;
use bytes::{Bytes, BytesMut};
use refract_pg::classify::{fingerprint, Classification, Route};
use refract_pg::frontend::Target;
use refract_pg::session::{Origin, PreparedStatement};
use refract_pg::{reply, BackendMessage, FrontendMessage};
use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hasher;
use std::sync::Arc;

/// What answer a message sent to the server ends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Parse,
    Bind,
    Close,
    DescribeStatement,
    DescribePortal,
    Execute,
    Sync,
    Other,
}

impl Kind {
    fn of(msg: &FrontendMessage) -> Kind {
        match msg {
            FrontendMessage::Parse { .. } => Kind::Parse,
            FrontendMessage::Bind(_) => Kind::Bind,
            FrontendMessage::Close(..) => Kind::Close,
            FrontendMessage::Describe(Target::Statement, _) => Kind::DescribeStatement,
            FrontendMessage::Describe(Target::Portal, _) => Kind::DescribePortal,
            FrontendMessage::Execute { .. } => Kind::Execute,
            FrontendMessage::Sync => Kind::Sync,
            _ => Kind::Other,
        }
    }

    /// Whether `tag` is the last answer to this message.
    fn ends_with(self, tag: u8) -> bool {
        match self {
            Kind::Parse => tag == b'1',
            Kind::Bind => tag == b'2',
            Kind::Close => tag == b'3',
            Kind::DescribeStatement | Kind::DescribePortal => tag == b'T' || tag == b'n',
            Kind::Execute => matches!(tag, b'C' | b'I' | b's'),
            Kind::Sync => tag == b'Z',
            Kind::Other => tag == b'V',
        }
    }
}

/// What a ParseComplete from the server establishes.
#[derive(Debug, Clone)]
pub(crate) enum Made {
    /// This global name is prepared on the connection (refract prepared it silently).
    Global(String),
    /// The connection's unnamed statement is `ps` (parsed again silently).
    Unnamed(Arc<PreparedStatement>),
    /// The client's own Parse of `ps`, sent as `global` (`None`: the unnamed statement). It
    /// replaced `previous` under that name in the client's registry, which is put back if
    /// the server skips the Parse (an earlier error in the batch).
    Parse { global: Option<String>, ps: Arc<PreparedStatement>, previous: Option<Arc<PreparedStatement>> },
    /// A stand-in for a Parse PostgreSQL refuses: it fails on the server, and the client gets
    /// this error in place of the server's (`None`: the server's own).
    Refused(Option<Bytes>),
}

/// An answer expected in the server's stream.
#[derive(Debug)]
pub(crate) enum Expect {
    /// The server answers this message; relay it unless refract sent the message itself.
    /// `runs`: what an Execute runs (its SETs are tracked, `extended`).
    Server { kind: Kind, relay: bool, prepares: Option<Made>, runs: Option<Arc<Classification>> },
    /// refract answers in the server's place at this point (for a Parse: what it made).
    Local(Bytes, Option<Made>),
}

/// Whose a message in a rewritten batch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Whose {
    /// The client's: the server's answer is relayed.
    Client,
    /// refract's own: the answer is swallowed.
    Refract,
}

/// A batch being rewritten for one server connection.
#[derive(Default)]
pub(crate) struct Plan {
    pub out: BytesMut,
    pub expect: VecDeque<Expect>,
    /// Global names this batch prepares (not yet confirmed).
    pub preparing: HashSet<String>,
    pub skip: bool,
    /// The client statement the server's unnamed statement will be once the messages planned
    /// so far have run (`None`: none, or not one refract knows).
    pub unnamed: Option<Arc<PreparedStatement>>,
    /// Where the last Bind starts in `out` (a large Bind's head replaces it: `bind`).
    pub bind_at: Option<usize>,
}

impl Plan {
    pub(crate) fn send(&mut self, msg: &FrontendMessage, whose: Whose, prepares: Option<Made>) {
        msg.encode(&mut self.out);
        let kind = Kind::of(msg);
        if matches!(msg, FrontendMessage::Flush) || (self.skip && kind != Kind::Sync) {
            return;
        }
        let relay = whose == Whose::Client;
        self.expect.push_back(Expect::Server { kind, relay, prepares, runs: None });
    }

    /// An Execute of a portal running `runs`.
    pub(crate) fn execute(&mut self, msg: &FrontendMessage, runs: Option<Arc<Classification>>) {
        self.send(msg, Whose::Client, None);
        if let (false, Some(Expect::Server { runs: slot, .. })) = (self.skip, self.expect.back_mut()) {
            *slot = runs;
        }
    }

    fn local(&mut self, answer: Bytes, made: Option<Made>) {
        if !self.skip {
            self.expect.push_back(Expect::Local(answer, made));
        }
    }
}

impl Session {
    /// Runs the batch collected up to this Sync or Flush.
    pub(crate) async fn run_batch(&mut self) -> Result<(), PgError> {
        let msgs = std::mem::take(&mut self.batch);
        let Some(msgs) = self.listen_batch(msgs).await? else { return Ok(()) };
        let end = BatchEnd::of(&msgs);
        if self.bound.is_none() && end == BatchEnd::Sync && msgs.len() == 1 {
            self.io.out.extend_from_slice(&reply::ready_for_query(self.phase().tx()));
            return self.flush().await;
        }
        let route = self.batch_route(&msgs);
        let key = self.batch_key(&msgs);
        let tables = if route == Route::Read { self.batch_tables(&msgs) } else { vec![] };
        let bound = match self.shared.sharding.clone() {
            None => {
                let affinity = if route == Route::Read { self.batch_affinity(&msgs, &tables) } else { None };
                self.bind(route, Some(key), &tables, affinity).await
            }
            Some(sh) => match self.place_batch(&sh, &msgs, route, key, &tables, end).await {
                Placed::Bound(result) => result,
                Placed::Several => return self.run_several(&sh, msgs).await,
                Placed::Answered(result) => return result,
            },
        };
        if let Err(e) = bound {
            return self.refuse(e, end).await;
        }
        let executes = msgs.iter().any(|m| matches!(m, FrontendMessage::Execute { .. }));
        self.advance(Event::Batch { end, executes });
        let result = self.run_bound_batch(msgs, end, route, key).await;
        self.settle(result).await
    }

    pub(crate) async fn run_bound_batch(
        &mut self,
        msgs: Vec<FrontendMessage>,
        end: BatchEnd,
        route: Route,
        key: u64,
    ) -> Result<(), PgError> {
        self.mirror_batch_names(&msgs).await?;
        let started = self.sent(key);
        let mut head = BytesMut::new();
        let prefixed = self.params_prefix(&mut head)?;
        let plan = self.plan(msgs)?;
        if prefixed {
            head.extend_from_slice(&plan.out);
            self.conn()?.wire.send(&head).await?;
            self.drain_prefix().await?;
        } else {
            self.conn()?.wire.send(&plan.out).await?;
        }
        let outcome = self.relay_batch(plan.expect).await?;
        if end == BatchEnd::Sync {
            self.book(started, outcome);
            self.after_ready(if route == Route::Write { Wrote::Yes } else { Wrote::No }).await?;
        }
        Ok(())
    }

    /// The query text of each statement the batch parses or binds, in order (`None`: a Bind of
    /// a statement refract does not know).
    pub(crate) fn statement_texts<'a>(&'a self, msgs: &'a [FrontendMessage]) -> Vec<Option<&'a str>> {
        let mut parsed: HashMap<&str, &str> = HashMap::new();
        let mut texts = vec![];
        for m in msgs {
            match m {
                FrontendMessage::Parse { name, query, .. } => {
                    parsed.insert(name, query);
                    texts.push(Some(query.as_str()));
                }
                FrontendMessage::Bind(b) => texts.push(parsed.get(b.statement.as_str()).copied().or_else(|| {
                    self.state.prepared.get(&b.statement).map(|p| match &p.origin {
                        Origin::Protocol { query, .. } => query.as_str(),
                        Origin::Sql { text } => text.as_str(),
                    })
                })),
                _ => {}
            }
        }
        texts
    }

    /// The batch's kind for its server's adaptive limit and its connection's kind (`sizes.rs`):
    /// the fingerprints of the statements it parses and binds, in order
    /// (`refract_pg::classify::fingerprint` of each query text).
    pub(crate) fn batch_key(&self, msgs: &[FrontendMessage]) -> u64 {
        let mut h = DefaultHasher::new();
        for t in self.statement_texts(msgs).into_iter().flatten() {
            h.write_u64(fingerprint(t));
        }
        h.finish()
    }

    /// The relations the statements a batch parses or binds name, sorted, once each; empty
    /// when one of them is not known (a server that holds every table serves it).
    fn batch_tables(&self, msgs: &[FrontendMessage]) -> Vec<String> {
        let mut tables = vec![];
        for text in self.statement_texts(msgs) {
            let Some(text) = text else { return vec![] };
            let c = self.classify_text(text).0;
            if c.tables.is_empty() {
                return vec![];
            }
            tables.extend(c.tables.iter().cloned());
        }
        tables.sort();
        tables.dedup();
        tables
    }

    /// The affinity key of a read batch (`[balance] policy = "affinity"`): its first Bind's, or
    /// without one (a Parse and Describe ahead of the values) its first statement's.
    fn batch_affinity(&self, msgs: &[FrontendMessage], tables: &[String]) -> Option<u64> {
        let affinity = self.shared.affinity.as_ref()?;
        let texts = self.statement_texts(msgs);
        let first = *texts.first()?;
        let named = msgs.iter().filter(|m| matches!(m, FrontendMessage::Parse { .. } | FrontendMessage::Bind(_)));
        let bound = texts.into_iter().zip(named).find_map(|(text, m)| match m {
            FrontendMessage::Bind(b) => Some((text, b)),
            _ => None,
        });
        match bound {
            Some((text, bind)) => affinity.of_bind(text?, bind, tables),
            None => affinity.of_query(first?, tables),
        }
    }

    /// A batch is a read if every statement it parses or binds is one (and it is not part of a
    /// pipeline run before its end: `Session::pipeline_flush`).
    pub(crate) fn batch_route(&self, msgs: &[FrontendMessage]) -> Route {
        if self.held.batch_start == BatchStart::QuietTime {
            return Route::Write;
        }
        let mut parsed: HashMap<&str, bool> = HashMap::new();
        let mut write = false;
        for m in msgs {
            match m {
                FrontendMessage::Parse { name, query, .. } => {
                    let read = self.is_read(query);
                    parsed.insert(name, read);
                    write |= !read;
                }
                FrontendMessage::Bind(b) => {
                    let known = self.state.prepared.get(&b.statement).map(|p| p.read);
                    write |= !parsed.get(b.statement.as_str()).copied().or(known).unwrap_or(false);
                }
                _ => {}
            }
        }
        if write {
            Route::Write
        } else {
            Route::Read
        }
    }

    pub(crate) fn is_read(&self, query: &str) -> bool {
        self.classify_text(query).0.target(self.state.route) == Route::Read
    }

    /// Rewrites the batch for the bound connection.
    pub(crate) fn plan(&mut self, msgs: Vec<FrontendMessage>) -> Result<Plan, PgError> {
        let unnamed = self.conn()?.unnamed.clone();
        let mut plan = Plan { skip: self.phase().skipping(), unnamed, ..Plan::default() };
        let (mut parsed, mut portals) = (HashMap::new(), HashMap::new());
        for msg in msgs {
            match msg {
                FrontendMessage::Parse { name, query, param_types } => {
                    if !name.is_empty() && self.state.prepared.get(&name).is_some() {
                        self.parse_duplicate(&mut plan, &name);
                        continue;
                    }
                    let (c, untracked) = self.classify_text(&query);
                    if untracked {
                        self.bound.iter_mut().for_each(Bound::untrack);
                    }
                    let read = c.target(self.state.route) == Route::Read;
                    self.note_state(&c);
                    parsed.insert(name.clone(), c);
                    let previous = self.state.prepared.get(&name).cloned();
                    let ps = self.state.prepared.parse(&name, &query, &param_types, read);
                    if name.is_empty() {
                        self.parse_unnamed(&mut plan, ps, previous)?;
                    } else if self.is_prepared(&ps, &plan)? {
                        let made = Made::Parse { global: Some(self.identity(&ps)), ps, previous };
                        plan.local(BackendMessage::ParseComplete.to_bytes(), Some(made));
                    } else {
                        let g = self.identity(&ps);
                        plan.preparing.insert(g.clone());
                        let made = Some(Made::Parse { global: Some(g.clone()), ps, previous });
                        plan.send(&FrontendMessage::Parse { name: g, query, param_types }, Whose::Client, made);
                    }
                }
                FrontendMessage::Bind(mut b) => {
                    if let Some(c) = self.bound_statement(&b.statement, &parsed) {
                        self.note_state(&c);
                        portals.insert(b.portal.clone(), c);
                    }
                    b.statement = self.server_name(&b.statement, &mut plan)?;
                    plan.bind_at = Some(plan.out.len());
                    plan.send(&FrontendMessage::Bind(b), Whose::Client, None);
                }
                FrontendMessage::Describe(Target::Statement, name) => {
                    let name = self.server_name(&name, &mut plan)?;
                    plan.send(&FrontendMessage::Describe(Target::Statement, name), Whose::Client, None);
                }
                FrontendMessage::Close(Target::Statement, name) if !name.is_empty() => {
                    // Other clients may share the server-side statement: it stays prepared.
                    self.state.prepared.close(&name);
                    plan.local(BackendMessage::CloseComplete.to_bytes(), None);
                }
                FrontendMessage::Close(Target::Statement, _) => self.close_unnamed(&mut plan, Whose::Client)?,
                FrontendMessage::Execute { ref portal, .. } => {
                    let runs = portals.get(portal).cloned();
                    plan.execute(&msg, runs);
                }
                msg => plan.send(&msg, Whose::Client, None),
            }
        }
        Ok(plan)
    }

    fn is_prepared(&mut self, ps: &PreparedStatement, plan: &Plan) -> Result<bool, PgError> {
        let g = self.identity(ps);
        Ok(plan.preparing.contains(&g) || self.conn()?.prepared.contains(&g))
    }

    /// The server-side name of a client's statement, preparing it first where it is missing;
    /// a name the client has no statement under is made free on the server (so it answers
    /// `26000` as PostgreSQL would, never with another client's statement).
    fn server_name(&mut self, name: &str, plan: &mut Plan) -> Result<String, PgError> {
        if name.is_empty() {
            self.use_unnamed(plan)?;
            return Ok(String::new());
        }
        let Some(ps) = self.state.prepared.get(name).cloned() else {
            self.close_missing(plan, name)?;
            return Ok(name.to_owned());
        };
        if !matches!(ps.origin, Origin::Protocol { .. }) {
            return Ok(name.to_owned()); // SQL PREPARE: the name is the server's too (mirrored)
        }
        let g = self.identity(&ps);
        if !self.is_prepared(&ps, plan)? {
            prepare_silently(plan, &ps, &g);
        }
        Ok(g)
    }

    /// Relays answers in order, inserting refract's own where due, until all are in; returns
    /// whether an error came.
    pub(crate) async fn relay_batch(&mut self, mut expect: VecDeque<Expect>) -> Result<Outcome, PgError> {
        let mut outcome = Outcome::Ok;
        loop {
            while let Some(Expect::Local(..)) = expect.front() {
                if let Some(Expect::Local(b, _)) = expect.pop_front() {
                    self.io.out.extend_from_slice(&b);
                }
            }
            if expect.is_empty() {
                return self.flush().await.map(|()| outcome);
            }
            let (tag, frame) = self.server_frame().await?;
            self.note_copy(tag);
            match tag {
                refract_pg::hybrid::WANT => {
                    let verbatim = verbatim(&expect) && self.held.failed_prepares.is_empty();
                    self.at_want(if verbatim { Rest::Verbatim } else { Rest::Edited }).await?
                }
                b'S' => {
                    self.bound.iter_mut().for_each(Bound::untrack);
                    self.io.out.extend_from_slice(&frame);
                }
                b'N' => {
                    self.note_notice(&frame);
                    self.io.out.extend_from_slice(&frame);
                }
                b'A' => self.io.out.extend_from_slice(&frame),
                b'E' => {
                    outcome = Outcome::Failed;
                    self.held.ext_outcome = Outcome::Failed;
                    self.note_stale_plan(&frame);
                    let replaced = self.parse_failed(&expect).or_else(|| self.prepare_error_for(&frame));
                    let frame = replaced.unwrap_or(frame);
                    self.io.out.extend_from_slice(&frame);
                    skip_to_sync(&mut expect);
                    self.advance(Event::BatchError { sync_pending: !expect.is_empty() });
                }
                b'G' => {
                    self.io.out.extend_from_slice(&frame);
                    self.flush().await?;
                    self.copy_in().await?;
                }
                _ => self.answer(tag, frame, &mut expect)?,
            }
            if self.io.out.len() >= FLUSH_AT {
                self.flush().await?;
            }
        }
    }

    fn answer(&mut self, tag: u8, frame: Bytes, expect: &mut VecDeque<Expect>) -> Result<(), PgError> {
        let Some(Expect::Server { kind, relay, prepares, runs }) = expect.front() else {
            return Err(PgError::Unavailable(format!("internal: unexpected server message '{}'", char::from(tag))));
        };
        let (kind, relay) = (*kind, *relay);
        if tag == b'1' {
            if let Some(made) = prepares.clone() {
                self.made(made)?;
            }
        }
        if let (b'C', Some(c)) = (tag, runs.clone()) {
            self.executed(&c);
        }
        if tag == b'Z' {
            self.synced();
        }
        if tag == b'C' || tag == b'Z' {
            self.observe(tag, &frame, ReadyFor::Sync)?;
        }
        if relay {
            self.io.out.extend_from_slice(&frame);
        }
        if kind.ends_with(tag) {
            expect.pop_front();
        }
        Ok(())
    }
}

impl Session {
    /// The server says a statement's plan is stale (the schema changed where refract did not
    /// see it: `0A000 cached plan must not change result type`, `XX000 cache lookup failed`):
    /// a new schema epoch, so that Parses from now on prepare afresh instead of sharing it.
    fn note_stale_plan(&self, frame: &Bytes) {
        let Some(Ok(BackendMessage::ErrorResponse(e))) = frame.get(5..).map(|b| BackendMessage::decode(b'E', b)) else {
            return;
        };
        let message = e.message().unwrap_or_default();
        let stale = match e.code() {
            Some("0A000") => message.starts_with("cached plan must not change result type"),
            Some("XX000") => message.starts_with("cache lookup failed"),
            _ => false,
        };
        if stale {
            self.shared.new_schema_epoch();
        }
    }
}

/// Prepares `ps` as `g` ahead of a message that needs it; its ParseComplete is not relayed.
fn prepare_silently(plan: &mut Plan, ps: &Arc<PreparedStatement>, g: &str) {
    plan.preparing.insert(g.to_owned());
    plan.out.extend_from_slice(&ps.prepare_message(g));
    if !plan.skip {
        plan.expect.push_back(Expect::Server {
            kind: Kind::Parse,
            relay: false,
            prepares: Some(Made::Global(g.to_owned())),
            runs: None,
        });
    }
}

/// Whether every answer still expected goes to the client as the server sends it (no answer
/// refract swallows, stands in for or rewrites): only then may the agent write them itself.
fn verbatim(expect: &VecDeque<Expect>) -> bool {
    expect.iter().all(|e| match e {
        Expect::Server { relay, prepares, .. } => *relay && !matches!(prepares, Some(Made::Refused(_))),
        Expect::Local(..) => false,
    })
}

/// After an error the server skips to the next Sync, and refract owes nothing before it.
fn skip_to_sync(expect: &mut VecDeque<Expect>) {
    while let Some(e) = expect.front() {
        if matches!(e, Expect::Server { kind: Kind::Sync, .. }) {
            return;
        }
        expect.pop_front();
    }
}
