//! Combining one group's rows from several shards: counts and sums add up, min and max pick,
//! and an average is rebuilt from its sum and count with PostgreSQL's result type, text and
//! binary form (numeric in either format, as `numeric_out`/`numeric_send` give it).

use std::cmp::Ordering;

use bytes::Bytes;

use super::decimal::Numeric;
use super::error::GatherError;
use super::plan::Role;
use super::value::{oid, ColType, Row};
use refract_pg::backend::FieldDescription;

/// How one column of a group combines.
#[derive(Debug, Clone, Copy)]
pub enum Fold {
    /// A group key (equal in every row of the group) or a hidden column kept as is.
    Keep,
    /// int8 values (counts, sums of int2/int4) added, in the column's format.
    AddInt { binary: bool },
    /// numeric sums added (sum of int8 or numeric), in the column's format.
    AddNum { binary: bool },
    /// min or max by the column's order.
    Pick { ty: ColType, max: bool },
}

impl Fold {
    /// The fold for a column of `role` and description `f`, or why it cannot be combined.
    pub fn of(role: Role, f: &FieldDescription, c_collation: bool) -> Result<Fold, String> {
        let binary = f.format == 1;
        Ok(match role {
            Role::Key => Fold::Keep,
            Role::Count if f.type_oid == oid::INT8 => Fold::AddInt { binary },
            Role::Count => return Err(format!("count() came back as type OID {}", f.type_oid)),
            Role::Sum | Role::Avg { .. } => match f.type_oid {
                oid::INT8 => Fold::AddInt { binary },
                oid::NUMERIC => Fold::AddNum { binary },
                oid::FLOAT4 | oid::FLOAT8 => {
                    return Err("floating-point sums and averages depend on the order of addition".into())
                }
                other => return Err(format!("sums of type OID {other} are not combined across shards")),
            },
            Role::Min | Role::Max => {
                let ty = ColType::of(f.type_oid, f.format, c_collation)?;
                Fold::Pick { ty, max: role == Role::Max }
            }
        })
    }

    /// Folds `next` into `acc`.
    pub fn apply(&self, acc: &mut Option<Bytes>, next: Option<Bytes>) -> Result<(), GatherError> {
        let (Some(a), Some(b)) = (acc.as_ref(), next.as_ref()) else {
            // NULL is no contribution: sum, min and max of only NULLs stay NULL.
            if acc.is_none() && !matches!(self, Fold::Keep) {
                *acc = next;
            }
            return Ok(());
        };
        let combined = match self {
            Fold::Keep => return Ok(()),
            Fold::AddInt { binary } => {
                let sum = int8(a, *binary)?.checked_add(int8(b, *binary)?).ok_or(GatherError::OutOfRange)?;
                put_int8(sum, *binary)
            }
            Fold::AddNum { binary } => put_numeric(&numeric(a, *binary)?.add(&numeric(b, *binary)?), *binary)?,
            Fold::Pick { ty, max } => {
                let ord = ty.read(b).map_err(GatherError::Value)?.order(&ty.read(a).map_err(GatherError::Value)?);
                let better = if *max { ord == Ordering::Greater } else { ord == Ordering::Less };
                if !better {
                    return Ok(());
                }
                b.clone()
            }
        };
        *acc = Some(combined);
        Ok(())
    }
}

/// `avg` from the group's sum (int8 or numeric) and count (as their folds read them), as
/// numeric in the sum column's format: text as `numeric_out` prints the quotient, binary as
/// `numeric_send` sends that same value at that same display scale.
pub fn average(
    sum: Option<&Bytes>,
    sum_fold: Fold,
    count: Option<&Bytes>,
    count_fold: Fold,
) -> Result<Option<Bytes>, GatherError> {
    let (Some(sum), Some(count)) = (sum, count) else { return Ok(None) };
    let count_binary = matches!(count_fold, Fold::AddInt { binary: true });
    let n = u64::try_from(int8(count, count_binary)?).map_err(|_| GatherError::Value("negative count".into()))?;
    let (total, binary) = match sum_fold {
        Fold::AddInt { binary } => (numeric(int8(sum, binary)?.to_string().as_bytes(), false)?, binary),
        Fold::AddNum { binary } => (numeric(sum, binary)?, binary),
        _ => (numeric(sum, false)?, false),
    };
    if n == 0 {
        return Ok(None);
    }
    put_numeric(&total.avg(n), binary).map(Some)
}

/// The client's description of an average column: numeric, as PostgreSQL's `avg` of integers
/// and numerics returns.
pub fn avg_field(f: &FieldDescription) -> FieldDescription {
    FieldDescription { table_oid: 0, column: 0, type_oid: oid::NUMERIC, type_size: -1, type_modifier: -1, ..f.clone() }
}

fn int8(v: &Bytes, binary: bool) -> Result<i64, GatherError> {
    let bad = || GatherError::Value(format!("not an int8: {:?}", String::from_utf8_lossy(v)));
    if binary {
        return <[u8; 8]>::try_from(&v[..]).map(i64::from_be_bytes).map_err(|_| bad());
    }
    std::str::from_utf8(v).ok().and_then(|s| s.parse().ok()).ok_or_else(bad)
}

fn put_int8(v: i64, binary: bool) -> Bytes {
    if binary {
        Bytes::copy_from_slice(&v.to_be_bytes())
    } else {
        Bytes::from(v.to_string())
    }
}

fn numeric(v: &[u8], binary: bool) -> Result<Numeric, GatherError> {
    let n = if binary { Numeric::from_binary(v) } else { Numeric::parse(v) };
    n.ok_or_else(|| GatherError::Value(format!("not a numeric: {:?}", String::from_utf8_lossy(v))))
}

fn put_numeric(n: &Numeric, binary: bool) -> Result<Bytes, GatherError> {
    if !binary {
        return Ok(Bytes::from(n.to_text()));
    }
    let b = n.to_binary().ok_or_else(|| GatherError::Value("numeric out of the binary form's range".into()))?;
    Ok(Bytes::from(b))
}

/// Folds a row into the group's accumulated row, column by column.
pub fn fold_row(folds: &[Fold], acc: &mut Row, row: Row) -> Result<(), GatherError> {
    for ((f, a), v) in folds.iter().zip(acc.iter_mut()).zip(row) {
        f.apply(a, v)?;
    }
    Ok(())
}
