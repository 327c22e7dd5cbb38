//! An extended-protocol batch that no one shard can run: a statement whose Bind values name
//! several shards (a scatter read, a write on several shards, a write of replicated tables),
//! statements of one batch on different shards (a driver's `executemany`), or the COMMIT of a
//! transaction open on several shards. refract answers such a batch itself, message by
//! message, as PostgreSQL would:
//! - Parse, Bind and Close are answered from the session's registry of statements and the
//!   batch's portals (a Bind is routed by its values there and then: a refusal is its error);
//! - Describe of a statement asks one shard; Describe of a portal is answered with the rows of
//!   its Execute when that follows (as drivers send them), else asks one shard;
//! - each Execute runs its statement on its shards as the unnamed statement and portal
//!   (Parse, Bind, Describe, Execute, Sync), combined as a simple query's are (`fanout.rs`):
//!   one shard's answer relayed, rows of a read merged by its plan, row counts of a write
//!   summed (one copy's for replicated tables);
//! - a batch that writes runs in a transaction on each shard it reaches, ended at Sync on all
//!   together (two-phase commit where possible) or rolled back on all after an error:
//!   PostgreSQL's implicit transaction of a batch, over several shards.
//!
//! After an error the rest of the batch is skipped up to its Sync, as PostgreSQL does.
//!
//! # Layout
//! - `execute`: an Execute of the batch run on its shards.

mod execute;

use self::execute::unit;

use super::fanout::{end_block, Leg};
use super::route::{route, Target};
use super::transaction::End;
use super::Sharding;
use crate::error::PgError;
use crate::session::phase::{BatchEnd, Event};
use crate::session::{Session, FLUSH_AT};
use bytes::BytesMut;
use refract_pg::classify::{Route, Statement};
use refract_pg::frontend::{Bind, Target as Of};
use refract_pg::notice::sqlstate;
use refract_pg::session::Origin;
use refract_pg::{reply, BackendMessage, ErrorFields, FrontendMessage, TxStatus};
use refract_shard::keyparam::Params;
use std::collections::HashMap;

/// SQLSTATE `invalid_cursor_name`: no such portal.
const NO_PORTAL: &str = "34000";
/// SQLSTATE `invalid_sql_statement_name`: no such prepared statement.
const NO_STATEMENT: &str = "26000";
/// SQLSTATE `duplicate_prepared_statement`.
const DUPLICATE_STATEMENT: &str = "42P05";
/// SQLSTATE `syntax_error`.
const SYNTAX_ERROR: &str = "42601";

/// What a bound portal runs.
enum Runs {
    /// A read or write on the shards of `Target`.
    Data(Target),
    /// COMMIT or ROLLBACK of the open transaction.
    End(End),
}

/// A portal of the batch.
struct Portal {
    query: String,
    param_types: Vec<u32>,
    bind: Bind,
    runs: Runs,
    /// Its Execute comes right after a Describe of it: the description goes with the rows.
    describe: bool,
}

/// The batch's state.
struct Several {
    /// The connections on the shards the batch reached, kept to its Sync.
    legs: Vec<Leg>,
    /// The batch writes: each leg runs in a transaction block, ended at Sync.
    block: bool,
    portals: HashMap<String, Portal>,
    /// An error was sent: skip to Sync.
    failed: bool,
    /// The ReadyForQuery status at Sync.
    status: TxStatus,
    /// A simple Query's statements: no ParseComplete, BindComplete or NoData to the client.
    simple: bool,
}

impl Several {
    /// Whether the client gets an answer refract owes for this extended-protocol message.
    fn owes(&self) -> bool {
        !self.simple
    }
}

impl Session {
    /// A simple Query of several statements that no one shard runs (psycopg2's
    /// `execute_batch`, for one): each statement as the unnamed statement and portal, described
    /// and executed, then Sync, answered as the simple protocol answers (no ParseComplete,
    /// BindComplete or NoData).
    pub(crate) async fn run_several_simple(&mut self, sh: &Sharding, sql: &str) -> Result<(), PgError> {
        let statements = match pg_query::split_with_parser(sql) {
            Ok(s) => s,
            Err(e) => {
                let why = format!("cannot split the query into statements: {e}");
                return self.refuse_sharded(sh, SYNTAX_ERROR, &why).await;
            }
        };
        let mut msgs = vec![];
        for st in statements {
            let bind = Bind {
                portal: String::new(),
                statement: String::new(),
                param_formats: vec![],
                params: vec![],
                result_formats: vec![],
            };
            msgs.extend([
                FrontendMessage::Parse { name: String::new(), query: st.to_owned(), param_types: vec![] },
                FrontendMessage::Bind(bind),
                FrontendMessage::Describe(Of::Portal, String::new()),
                FrontendMessage::Execute { portal: String::new(), max_rows: 0 },
            ]);
        }
        msgs.push(FrontendMessage::Sync);
        self.run_batch_here(sh, msgs, true).await
    }

    /// Runs `msgs` as described in the module header. They end with Sync, or with Flush when
    /// they only parse, describe and close (no connection stays behind: each request to a
    /// shard ends with its own Sync).
    pub(crate) async fn run_several(&mut self, sh: &Sharding, msgs: Vec<FrontendMessage>) -> Result<(), PgError> {
        self.run_batch_here(sh, msgs, false).await
    }

    /// [`Session::run_several`]; `simple`: for a simple Query ([`Session::run_several_simple`]).
    async fn run_batch_here(&mut self, sh: &Sharding, msgs: Vec<FrontendMessage>, simple: bool) -> Result<(), PgError> {
        let executes = msgs.iter().any(|m| matches!(m, FrontendMessage::Execute { .. }));
        let end = BatchEnd::of(&msgs);
        if end == BatchEnd::Sync && !simple {
            self.advance(Event::Batch { end, executes });
        }
        let block = executes && !self.phase().in_transaction() && self.batch_route(&msgs) == Route::Write;
        let status = self.phase().tx();
        let mut run = Several { legs: vec![], block, portals: HashMap::new(), failed: false, status, simple };
        let mut lost = None;
        for (i, msg) in msgs.iter().enumerate() {
            if run.failed && !matches!(msg, FrontendMessage::Sync) {
                continue;
            }
            let next = msgs.get(i + 1);
            let step = match msg {
                FrontendMessage::Parse { name, query, param_types } => {
                    self.parse_here(&mut run, name, query, param_types);
                    Ok(())
                }
                FrontendMessage::Bind(b) => {
                    self.bind_here(sh, &mut run, b);
                    Ok(())
                }
                FrontendMessage::Describe(Of::Statement, name) => self.describe_statement(sh, &mut run, name).await,
                FrontendMessage::Describe(Of::Portal, name) => self.describe_portal(sh, &mut run, name, next).await,
                FrontendMessage::Execute { portal, max_rows } => {
                    self.execute_here(sh, &mut run, portal, *max_rows).await
                }
                FrontendMessage::Close(of, name) => {
                    match of {
                        Of::Statement => drop(self.state.prepared.close(name)),
                        Of::Portal => drop(run.portals.remove(name)),
                    }
                    self.io.out.extend_from_slice(&BackendMessage::CloseComplete.to_bytes());
                    Ok(())
                }
                FrontendMessage::Flush => self.flush().await,
                FrontendMessage::Sync => break,
                _ => Ok(()),
            };
            if let Err(e) = step {
                lost = Some(e);
                break;
            }
            if self.io.out.len() >= FLUSH_AT {
                if let Err(e) = self.flush().await {
                    lost = Some(e);
                    break;
                }
            }
        }
        if lost.is_none() && run.block {
            let end = if run.failed { End::Rollback } else { End::Commit };
            match end_block(sh, &mut run.legs, end).await {
                Ok(Some(e)) => self.fail_here(&mut run, e),
                Ok(None) => {}
                Err(e) => lost = Some(e),
            }
        }
        if run.failed && self.phase().in_transaction() {
            // The transaction failed: rolled back on its shards now (a later COMMIT is
            // answered ROLLBACK here, as for any refusal).
            self.abort_on_shard().await;
            run.status = TxStatus::Failed;
        }
        match lost {
            None if end == BatchEnd::Flush => {
                for l in run.legs {
                    l.finish();
                }
                if run.failed {
                    // As PostgreSQL skips to the client's Sync after an error.
                    self.advance(Event::Refused { end: BatchEnd::Flush });
                }
                self.flush().await
            }
            None => {
                for l in run.legs {
                    l.finish();
                }
                self.advance(if simple { Event::Ready(run.status) } else { Event::Synced(run.status) });
                self.io.out.extend_from_slice(&reply::ready_for_query(run.status));
                self.flush().await
            }
            Some(e) => self.legs_lost(run.legs, e).await,
        }
    }

    /// Parse: registered for this session (its syntax checked by PostgreSQL's own parser).
    fn parse_here(&mut self, run: &mut Several, name: &str, query: &str, param_types: &[u32]) {
        if !name.is_empty() && self.state.prepared.get(name).is_some() {
            let e = error(DUPLICATE_STATEMENT, format!("prepared statement \"{name}\" already exists"));
            return self.fail_here(run, e);
        }
        if let Err(e) = pg_query::parse(query, 0) {
            let message = match e {
                pg_query::Error::Parse(m) => m,
                other => other.to_string(),
            };
            return self.fail_here(run, error(SYNTAX_ERROR, message));
        }
        let read = self.is_read(query);
        self.state.prepared.parse(name, query, param_types, read);
        if run.owes() {
            self.io.out.extend_from_slice(&BackendMessage::ParseComplete.to_bytes());
        }
    }

    /// Bind: the portal routed by its values.
    fn bind_here(&mut self, sh: &Sharding, run: &mut Several, b: &Bind) {
        let (query, param_types, read) = match self.statement_here(&b.statement) {
            Ok(s) => s,
            Err(e) => return self.fail_here(run, e),
        };
        let c = self.classify_text(&query).0;
        let ends = matches!(c.statements.as_slice(), [Statement::Commit | Statement::Rollback]);
        if self.phase().tx() == TxStatus::Failed && self.bound.is_none() && !ends {
            let why = "current transaction is aborted, commands ignored until end of transaction block";
            return self.fail_here(run, error(super::session::IN_FAILED_TX, why.into()));
        }
        let runs = match c.statements.as_slice() {
            [Statement::Commit] if self.phase().in_transaction() => Runs::End(End::Commit),
            [Statement::Rollback] if self.phase().in_transaction() => Runs::End(End::Rollback),
            all if !all.is_empty() && all.iter().all(|s| matches!(s, Statement::Read | Statement::Write)) => {
                let values: Vec<Option<&[u8]>> = b.params.iter().map(|p| p.as_deref()).collect();
                let params = Params { formats: &b.param_formats, values: &values };
                match route(sh, &query, read, Some(params)) {
                    Target::Refuse(why) => {
                        return self.fail_here(run, error(sqlstate::FEATURE_NOT_SUPPORTED, format!("refract: {why}")));
                    }
                    Target::Split(_) => {
                        // `route` splits only an INSERT of constants, never one with values bound.
                        let why = "refract: an INSERT whose rows belong to several shards is not split here: insert them one shard at a time";
                        return self.fail_here(run, error(sqlstate::FEATURE_NOT_SUPPORTED, why.into()));
                    }
                    Target::Fail(code, why) => return self.fail_here(run, error(code, why)),
                    Target::CopyIn(_) | Target::CopyOut => {
                        let why = "refract: COPY through the extended protocol is not run across shards: send it as a simple query";
                        return self.fail_here(run, error(sqlstate::FEATURE_NOT_SUPPORTED, why.into()));
                    }
                    target => Runs::Data(target),
                }
            }
            _ => {
                let why = "refract: this batch needs several shards, and refract runs such a batch only with reads, writes and the end of a transaction: send session statements (SET, BEGIN, ...) in a batch of their own";
                return self.fail_here(run, error(sqlstate::FEATURE_NOT_SUPPORTED, why.into()));
            }
        };
        let portal = Portal { query, param_types, bind: b.clone(), runs, describe: false };
        run.portals.insert(b.portal.clone(), portal);
        if run.owes() {
            self.io.out.extend_from_slice(&BackendMessage::BindComplete.to_bytes());
        }
    }

    /// A prepared statement's text, parameter types and read-ness, or the client's error.
    fn statement_here(&self, name: &str) -> Result<(String, Vec<u32>, bool), ErrorFields> {
        let Some(ps) = self.state.prepared.get(name) else {
            return Err(error(NO_STATEMENT, format!("prepared statement \"{name}\" does not exist")));
        };
        match &ps.origin {
            Origin::Protocol { query, param_types } => Ok((query.clone(), param_types.clone(), ps.read)),
            Origin::Sql { .. } => Err(error(
                sqlstate::FEATURE_NOT_SUPPORTED,
                "refract: an SQL PREPAREd statement is not run across shards: use the extended protocol's Parse".into(),
            )),
        }
    }

    /// Describe of a statement: one shard describes it (a connection the batch holds, if any).
    async fn describe_statement(&mut self, sh: &Sharding, run: &mut Several, name: &str) -> Result<(), PgError> {
        let (query, param_types, read) = match self.statement_here(name) {
            Ok(s) => s,
            Err(e) => {
                self.fail_here(run, e);
                return Ok(());
            }
        };
        let shard = run.legs.first().map_or_else(|| sh.any_shard(), |l| l.shard);
        let mut request = BytesMut::new();
        FrontendMessage::Parse { name: String::new(), query, param_types }.encode(&mut request);
        FrontendMessage::Describe(Of::Statement, String::new()).encode(&mut request);
        FrontendMessage::Sync.encode(&mut request);
        self.relay_on(run, shard, read, &request.freeze(), true).await
    }

    /// Describe of a portal: answered with its Execute's rows when that comes next, else one
    /// of its shards describes it.
    async fn describe_portal(
        &mut self,
        sh: &Sharding,
        run: &mut Several,
        name: &str,
        next: Option<&FrontendMessage>,
    ) -> Result<(), PgError> {
        let Some(portal) = run.portals.get_mut(name) else {
            self.fail_here(run, error(NO_PORTAL, format!("portal \"{name}\" does not exist")));
            return Ok(());
        };
        if matches!(next, Some(FrontendMessage::Execute { portal: p, .. }) if p == name) {
            portal.describe = true;
            return Ok(());
        }
        let shard = match &portal.runs {
            Runs::Data(Target::Shards(s) | Target::Scatter(s, _)) => s[0],
            Runs::Data(_) => sh.any_shard(),
            Runs::End(_) => {
                self.io.out.extend_from_slice(&BackendMessage::NoData.to_bytes());
                return Ok(());
            }
        };
        let request = unit(&portal.query, &portal.param_types, &portal.bind, &portal.bind.result_formats, false);
        let read = !run.block;
        self.relay_on(run, shard, read, &request, true).await
    }

    /// Refuses a statement inside a transaction: the transaction fails (rolled back on its
    /// shards now, as `Session::refuse_sharded` does) and the batch skips to its Sync.
    async fn fail_tx_here(&mut self, sh: &Sharding, run: &mut Several, why: String) {
        sh.count_refused();
        self.abort_on_shard().await;
        self.fail_here(run, error(sqlstate::FEATURE_NOT_SUPPORTED, format!("refract: {why}")));
    }

    /// Sends the client `e` and skips the batch to its Sync.
    fn fail_here(&mut self, run: &mut Several, e: ErrorFields) {
        run.failed = true;
        self.advance(Event::QueryError);
        self.io.out.extend_from_slice(&BackendMessage::ErrorResponse(e).to_bytes());
    }
}

/// An ErrorResponse's fields.
fn error(code: &str, message: String) -> ErrorFields {
    ErrorFields::new("ERROR", code, message)
}
