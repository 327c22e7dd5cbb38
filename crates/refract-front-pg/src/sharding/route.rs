//! Where one statement goes in a sharded cluster ([`route`]): the shards holding the keys it
//! names (`refract_shard::shardkey`), every shard for a write of a replicated table, a
//! scatter-gather plan (`refract_shard::scatter`) for a read over several shards, an INSERT split
//! by its rows' keys, or a refusal that says why. No I/O: the session runs the answer (the
//! rows of an INSERT are counted per shard here, when they are placed).

use super::Sharding;
use pg_query::protobuf::{self, Node};
use pg_query::NodeEnum;
use refract_shard::copyrows::{CopyFormat, Force};
use refract_shard::keyparam::Params;
use refract_shard::partition::{Key, KeyType};
use refract_shard::scatter::{self, Decision, Plan};
use refract_shard::shardkey::{self, KeySet, KeyValue, Schema, TableKeys};

/// Where a statement runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// It names no sharded table and reads: any one shard answers (replicated tables).
    Any,
    /// These shards (sorted, at least one): one alone, or a write on each (counts summed).
    Shards(Vec<usize>),
    /// A read over several shards, combined by the plan.
    Scatter(Vec<usize>, Plan),
    /// An INSERT whose rows belong to several shards: each shard's own INSERT.
    Split(Vec<(usize, String)>),
    /// A write of replicated tables (or DDL): every shard, the answer of one copy.
    Copies,
    /// Not answered exactly across shards: SQLSTATE 0A000 and the reason.
    Refuse(String),
    /// Refused as PostgreSQL would refuse it (SQLSTATE, message).
    Fail(&'static str, String),
    /// `COPY ... FROM STDIN` on every shard: each row to the shard its key names (the
    /// key is field `key` of a row), or every row to every shard (a replicated table: `None`).
    CopyIn(Option<(String, usize)>),
    /// `COPY table TO STDOUT` of a sharded table: every shard's rows, one after the other.
    CopyOut,
    /// A query of several statements that no one shard runs: each runs where it would alone,
    /// in one transaction per shard committed together (`across.rs`).
    Statements,
}

/// SQLSTATE `check_violation`: PostgreSQL's "no partition of relation found for row".
const NO_PARTITION: &str = "23514";

/// Routes `sql` (`read`: the classifier calls it a plain read; `params`: a Bind's values for
/// its `$n`).
pub(crate) fn route(sh: &Sharding, sql: &str, read: bool, params: Option<Params<'_>>) -> Target {
    let fast = match params {
        None => by_shape(sh, sql, read),
        // A Parse text with `$n`: its template is the text's own.
        Some(p) => sh.template(sql, read, || template(sh, sql, read)).and_then(|refs| one_shard_of(sh, &refs, p)),
    };
    fast.unwrap_or_else(|| parse_and_route(sh, sql, read, params))
}

/// The one shard `refs` restrict every table to under `params`, as a target.
fn one_shard_of(sh: &Sharding, refs: &[TableKeys], params: Params<'_>) -> Option<Target> {
    let sets: Vec<Option<Vec<usize>>> = refs.iter().map(|r| shards_of(sh, r, Some(params))).collect();
    one_shard(&sets).map(|x| Target::Shards(vec![x]))
}

/// The fast path of a keyed statement sent with its key as a literal (`... WHERE id = 42`):
/// its shape (literals as parameters) is analysed once and cached; each text then only
/// places its literals. `None` when the shape is not a single SELECT, UPDATE or DELETE whose
/// every sharded table is restricted to listed keys, or its keys span shards.
fn by_shape(sh: &Sharding, sql: &str, read: bool) -> Option<Target> {
    let (text, values) = refract_pg::classify::parameterized(sql)?;
    let refs = sh.template(&text, read, || template(sh, &text, read))?;
    let values: Vec<Option<&[u8]>> = values.iter().map(|v| Some(v.as_bytes())).collect();
    one_shard_of(sh, &refs, Params { formats: &[], values: &values })
}

/// A shape's key restrictions, when routing needs nothing else of it (see [`by_shape`]).
fn template(sh: &Sharding, text: &str, read: bool) -> Option<Vec<TableKeys>> {
    let parsed = pg_query::parse(text, 0).ok()?;
    let [raw] = parsed.protobuf.stmts.as_slice() else { return None };
    let node = raw.stmt.as_ref()?.node.as_ref()?;
    let refs = shardkey::of(node, sh);
    let keyed = !refs.is_empty() && refs.iter().all(|r| matches!(r.keys, KeySet::OneOf(_)));
    let plain = match node {
        NodeEnum::SelectStmt(_) => read,
        NodeEnum::UpdateStmt(_) | NodeEnum::DeleteStmt(_) => {
            // The write's own table must be the one sharded table, its key not set.
            !read && refs.len() == 1 && write_target(node).is_some_and(|t| t == refs[0].table) && !sets_key(sh, node)
        }
        _ => false,
    };
    (keyed && plain).then_some(refs)
}

/// Whether an UPDATE sets its table's shard key.
fn sets_key(sh: &Sharding, node: &NodeEnum) -> bool {
    let NodeEnum::UpdateStmt(u) = node else { return false };
    let Some(key) = u.relation.as_ref().and_then(|r| sh.key_of(&r.relname)) else { return false };
    u.target_list.iter().any(|t| matches!(&t.node, Some(NodeEnum::ResTarget(r)) if r.name == key))
}

/// Routes `sql` from its parse tree.
fn parse_and_route(sh: &Sharding, sql: &str, read: bool, params: Option<Params<'_>>) -> Target {
    // A text PostgreSQL's parser rejects gets its syntax error from one shard.
    let Ok(parsed) = pg_query::parse(sql, 0) else { return Target::Any };
    let nodes: Vec<&NodeEnum> = parsed.protobuf.stmts.iter().filter_map(|r| r.stmt.as_ref()?.node.as_ref()).collect();
    match nodes.as_slice() {
        [] => Target::Any,
        [node] => one(sh, sql, node, read, params, parsed.protobuf.version),
        many => {
            // Each alone; on one shard if they all stay there, else each where it runs.
            let mut at = None;
            let mut several = false;
            let texts = statement_texts(sql, &parsed.protobuf.stmts);
            for (node, text) in many.iter().zip(texts) {
                // The query as a whole may write; a plain SELECT among its statements reads
                // (each is routed again with its own classification when they run apart).
                let plain =
                    matches!(node, NodeEnum::SelectStmt(s) if s.locking_clause.is_empty() && s.into_clause.is_none());
                match one(sh, text, node, read || plain, params, parsed.protobuf.version) {
                    Target::Any => {}
                    Target::Shards(s) if s.len() == 1 && at.is_none_or(|a| a == s[0]) => at = Some(s[0]),
                    refused @ (Target::Refuse(_) | Target::Fail(..)) => return refused,
                    Target::CopyIn(_) | Target::CopyOut => {
                        return Target::Refuse(
                            "COPY in a query of several statements over several shards is not supported: send it alone"
                                .into(),
                        )
                    }
                    _ => several = true,
                }
            }
            if several {
                return Target::Statements;
            }
            at.map_or(Target::Any, |a| Target::Shards(vec![a]))
        }
    }
}

/// Each statement's own text in `sql` (PostgreSQL's statement locations, in bytes; a length
/// of 0 runs to the end).
fn statement_texts<'a>(sql: &'a str, stmts: &[protobuf::RawStmt]) -> Vec<&'a str> {
    stmts
        .iter()
        .filter(|r| r.stmt.as_ref().is_some_and(|s| s.node.is_some()))
        .map(|r| {
            let from = usize::try_from(r.stmt_location).unwrap_or(0).min(sql.len());
            let len = usize::try_from(r.stmt_len).unwrap_or(0);
            let to = if len == 0 { sql.len() } else { (from + len).min(sql.len()) };
            sql.get(from..to).unwrap_or(sql)
        })
        .collect()
}

/// Routes one parsed statement.
fn one(sh: &Sharding, sql: &str, node: &NodeEnum, read: bool, params: Option<Params<'_>>, version: i32) -> Target {
    let refs = shardkey::of(node, sh);
    if let Some(t) = write_target(node) {
        return write(sh, node, &t, &refs, params, version);
    }
    if let NodeEnum::CopyStmt(copy) = node {
        return copy_target(sh, copy, &refs);
    }
    if refs.is_empty() {
        return if read { Target::Any } else { Target::Copies };
    }
    if !matches!(node, NodeEnum::SelectStmt(_)) || !read {
        if matches!(node, NodeEnum::SelectStmt(_)) {
            // A SELECT the classifier calls a write (FOR UPDATE, a write function).
            return single_or(
                sh,
                &refs,
                params,
                "a locking or writing SELECT over several shards is not supported: name the key so one shard answers",
            );
        }
        // DDL and the like on a sharded table: every shard.
        return Target::Copies;
    }
    let sets: Vec<Option<Vec<usize>>> = refs.iter().map(|r| shards_of(sh, r, params)).collect();
    if let Some(x) = one_shard(&sets) {
        return Target::Shards(vec![x]);
    }
    let colocated =
        refs.len() > 1 && shardkey::colocated(node, sh).is_some_and(|t| t.len() == refs.len() && sh.placed_alike(&t));
    let shards = if colocated { intersect(sh.count(), &sets) } else { union(sh.count(), &sets) };
    if shards.len() == 1 {
        return Target::Shards(shards);
    }
    let opts = scatter::Options { schema: sh, aggregates: &[], colocated };
    match scatter::plan(sql, &opts) {
        Decision::Exact(plan) => Target::Scatter(shards, plan),
        Decision::One => Target::Any,
        Decision::Refuse(reason) => Target::Refuse(reason),
    }
}

/// COPY naming a sharded table: `FROM STDIN` in text or csv format is split by each row's key
/// ([`copy_format`] lists the options); `TO
/// STDOUT` of the table (text or csv without a header) concatenates the shards' rows.
fn copy_target(sh: &Sharding, copy: &protobuf::CopyStmt, refs: &[TableKeys]) -> Target {
    let options: Vec<(String, String)> = copy
        .options
        .iter()
        .filter_map(|o| match o.node.as_ref() {
            Some(NodeEnum::DefElem(d)) => Some((d.defname.to_lowercase(), def_value(d.arg.as_deref()))),
            _ => None,
        })
        .collect();
    let format = options.iter().find(|(k, _)| k == "format").map_or("text", |(_, v)| v.as_str());
    let table = copy.relation.as_ref().map(|r| r.relname.clone());
    let sharded_table = table.as_deref().and_then(|t| sh.key_of(t).map(|k| (t.to_owned(), k.to_owned())));
    // `refs` sees the tables of a COPY (SELECT ...) only; the COPY's own table is `relation`.
    if sharded_table.is_none() && refs.is_empty() {
        return match (copy.is_from, copy.is_program || !copy.filename.is_empty()) {
            (true, false) => Target::CopyIn(None), // a replicated table: every row to every copy
            (true, true) => Target::Copies,        // each server reads its own file
            (false, _) => Target::Any,             // one copy answers
        };
    }
    if copy.is_program || !copy.filename.is_empty() {
        return Target::Refuse(
            "COPY of a sharded table with a file or program on the server is not supported: use STDIN / STDOUT".into(),
        );
    }
    if copy.is_from {
        let Some((table, key)) = sharded_table else {
            return Target::Refuse(
                "COPY FROM into a replicated table that reads a sharded table is not supported".into(),
            );
        };
        if let Err(why) = copy_format(copy, &key, sh.key_type(&table)) {
            return Target::Refuse(format!("COPY FROM into sharded table {table} is split by key: {why}"));
        }
        let cols: Vec<String> = copy
            .attlist
            .iter()
            .filter_map(|c| match c.node.as_ref() {
                Some(NodeEnum::String(s)) => Some(s.sval.clone()),
                _ => None,
            })
            .collect();
        let at = if cols.is_empty() { sh.key_position(&table) } else { cols.iter().position(|c| *c == key) };
        return match at {
            Some(at) => Target::CopyIn(Some((table, at))),
            None => {
                Target::Refuse(format!("COPY FROM into sharded table {table} needs its key {key} among the columns"))
            }
        };
    }
    if copy.query.is_some() || !refs.is_empty() || sharded_table.is_none() {
        return Target::Refuse(
            "COPY (SELECT ...) TO over sharded tables is not supported: COPY the table, or SELECT".into(),
        );
    }
    if format == "binary" || options.iter().any(|(k, v)| k == "header" && v != "false") {
        return Target::Refuse(
            "COPY TO of a sharded table in binary format or with a header would repeat them per shard".into(),
        );
    }
    Target::CopyOut
}

/// The data format of `COPY ... FROM STDIN` (its options), and how FORCE_NOT_NULL /
/// FORCE_NULL read column `key`; `Err`: an option the split by key does not support.
pub(crate) fn copy_format(
    copy: &protobuf::CopyStmt,
    key: &str,
    ty: Option<KeyType>,
) -> Result<(CopyFormat, Force), String> {
    let defs = copy.options.iter().filter_map(|o| match o.node.as_ref() {
        Some(NodeEnum::DefElem(d)) => Some(d.as_ref()),
        _ => None,
    });
    let defs: Vec<&protobuf::DefElem> = defs.collect();
    let value =
        |name: &str| defs.iter().find(|d| d.defname.eq_ignore_ascii_case(name)).map(|d| def_value(d.arg.as_deref()));
    let csv = match value("format").as_deref() {
        None | Some("text") => false,
        Some("csv") => true,
        Some(other) => return Err(format!("the {other} format is not split (text and csv are)")),
    };
    let mut fmt = CopyFormat::new(csv);
    let mut force = Force::default();
    let byte = |name: &str, v: &str| match v.as_bytes() {
        [b] => Ok(*b),
        _ => Err(format!("{name} must be a single one-byte character")),
    };
    for d in &defs {
        let name = d.defname.to_lowercase();
        // The raw text (def_value lower-cases it): NULL, DELIMITER, QUOTE, ESCAPE keep their case.
        let raw = match d.arg.as_deref().and_then(|a| a.node.as_ref()) {
            Some(NodeEnum::String(s)) => s.sval.clone(),
            _ => def_value(d.arg.as_deref()),
        };
        match name.as_str() {
            "format" | "freeze" => {}
            "delimiter" => fmt.delimiter = byte("DELIMITER", &raw)?,
            "quote" => fmt.quote = byte("QUOTE", &raw)?,
            "escape" => fmt.escape = byte("ESCAPE", &raw)?,
            "null" => fmt.null = raw.into_bytes(),
            // HEADER MATCH too: every shard sees the header line (and checks it).
            "header" => fmt.header = !matches!(raw.to_lowercase().as_str(), "false" | "off" | "0"),
            "force_not_null" => force.not_null = names_column(d.arg.as_deref(), key),
            "force_null" => force.null = names_column(d.arg.as_deref(), key),
            "encoding" => {
                let utf8 = matches!(raw.to_lowercase().replace(['-', '_'], "").as_str(), "utf8" | "unicode");
                if !utf8 && ty == Some(KeyType::Text) {
                    return Err("ENCODING other than UTF8 with a text key (the key's bytes would be hashed in the client's encoding)".into());
                }
                if ["sjis", "big5", "gbk", "uhc", "gb18030", "johab", "shiftjis2004"]
                    .contains(&raw.to_lowercase().replace(['-', '_'], "").as_str())
                {
                    return Err(format!("ENCODING {raw} can hide delimiters and quotes inside characters"));
                }
            }
            other => return Err(format!("the option {other} is not supported")),
        }
    }
    if !csv {
        fmt.quote = 0;
        fmt.escape = 0;
    } else if !defs.iter().any(|d| d.defname.eq_ignore_ascii_case("escape")) {
        fmt.escape = fmt.quote;
    }
    Ok((fmt, force))
}

/// Whether a FORCE_NOT_NULL / FORCE_NULL list (or `*`) names column `key`.
fn names_column(arg: Option<&Node>, key: &str) -> bool {
    match arg.and_then(|a| a.node.as_ref()) {
        Some(NodeEnum::List(l)) => l.items.iter().any(|i| match i.node.as_ref() {
            Some(NodeEnum::String(s)) => s.sval == key,
            _ => false,
        }),
        Some(NodeEnum::AStar(_)) => true,
        _ => false,
    }
}

/// The format of the `COPY ... FROM STDIN` text `sql` into a table with key column `key`
/// (as [`copy_target`] accepted it).
pub(crate) fn copy_in_format(sql: &str, key: &str, ty: Option<KeyType>) -> Result<(CopyFormat, Force), String> {
    let parsed = pg_query::parse(sql, 0).map_err(|e| e.to_string())?;
    let copy = parsed.protobuf.stmts.iter().find_map(|r| match r.stmt.as_ref()?.node.as_ref()? {
        NodeEnum::CopyStmt(c) => Some(c.clone()),
        _ => None,
    });
    copy_format(&*copy.ok_or_else(|| "not a COPY".to_owned())?, key, ty)
}

/// A COPY option's value as text (`csv`, `true`, ...).
fn def_value(arg: Option<&Node>) -> String {
    match arg.and_then(|a| a.node.as_ref()) {
        Some(NodeEnum::String(s)) => s.sval.to_lowercase(),
        Some(NodeEnum::Boolean(b)) => b.boolval.to_string(),
        Some(NodeEnum::Integer(i)) => i.ival.to_string(),
        None => "true".into(),
        Some(_) => "?".into(),
    }
}

/// The table an INSERT, UPDATE, DELETE or MERGE writes, if the statement is one.
fn write_target(node: &NodeEnum) -> Option<String> {
    let rv = match node {
        NodeEnum::InsertStmt(s) => s.relation.as_ref(),
        NodeEnum::UpdateStmt(s) => s.relation.as_ref(),
        NodeEnum::DeleteStmt(s) => s.relation.as_ref(),
        NodeEnum::MergeStmt(s) => s.relation.as_ref(),
        _ => None,
    }?;
    Some(rv.relname.clone())
}

/// An INSERT, UPDATE, DELETE or MERGE of `table`.
fn write(
    sh: &Sharding,
    node: &NodeEnum,
    table: &str,
    refs: &[TableKeys],
    params: Option<Params<'_>>,
    version: i32,
) -> Target {
    let Some(key) = sh.key_of(table) else {
        return if refs.is_empty() {
            Target::Copies
        } else {
            Target::Refuse(format!(
                "a write of replicated table {table} that reads a sharded table would see only one shard's rows on each copy"
            ))
        };
    };
    if matches!(node, NodeEnum::MergeStmt(_)) {
        return Target::Refuse("MERGE into a sharded table is not supported".into());
    }
    if sets_key(sh, node) {
        return Target::Refuse(format!("UPDATE of the shard key {table}.{key} would have to move rows between shards"));
    }
    let why =
        "a write that reads other sharded tables is run only when one shard holds every row it touches (name the keys)";
    let (target, rest) = refs.split_first().map_or((None, &[][..]), |(t, r)| (Some(t), r));
    let Some(target) = target.filter(|t| t.table == table) else { return Target::Refuse(why.into()) };
    if let (KeySet::Rows(rows), NodeEnum::InsertStmt(ins)) = (&target.keys, node) {
        if !rest.is_empty() {
            return Target::Refuse(why.into());
        }
        return split_insert(sh, table, rows, ins.as_ref(), params, version);
    }
    if matches!(node, NodeEnum::InsertStmt(_)) {
        return Target::Refuse(format!(
            "an INSERT into sharded table {table} needs its key {key} in the column list, as a constant or $n in VALUES"
        ));
    }
    if rest.is_empty() {
        let shards = shards_of(sh, target, params).unwrap_or_else(|| (0..sh.count()).collect());
        return Target::Shards(if shards.is_empty() { vec![0] } else { shards });
    }
    single_or(sh, refs, params, why)
}

/// One shard when every reference is restricted to the same one, else refused with `why`.
fn single_or(sh: &Sharding, refs: &[TableKeys], params: Option<Params<'_>>, why: &str) -> Target {
    let sets: Vec<Option<Vec<usize>>> = refs.iter().map(|r| shards_of(sh, r, params)).collect();
    one_shard(&sets).map_or_else(|| Target::Refuse(why.into()), |x| Target::Shards(vec![x]))
}

/// INSERT ... VALUES: the rows by shard; one shard runs it as written, several their own rows.
fn split_insert(
    sh: &Sharding,
    table: &str,
    rows: &[KeyValue],
    ins: &protobuf::InsertStmt,
    params: Option<Params<'_>>,
    version: i32,
) -> Target {
    let mut at = Vec::with_capacity(rows.len());
    for v in rows {
        let key = match key(sh, table, v, params) {
            Ok(k) => k,
            Err(e) => return Target::Fail("22P02", e),
        };
        match sh.place(table, &key) {
            Ok(i) => at.push(i),
            Err(e) => {
                return Target::Fail(NO_PARTITION, format!("no partition of relation \"{table}\" found for row: {e}"))
            }
        }
    }
    let mut shards = at.clone();
    shards.sort_unstable();
    shards.dedup();
    for &s in &shards {
        sh.count_rows(s, at.iter().filter(|&&a| a == s).count() as u64);
    }
    if shards.len() == 1 {
        return Target::Shards(shards);
    }
    if params.is_some() {
        return Target::Refuse("an INSERT with $n parameters whose rows belong to several shards is not split: insert them one shard at a time".into());
    }
    let mut out = vec![];
    for s in shards {
        match insert_rows(ins, &at, s, version) {
            Ok(sql) => out.push((s, sql)),
            Err(e) => return Target::Refuse(e),
        }
    }
    Target::Split(out)
}

/// The INSERT with only the VALUES rows `at` places on shard `s`.
fn insert_rows(ins: &protobuf::InsertStmt, at: &[usize], s: usize, version: i32) -> Result<String, String> {
    let mut ins = ins.clone();
    let Some(NodeEnum::SelectStmt(sel)) = ins.select_stmt.as_deref_mut().and_then(|n| n.node.as_mut()) else {
        return Err("not an INSERT ... VALUES".into());
    };
    let rows = std::mem::take(&mut sel.values_lists);
    sel.values_lists = rows.into_iter().zip(at).filter(|(_, a)| **a == s).map(|(r, _)| r).collect();
    let raw = protobuf::RawStmt {
        stmt: Some(Box::new(Node { node: Some(NodeEnum::InsertStmt(Box::new(ins))) })),
        stmt_location: 0,
        stmt_len: 0,
    };
    let tree = protobuf::ParseResult { version, stmts: vec![raw] };
    pg_query::deparse(&tree, Default::default()).map_err(|e| format!("cannot write the shards' INSERT: {e}"))
}

/// The key value `v` of `table`'s key.
fn key(sh: &Sharding, table: &str, v: &KeyValue, params: Option<Params<'_>>) -> Result<Key, String> {
    let ty = sh.key_type(table).ok_or_else(|| format!("{table} is not sharded"))?;
    let none = Params { formats: &[], values: &[] };
    params.unwrap_or(none).key(v, ty).map_err(|e| e.to_string())
}

/// The shards a reference touches (`None`: every shard). A key value no shard holds (a list
/// or range without it) touches none: no row has it.
fn shards_of(sh: &Sharding, r: &TableKeys, params: Option<Params<'_>>) -> Option<Vec<usize>> {
    let ty = sh.key_type(&r.table)?;
    let keys: Vec<Key> = match &r.keys {
        KeySet::Every => return None,
        KeySet::OneOf(vs) | KeySet::Rows(vs) => {
            let keys: Result<Vec<Key>, String> = vs.iter().map(|v| key(sh, &r.table, v, params)).collect();
            keys.ok()?
        }
        KeySet::AnyOf(n) => params?.array(*n, ty).ok()?,
    };
    let mut shards: Vec<usize> = keys.iter().filter_map(|k| sh.place(&r.table, k).ok()).collect();
    shards.sort_unstable();
    shards.dedup();
    Some(shards)
}

/// The one shard every reference is restricted to, if there is one.
fn one_shard(sets: &[Option<Vec<usize>>]) -> Option<usize> {
    let first = sets.first()?.as_ref()?;
    let x = match first.as_slice() {
        [x] => *x,
        _ => return None,
    };
    sets.iter().all(|s| s.as_deref() == Some(&[x][..])).then_some(x)
}

/// Every shard any reference touches (a reference to every shard makes it all of them).
fn union(n: usize, sets: &[Option<Vec<usize>>]) -> Vec<usize> {
    if sets.iter().any(Option::is_none) {
        return (0..n).collect();
    }
    let mut all: Vec<usize> = sets.iter().flatten().flatten().copied().collect();
    all.sort_unstable();
    all.dedup();
    if all.is_empty() {
        all.push(0);
    }
    all
}

/// The shards every restricted reference touches (a co-located join: a row pair lives on one).
fn intersect(n: usize, sets: &[Option<Vec<usize>>]) -> Vec<usize> {
    let mut out: Vec<usize> = (0..n).collect();
    for s in sets.iter().flatten() {
        out.retain(|x| s.contains(x));
    }
    if out.is_empty() {
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PgConfig;

    fn sharding(n: usize) -> Sharding {
        let mut text = "listen = \"127.0.0.1:6432\"\nserver_user = \"u\"\n\
            [[sharded_table]]\nname = \"customers\"\nkey = \"id\"\n\
            [[sharded_table]]\nname = \"orders\"\nkey = \"customer_id\"\n"
            .to_owned();
        for i in 0..n {
            text.push_str(&format!(
                "[[shard]]\nname = \"s{i}\"\n[[shard.server]]\nname = \"p{i}\"\naddr = \"127.0.0.1:{}\"\nrole = \"primary\"\n",
                5441 + i
            ));
        }
        Sharding::new(&toml::from_str::<PgConfig>(&text).expect("config"), &std::sync::Arc::default())
    }

    fn at(sh: &Sharding, id: i64) -> usize {
        sh.place("customers", &Key::Int8(id)).expect("placed")
    }

    #[test]
    fn keyed_statements_go_to_their_shard() {
        let sh = sharding(3);
        let r = |sql: &str, read: bool| route(&sh, sql, read, None);
        assert_eq!(r("select * from customers where id = 7", true), Target::Shards(vec![at(&sh, 7)]));
        assert_eq!(r("update customers set name = 'x' where id = 7", false), Target::Shards(vec![at(&sh, 7)]));
        let join = "select * from customers c join orders o on c.id = o.customer_id where c.id = 7";
        assert_eq!(r(join, true), Target::Shards(vec![at(&sh, 7)]));
        assert_eq!(r("select * from products", true), Target::Any);
        assert_eq!(r("insert into products values (1)", false), Target::Copies);
        assert_eq!(r("create table t (a int)", false), Target::Copies);
        assert_eq!(r("delete from customers", false), Target::Shards(vec![0, 1, 2]));
    }

    #[test]
    fn reads_over_several_shards_are_planned_or_refused() {
        let sh = sharding(2);
        let r = |sql: &str| route(&sh, sql, true, None);
        assert!(matches!(r("select count(*) from customers"), Target::Scatter(s, _) if s == vec![0, 1]));
        let colocated = "select c.id, o.id from customers c join orders o on c.id = o.customer_id order by 1, 2";
        assert!(matches!(r(colocated), Target::Scatter(..)), "{:?}", r(colocated));
        let loose = "select * from customers c join orders o on c.name = o.status";
        assert!(matches!(r(loose), Target::Refuse(w) if w.contains("join")));
        assert!(
            matches!(r("select id, rank() over (order by id) from customers"), Target::Refuse(w) if w.contains("window"))
        );
    }

    #[test]
    fn inserts_split_by_key_and_writes_refuse_what_would_be_wrong() {
        let sh = sharding(2);
        let (a, b) = ((1..100).find(|i| at(&sh, *i) == 0).unwrap(), (1..100).find(|i| at(&sh, *i) == 1).unwrap());
        let sql = format!("insert into customers (id, name) values ({a}, 'a'), ({b}, 'b'), ({a}, 'c')");
        match route(&sh, &sql, false, None) {
            Target::Split(parts) => {
                assert_eq!(parts.len(), 2);
                assert!(parts[0].1.contains(&format!("({a}, 'a'), ({a}, 'c')")), "{}", parts[0].1);
                assert!(parts[1].1.contains(&format!("({b}, 'b')")) && !parts[1].1.contains("'a'"), "{}", parts[1].1);
            }
            other => panic!("{other:?}"),
        }
        let key_update = route(&sh, "update customers set id = 5 where id = 1", false, None);
        assert!(matches!(key_update, Target::Refuse(w) if w.contains("shard key")));
        let no_key = route(&sh, "insert into customers (name) values ('x')", false, None);
        assert!(matches!(no_key, Target::Refuse(w) if w.contains("key id")));
        let cross = route(&sh, "insert into products select id from customers", false, None);
        assert!(matches!(cross, Target::Refuse(w) if w.contains("replicated table products")));
        let bad = route(&sh, "insert into customers (id) values ('x')", false, None);
        assert!(matches!(bad, Target::Fail("22P02", _)));
    }

    #[test]
    fn copy_is_split_by_key_or_sent_to_every_copy() {
        let sh = sharding(2);
        let r = |sql: &str| route(&sh, sql, false, None);
        assert_eq!(r("copy customers (name, id) from stdin"), Target::CopyIn(Some(("customers".into(), 1))));
        let csv = "copy customers (name, id) from stdin (format csv, header, delimiter ';', quote '''', escape '\\', null 'NULL', force_not_null (id))";
        assert_eq!(r(csv), Target::CopyIn(Some(("customers".into(), 1))));
        let (fmt, force) = copy_in_format(csv, "id", Some(KeyType::Int8)).expect("format");
        assert_eq!(
            (fmt.delimiter, fmt.quote, fmt.escape, &fmt.null[..], fmt.header),
            (b';', b'\'', b'\\', &b"NULL"[..], true)
        );
        assert_eq!(force, Force { not_null: true, null: false });
        let (fmt, _) =
            copy_in_format("copy customers from stdin with (format csv, quote '|')", "id", None).expect("format");
        assert_eq!(
            (fmt.delimiter, fmt.escape, fmt.null.len(), fmt.header),
            (b',', b'|', 0, false),
            "escape follows quote"
        );
        let (fmt, _) =
            copy_in_format("copy customers from stdin (delimiter '|', null '')", "id", None).expect("format");
        assert_eq!((fmt.csv, fmt.delimiter, fmt.null.len()), (false, b'|', 0));
        assert!(
            matches!(r("copy customers (id) from stdin (format binary)"), Target::Refuse(w) if w.contains("binary"))
        );
        assert!(
            matches!(r("copy customers (id) from stdin (format csv, delimiter ';;')"), Target::Refuse(w) if w.contains("one-byte"))
        );
        assert!(
            matches!(r("copy customers from stdin"), Target::Refuse(w) if w.contains("key id")),
            "position not known"
        );
        sh.set_position("customers", 0);
        assert_eq!(r("copy customers from stdin"), Target::CopyIn(Some(("customers".into(), 0))));
        assert_eq!(r("copy products from stdin"), Target::CopyIn(None));
        assert_eq!(r("copy customers to stdout"), Target::CopyOut);
        assert_eq!(r("copy products to stdout"), Target::Any);
        assert!(matches!(r("copy customers to stdout (format binary)"), Target::Refuse(_)));
        assert!(matches!(r("copy (select * from customers order by id) to stdout"), Target::Refuse(_)));
        assert_eq!(r("copy (select * from products) to stdout"), Target::Any);
    }

    #[test]
    fn literal_keys_route_by_their_shape_as_by_their_parse() {
        let sh = sharding(3);
        for id in [-3i64, 0, 7, 11, 42, 1000] {
            let sql = format!("select abalance from customers where id = {id}");
            assert_eq!(route(&sh, &sql, true, None), Target::Shards(vec![at(&sh, id)]), "{sql}");
            assert_eq!(parse_and_route(&sh, &sql, true, None), Target::Shards(vec![at(&sh, id)]), "{sql}");
            let upd = format!("update customers set name = 'x' where id = {id}");
            assert_eq!(route(&sh, &upd, false, None), parse_and_route(&sh, &upd, false, None), "{upd}");
        }
        // Not the fast path, answered by the parse: the key set, several shards, an IN list.
        assert!(matches!(route(&sh, "update customers set id = 2 where id = 1", false, None), Target::Refuse(_)));
        let (a, b) = ((1..100).find(|i| at(&sh, *i) == 0).unwrap(), (1..100).find(|i| at(&sh, *i) == 1).unwrap());
        let spread = format!("select count(*) from customers where id in ({a}, {b})");
        assert!(matches!(route(&sh, &spread, true, None), Target::Scatter(s, _) if s == vec![0, 1]));
    }
}
