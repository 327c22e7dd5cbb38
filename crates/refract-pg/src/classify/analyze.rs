//! The parse-tree walk behind [`super::Classifier`]: one [`Statement`] per parsed statement.

use pg_query::protobuf::{self, a_const, RawStmt, TransactionStmt, VariableSetStmt};
use pg_query::NodeEnum;
use serde_json::Value;

use super::state::Effects;
use super::{RouteHint, Statement};

/// What [`statements`] finds in a query text.
pub(super) type Analysis = (Vec<Statement>, Effects, Vec<String>);

/// Parses `sql` and describes each statement, whether any may leave session state behind
/// (`super::state`), and the relations it names ([`relations`]); `Err` carries the parser's
/// message.
pub(super) fn statements(sql: &str, write_functions: &[String]) -> Result<Analysis, String> {
    let parsed = pg_query::parse(sql, 0).map_err(|e| e.to_string())?;
    let tables = relations(&parsed.protobuf);
    let mut all = Effects::default();
    for node in parsed.protobuf.stmts.iter().filter_map(|raw| raw.stmt.as_ref().and_then(|n| n.node.as_ref())) {
        let e = super::state::effects(node)?;
        all.stateful |= e.stateful;
        all.set_config |= e.set_config;
        all.nested_executes.extend(e.nested_executes);
        all.changes_schema |= e.changes_schema;
    }
    let alone = parsed.protobuf.stmts.len() == 1;
    let statements: Result<Vec<_>, _> =
        parsed.protobuf.stmts.iter().map(|raw| statement(sql, raw, alone, write_functions)).collect();
    Ok((statements?, all, tables))
}

/// Every relation the text names (each `RangeVar`: tables, views, and also the names of its
/// common table expressions, which a server without such a table cannot answer — harmless,
/// since a name no replica holds only sends the statement to a full server), as
/// [`super::relation_name`] spells them, sorted, once each.
fn relations(tree: &protobuf::ParseResult) -> Vec<String> {
    let mut names: Vec<String> = tree
        .nodes()
        .into_iter()
        .filter_map(|(node, ..)| match node {
            pg_query::NodeRef::RangeVar(v) => Some(super::relation_name(&v.schemaname, &v.relname)),
            _ => None,
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// One statement of `sql`; `alone`: the only one (a PREPARE then keeps the whole text, as
/// PostgreSQL shows it in `pg_prepared_statements`, so preparing it again elsewhere shows the
/// same).
fn statement(sql: &str, raw: &RawStmt, alone: bool, write_functions: &[String]) -> Result<Statement, String> {
    let Some(node) = raw.stmt.as_ref().and_then(|n| n.node.as_ref()) else { return Ok(Statement::Write) };
    Ok(match node {
        NodeEnum::SelectStmt(_) => read_unless_marked(node, write_functions)?,
        NodeEnum::VariableShowStmt(_) => Statement::Read,
        NodeEnum::ExplainStmt(e) => match e.query.as_ref().and_then(|q| q.node.as_ref()) {
            Some(q @ NodeEnum::SelectStmt(_)) => read_unless_marked(q, write_functions)?,
            _ => Statement::Write,
        },
        NodeEnum::TransactionStmt(t) => transaction(t),
        NodeEnum::VariableSetStmt(s) => set(s, text(sql, raw)),
        NodeEnum::DiscardStmt(d) => Statement::Discard { all: d.target == protobuf::DiscardMode::DiscardAll as i32 },
        NodeEnum::PrepareStmt(p) => {
            let text = if alone { sql.to_owned() } else { text(sql, raw) };
            prepare(p, text, write_functions)?
        }
        NodeEnum::ExecuteStmt(e) => Statement::Execute { name: e.name.clone() },
        NodeEnum::DeallocateStmt(d) => Statement::Deallocate { name: (!d.isall).then(|| d.name.clone()) },
        NodeEnum::ListenStmt(l) => Statement::Listen { channel: l.conditionname.clone() },
        NodeEnum::UnlistenStmt(u) => {
            Statement::Unlisten { channel: Some(u.conditionname.clone()).filter(|c| !c.is_empty()) }
        }
        _ => Statement::Write,
    })
}

/// `PREPARE name AS query`, noting whether the query is a plain read (for its EXECUTEs).
fn prepare(p: &protobuf::PrepareStmt, text: String, write_functions: &[String]) -> Result<Statement, String> {
    let read = match p.query.as_ref().and_then(|q| q.node.as_ref()) {
        Some(q @ NodeEnum::SelectStmt(_)) => read_unless_marked(q, write_functions)? == Statement::Read,
        _ => false,
    };
    Ok(Statement::Prepare { name: p.name.clone(), text, read })
}

/// The statement's own text (without the `;`), to replay it elsewhere.
fn text(sql: &str, raw: &RawStmt) -> String {
    let start = usize::try_from(raw.stmt_location).unwrap_or(0);
    let end = match usize::try_from(raw.stmt_len) {
        Ok(0) | Err(_) => sql.len(),
        Ok(n) => (start + n).min(sql.len()),
    };
    sql.get(start..end).unwrap_or(sql).trim().to_owned()
}

/// A SELECT is a read unless something in its tree writes: a data-modifying CTE (or any DML
/// node), `FOR UPDATE/SHARE`, `SELECT INTO`, or a call to a write function.
///
/// The tree is walked generically through its serde form, so no node type can be missed
/// (pg_query's own iterator skips some, e.g. VALUES lists and LIMIT expressions).
fn read_unless_marked(node: &NodeEnum, write_functions: &[String]) -> Result<Statement, String> {
    let tree = serde_json::to_value(node).map_err(|e| e.to_string())?;
    let mut stack = vec![&tree];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(fields) => {
                for (key, child) in fields {
                    if marks_write(key, child, write_functions) {
                        return Ok(Statement::Write);
                    }
                    stack.push(child);
                }
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    Ok(Statement::Read)
}

fn marks_write(key: &str, child: &Value, write_functions: &[String]) -> bool {
    match key {
        "InsertStmt" | "UpdateStmt" | "DeleteStmt" | "MergeStmt" | "LockingClause" => true,
        "into_clause" => !child.is_null(),
        "FuncCall" => function_name(child).is_some_and(|f| write_functions.iter().any(|p| glob(p, &f))),
        _ => false,
    }
}

/// The unqualified, lower-case name of a FuncCall (`pg_catalog.nextval` → `nextval`).
fn function_name(call: &Value) -> Option<String> {
    let last = call["funcname"].as_array()?.last()?;
    Some(last["node"]["String"]["sval"].as_str()?.to_ascii_lowercase())
}

/// `pattern` with at most one `*` matching any run of characters.
pub(super) fn glob(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((prefix, suffix)) => {
            name.len() >= prefix.len() + suffix.len() && name.starts_with(prefix) && name.ends_with(suffix)
        }
    }
}

fn transaction(t: &TransactionStmt) -> Statement {
    use protobuf::TransactionStmtKind as K;
    match K::try_from(t.kind) {
        Ok(K::TransStmtBegin | K::TransStmtStart) => Statement::Begin { read_only: read_only(&t.options) },
        Ok(K::TransStmtCommit) => Statement::Commit,
        Ok(K::TransStmtRollback) => Statement::Rollback,
        Ok(K::TransStmtSavepoint | K::TransStmtRelease | K::TransStmtRollbackTo) => Statement::Savepoint,
        _ => Statement::Write, // PREPARE TRANSACTION, COMMIT/ROLLBACK PREPARED
    }
}

/// The last `transaction_read_only` option wins, as in PostgreSQL.
fn read_only(options: &[protobuf::Node]) -> bool {
    let mut read_only = false;
    for opt in options.iter().filter_map(|n| n.node.as_ref()) {
        if let NodeEnum::DefElem(d) = opt {
            if d.defname == "transaction_read_only" {
                read_only = d.arg.as_ref().and_then(|a| a.node.as_ref()).and_then(int_const) == Some(1);
            }
        }
    }
    read_only
}

fn int_const(node: &NodeEnum) -> Option<i32> {
    match node {
        NodeEnum::AConst(c) => match &c.val {
            Some(a_const::Val::Ival(i)) => Some(i.ival),
            _ => None,
        },
        _ => None,
    }
}

fn string_const(args: &[protobuf::Node]) -> Option<&str> {
    match args.first()?.node.as_ref()? {
        NodeEnum::AConst(c) => match &c.val {
            Some(a_const::Val::Sval(s)) => Some(&s.sval),
            _ => None,
        },
        _ => None,
    }
}

fn set(s: &VariableSetStmt, text: String) -> Statement {
    use protobuf::VariableSetKind as K;
    let name = s.name.to_ascii_lowercase();
    let kind = K::try_from(s.kind);
    if name == "refract.route" {
        let hint = match kind {
            Ok(K::VarSetValue) => string_const(&s.args).and_then(RouteHint::parse),
            Ok(K::VarReset | K::VarSetDefault) => Some(RouteHint::Auto),
            _ => None,
        };
        if let Some(h) = hint {
            return Statement::RouteSetting(h);
        }
    }
    match kind {
        Ok(K::VarReset) => Statement::Reset { name: Some(name) },
        Ok(K::VarResetAll) => Statement::Reset { name: None },
        _ => {
            let local = s.is_local || name == "transaction";
            Statement::Set { name, local, text }
        }
    }
}
