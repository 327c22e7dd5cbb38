//! [`Gather`]: turns k shards' answers to a [`Plan`]'s SQL into the client's answer, streaming.
//! A k-way merge holds one pending row per shard in a heap (rows of a shard arrive in the plan's
//! order; a row out of that order is an error, not a wrong answer), equal adjacent rows combine
//! (GROUP BY) or collapse (DISTINCT), then OFFSET and LIMIT apply. Pure: the caller reads rows
//! from the shards when [`Gather::step`] asks for one ([`Step::Need`]) and hands them over with
//! [`Gather::push`].

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;

pub use super::error::GatherError;
use super::fold::{self, Fold};
use super::plan::{Plan, Role, Shape};
pub use super::value::Row;
use super::value::{cmp_nullable, ColType, Val};
use refract_pg::backend::FieldDescription;

/// What the caller does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send this row to the client.
    Row(Row),
    /// Read shard `i`'s next row (or its end) and [`Gather::push`] it.
    Need(usize),
    /// The answer is complete: send this CommandComplete tag (`SELECT n`). Rows the shards
    /// still send (after a LIMIT) are to be read and dropped.
    Done(String),
}

/// One key of the merge order, resolved against the RowDescription.
#[derive(Debug)]
struct Spec {
    col: usize,
    ty: ColType,
    desc: bool,
    nulls_first: bool,
}

/// A sort key's values of one row.
type Keys = Vec<Option<Val>>;

fn cmp_keys(spec: &[Spec], a: &Keys, b: &Keys) -> Ordering {
    for (s, (x, y)) in spec.iter().zip(a.iter().zip(b)) {
        let o = cmp_nullable(x.as_ref(), y.as_ref(), s.desc, s.nulls_first);
        if o != Ordering::Equal {
            return o;
        }
    }
    Ordering::Equal
}

/// A shard's pending row in the merge heap.
struct Pending {
    keys: Keys,
    shard: usize,
    row: Row,
    spec: Arc<[Spec]>,
}

impl Ord for Pending {
    /// Reversed (BinaryHeap pops the greatest): the first row in merge order, then the lower
    /// shard number, is the greatest.
    fn cmp(&self, other: &Self) -> Ordering {
        cmp_keys(&self.spec, &other.keys, &self.keys).then(other.shard.cmp(&self.shard))
    }
}

impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pending {}

/// The gathering of one scattered SELECT.
pub struct Gather {
    spec: Arc<[Spec]>,
    clients: usize,
    width: usize,
    description: Vec<FieldDescription>,
    /// Groups: how each column folds, and which columns are averages (sum column, count).
    folds: Option<Vec<Fold>>,
    averages: Vec<(usize, usize)>,
    distinct: bool,
    heap: BinaryHeap<Pending>,
    /// Shards whose next row must be in the heap before the next pop.
    waiting: Vec<usize>,
    /// The sort keys of the row last taken from each shard, to check each shard's order.
    last: Vec<Option<Keys>>,
    /// The group being combined (GROUP BY) or the last row sent (DISTINCT), by its keys.
    current: Option<(Keys, Row)>,
    offset: u64,
    limit: Option<u64>,
    skipped: u64,
    sent: u64,
    peak: usize,
}

enum Pull {
    Need(usize),
    Row(Keys, Row),
    End,
}

impl Gather {
    /// Starts gathering `shards` answers to `plan`, given their RowDescriptions. `c_collation`:
    /// the shards compare text under the C collation (see [`super::value::ColType::of`]).
    pub fn new(plan: &Plan, descs: &[Vec<FieldDescription>], c_collation: bool) -> Result<Gather, GatherError> {
        let first = descs.first().ok_or_else(|| GatherError::Refused("no shards to gather from".into()))?;
        agree(descs)?;
        let width = first.len();
        let clients = width.checked_sub(plan.hidden).ok_or_else(|| shard0("fewer columns than the plan"))?;
        let spec = plan
            .order
            .iter()
            .map(|k| {
                let col = k.col.index(clients);
                let f = first.get(col).ok_or_else(|| shard0("a sort column is missing"))?;
                let ty = ColType::of(f.type_oid, f.format, c_collation)
                    .map_err(|why| GatherError::Refused(format!("ORDER BY column \"{}\": {why}", f.name)))?;
                Ok(Spec { col, ty, desc: k.desc, nulls_first: k.nulls_first })
            })
            .collect::<Result<Vec<_>, GatherError>>()?;
        let mut g = Gather {
            spec: spec.into(),
            clients,
            width,
            description: first[..clients].to_vec(),
            folds: None,
            averages: vec![],
            distinct: plan.shape == Shape::Distinct,
            heap: BinaryHeap::with_capacity(descs.len()),
            waiting: (0..descs.len()).rev().collect(),
            last: vec![None; descs.len()],
            current: None,
            offset: plan.offset,
            limit: plan.limit,
            skipped: 0,
            sent: 0,
            peak: 0,
        };
        if let Shape::Groups(roles) = &plan.shape {
            g.groups(roles, first, c_collation)?;
        }
        Ok(g)
    }

    fn groups(&mut self, roles: &[Role], desc: &[FieldDescription], c_collation: bool) -> Result<(), GatherError> {
        if roles.len() != self.width {
            return Err(shard0("a column count other than the plan's"));
        }
        let mut folds = vec![];
        for (i, (role, f)) in roles.iter().zip(desc).enumerate() {
            let fold = Fold::of(*role, f, c_collation)
                .map_err(|why| GatherError::Refused(format!("column \"{}\": {why}", f.name)))?;
            if let Role::Avg { count } = role {
                let client = self.description.get_mut(i).ok_or_else(|| shard0("avg() among the hidden columns"))?;
                *client = fold::avg_field(f);
                self.averages.push((i, *count));
            }
            folds.push(fold);
        }
        self.folds = Some(folds);
        Ok(())
    }

    /// The RowDescription to send the client.
    pub fn description(&self) -> &[FieldDescription] {
        &self.description
    }

    /// Rows held now, waiting to be merged (at most one per shard).
    pub fn resident(&self) -> usize {
        self.heap.len()
    }

    /// The most rows ever held at once.
    pub fn peak(&self) -> usize {
        self.peak
    }

    /// Hands over shard `shard`'s next row, or `None` at its end (its CommandComplete).
    pub fn push(&mut self, shard: usize, row: Option<Row>) -> Result<(), GatherError> {
        let err = |reason: String| GatherError::Shard { shard, reason };
        let at =
            self.waiting.iter().position(|&s| s == shard).ok_or_else(|| err("a row that was not asked for".into()))?;
        self.waiting.remove(at);
        let Some(row) = row else { return Ok(()) };
        if row.len() != self.width {
            return Err(err(format!("a row of {} columns, not {}", row.len(), self.width)));
        }
        let keys = self.keys(&row)?;
        if let Some(prev) = &self.last[shard] {
            if cmp_keys(&self.spec, prev, &keys) == Ordering::Greater {
                return Err(err("rows out of the pushed-down ORDER BY (does its collation differ?)".into()));
            }
        }
        self.heap.push(Pending { keys, shard, row, spec: self.spec.clone() });
        self.peak = self.peak.max(self.heap.len());
        Ok(())
    }

    fn keys(&self, row: &Row) -> Result<Keys, GatherError> {
        let read = |s: &Spec| row[s.col].as_ref().map(|v| s.ty.read(v)).transpose().map_err(GatherError::Value);
        self.spec.iter().map(read).collect()
    }

    /// The next thing to do.
    pub fn step(&mut self) -> Result<Step, GatherError> {
        loop {
            if self.limit.is_some_and(|l| self.sent >= l) {
                return Ok(self.done());
            }
            let out = match self.pull() {
                Pull::Need(s) => return Ok(Step::Need(s)),
                Pull::Row(keys, row) => self.combine(keys, row)?,
                Pull::End => match self.current.take() {
                    Some((_, row)) if self.folds.is_some() => Some(self.finish(row)?),
                    _ => return Ok(self.done()),
                },
            };
            if let Some(row) = out.and_then(|r| self.window(r)) {
                return Ok(Step::Row(row));
            }
        }
    }

    fn done(&mut self) -> Step {
        self.limit = Some(self.sent);
        Step::Done(format!("SELECT {}", self.sent))
    }

    fn pull(&mut self) -> Pull {
        if let Some(&s) = self.waiting.last() {
            return Pull::Need(s);
        }
        match self.heap.pop() {
            Some(p) => {
                self.waiting.push(p.shard);
                self.last[p.shard] = Some(p.keys.clone());
                Pull::Row(p.keys, p.row)
            }
            None => Pull::End,
        }
    }

    /// A merged row in, a finished client row out (if any).
    fn combine(&mut self, keys: Keys, row: Row) -> Result<Option<Row>, GatherError> {
        let same = self.current.as_ref().is_some_and(|(k, _)| cmp_keys(&self.spec, k, &keys) == Ordering::Equal);
        if let Some(folds) = &self.folds {
            if same {
                if let Some((_, acc)) = self.current.as_mut() {
                    fold::fold_row(folds, acc, row)?;
                }
                return Ok(None);
            }
            return match self.current.replace((keys, row)) {
                Some((_, done)) => self.finish(done).map(Some),
                None => Ok(None),
            };
        }
        if self.distinct {
            if same {
                return Ok(None);
            }
            self.current = Some((keys, Vec::new()));
        }
        Ok(Some(self.project(row)))
    }

    /// A combined group: averages rebuilt, hidden columns dropped.
    fn finish(&self, mut row: Row) -> Result<Row, GatherError> {
        let folds = self.folds.as_deref().unwrap_or_default();
        for &(sum, count) in &self.averages {
            let fold = |i: usize| folds.get(i).copied().unwrap_or(Fold::Keep);
            let n = row.get(count).and_then(Option::as_ref);
            row[sum] = fold::average(row[sum].as_ref(), fold(sum), n, fold(count))?;
        }
        Ok(self.project(row))
    }

    fn project(&self, mut row: Row) -> Row {
        row.truncate(self.clients);
        row
    }

    /// OFFSET, then LIMIT.
    fn window(&mut self, row: Row) -> Option<Row> {
        if self.skipped < self.offset {
            self.skipped += 1;
            return None;
        }
        self.sent += 1;
        Some(row)
    }
}

/// Every shard must describe the same columns.
fn agree(descs: &[Vec<FieldDescription>]) -> Result<(), GatherError> {
    let key = |d: &Vec<FieldDescription>| d.iter().map(|f| (f.type_oid, f.format)).collect::<Vec<_>>();
    match descs.iter().position(|d| key(d) != key(&descs[0])) {
        Some(shard) => Err(GatherError::Shard { shard, reason: "columns unlike shard 0's".into() }),
        None => Ok(()),
    }
}

fn shard0(reason: &str) -> GatherError {
    GatherError::Shard { shard: 0, reason: format!("{reason} in its RowDescription") }
}
