//! Membership changes on this dispatcher, whichever front end a member belongs to: a member
//! joins (an HTTP backend, or a PostgreSQL server with `"front": "postgres"`), is drained or
//! undrained, leaves. The admin API calls these directly when the dispatcher runs alone; with
//! `[cluster]` they apply what the cluster shared (`cluster.rs`). Each answers what happened or
//! why not, as an HTTP status and a message.

use refract_core::config::BackendConfig;
use refract_core::membership::AddError;
use refract_core::Ctx;
use refract_front_pg::{Change, ChangeError, PgFront, PgServerConfig};

/// Why a change was not made: the HTTP status to answer with and what to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// 400 bad definition, 404 no such member, 409 conflict, 503 cannot be shared now.
    pub status: u16,
    /// What to say.
    pub message: String,
}

impl Refusal {
    pub fn new(status: u16, message: impl Into<String>) -> Refusal {
        Refusal { status, message: message.into() }
    }

    fn bad(e: &dyn std::fmt::Display) -> Refusal {
        Refusal::new(400, format!("bad backend definition: {e}"))
    }

    fn no_such(name: &str) -> Refusal {
        Refusal::new(404, format!("no such backend: {name}"))
    }
}

/// A member's definition as `POST /backends` takes it, decoded: which front end, and its name.
pub(crate) enum Definition {
    /// An HTTP backend (or, deprecated, a PostgreSQL server named `pg:NAME`).
    Http(BackendConfig),
    /// A PostgreSQL server (`"front": "postgres"`).
    Postgres(PgServerConfig),
}

impl Definition {
    /// Decodes `POST /backends`' body.
    pub fn parse(mut def: serde_json::Value) -> Result<Definition, Refusal> {
        let front = def.as_object_mut().and_then(|o| o.remove("front"));
        match front.as_ref().map(|f| f.as_str()) {
            Some(Some("postgres")) => {
                serde_json::from_value(def).map(Definition::Postgres).map_err(|e| Refusal::bad(&e))
            }
            None | Some(Some("http")) => {
                serde_json::from_value(def).map(Definition::Http).map_err(|e| Refusal::bad(&e))
            }
            Some(_) => Err(Refusal::bad(&"`front` is \"http\" or \"postgres\"")),
        }
    }

    /// The member's name, without the deprecated `pg:` prefix.
    pub fn name(&self) -> &str {
        match self {
            Definition::Http(c) => c.name.strip_prefix("pg:").unwrap_or(&c.name),
            Definition::Postgres(c) => &c.name,
        }
    }
}

/// Whether either front end has a member called `name` (plain, or `pg:NAME`).
pub(crate) fn exists(ctx: &Ctx, pg: &PgFront, name: &str) -> bool {
    ctx.members.get(name).is_some() || pg.has(name)
}

/// Whether member `name` is drained, if there is one.
pub(crate) fn drained(ctx: &Ctx, pg: &PgFront, name: &str) -> Option<bool> {
    if let Some(b) = ctx.members.get(name) {
        return Some(b.is_drained());
    }
    let plain = name.strip_prefix("pg:").unwrap_or(name);
    pg.members().into_iter().find(|m| m["name"] == plain).and_then(|m| m["drained"].as_bool())
}

/// A member joins; its name. A name either front end has already is refused (409).
pub(crate) fn add(ctx: &Ctx, pg: &PgFront, def: Definition) -> Result<String, Refusal> {
    let name = def.name().to_owned();
    // A PostgreSQL server's own duplicates are refused by its front end, in its words.
    let taken = match &def {
        Definition::Postgres(_) => ctx.members.get(&name).is_some(),
        Definition::Http(_) => exists(ctx, pg, &name),
    };
    if taken {
        return Err(Refusal::new(409, format!("backend {name} already exists")));
    }
    let changed = match &def {
        Definition::Postgres(cfg) => pg.change(Change::Join(cfg)),
        Definition::Http(cfg) if cfg.name.starts_with("pg:") => pg.change(Change::Add(cfg)),
        Definition::Http(cfg) => {
            return match ctx.members.add(cfg.clone()) {
                Ok(()) => Ok(name),
                Err(AddError::Conflict(e)) => Err(Refusal::new(409, e)),
                Err(AddError::Invalid(e)) => Err(Refusal::new(400, e)),
            }
        }
    };
    match changed {
        Some(Ok(())) => Ok(name),
        Some(Err(e)) => Err(Refusal::new(409, e.to_string())),
        None => Err(Refusal::new(404, "the PostgreSQL front end is not configured")),
    }
}

/// Member `name` is drained (`drain`) or undrained. A plain name is the HTTP backend's if there
/// is one, else the PostgreSQL server's.
pub(crate) fn drain(ctx: &Ctx, pg: &PgFront, name: &str, drain: bool) -> Result<(), Refusal> {
    let in_pg = || pg.change(Change::Drain(name, drain)).and_then(|r| r.ok());
    let done = match name.starts_with("pg:") {
        true => in_pg(),
        false => ctx.members.set_drained(name, drain).map(|_| ()).or_else(in_pg),
    };
    done.ok_or_else(|| Refusal::no_such(name))
}

/// Member `name` leaves.
pub(crate) fn remove(ctx: &Ctx, pg: &PgFront, name: &str) -> Result<(), Refusal> {
    if !name.starts_with("pg:") && ctx.members.remove(name) {
        return Ok(());
    }
    match pg.change(Change::Remove(name)) {
        Some(Ok(())) => Ok(()),
        Some(Err(ChangeError::Conflict(e))) => Err(Refusal::new(409, e)),
        Some(Err(_)) | None => Err(Refusal::no_such(name)),
    }
}
