//! [`plan`]: decides whether a SELECT over sharded tables can be answered exactly from every
//! shard's answer, and if so rewrites it for the shards (LIMIT n OFFSET m → LIMIT n+m, avg →
//! sum and a hidden count, ORDER BY and GROUP BY keys outside the select list → hidden
//! columns, the order that makes groups and duplicates adjacent) and says how to combine.
//! Anything it cannot answer exactly is refused with the reason; nothing is guessed.

use pg_query::protobuf::{self, LimitOption, Node, SelectStmt, SetOperation, SortByDir, SortByNulls};
use pg_query::NodeEnum;

use super::plan::{self, AggKind, Col, Decision, Plan, Role, Shape, SortKey, Target};
use super::tree;
use crate::shardkey::Schema;

/// What the planner needs to know about the cluster.
#[derive(Clone, Copy)]
pub struct Options<'a> {
    /// Which tables are sharded (any others are replicated on every shard).
    pub schema: &'a dyn Schema,
    /// User-defined aggregate names (lowercase), e.g. read from `pg_proc` at connect: without
    /// them such a call looks like a plain function.
    pub aggregates: &'a [String],
    /// The caller checked that the sharded tables in FROM are joined on their keys and placed
    /// alike ([`crate::shardkey::colocated`]): each shard answers the join for its own rows,
    /// so the join is combined as one table would be.
    pub colocated: bool,
}

/// Plans `sql` (one SELECT) for every shard, or refuses it.
pub fn plan(sql: &str, opts: &Options<'_>) -> Decision {
    // A statement PostgreSQL's parser rejects gets its syntax error from one shard.
    let Ok(parsed) = pg_query::parse(sql, 0) else { return Decision::One };
    let tree = parsed.protobuf;
    let stmt = match tree.stmts.as_slice() {
        [raw] => raw.stmt.as_ref().and_then(|n| n.node.as_ref()),
        _ => return Decision::Refuse("only one statement at a time is answered across shards".into()),
    };
    let Some(NodeEnum::SelectStmt(s)) = stmt else {
        return Decision::Refuse("only SELECT is answered from every shard".into());
    };
    let node = NodeEnum::SelectStmt(s.clone());
    if tree::sharded_anywhere(&node, opts.schema) == 0 {
        return Decision::One;
    }
    match check(s, opts).and_then(|()| Build::new(s, opts)?.plan(s.as_ref().clone(), tree.version)) {
        Ok(p) => Decision::Exact(p),
        Err(reason) => Decision::Refuse(reason),
    }
}

/// The statement-level refusals, and where the sharded tables are.
fn check(s: &SelectStmt, opts: &Options<'_>) -> Result<(), String> {
    let refuse = |why: &str| Err(why.to_owned());
    if s.op != SetOperation::SetopNone as i32 {
        return refuse("set operations (UNION, INTERSECT, EXCEPT) over sharded tables are not combined across shards");
    }
    if s.with_clause.is_some() {
        return refuse("WITH (common table expressions) over sharded tables is not answered across shards");
    }
    if !s.locking_clause.is_empty() {
        return refuse("FOR UPDATE/SHARE over every shard is not supported: name the key so one shard answers");
    }
    if s.into_clause.is_some() {
        return refuse("SELECT INTO over sharded tables is not supported");
    }
    if !s.window_clause.is_empty() {
        return refuse("window functions over a sharded table need every row on one server");
    }
    if s.having_clause.is_some() {
        return refuse("HAVING over a sharded table is not combined across shards");
    }
    if s.limit_option == LimitOption::WithTies as i32 {
        return refuse("FETCH ... WITH TIES over a sharded table is not supported");
    }
    let node = NodeEnum::SelectStmt(Box::new(s.clone()));
    let mut direct = 0;
    for f in &s.from_clause {
        direct += tree::sharded_in_from(f, opts.schema)?;
    }
    if tree::sharded_anywhere(&node, opts.schema) > direct {
        return refuse("a sharded table in a subquery is not answered across shards");
    }
    if direct > 1 && !opts.colocated {
        return refuse("a join of two sharded tables is not answered across shards by the merge");
    }
    Ok(())
}

/// The planner's working state for one statement.
struct Build<'a> {
    opts: &'a Options<'a>,
    /// The select list, classified, and each entry's expression and explicit alias.
    targets: Vec<Target>,
    vals: Vec<Option<Node>>,
    aliases: Vec<String>,
    star: bool,
    distinct: bool,
    /// Expressions appended to the select list for the shards, and their roles.
    hidden: Vec<Node>,
    hidden_roles: Vec<Role>,
    /// GROUP BY keys and the columns holding them.
    groups: Vec<(Node, Col)>,
}

impl<'a> Build<'a> {
    fn new(s: &SelectStmt, opts: &'a Options<'a>) -> Result<Build<'a>, String> {
        let mut b = Build {
            opts,
            targets: vec![],
            vals: vec![],
            aliases: vec![],
            star: false,
            distinct: false,
            hidden: vec![],
            hidden_roles: vec![],
            groups: vec![],
        };
        for t in &s.target_list {
            let Some(NodeEnum::ResTarget(rt)) = t.node.as_ref() else { continue };
            let val = rt.val.as_deref().cloned().unwrap_or_default();
            let target = b.classify(&val)?;
            b.star |= matches!(target, Target::Star);
            b.targets.push(target);
            b.vals.push(Some(val));
            b.aliases.push(rt.name.clone());
        }
        b.distinct = match s.distinct_clause.as_slice() {
            [] => false,
            [only] if only.node.is_none() => true,
            _ => return Err("DISTINCT ON over a sharded table is not combined across shards".into()),
        };
        Ok(b)
    }

    /// One select-list entry: `*`, a plain expression, or a supported aggregate.
    fn classify(&self, val: &Node) -> Result<Target, String> {
        if tree::is_star(val) {
            return Ok(Target::Star);
        }
        let calls = tree::calls(val, self.opts.aggregates);
        if calls.windows {
            return Err("window functions over a sharded table need every row on one server".into());
        }
        if calls.aggregates == 0 {
            return Ok(Target::Plain(val.clone()));
        }
        let Some(NodeEnum::FuncCall(f)) = val.node.as_ref() else {
            return Err("an aggregate inside an expression (e.g. sum(x) + 1) is not combined across shards".into());
        };
        aggregate(f, self.opts.aggregates)
    }

    fn aggregating(&self) -> bool {
        !self.groups.is_empty() || self.targets.iter().any(|t| matches!(t, Target::Agg(..)))
    }

    fn plan(mut self, mut s: SelectStmt, version: i32) -> Result<Plan, String> {
        self.group_keys(&s.group_clause)?;
        let aggregating = self.aggregating();
        if aggregating && (self.star || self.distinct) {
            return Err("SELECT * or DISTINCT together with aggregates is not combined across shards".into());
        }
        if self.distinct && self.star {
            return Err("SELECT DISTINCT * over sharded tables is not supported: name the columns".into());
        }
        let roles = if aggregating { Some(self.roles()?) } else { None };
        let mut order = self.client_order(&s.sort_clause, roles.as_deref())?;
        let extra = self.completing_order(&order, roles.is_some());
        s.sort_clause.extend(extra.iter().map(|k| plan::sort_by(plan::int(self.position(k.col) as i64 + 1))));
        order.extend(extra);
        let offset = bound(s.limit_offset.as_deref(), "OFFSET")?.unwrap_or(0);
        let limit = bound(s.limit_count.as_deref(), "LIMIT")?;
        let whole_table_aggregate = aggregating && self.groups.is_empty();
        let pushed = limit.filter(|_| !whole_table_aggregate).and_then(|n| n.checked_add(offset));
        s.limit_offset = None;
        s.limit_count = pushed.and_then(|n| i64::try_from(n).ok()).map(|n| Box::new(plan::int(n)));
        if s.limit_count.is_none() {
            s.limit_option = LimitOption::Default as i32;
        }
        self.rewrite_targets(&mut s);
        let shape = match roles {
            Some(r) => Shape::Groups(r),
            None if self.distinct => Shape::Distinct,
            None => Shape::Rows,
        };
        Ok(Plan { sql: plan::deparse(s, version)?, hidden: self.hidden.len(), order, shape, offset, limit })
    }

    /// The column's 0-based place in the shards' select list (no `*` when this is asked).
    fn position(&self, col: Col) -> usize {
        col.index(self.targets.len())
    }

    /// Resolves GROUP BY entries to columns, appending hidden ones.
    fn group_keys(&mut self, clause: &[Node]) -> Result<(), String> {
        for g in clause {
            if matches!(g.node, Some(NodeEnum::GroupingSet(_))) {
                return Err("GROUPING SETS, ROLLUP and CUBE are not combined across shards".into());
            }
            if tree::calls(g, self.opts.aggregates).aggregates > 0 {
                return Err("an aggregate in GROUP BY is not allowed".into());
            }
            let col = match tree::int_const(g) {
                Some(Some(k)) => self.position_ref(k)?,
                _ => match self.output_named(g)? {
                    Some(i) => Col::Out(i),
                    None => self.find_or_hide(g, Role::Key),
                },
            };
            self.groups.push((g.clone(), col));
        }
        Ok(())
    }

    /// `ORDER BY k` / `GROUP BY k`: the k-th output column.
    fn position_ref(&self, k: i64) -> Result<Col, String> {
        if self.star {
            return Err("a column position with SELECT * is not resolved across shards".into());
        }
        let i = usize::try_from(k).ok().filter(|&k| (1..=self.targets.len()).contains(&k));
        i.map(|k| Col::Out(k - 1)).ok_or_else(|| format!("column position {k} is not in the select list"))
    }

    /// A bare name that is an output column's alias. In GROUP BY PostgreSQL prefers an input
    /// column of that name, which refract cannot see: refused unless the alias names itself.
    fn output_named(&self, n: &Node) -> Result<Option<usize>, String> {
        let Some(name) = tree::bare_name(n) else { return Ok(None) };
        let Some(i) = self.aliases.iter().position(|a| a == name) else { return Ok(None) };
        let itself = self.vals[i].as_ref().and_then(tree::bare_name) == Some(name);
        if self.star || !itself {
            return Err(format!("\"{name}\" may name an output column or a table column; write the expression"));
        }
        Ok(Some(i))
    }

    /// The output column computing `n`, else a new hidden column for it.
    fn find_or_hide(&mut self, n: &Node, role: Role) -> Col {
        let found =
            (!self.star).then(|| self.vals.iter().position(|v| v.as_ref().is_some_and(|v| tree::same(v, n)))).flatten();
        match found {
            Some(i) => Col::Out(i),
            None => {
                if let Some(j) = self.hidden.iter().position(|h| tree::same(h, n)) {
                    return Col::Hidden(j);
                }
                self.hidden.push(n.clone());
                self.hidden_roles.push(role);
                Col::Hidden(self.hidden.len() - 1)
            }
        }
    }

    /// Each column's role in an aggregating query; avg's count becomes a hidden column.
    fn roles(&mut self) -> Result<Vec<Role>, String> {
        let mut roles = vec![];
        for (i, t) in self.targets.clone().iter().enumerate() {
            roles.push(match t {
                Target::Plain(_) if self.groups.iter().any(|(_, c)| *c == Col::Out(i)) => Role::Key,
                Target::Plain(_) | Target::Star => {
                    return Err(format!("output column {} is neither an aggregate nor a GROUP BY key", i + 1))
                }
                Target::Agg(AggKind::Avg, arg) => {
                    let count = plan::call("count", arg.clone(), "");
                    self.hidden.push(count);
                    self.hidden_roles.push(Role::Count);
                    Role::Avg { count: self.targets.len() + self.hidden.len() - 1 }
                }
                Target::Agg(kind, _) => match kind {
                    AggKind::Count => Role::Count,
                    AggKind::Sum => Role::Sum,
                    AggKind::Min => Role::Min,
                    AggKind::Max => Role::Max,
                    AggKind::Avg => Role::Count,
                },
            });
        }
        roles.extend(self.hidden_roles.iter().copied());
        Ok(roles)
    }

    /// The client's ORDER BY as merge keys.
    fn client_order(&mut self, clause: &[Node], roles: Option<&[Role]>) -> Result<Vec<SortKey>, String> {
        let mut keys = vec![];
        for item in clause {
            let Some(NodeEnum::SortBy(sb)) = item.node.as_ref() else { continue };
            let expr = sb.node.as_deref().cloned().unwrap_or_default();
            if sb.sortby_dir == SortByDir::SortbyUsing as i32 {
                return Err("ORDER BY ... USING an operator is not merged across shards".into());
            }
            let calls = tree::calls(&expr, self.opts.aggregates);
            if let Some(c) = calls.collations.first() {
                return Err(format!("ORDER BY ... COLLATE \"{c}\" is not merged exactly (only C and POSIX are)"));
            }
            if calls.windows {
                return Err("window functions over a sharded table need every row on one server".into());
            }
            let col = self.sort_col(&expr, roles, calls.aggregates > 0)?;
            let desc = sb.sortby_dir == SortByDir::SortbyDesc as i32;
            let nulls_first = match SortByNulls::try_from(sb.sortby_nulls) {
                Ok(SortByNulls::SortbyNullsFirst) => true,
                Ok(SortByNulls::SortbyNullsLast) => false,
                _ => desc,
            };
            keys.push(SortKey { col, desc, nulls_first });
        }
        Ok(keys)
    }

    fn sort_col(&mut self, expr: &Node, roles: Option<&[Role]>, has_agg: bool) -> Result<Col, String> {
        let named = match tree::int_const(expr) {
            Some(Some(k)) => Some(self.position_ref(k)?),
            _ => {
                let alias = tree::bare_name(expr).and_then(|n| self.aliases.iter().position(|a| a == n));
                if alias.is_some() && self.star {
                    return Err("ORDER BY an output alias with SELECT * is not resolved across shards".into());
                }
                alias.map(Col::Out)
            }
        };
        let col = match (named, roles) {
            (Some(c), _) => c,
            (None, Some(_)) => {
                let group = self.groups.iter().find(|(g, _)| tree::same(g, expr)).map(|(_, c)| *c);
                let out = (!self.star)
                    .then(|| self.vals.iter().position(|v| v.as_ref().is_some_and(|v| tree::same(v, expr))));
                group.or(out.flatten().map(Col::Out)).ok_or("ORDER BY must use GROUP BY keys across shards")?
            }
            (None, None) if has_agg => return Err("ORDER BY an aggregate needs every group in memory".into()),
            (None, None) if self.distinct => {
                let out = self.vals.iter().position(|v| v.as_ref().is_some_and(|v| tree::same(v, expr)));
                Col::Out(out.ok_or("with SELECT DISTINCT, ORDER BY must name output columns")?)
            }
            (None, None) => self.find_or_hide(expr, Role::Key),
        };
        let is_key = |r: &[Role]| r.get(self.position(col)) == Some(&Role::Key);
        if roles.is_some_and(|r| !is_key(r)) {
            return Err(
                "ORDER BY an aggregate across shards needs every group in memory; order by GROUP BY keys".into()
            );
        }
        Ok(col)
    }

    /// Keys appended to the client's order so that equal groups (GROUP BY) or equal rows
    /// (DISTINCT) arrive next to each other.
    fn completing_order(&self, keys: &[SortKey], aggregating: bool) -> Vec<SortKey> {
        let wanted: Vec<Col> = if aggregating {
            self.groups.iter().map(|(_, c)| *c).collect()
        } else if self.distinct {
            (0..self.targets.len()).map(Col::Out).collect()
        } else {
            vec![]
        };
        let mut out: Vec<SortKey> = vec![];
        for c in wanted {
            if !keys.iter().chain(&out).any(|k| k.col == c) {
                out.push(SortKey { col: c, desc: false, nulls_first: false });
            }
        }
        out
    }

    /// avg → sum (aliased `avg` unless named), then the hidden columns.
    fn rewrite_targets(&self, s: &mut SelectStmt) {
        let mut at = 0;
        for t in &mut s.target_list {
            let Some(NodeEnum::ResTarget(rt)) = t.node.as_mut() else { continue };
            if matches!(self.targets.get(at), Some(Target::Agg(AggKind::Avg, _))) {
                if let Some(NodeEnum::FuncCall(f)) = rt.val.as_mut().and_then(|v| v.node.as_mut()) {
                    f.funcname = vec![Node { node: Some(NodeEnum::String(protobuf::String { sval: "sum".into() })) }];
                }
                if rt.name.is_empty() {
                    rt.name = "avg".into();
                }
            }
            at += 1;
        }
        for h in &self.hidden {
            match h.node.as_ref() {
                Some(NodeEnum::ResTarget(_)) => s.target_list.push(h.clone()),
                _ => s.target_list.push(plan::target(h.clone(), "")),
            }
        }
    }
}

/// A supported aggregate call, or why not.
fn aggregate(f: &protobuf::FuncCall, extra: &[String]) -> Result<Target, String> {
    let name = tree::func_name(f).unwrap_or_default();
    let Some(kind) = AggKind::from_name(&name) else {
        return Err(format!(
            "aggregate {name}() is not combined across shards (only count, sum, min, max and avg are)"
        ));
    };
    if f.agg_distinct {
        return Err(format!("{name}(DISTINCT ...) over a sharded table is not combined across shards"));
    }
    if f.agg_filter.is_some() || !f.agg_order.is_empty() || f.agg_within_group || f.func_variadic {
        return Err(format!("{name}() with FILTER, ORDER BY or WITHIN GROUP is not combined across shards"));
    }
    match (f.agg_star, f.args.as_slice()) {
        (true, []) if kind == AggKind::Count => Ok(Target::Agg(kind, None)),
        (false, [arg]) if tree::calls(arg, extra).aggregates == 0 => Ok(Target::Agg(kind, Some(arg.clone()))),
        _ => Err(format!("this call of {name}() is not combined across shards")),
    }
}

/// A LIMIT or OFFSET: absent or ALL, or a non-negative integer constant.
fn bound(n: Option<&Node>, what: &str) -> Result<Option<u64>, String> {
    let Some(n) = n else { return Ok(None) };
    match tree::int_const(n) {
        Some(None) => Ok(None),
        Some(Some(v)) => u64::try_from(v).map(Some).map_err(|_| format!("{what} must not be negative")),
        None => Err(format!("{what} across shards must be an integer constant")),
    }
}
