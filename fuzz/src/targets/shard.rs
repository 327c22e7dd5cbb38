//! Targets for refract-shard: PostgreSQL `numeric` as the scatter merge reads it from the
//! shards' rows (`scatter/decimal.rs`), in text (`numeric_out`) and binary (`numeric_send`)
//! form, and the arithmetic it does on what it read (sums, `avg`, ordering).

use std::cmp::Ordering;

use refract_shard::scatter::Numeric;

/// `NUMERIC_MAX_DISPLAY_SCALE`: the most digits after the point a quotient keeps.
const MAX_DISPLAY_SCALE: usize = 1000;

/// `Numeric` from server bytes: byte 0 is the count an average divides by (plus one); the rest
/// is read as text, as binary, and as two texts split at the first `,`. Nothing may panic;
/// every value read renders to text that reads back to the same value, and to binary (when it
/// fits the form) that reads back to the same value; a sum is the same in either order, a
/// value divided by 1 equals itself (up to a quotient's largest scale), and ordering is
/// antisymmetric.
pub fn pg_numeric(data: &[u8]) {
    let [count, rest @ ..] = data else { return };
    let (a, b) = match rest.iter().position(|&c| c == b',') {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, &[][..]),
    };
    let read = [Numeric::parse(rest), Numeric::from_binary(rest), Numeric::parse(a), Numeric::parse(b)];
    for n in read.iter().flatten() {
        round_trips(n);
        let text = n.to_text();
        // A quotient's scale is at most 1000 (`NUMERIC_MAX_DISPLAY_SCALE`), as in PostgreSQL.
        if text.split_once('.').is_none_or(|(_, frac)| frac.len() <= MAX_DISPLAY_SCALE) {
            assert_eq!(n.avg(1).cmp(n), Ordering::Equal, "{text} / 1 is {}", n.avg(1).to_text());
        }
        round_trips(&n.avg(u64::from(*count) + 1));
    }
    if let [_, _, Some(a), Some(b)] = &read {
        let sum = a.add(b);
        assert_eq!(sum, b.add(a), "{} + {} depends on the order", a.to_text(), b.to_text());
        round_trips(&sum);
        assert_eq!(a.cmp(b), b.cmp(a).reverse(), "{} and {} order both ways", a.to_text(), b.to_text());
    }
}

/// `n` printed reads back as `n`, scale included; its binary form, when it has one, too.
fn round_trips(n: &Numeric) {
    let text = n.to_text();
    assert_eq!(Numeric::parse(text.as_bytes()).as_ref(), Some(n), "{text} reads back as another value");
    if let Some(bin) = n.to_binary() {
        assert_eq!(
            Numeric::from_binary(&bin).as_ref(),
            Some(n),
            "{text}'s binary form {bin:02x?} reads back as another value"
        );
    }
}
