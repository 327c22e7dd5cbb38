//! The CommandComplete of a write sent to several shards: what one PostgreSQL holding all the
//! data would report. A sharded table's rows are split over the shards, so the counts add up;
//! a replicated table has a copy on every shard, so one copy's count is the answer.

/// Where a written table lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Split over the shards by key.
    Sharded,
    /// A full copy on every shard.
    Replicated,
}

/// Tags refract cannot combine.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum TagError {
    #[error("no shard answered")]
    Empty,
    #[error("shards answered different commands: {0:?} and {1:?}")]
    Mixed(String, String),
    #[error("not a row-count tag: {0:?}")]
    NotCounted(String),
    /// The copies of a replicated table changed different numbers of rows: they have diverged.
    #[error("the copies of a replicated table report different row counts: {0:?}")]
    CopiesDiffer(Vec<u64>),
}

/// `INSERT 0 n`, `UPDATE n`, `DELETE n`, `MERGE n`, `COPY n`, `SELECT n`: the verb (with
/// INSERT's oid field) and the count.
fn split(tag: &str) -> Result<(&str, u64), TagError> {
    let bad = || TagError::NotCounted(tag.to_owned());
    let (verb, n) = tag.rsplit_once(' ').ok_or_else(bad)?;
    let counted = ["INSERT 0", "UPDATE", "DELETE", "MERGE", "COPY", "SELECT"];
    if !counted.contains(&verb) {
        return Err(bad());
    }
    Ok((verb, n.parse().map_err(|_| bad())?))
}

/// The client's tag for a write whose shards answered `tags`.
pub fn write_tag(tags: &[&str], placement: Placement) -> Result<String, TagError> {
    let first = tags.first().ok_or(TagError::Empty)?;
    let (verb, _) = split(first)?;
    let mut counts = vec![];
    for t in tags {
        let (v, n) = split(t)?;
        if v != verb {
            return Err(TagError::Mixed((*first).to_owned(), (*t).to_owned()));
        }
        counts.push(n);
    }
    let n = match placement {
        Placement::Sharded => counts.iter().sum(),
        Placement::Replicated if counts.iter().all(|&c| c == counts[0]) => counts[0],
        Placement::Replicated => return Err(TagError::CopiesDiffer(counts)),
    };
    Ok(format!("{verb} {n}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharded_writes_add_up_and_replicated_ones_count_one_copy() {
        assert_eq!(write_tag(&["INSERT 0 2", "INSERT 0 3"], Placement::Sharded), Ok("INSERT 0 5".into()));
        assert_eq!(write_tag(&["UPDATE 4", "UPDATE 4", "UPDATE 4"], Placement::Replicated), Ok("UPDATE 4".into()));
        assert_eq!(write_tag(&["DELETE 0", "DELETE 7"], Placement::Sharded), Ok("DELETE 7".into()));
        assert_eq!(write_tag(&["COPY 1", "COPY 2"], Placement::Sharded), Ok("COPY 3".into()));
        assert_eq!(
            write_tag(&["UPDATE 1", "UPDATE 2"], Placement::Replicated),
            Err(TagError::CopiesDiffer(vec![1, 2]))
        );
        assert!(matches!(write_tag(&["UPDATE 1", "DELETE 1"], Placement::Sharded), Err(TagError::Mixed(..))));
        assert!(matches!(write_tag(&["CREATE TABLE"], Placement::Sharded), Err(TagError::NotCounted(_))));
        assert_eq!(write_tag(&[], Placement::Sharded), Err(TagError::Empty));
    }
}
