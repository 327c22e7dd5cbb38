//! Which key values a statement touches in each sharded table, read from its parse tree: the
//! routing input of a sharded cluster. Pure: the caller says which tables are sharded on which
//! column, and turns the answer into shards with [`crate::partition`] (or a range or list map).
//!
//! What restricts a table's key (in WHERE, and in JOIN ... ON):
//! - `key = const`, `key = $n` (either side, through casts), `key IN (consts or $n)`,
//!   `key = ANY($n)` (an array parameter) and `key = ANY(ARRAY[...])`;
//! - AND takes the narrowest restricting conjunct; OR restricts only when every branch does;
//! - `a.key = b.key` carries one table's restriction to the other (a co-located join).
//!
//! INSERT ... VALUES gives each row's key ([`KeySet::Rows`]), so a multi-row INSERT can be split.
//! Anything else (a sharded table in a subquery, a key compared with an expression, NOT, a
//! function of the key) is [`KeySet::Every`]: sending a statement to more shards is slower,
//! never wrong, so the walk errs that way.

use pg_query::protobuf::{self, a_const, AExprKind, BoolExprType, Node};
use pg_query::NodeEnum;
use serde_json::Value;

/// Where one key value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyValue {
    /// A constant, as PostgreSQL's text form (`42`, `abc`, `a0ee...`).
    Literal(String),
    /// The statement's parameter `$n` (1-based), bound later by Bind.
    Param(usize),
    Null,
}

/// What a statement says about one sharded table's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySet {
    /// No restriction found: every shard.
    Every,
    /// The key is one of these values.
    OneOf(Vec<KeyValue>),
    /// `key = ANY($n)`: one of the elements of an array parameter.
    AnyOf(usize),
    /// INSERT: row i has key `rows[i]`.
    Rows(Vec<KeyValue>),
}

/// One reference to a sharded table and its key restriction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableKeys {
    pub table: String,
    pub keys: KeySet,
}

/// The sharding schema as the walk needs it: a table's key column, if the table is sharded.
pub trait Schema {
    fn key_of(&self, table: &str) -> Option<&str>;

    /// The key column's position among the table's columns (0-based), if known: an INSERT
    /// without a column list gives its values in that order.
    fn key_position(&self, _table: &str) -> Option<usize> {
        None
    }
}

impl<F: Fn(&str) -> Option<&'static str>> Schema for F {
    fn key_of(&self, table: &str) -> Option<&str> {
        self(table)
    }
}

/// Parses `sql` and returns, statement by statement, the key restriction of every reference
/// to a sharded table; `Err` carries the parser's message.
pub fn key_sets(sql: &str, schema: &dyn Schema) -> Result<Vec<Vec<TableKeys>>, String> {
    let parsed = pg_query::parse(sql, 0).map_err(|e| e.to_string())?;
    Ok(parsed.protobuf.stmts.iter().filter_map(|raw| raw.stmt.as_ref()?.node.as_ref()).map(|n| of(n, schema)).collect())
}

/// The restrictions of one parsed statement.
pub fn of(node: &NodeEnum, schema: &dyn Schema) -> Vec<TableKeys> {
    let (scope, filters): (Vec<Ref>, Vec<&Node>) = match node {
        NodeEnum::SelectStmt(s) if s.op == protobuf::SetOperation::SetopNone as i32 => {
            let mut refs = vec![];
            let mut quals = vec![];
            for f in &s.from_clause {
                from_item(f, schema, &mut refs, &mut quals);
            }
            quals.extend(s.where_clause.as_deref());
            (refs, quals)
        }
        NodeEnum::UpdateStmt(u) => (one(u.relation.as_ref(), schema), u.where_clause.as_deref().into_iter().collect()),
        NodeEnum::DeleteStmt(d) => (one(d.relation.as_ref(), schema), d.where_clause.as_deref().into_iter().collect()),
        NodeEnum::InsertStmt(i) => {
            let target = insert(i, schema);
            let counted: Vec<&str> = target.iter().map(|t| t.table.as_str()).collect();
            let rest = others(node, &counted, schema);
            return target.into_iter().chain(rest).collect();
        }
        _ => return others(node, &[], schema),
    };
    let conj: Vec<&Node> = filters.into_iter().flat_map(conjuncts).collect();
    let mut out: Vec<TableKeys> =
        scope.iter().map(|r| TableKeys { table: r.table.clone(), keys: restriction(&conj, r, &scope) }).collect();
    carry_over_joins(&conj, &scope, &mut out);
    let counted: Vec<&str> = scope.iter().map(|r| r.table.as_str()).collect();
    out.extend(others(node, &counted, schema));
    out
}

/// The sharded tables a SELECT's FROM names (through joins), when there are two or more and
/// every one is joined to the others by an equality of their key columns (`a.key = b.key`, in
/// WHERE or in JOIN ... ON, through chains): a co-located join, which each shard answers for
/// its own rows when the tables are placed alike. `None` otherwise (the tables' names in scope
/// order when `Some`).
pub fn colocated(node: &NodeEnum, schema: &dyn Schema) -> Option<Vec<String>> {
    let NodeEnum::SelectStmt(s) = node else { return None };
    let (mut refs, mut inner) = (vec![], vec![]);
    for f in &s.from_clause {
        from_item(f, schema, &mut refs, &mut inner);
    }
    if refs.len() < 2 {
        return None;
    }
    // An outer join on the keys is co-located too: a row's partners are all on its shard.
    let mut quals = vec![];
    s.from_clause.iter().for_each(|f| join_quals(f, &mut quals));
    quals.extend(s.where_clause.as_deref());
    let conj: Vec<&Node> = quals.into_iter().flat_map(conjuncts).collect();
    // Joined so far: start from the first table, add any table equated to a joined one.
    let mut joined = vec![false; refs.len()];
    joined[0] = true;
    for _ in 0..refs.len() {
        for c in &conj {
            let Some((a, b)) = key_equality(c, &refs) else { continue };
            if joined[a] || joined[b] {
                (joined[a], joined[b]) = (true, true);
            }
        }
    }
    joined.iter().all(|j| *j).then(|| refs.into_iter().map(|r| r.table).collect())
}

/// The ON conditions of every join in a FROM item, inner or outer.
fn join_quals<'a>(n: &'a Node, out: &mut Vec<&'a Node>) {
    if let Some(NodeEnum::JoinExpr(j)) = n.node.as_ref() {
        for side in [&j.larg, &j.rarg].into_iter().flatten() {
            join_quals(side, out);
        }
        out.extend(j.quals.as_deref());
    }
}

/// `a.key = b.key` between two tables in scope: their positions.
fn key_equality(c: &Node, scope: &[Ref]) -> Option<(usize, usize)> {
    let Some(NodeEnum::AExpr(e)) = c.node.as_ref() else { return None };
    if e.kind != AExprKind::AexprOp as i32 || op_name(e) != Some("=") {
        return None;
    }
    let (l, r) = (e.lexpr.as_deref()?, e.rexpr.as_deref()?);
    let side = |n: &Node| scope.iter().position(|s| is_key(n, s, scope));
    let (a, b) = (side(l)?, side(r)?);
    (a != b).then_some((a, b))
}

/// A sharded table in scope: its name, the name it goes by in the statement, its key column.
#[derive(Debug)]
struct Ref {
    table: String,
    alias: String,
    key: String,
}

fn one(rv: Option<&protobuf::RangeVar>, schema: &dyn Schema) -> Vec<Ref> {
    rv.and_then(|rv| range_ref(rv, schema)).into_iter().collect()
}

fn range_ref(rv: &protobuf::RangeVar, schema: &dyn Schema) -> Option<Ref> {
    let key = schema.key_of(&rv.relname)?.to_owned();
    let alias = rv.alias.as_ref().map_or(rv.relname.clone(), |a| a.aliasname.clone());
    Some(Ref { table: rv.relname.clone(), alias, key })
}

/// A FROM item: a table, or a join of FROM items whose ON condition also filters.
fn from_item<'a>(n: &'a Node, schema: &dyn Schema, refs: &mut Vec<Ref>, quals: &mut Vec<&'a Node>) {
    match n.node.as_ref() {
        Some(NodeEnum::RangeVar(rv)) => refs.extend(range_ref(rv, schema)),
        Some(NodeEnum::JoinExpr(j)) => {
            for side in [&j.larg, &j.rarg].into_iter().flatten() {
                from_item(side, schema, refs, quals);
            }
            // Only an inner join's condition filters the rows of both sides.
            if j.jointype == protobuf::JoinType::JoinInner as i32 {
                quals.extend(j.quals.as_deref());
            }
        }
        _ => {}
    }
}

/// The AND-ed parts of a condition.
fn conjuncts(n: &Node) -> Vec<&Node> {
    match n.node.as_ref() {
        Some(NodeEnum::BoolExpr(b)) if b.boolop == BoolExprType::AndExpr as i32 => {
            b.args.iter().flat_map(conjuncts).collect()
        }
        _ => vec![n],
    }
}

/// The narrowest restriction of `r`'s key among the conjuncts.
fn restriction(conj: &[&Node], r: &Ref, scope: &[Ref]) -> KeySet {
    conj.iter().filter_map(|c| restricts(c, r, scope)).min_by_key(width).unwrap_or(KeySet::Every)
}

fn width(k: &KeySet) -> usize {
    match k {
        KeySet::OneOf(v) | KeySet::Rows(v) => v.len(),
        KeySet::AnyOf(_) => usize::MAX - 1,
        KeySet::Every => usize::MAX,
    }
}

/// What one condition says about `r`'s key, if anything.
fn restricts(n: &Node, r: &Ref, scope: &[Ref]) -> Option<KeySet> {
    match n.node.as_ref()? {
        NodeEnum::BoolExpr(b) if b.boolop == BoolExprType::AndExpr as i32 => {
            let conj: Vec<&Node> = b.args.iter().flat_map(conjuncts).collect();
            Some(restriction(&conj, r, scope)).filter(|k| *k != KeySet::Every)
        }
        NodeEnum::BoolExpr(b) if b.boolop == BoolExprType::OrExpr as i32 => {
            let mut all = vec![];
            for arg in &b.args {
                match restricts(arg, r, scope)? {
                    KeySet::OneOf(v) => all.extend(v),
                    _ => return None,
                }
            }
            Some(KeySet::OneOf(all))
        }
        NodeEnum::AExpr(e) => compare(e, r, scope),
        _ => None,
    }
}

/// `key = v`, `key IN (...)`, `key = ANY(...)`.
fn compare(e: &protobuf::AExpr, r: &Ref, scope: &[Ref]) -> Option<KeySet> {
    let (l, rt) = (e.lexpr.as_deref()?, e.rexpr.as_deref()?);
    let is_eq = op_name(e) == Some("=");
    if e.kind == AExprKind::AexprOp as i32 && is_eq {
        let v = if is_key(l, r, scope) {
            value(rt)
        } else if is_key(rt, r, scope) {
            value(l)
        } else {
            None
        };
        return v.map(|v| KeySet::OneOf(vec![v]));
    }
    if !is_key(l, r, scope) {
        return None;
    }
    if e.kind == AExprKind::AexprIn as i32 && is_eq {
        let Some(NodeEnum::List(list)) = rt.node.as_ref() else { return None };
        return list.items.iter().map(value).collect::<Option<Vec<_>>>().map(KeySet::OneOf);
    }
    if e.kind == AExprKind::AexprOpAny as i32 && is_eq {
        return match uncast(rt).node.as_ref()? {
            NodeEnum::ParamRef(p) => Some(KeySet::AnyOf(usize::try_from(p.number).ok()?)),
            NodeEnum::AArrayExpr(a) => a.elements.iter().map(value).collect::<Option<Vec<_>>>().map(KeySet::OneOf),
            _ => None,
        };
    }
    None
}

fn op_name(e: &protobuf::AExpr) -> Option<&str> {
    match e.name.as_slice() {
        [n] => match n.node.as_ref()? {
            NodeEnum::String(s) => Some(s.sval.as_str()),
            _ => None,
        },
        _ => None,
    }
}

/// Is `n` (through casts) `r`'s key column? An unqualified name counts only when `r` is the one
/// sharded table in scope (with two, PostgreSQL resolves it by columns refract does not know).
fn is_key(n: &Node, r: &Ref, scope: &[Ref]) -> bool {
    let Some(NodeEnum::ColumnRef(c)) = uncast(n).node.as_ref() else { return false };
    let names: Vec<&str> = c
        .fields
        .iter()
        .filter_map(|f| match f.node.as_ref() {
            Some(NodeEnum::String(s)) => Some(s.sval.as_str()),
            _ => None,
        })
        .collect();
    match names.as_slice() {
        [col] => *col == r.key && scope.len() == 1,
        [.., qual, col] => *col == r.key && *qual == r.alias,
        [] => false,
    }
}

fn uncast(n: &Node) -> &Node {
    match n.node.as_ref() {
        Some(NodeEnum::TypeCast(t)) => t.arg.as_deref().map_or(n, uncast),
        _ => n,
    }
}

/// A constant or parameter (through casts).
fn value(n: &Node) -> Option<KeyValue> {
    match uncast(n).node.as_ref()? {
        NodeEnum::ParamRef(p) => usize::try_from(p.number).ok().filter(|&n| n > 0).map(KeyValue::Param),
        NodeEnum::AConst(c) if c.isnull => Some(KeyValue::Null),
        NodeEnum::AConst(c) => Some(KeyValue::Literal(match c.val.as_ref()? {
            a_const::Val::Ival(i) => i.ival.to_string(),
            a_const::Val::Fval(f) => f.fval.clone(),
            a_const::Val::Sval(s) => s.sval.clone(),
            a_const::Val::Boolval(b) => b.boolval.to_string(),
            a_const::Val::Bsval(_) => return None,
        })),
        _ => None,
    }
}

/// `a.key = b.key` between two sharded tables in scope: an unrestricted side takes the
/// other's restriction (the rows that join have the same key).
fn carry_over_joins(conj: &[&Node], scope: &[Ref], out: &mut [TableKeys]) {
    for _ in 0..scope.len() {
        for c in conj {
            let Some(NodeEnum::AExpr(e)) = c.node.as_ref() else { continue };
            if e.kind != AExprKind::AexprOp as i32 || op_name(e) != Some("=") {
                continue;
            }
            let (Some(l), Some(r)) = (e.lexpr.as_deref(), e.rexpr.as_deref()) else { continue };
            let side = |n: &Node| scope.iter().position(|s| is_key(n, s, scope));
            if let (Some(a), Some(b)) = (side(l), side(r)) {
                if out[a].keys == KeySet::Every {
                    out[a].keys = out[b].keys.clone();
                } else if out[b].keys == KeySet::Every {
                    out[b].keys = out[a].keys.clone();
                }
            }
        }
    }
}

/// INSERT INTO t [(cols)] VALUES (...), ...: each row's key. Without a column list, or with
/// a key that is not a plain value, the rows are not known (every shard).
fn insert(i: &protobuf::InsertStmt, schema: &dyn Schema) -> Option<TableKeys> {
    let r = range_ref(i.relation.as_ref()?, schema)?;
    let every = TableKeys { table: r.table.clone(), keys: KeySet::Every };
    let cols: Vec<&str> = i
        .cols
        .iter()
        .filter_map(|c| match c.node.as_ref() {
            Some(NodeEnum::ResTarget(t)) => Some(t.name.as_str()),
            _ => None,
        })
        .collect();
    let at = if cols.is_empty() { schema.key_position(&r.table) } else { cols.iter().position(|c| *c == r.key) };
    let Some(at) = at else { return Some(every) };
    let Some(NodeEnum::SelectStmt(s)) = i.select_stmt.as_deref().and_then(|n| n.node.as_ref()) else {
        return Some(every);
    };
    if s.values_lists.is_empty() {
        return Some(every);
    }
    let rows: Option<Vec<KeyValue>> = s
        .values_lists
        .iter()
        .map(|row| match row.node.as_ref()? {
            NodeEnum::List(l) => value(l.items.get(at)?),
            _ => None,
        })
        .collect();
    Some(rows.map_or(every.clone(), |rows| TableKeys { table: r.table, keys: KeySet::Rows(rows) }))
}

/// Every other sharded table the tree names (subqueries, CTEs, INSERT ... SELECT sources),
/// beyond the `counted` references already described: unrestricted.
fn others(node: &NodeEnum, counted: &[&str], schema: &dyn Schema) -> Vec<TableKeys> {
    let Ok(tree) = serde_json::to_value(node) else { return vec![] };
    let mut names = vec![];
    let mut stack = vec![&tree];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(fields) => {
                if let Some(Value::String(t)) = fields.get("RangeVar").and_then(|rv| rv.get("relname")) {
                    names.push(t.clone());
                }
                stack.extend(fields.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    let mut left: Vec<&str> = counted.to_vec();
    let mut out = vec![];
    for t in names.iter().rev() {
        if let Some(i) = left.iter().position(|c| c == t) {
            left.remove(i);
        } else if schema.key_of(t).is_some() {
            out.push(TableKeys { table: t.clone(), keys: KeySet::Every });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(t: &str) -> Option<&'static str> {
        match t {
            "customers" => Some("id"),
            "orders" => Some("customer_id"),
            _ => None,
        }
    }

    fn keys(sql: &str) -> Vec<(String, KeySet)> {
        let all = key_sets(sql, &schema).unwrap();
        assert_eq!(all.len(), 1, "{sql}");
        all.into_iter().next().unwrap().into_iter().map(|t| (t.table, t.keys)).collect()
    }

    fn lit(v: &[&str]) -> KeySet {
        KeySet::OneOf(v.iter().map(|s| KeyValue::Literal(s.to_string())).collect())
    }

    fn c(k: KeySet) -> Vec<(String, KeySet)> {
        vec![("customers".into(), k)]
    }

    #[test]
    fn equality_in_lists_and_any() {
        assert_eq!(keys("SELECT * FROM customers WHERE id = 5"), c(lit(&["5"])));
        assert_eq!(keys("SELECT * FROM customers WHERE 5 = id AND name = 'x'"), c(lit(&["5"])));
        assert_eq!(keys("SELECT * FROM customers c WHERE c.id = $2::int8"), c(KeySet::OneOf(vec![KeyValue::Param(2)])));
        assert_eq!(
            keys("SELECT * FROM customers WHERE id IN (1, 2, $1)"),
            c(KeySet::OneOf(vec![KeyValue::Literal("1".into()), KeyValue::Literal("2".into()), KeyValue::Param(1)]))
        );
        assert_eq!(keys("SELECT * FROM customers WHERE id = ANY($1)"), c(KeySet::AnyOf(1)));
        assert_eq!(keys("SELECT * FROM customers WHERE id = ANY(ARRAY[3, 4])"), c(lit(&["3", "4"])));
        assert_eq!(
            keys("SELECT * FROM public.customers WHERE id = 9223372036854775807"),
            c(lit(&["9223372036854775807"]))
        );
        assert_eq!(keys("SELECT * FROM customers WHERE id = -3"), c(lit(&["-3"])));
    }

    #[test]
    fn or_needs_every_branch_and_and_takes_the_narrowest() {
        assert_eq!(keys("SELECT * FROM customers WHERE id = 1 OR id = 2"), c(lit(&["1", "2"])));
        assert_eq!(keys("SELECT * FROM customers WHERE id = 1 OR name = 'x'"), c(KeySet::Every));
        assert_eq!(keys("SELECT * FROM customers WHERE id IN (1, 2, 3) AND id = 2"), c(lit(&["2"])));
        assert_eq!(keys("SELECT * FROM customers WHERE (id = 1 AND x) OR id = 3"), c(lit(&["1", "3"])));
    }

    #[test]
    fn what_does_not_restrict_is_every_shard() {
        for sql in [
            "SELECT * FROM customers",
            "SELECT * FROM customers WHERE id > 5",
            "SELECT * FROM customers WHERE NOT id = 5",
            "SELECT * FROM customers WHERE id + 0 = 5",
            "SELECT * FROM customers WHERE id = other_col",
            "SELECT * FROM customers WHERE id = ANY('{1,2}')",
            "SELECT * FROM customers x WHERE customers.id = 5",
        ] {
            assert_eq!(keys(sql), c(KeySet::Every), "{sql}");
        }
    }

    #[test]
    fn writes_restrict_by_key_and_inserts_give_each_rows_key() {
        assert_eq!(keys("UPDATE customers SET name = 'x' WHERE id = 7"), c(lit(&["7"])));
        assert_eq!(keys("DELETE FROM customers WHERE id IN (7, 8)"), c(lit(&["7", "8"])));
        assert_eq!(
            keys("INSERT INTO customers (name, id) VALUES ('a', 1), ('b', $1), ('c', NULL)"),
            c(KeySet::Rows(vec![KeyValue::Literal("1".into()), KeyValue::Param(1), KeyValue::Null]))
        );
        assert_eq!(keys("INSERT INTO customers VALUES (1, 'a')"), c(KeySet::Every));
        assert_eq!(keys("INSERT INTO customers (id) VALUES (now())"), c(KeySet::Every));
        assert_eq!(keys("INSERT INTO customers (id) SELECT 1"), c(KeySet::Every));
    }

    #[test]
    fn joins_on_the_key_carry_the_restriction() {
        let both = |k: KeySet| vec![("customers".to_string(), k.clone()), ("orders".to_string(), k)];
        assert_eq!(
            keys("SELECT * FROM customers c JOIN orders o ON o.customer_id = c.id WHERE c.id = 4"),
            both(lit(&["4"]))
        );
        assert_eq!(
            keys("SELECT * FROM customers c, orders o WHERE o.customer_id = 4 AND c.id = o.customer_id"),
            both(lit(&["4"]))
        );
        // Unqualified names are ambiguous with two sharded tables in scope.
        assert_eq!(
            keys("SELECT * FROM customers c JOIN orders o ON o.customer_id = c.id WHERE id = 4"),
            both(KeySet::Every)
        );
        // An outer join's condition does not filter the preserved side.
        assert_eq!(
            keys("SELECT * FROM customers c LEFT JOIN orders o ON o.customer_id = c.id AND o.customer_id = 4"),
            both(KeySet::Every)
        );
    }

    #[test]
    fn sharded_tables_elsewhere_in_the_tree_are_every_shard() {
        assert_eq!(
            keys("SELECT * FROM customers WHERE id = 1 AND EXISTS (SELECT 1 FROM orders)"),
            vec![("customers".into(), lit(&["1"])), ("orders".into(), KeySet::Every)]
        );
        assert_eq!(
            keys("INSERT INTO orders (customer_id) SELECT id FROM customers"),
            vec![("orders".into(), KeySet::Every), ("customers".into(), KeySet::Every)]
        );
        assert_eq!(keys("SELECT * FROM other WHERE id = 1"), vec![]);
        assert_eq!(keys("WITH x AS (SELECT * FROM customers) SELECT * FROM x"), c(KeySet::Every));
    }

    #[test]
    fn colocated_joins_are_found_through_chains() {
        let schema = |t: &str| match t {
            "customers" => Some("id"),
            "orders" => Some("customer_id"),
            "items" => Some("customer_id"),
            _ => None,
        };
        let co = |sql: &str| {
            let parsed = pg_query::parse(sql, 0).unwrap();
            let node = parsed.protobuf.stmts[0].stmt.as_ref().unwrap().node.clone().unwrap();
            colocated(&node, &schema)
        };
        let both = Some(vec!["customers".to_owned(), "orders".to_owned()]);
        assert_eq!(co("select * from customers c join orders o on c.id = o.customer_id"), both);
        assert_eq!(co("select * from customers c, orders o where o.customer_id = c.id and c.name = 'x'"), both);
        assert_eq!(co("select * from customers c left join orders o on c.id = o.customer_id"), both);
        assert!(co("select * from customers c join orders o on c.id = o.id").is_none(), "not the key");
        assert!(co("select * from customers c join orders o on c.name = o.status").is_none());
        assert!(co("select * from customers c, orders o where c.id = o.customer_id or c.id = 1").is_none());
        assert!(co("select * from customers").is_none(), "one table is no join");
        let three = "select * from customers c join orders o on c.id = o.customer_id join items i on i.customer_id = o.customer_id";
        assert_eq!(co(three).map(|t| t.len()), Some(3));
        let loose = "select * from customers c join orders o on c.id = o.customer_id join items i on true";
        assert!(co(loose).is_none());
    }
}
