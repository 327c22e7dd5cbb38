//! Whether a statement may leave session state on its server connection that a transaction
//! pooler cannot carry to another one: temporary objects, session advisory locks,
//! `set_config(..., false)`, `WITH HOLD` cursors, LISTEN, or code that may do any of these
//! (`DO`, `CALL`).
//!
//! The answer is deliberately generous ("may"): the session layer asks the server afterwards
//! what is really left (see `refract-core`'s `pg/pin.rs`), so a false positive costs one small
//! query, a false negative a leak. Nothing here depends on a literal's value (a `set_config`
//! counts as transaction-local only with the keyword `true`), so the shape cache stays valid.

use pg_query::NodeEnum;
use serde_json::Value;

/// `CURSOR_OPT_HOLD` in PostgreSQL's `parsenodes.h`.
const CURSOR_OPT_HOLD: i32 = 0x0020;

/// What one statement may leave behind, and the prepared statements it runs inside itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Effects {
    /// Any session state (see the module doc).
    pub stateful: bool,
    /// A `set_config(..., false)` (or not certainly local): settings the server may not show
    /// (custom `a.b` placeholders are hidden from `pg_settings`).
    pub set_config: bool,
    /// SQL-level prepared statements run inside another statement (`CREATE TABLE ... AS
    /// EXECUTE q`, `EXPLAIN EXECUTE q`): the server looks them up by name, as for `EXECUTE`.
    pub nested_executes: Vec<String>,
    /// DDL (or code that may run it, `DO`): what prepared statements planned before it see
    /// may have changed.
    pub changes_schema: bool,
}

/// What `node` (one parsed statement) may leave behind.
pub(super) fn effects(node: &NodeEnum) -> Result<Effects, String> {
    let stateful = match node {
        NodeEnum::DeclareCursorStmt(d) => d.options & CURSOR_OPT_HOLD != 0,
        NodeEnum::DoStmt(_) | NodeEnum::CallStmt(_) | NodeEnum::ListenStmt(_) => true,
        _ => false,
    };
    let tree = serde_json::to_value(node).map_err(|e| e.to_string())?;
    let mut found = tree_effects(&tree);
    found.stateful |= stateful;
    found.changes_schema = changes_schema(node);
    if matches!(node, NodeEnum::ExecuteStmt(_)) {
        found.nested_executes.clear(); // the statement itself, not one inside it
    }
    Ok(found)
}

/// Whether `node` is DDL: anything but queries, DML, session and transaction control, cursors,
/// COPY, locks and maintenance that leaves types alone. Generous, like the rest: a false
/// positive costs a statement prepared again on the servers.
fn changes_schema(node: &NodeEnum) -> bool {
    !matches!(
        node,
        NodeEnum::SelectStmt(_)
            | NodeEnum::InsertStmt(_)
            | NodeEnum::UpdateStmt(_)
            | NodeEnum::DeleteStmt(_)
            | NodeEnum::MergeStmt(_)
            | NodeEnum::TransactionStmt(_)
            | NodeEnum::VariableSetStmt(_)
            | NodeEnum::VariableShowStmt(_)
            | NodeEnum::ExplainStmt(_)
            | NodeEnum::PrepareStmt(_)
            | NodeEnum::ExecuteStmt(_)
            | NodeEnum::DeallocateStmt(_)
            | NodeEnum::ListenStmt(_)
            | NodeEnum::UnlistenStmt(_)
            | NodeEnum::NotifyStmt(_)
            | NodeEnum::CopyStmt(_)
            | NodeEnum::LockStmt(_)
            | NodeEnum::DeclareCursorStmt(_)
            | NodeEnum::FetchStmt(_)
            | NodeEnum::ClosePortalStmt(_)
            | NodeEnum::DiscardStmt(_)
            | NodeEnum::CallStmt(_)
            | NodeEnum::CheckPointStmt(_)
            | NodeEnum::VacuumStmt(_)
            | NodeEnum::TruncateStmt(_)
            | NodeEnum::ConstraintsSetStmt(_)
    )
}

/// Walks the serde form of a statement for temporary relations or functions and for calls of
/// functions that create session state.
fn tree_effects(tree: &Value) -> Effects {
    let mut found = Effects::default();
    let mut stack = vec![tree];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(fields) => {
                for (key, child) in fields {
                    found.stateful |= marks_state(key, child);
                    found.set_config |= key == "FuncCall" && unsure_set_config(child);
                    if let ("ExecuteStmt", Some(name)) = (key.as_str(), child["name"].as_str()) {
                        found.nested_executes.push(name.to_owned());
                    }
                    stack.push(child);
                }
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    found
}

fn marks_state(key: &str, child: &Value) -> bool {
    match key {
        "relpersistence" => child.as_str() == Some("t"),
        "schemaname" => child.as_str().is_some_and(is_temp_schema),
        // Functions, and objects named by a qualified name list (statistics, collations,
        // operators, text search objects, types: `CREATE STATISTICS pg_temp.s ...`).
        "funcname" | "defnames" | "names" => {
            let first = child.as_array().and_then(|a| a.first()).and_then(|n| n["node"]["String"]["sval"].as_str());
            first.is_some_and(is_temp_schema)
        }
        "FuncCall" => call_leaves_state(child),
        _ => false,
    }
}

fn is_temp_schema(name: &str) -> bool {
    name.to_ascii_lowercase().starts_with("pg_temp")
}

/// Session advisory locks (taking or releasing: not the `_xact_` ones) and `set_config`
/// unless its third argument is the keyword `true`.
fn call_leaves_state(call: &Value) -> bool {
    let name = call_name(call).unwrap_or_default();
    if name.starts_with("pg_advisory") || name.starts_with("pg_try_advisory") {
        return !name.contains("xact");
    }
    unsure_set_config(call)
}

fn unsure_set_config(call: &Value) -> bool {
    call_name(call).as_deref() == Some("set_config") && !is_true_keyword(&call["args"][2])
}

/// The unqualified, lower-case name of a FuncCall.
fn call_name(call: &Value) -> Option<String> {
    let last = call["funcname"].as_array()?.last()?;
    Some(last["node"]["String"]["sval"].as_str()?.to_ascii_lowercase())
}

/// An `A_Const` holding the boolean `true` (serde form of `a_const::Val::Boolval`).
fn is_true_keyword(arg: &Value) -> bool {
    arg["node"]["AConst"]["val"]["Boolval"]["boolval"] == Value::Bool(true)
}
