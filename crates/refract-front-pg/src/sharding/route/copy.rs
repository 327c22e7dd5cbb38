//! Where a COPY naming a sharded table goes: `FROM STDIN` split by each row's key (in a
//! format whose options [`copy_format`] reads), `TO STDOUT` gathered from every shard.

use super::Target;
use crate::sharding::Sharding;
use pg_query::protobuf::{self, Node};
use pg_query::NodeEnum;
use refract_shard::copyrows::{CopyFormat, Force};
use refract_shard::partition::KeyType;
use refract_shard::shardkey::{Schema, TableKeys};

/// COPY naming a sharded table: `FROM STDIN` in text or csv format is split by each row's key
/// ([`copy_format`] lists the options); `TO
/// STDOUT` of the table (text or csv without a header) concatenates the shards' rows.
pub(super) fn copy_target(sh: &Sharding, copy: &protobuf::CopyStmt, refs: &[TableKeys]) -> Target {
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
pub(super) fn names_column(arg: Option<&Node>, key: &str) -> bool {
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
pub(super) fn def_value(arg: Option<&Node>) -> String {
    match arg.and_then(|a| a.node.as_ref()) {
        Some(NodeEnum::String(s)) => s.sval.to_lowercase(),
        Some(NodeEnum::Boolean(b)) => b.boolval.to_string(),
        Some(NodeEnum::Integer(i)) => i.ival.to_string(),
        None => "true".into(),
        Some(_) => "?".into(),
    }
}
