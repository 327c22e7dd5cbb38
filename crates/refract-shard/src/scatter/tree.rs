//! Questions the scatter planner asks of pg_query's parse tree: are two expressions the same,
//! which aggregates and window functions an expression calls, where the sharded tables sit in
//! FROM, and whether an outer join would repeat replicated rows on every shard.

use pg_query::protobuf::{self, a_const, JoinType, Node};
use pg_query::NodeEnum;
use serde_json::Value;

use crate::shardkey::Schema;

/// Aggregates built into PostgreSQL (15 to 18): without the catalog they are what tells an
/// aggregate call from a function call. A test checks the list against `pg_proc`.
pub const BUILTIN_AGGREGATES: &[&str] = &[
    "any_value",
    "array_agg",
    "avg",
    "bit_and",
    "bit_or",
    "bit_xor",
    "bool_and",
    "bool_or",
    "corr",
    "count",
    "covar_pop",
    "covar_samp",
    "cume_dist",
    "dense_rank",
    "every",
    "json_agg",
    "json_agg_strict",
    "json_object_agg",
    "json_object_agg_strict",
    "json_object_agg_unique",
    "json_object_agg_unique_strict",
    "jsonb_agg",
    "jsonb_agg_strict",
    "jsonb_object_agg",
    "jsonb_object_agg_strict",
    "jsonb_object_agg_unique",
    "jsonb_object_agg_unique_strict",
    "max",
    "min",
    "mode",
    "percent_rank",
    "percentile_cont",
    "percentile_disc",
    "range_agg",
    "range_intersect_agg",
    "rank",
    "regr_avgx",
    "regr_avgy",
    "regr_count",
    "regr_intercept",
    "regr_r2",
    "regr_slope",
    "regr_sxx",
    "regr_sxy",
    "regr_syy",
    "stddev",
    "stddev_pop",
    "stddev_samp",
    "string_agg",
    "sum",
    "var_pop",
    "var_samp",
    "variance",
    "xmlagg",
];

/// The parse tree as JSON with every `location` removed: equal exactly when two expressions
/// are written alike (PostgreSQL resolves them alike within one statement).
fn shape(n: &Node) -> Value {
    let mut v = serde_json::to_value(n).unwrap_or(Value::Null);
    strip_locations(&mut v);
    v
}

fn strip_locations(v: &mut Value) {
    match v {
        Value::Object(fields) => {
            fields.remove("location");
            fields.values_mut().for_each(strip_locations);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_locations),
        _ => {}
    }
}

/// Are `a` and `b` the same expression?
pub fn same(a: &Node, b: &Node) -> bool {
    shape(a) == shape(b)
}

/// A function's name, lowercase, without a `pg_catalog.` qualifier (`None` for another schema).
pub fn func_name(f: &protobuf::FuncCall) -> Option<String> {
    let parts: Vec<&str> = f
        .funcname
        .iter()
        .filter_map(|n| match n.node.as_ref() {
            Some(NodeEnum::String(s)) => Some(s.sval.as_str()),
            _ => None,
        })
        .collect();
    match parts.as_slice() {
        [name] | ["pg_catalog", name] => Some(name.to_lowercase()),
        _ => None,
    }
}

/// What an expression calls, found by walking all of it.
#[derive(Debug, Default)]
pub struct Calls {
    pub aggregates: usize,
    pub windows: bool,
    pub subqueries: bool,
    /// Explicit collations other than C and POSIX.
    pub collations: Vec<String>,
}

/// Walks `n` (JSON form, so every node kind is covered) for aggregate calls, window calls,
/// subqueries and COLLATE clauses.
pub fn calls(n: &Node, extra: &[String]) -> Calls {
    let mut out = Calls::default();
    let tree = serde_json::to_value(n).unwrap_or(Value::Null);
    let mut stack = vec![&tree];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(fields) => {
                note(fields, extra, &mut out);
                stack.extend(fields.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    out
}

fn note(fields: &serde_json::Map<String, Value>, extra: &[String], out: &mut Calls) {
    if let Some(f) = fields.get("FuncCall") {
        let set = |k: &str| f.get(k).is_some_and(|v| !v.is_null() && *v != Value::Bool(false));
        let listed = |k: &str| f.get(k).and_then(Value::as_array).is_some_and(|a| !a.is_empty());
        let name = names(f.get("funcname"));
        let named = match name.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
            [n] | ["pg_catalog", n] => BUILTIN_AGGREGATES.contains(n) || extra.iter().any(|e| e == n),
            _ => false,
        };
        let syntax = ["agg_star", "agg_distinct", "agg_filter", "agg_within_group"].iter().any(|k| set(k));
        out.windows |= set("over");
        out.aggregates += usize::from(!set("over") && (named || syntax || listed("agg_order")));
    }
    out.subqueries |= fields.contains_key("SubLink") || fields.contains_key("RangeSubselect");
    if let Some(c) = fields.get("CollateClause") {
        let name = names(c.get("collname"));
        if !matches!(name.last().map(String::as_str), Some("C" | "POSIX")) {
            out.collations.push(name.join("."));
        }
    }
}

/// The strings of a name list (`funcname`, `collname`), lowercase except collation names.
fn names(list: Option<&Value>) -> Vec<String> {
    list.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| p.pointer("/node/String/sval").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

/// How many references to sharded tables the whole statement holds (subqueries included).
pub fn sharded_anywhere(n: &NodeEnum, schema: &dyn Schema) -> usize {
    let tree = serde_json::to_value(n).unwrap_or(Value::Null);
    let mut count = 0;
    let mut stack = vec![&tree];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(fields) => {
                let rel = fields.get("RangeVar").and_then(|rv| rv.get("relname")).and_then(Value::as_str);
                count += usize::from(rel.is_some_and(|t| schema.key_of(t).is_some()));
                stack.extend(fields.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    count
}

/// The sharded tables a FROM item names directly (through joins), or why running it on every
/// shard would repeat rows: an outer join whose preserved side has no sharded table gives that
/// side's unmatched rows once per shard.
pub fn sharded_in_from(n: &Node, schema: &dyn Schema) -> Result<usize, String> {
    match n.node.as_ref() {
        Some(NodeEnum::RangeVar(rv)) => Ok(usize::from(schema.key_of(&rv.relname).is_some())),
        Some(NodeEnum::JoinExpr(j)) => {
            let side = |s: &Option<Box<Node>>| s.as_deref().map_or(Ok(0), |s| sharded_in_from(s, schema));
            let (l, r) = (side(&j.larg)?, side(&j.rarg)?);
            let outer_loses = match JoinType::try_from(j.jointype) {
                Ok(JoinType::JoinLeft) => l == 0 && r > 0,
                Ok(JoinType::JoinRight) => r == 0 && l > 0,
                Ok(JoinType::JoinFull) => l + r > 0,
                _ => false,
            };
            if outer_loses {
                return Err(
                    "an outer join that preserves rows of a table on every shard would repeat them once per shard"
                        .into(),
                );
            }
            Ok(l + r)
        }
        _ => Ok(0),
    }
}

/// An integer constant (`LIMIT 5`, `ORDER BY 2`); `Some(None)` for NULL (`LIMIT ALL`).
pub fn int_const(n: &Node) -> Option<Option<i64>> {
    let Some(NodeEnum::AConst(c)) = n.node.as_ref() else { return None };
    if c.isnull {
        return Some(None);
    }
    match c.val.as_ref() {
        Some(a_const::Val::Ival(i)) => Some(Some(i64::from(i.ival))),
        // Integers beyond int4 arrive as Float nodes holding their digits.
        Some(a_const::Val::Fval(f)) => f.fval.parse().ok().map(Some),
        None => Some(Some(0)),
        _ => None,
    }
}

/// A bare column name (`x`, not `t.x`).
pub fn bare_name(n: &Node) -> Option<&str> {
    let Some(NodeEnum::ColumnRef(c)) = n.node.as_ref() else { return None };
    match c.fields.as_slice() {
        [f] => match f.node.as_ref() {
            Some(NodeEnum::String(s)) => Some(s.sval.as_str()),
            _ => None,
        },
        _ => None,
    }
}

/// `*` or `t.*`.
pub fn is_star(n: &Node) -> bool {
    let Some(NodeEnum::ColumnRef(c)) = n.node.as_ref() else { return false };
    c.fields.iter().any(|f| matches!(f.node, Some(NodeEnum::AStar(_))))
}
