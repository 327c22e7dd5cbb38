//! What a scatter-gather answer is made of: the [`Plan`] (the SQL every shard runs and how the
//! rows combine), the statement's output columns as the planner sees them, and the rewrite of
//! the statement into the shards' SQL.

use pg_query::protobuf::{self, Node, ResTarget};
use pg_query::NodeEnum;

/// The planner's answer for one SELECT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The statement names no sharded table: any one shard answers it alone.
    One,
    /// Every shard runs `plan.sql`; [`super::Gather`] combines the answers exactly.
    Exact(Plan),
    /// refract cannot answer it exactly across shards; the reason goes to the client with
    /// SQLSTATE [`super::REFUSED`].
    Refuse(String),
}

/// How to answer a SELECT from every shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The SQL each shard runs.
    pub sql: String,
    /// Trailing columns of the shards' rows the client does not see (ORDER BY and GROUP BY
    /// keys outside the select list, the counts of rewritten averages).
    pub hidden: usize,
    /// The order each shard's rows arrive in, and so the merge order.
    pub order: Vec<SortKey>,
    /// How rows combine.
    pub shape: Shape,
    /// Rows of the combined answer to skip, then to send at most (the client's OFFSET, LIMIT).
    pub offset: u64,
    pub limit: Option<u64>,
}

/// A column of the shards' rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Col {
    /// The client's i-th column.
    Out(usize),
    /// The i-th hidden column (after the client's).
    Hidden(usize),
}

/// One key of the merge order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SortKey {
    pub col: Col,
    pub desc: bool,
    pub nulls_first: bool,
}

/// How the merged rows become the client's rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// As they come (merged or concatenated).
    Rows,
    /// SELECT DISTINCT: rows equal in every column (adjacent, as the order covers them all)
    /// are one.
    Distinct,
    /// Aggregates: rows equal in every sort key (the GROUP BY keys, adjacent) combine; one
    /// role per column of the shards' rows, hidden ones included.
    Groups(Vec<Role>),
}

/// What a column is in an aggregating query, and so how two shards' values combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A GROUP BY key: equal within the group, kept.
    Key,
    /// `count`: the counts add up.
    Count,
    /// `sum`: the sums add up (NULL when every shard's is).
    Sum,
    Min,
    Max,
    /// `avg`, sent as `sum`; the count is the shards' column `count` (an index of all columns).
    Avg {
        count: usize,
    },
}

impl Col {
    /// The column's index in the shards' rows, which have `clients` visible columns.
    pub fn index(self, clients: usize) -> usize {
        match self {
            Col::Out(i) => i,
            Col::Hidden(i) => clients + i,
        }
    }
}

/// One entry of the select list as the planner classifies it.
#[derive(Debug, Clone)]
pub enum Target {
    /// `*` or `t.*`: an unknown number of plain columns.
    Star,
    /// An expression without aggregates.
    Plain(Node),
    /// A supported aggregate: its kind and argument (`None` for `count(*)`).
    Agg(AggKind, Option<Node>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggKind {
    Count,
    Sum,
    Min,
    Max,
    Avg,
}

impl AggKind {
    pub fn from_name(name: &str) -> Option<AggKind> {
        Some(match name {
            "count" => AggKind::Count,
            "sum" => AggKind::Sum,
            "min" => AggKind::Min,
            "max" => AggKind::Max,
            "avg" => AggKind::Avg,
            _ => return None,
        })
    }
}

/// A call `name(arg)` (`name(*)` when `arg` is `None`) as a select-list entry.
pub fn call(name: &str, arg: Option<Node>, alias: &str) -> Node {
    let agg_star = arg.is_none();
    let func = protobuf::FuncCall {
        funcname: vec![string(name)],
        args: arg.into_iter().collect(),
        agg_star,
        funcformat: protobuf::CoercionForm::CoerceExplicitCall as i32,
        ..Default::default()
    };
    target(Node { node: Some(NodeEnum::FuncCall(Box::new(func))) }, alias)
}

/// A select-list entry.
pub fn target(val: Node, alias: &str) -> Node {
    let t = ResTarget { name: alias.to_owned(), val: Some(Box::new(val)), ..Default::default() };
    Node { node: Some(NodeEnum::ResTarget(Box::new(t))) }
}

/// `ORDER BY <node> ASC`.
pub fn sort_by(node: Node) -> Node {
    let s = protobuf::SortBy {
        node: Some(Box::new(node)),
        sortby_dir: protobuf::SortByDir::SortbyDefault as i32,
        sortby_nulls: protobuf::SortByNulls::SortbyNullsDefault as i32,
        ..Default::default()
    };
    Node { node: Some(NodeEnum::SortBy(Box::new(s))) }
}

/// An integer constant (`ORDER BY 2`, `LIMIT 10`).
pub fn int(v: i64) -> Node {
    let val = match i32::try_from(v) {
        Ok(i) => protobuf::a_const::Val::Ival(protobuf::Integer { ival: i }),
        Err(_) => protobuf::a_const::Val::Fval(protobuf::Float { fval: v.to_string() }),
    };
    Node { node: Some(NodeEnum::AConst(protobuf::AConst { isnull: false, location: -1, val: Some(val) })) }
}

fn string(s: &str) -> Node {
    Node { node: Some(NodeEnum::String(protobuf::String { sval: s.to_owned() })) }
}

/// The SQL text of a rewritten SELECT.
pub fn deparse(stmt: protobuf::SelectStmt, version: i32) -> Result<String, String> {
    let raw = protobuf::RawStmt {
        stmt: Some(Box::new(Node { node: Some(NodeEnum::SelectStmt(Box::new(stmt))) })),
        stmt_location: 0,
        stmt_len: 0,
    };
    let tree = protobuf::ParseResult { version, stmts: vec![raw] };
    pg_query::deparse(&tree, Default::default()).map_err(|e| format!("cannot write the shards' SQL: {e}"))
}
