//! PostgreSQL `numeric` in its text form, exactly: comparing, adding partial sums, and dividing
//! a sum by a count as `avg` does (`numeric_div` with `select_div_scale`), so an average rebuilt
//! from the shards' sums and counts prints as one server would print it.

use std::cmp::Ordering;

/// `NUMERIC_MIN_SIG_DIGITS`: a quotient gets at least this many significant digits.
const MIN_SIG_DIGITS: i64 = 16;
/// `NUMERIC_MAX_DISPLAY_SCALE`.
const MAX_DISPLAY_SCALE: i64 = 1000;
/// `DEC_DIGITS`: PostgreSQL stores numerics in base 10000, four decimal digits per word.
const DEC_DIGITS: i64 = 4;

/// A numeric value: finite (sign, magnitude digits, scale) or one of the special values,
/// ordered as PostgreSQL orders them (`-Infinity` < finite < `Infinity` < `NaN`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Numeric {
    NegInf,
    Finite(Dec),
    PosInf,
    NaN,
}

/// A finite decimal: `(-1)^neg * digits / 10^scale`, `digits` most significant first without
/// leading zeros (zero is no digits); `scale` is the display scale (digits after the point).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dec {
    neg: bool,
    digits: Vec<u8>,
    scale: usize,
}

impl Numeric {
    /// Reads `numeric_out`'s text (also an integer's). `None` if it is not one.
    pub fn parse(text: &[u8]) -> Option<Numeric> {
        match text {
            b"NaN" => return Some(Numeric::NaN),
            b"Infinity" => return Some(Numeric::PosInf),
            b"-Infinity" => return Some(Numeric::NegInf),
            _ => {}
        }
        let (neg, rest) = match text {
            [b'-', rest @ ..] => (true, rest),
            [b'+', rest @ ..] => (false, rest),
            _ => (false, text),
        };
        let (int, frac) = match rest.iter().position(|&c| c == b'.') {
            Some(at) => (&rest[..at], &rest[at + 1..]),
            None => (rest, &[][..]),
        };
        let all_digits = |s: &[u8]| s.iter().all(u8::is_ascii_digit);
        if int.len() + frac.len() == 0 || !all_digits(int) || !all_digits(frac) {
            return None;
        }
        let digits = int.iter().chain(frac).map(|c| c - b'0').collect();
        Some(Numeric::Finite(Dec::new(neg, digits, frac.len())))
    }

    /// The sum, as `numeric_add` computes it (scale: the larger one; NaN and opposite
    /// infinities give NaN).
    pub fn add(&self, other: &Numeric) -> Numeric {
        use Numeric::*;
        match (self, other) {
            (NaN, _) | (_, NaN) | (PosInf, NegInf) | (NegInf, PosInf) => NaN,
            (PosInf, _) | (_, PosInf) => PosInf,
            (NegInf, _) | (_, NegInf) => NegInf,
            (Finite(a), Finite(b)) => Finite(a.add(b)),
        }
    }

    /// `self / count` as `avg` prints it; `count` > 0.
    pub fn avg(&self, count: u64) -> Numeric {
        match self {
            Numeric::Finite(d) => Numeric::Finite(d.div(count)),
            special => special.clone(),
        }
    }

    /// `numeric_out`.
    pub fn to_text(&self) -> String {
        match self {
            Numeric::NaN => "NaN".into(),
            Numeric::PosInf => "Infinity".into(),
            Numeric::NegInf => "-Infinity".into(),
            Numeric::Finite(d) => d.to_text(),
        }
    }
}

impl Ord for Numeric {
    fn cmp(&self, other: &Self) -> Ordering {
        let rank = |n: &Numeric| match n {
            Numeric::NegInf => 0,
            Numeric::Finite(_) => 1,
            Numeric::PosInf => 2,
            Numeric::NaN => 3,
        };
        match (self, other) {
            (Numeric::Finite(a), Numeric::Finite(b)) => a.cmp_value(b),
            _ => rank(self).cmp(&rank(other)),
        }
    }
}

impl PartialOrd for Numeric {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Dec {
    fn new(neg: bool, digits: Vec<u8>, scale: usize) -> Dec {
        let first = digits.iter().position(|&d| d != 0).unwrap_or(digits.len());
        let digits = digits[first..].to_vec();
        // Zero has no sign, as in PostgreSQL.
        Dec { neg: neg && !digits.is_empty(), digits, scale }
    }

    /// The magnitude's digits at scale `s` (>= self.scale).
    fn scaled(&self, s: usize) -> Vec<u8> {
        let mut d = self.digits.clone();
        d.resize(d.len() + s - self.scale, 0);
        d
    }

    fn cmp_value(&self, other: &Dec) -> Ordering {
        match (self.neg, other.neg) {
            (false, true) => return Ordering::Greater,
            (true, false) => return Ordering::Less,
            _ => {}
        }
        let s = self.scale.max(other.scale);
        let mag = cmp_mag(&self.scaled(s), &other.scaled(s));
        if self.neg {
            mag.reverse()
        } else {
            mag
        }
    }

    fn add(&self, other: &Dec) -> Dec {
        let s = self.scale.max(other.scale);
        let (a, b) = (self.scaled(s), other.scaled(s));
        if self.neg == other.neg {
            return Dec::new(self.neg, add_mag(&a, &b), s);
        }
        match cmp_mag(&a, &b) {
            Ordering::Less => Dec::new(other.neg, sub_mag(&b, &a), s),
            _ => Dec::new(self.neg, sub_mag(&a, &b), s),
        }
    }

    /// Base-10000 weight and first word of the normalized value (0, 0 for zero), as
    /// `select_div_scale` reads them.
    fn weight_and_first(&self) -> (i64, u64) {
        if self.digits.is_empty() {
            return (0, 0);
        }
        let exp = self.digits.len() as i64 - 1 - self.scale as i64;
        let weight = exp.div_euclid(DEC_DIGITS);
        let lead = (exp - weight * DEC_DIGITS + 1) as usize;
        let first = self.digits.iter().take(lead).fold(0u64, |w, &d| w * 10 + d as u64);
        (weight, first)
    }

    /// `numeric_div(self, count)`: the quotient rounded half away from zero to the scale
    /// `select_div_scale` picks.
    fn div(&self, count: u64) -> Dec {
        let (w1, f1) = self.weight_and_first();
        let (w2, f2) = Dec::new(false, count.to_string().bytes().map(|c| c - b'0').collect(), 0).weight_and_first();
        let mut qweight = w1 - w2;
        if f1 <= f2 {
            qweight -= 1;
        }
        let rscale = (MIN_SIG_DIGITS - qweight * DEC_DIGITS).max(self.scale as i64).clamp(0, MAX_DISPLAY_SCALE);
        let rscale = rscale as usize;
        // The quotient truncated to one digit more than wanted (truncating the dividend first
        // is the same: floor(floor(a / b) / c) = floor(a / (b c))); that digit rounds it.
        let (q, _) = div_small(&self.at_scale(rscale + 1), count);
        let (keep, last) = q.split_at(q.len() - 1);
        let q = if last[0] >= 5 { add_mag(keep, &[1]) } else { keep.to_vec() };
        Dec::new(self.neg, q, rscale)
    }

    /// The magnitude's digits at scale `s`, padded with zeros or truncated.
    fn at_scale(&self, s: usize) -> Vec<u8> {
        if s >= self.scale {
            return self.scaled(s);
        }
        let keep = self.digits.len().saturating_sub(self.scale - s);
        let mut d = self.digits[..keep].to_vec();
        d.insert(0, 0);
        d
    }

    fn to_text(&self) -> String {
        let mut d = self.digits.clone();
        if d.len() <= self.scale {
            let pad = self.scale + 1 - d.len();
            d.splice(0..0, std::iter::repeat_n(0, pad));
        }
        let at = d.len() - self.scale;
        let digit = |x: &u8| char::from(b'0' + x);
        let mut s: String = if self.neg { "-".into() } else { String::new() };
        s.extend(d[..at].iter().map(digit));
        if self.scale > 0 {
            s.push('.');
            s.extend(d[at..].iter().map(digit));
        }
        s
    }
}

fn cmp_mag(a: &[u8], b: &[u8]) -> Ordering {
    let strip = |x: &[u8]| x.iter().position(|&d| d != 0).map_or(0, |p| x.len() - p);
    let (la, lb) = (strip(a), strip(b));
    la.cmp(&lb).then_with(|| a[a.len() - la..].cmp(&b[b.len() - lb..]))
}

fn add_mag(a: &[u8], b: &[u8]) -> Vec<u8> {
    let n = a.len().max(b.len());
    let at = |x: &[u8], i: usize| if i < x.len() { x[x.len() - 1 - i] } else { 0 };
    let mut out = Vec::with_capacity(n + 1);
    let mut carry = 0;
    for i in 0..n {
        let s = at(a, i) + at(b, i) + carry;
        out.push(s % 10);
        carry = s / 10;
    }
    if carry > 0 {
        out.push(carry);
    }
    out.reverse();
    out
}

/// `a - b` for `a >= b`.
fn sub_mag(a: &[u8], b: &[u8]) -> Vec<u8> {
    let at = |x: &[u8], i: usize| if i < x.len() { x[x.len() - 1 - i] as i8 } else { 0 };
    let mut out = Vec::with_capacity(a.len());
    let mut borrow = 0;
    for i in 0..a.len() {
        let mut d = at(a, i) - at(b, i) - borrow;
        borrow = i8::from(d < 0);
        if d < 0 {
            d += 10;
        }
        out.push(d as u8);
    }
    out.reverse();
    out
}

/// Long division of a decimal magnitude by a machine integer: quotient digits and remainder.
fn div_small(a: &[u8], by: u64) -> (Vec<u8>, u64) {
    let mut rem: u128 = 0;
    let mut q = Vec::with_capacity(a.len());
    for &d in a {
        rem = rem * 10 + u128::from(d);
        q.push((rem / u128::from(by)) as u8);
        rem %= u128::from(by);
    }
    (q, rem as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Numeric {
        Numeric::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn text_round_trips_and_orders() {
        for s in ["0", "-1.50", "0.001", "123456789012345678901234567890.5", "NaN", "-Infinity"] {
            assert_eq!(n(s).to_text(), s);
        }
        assert_eq!(n("-0.00").to_text(), "0.00");
        let mut v = [n("NaN"), n("1.5"), n("-2"), n("Infinity"), n("1.50001"), n("-Infinity"), n("-10")];
        v.sort();
        let t: Vec<String> = v.iter().map(Numeric::to_text).collect();
        assert_eq!(t, ["-Infinity", "-10", "-2", "1.5", "1.50001", "Infinity", "NaN"]);
        assert_eq!(n("1.0").cmp(&n("1.00")), Ordering::Equal);
        assert!(Numeric::parse(b"1e5").is_none() && Numeric::parse(b"").is_none() && Numeric::parse(b".").is_none());
    }

    #[test]
    fn sums_keep_the_larger_scale() {
        assert_eq!(n("1.25").add(&n("-3.5")).to_text(), "-2.25");
        assert_eq!(n("99.9").add(&n("0.10")).to_text(), "100.00");
        assert_eq!(n("-5").add(&n("5.000")).to_text(), "0.000");
        assert_eq!(n("Infinity").add(&n("-Infinity")).to_text(), "NaN");
        assert_eq!(n("Infinity").add(&n("1")).to_text(), "Infinity");
    }

    /// Figures from PostgreSQL 15 (`SELECT 10::numeric / 3`, `SELECT 1.005 / 2`, ...).
    #[test]
    fn averages_print_as_postgresql_does() {
        assert_eq!(n("10").avg(3).to_text(), "3.3333333333333333");
        assert_eq!(n("6").avg(3).to_text(), "2.0000000000000000");
        assert_eq!(n("2").avg(3).to_text(), "0.66666666666666666667");
        assert_eq!(n("-2").avg(3).to_text(), "-0.66666666666666666667");
        assert_eq!(n("12345678").avg(7).to_text(), "1763668.285714285714");
        assert_eq!(n("1.005").avg(2).to_text(), "0.50250000000000000000");
        assert_eq!(n("0").avg(4).to_text(), "0.00000000000000000000");
        assert_eq!(n("7").avg(9).to_text(), "0.77777777777777777778");
        assert_eq!(n("99999999").avg(99_999_999).to_text(), "1.00000000000000000000");
        assert_eq!(n("5").avg(30_000_000_000_000_000).to_text(), "0.00000000000000016666666666666667");
        assert_eq!(n("1.000005").avg(1_000_000).to_text(), "0.000001000005000000000000");
        assert_eq!(n("123.45").avg(999_999_999_999).to_text(), "0.0000000001234500000001234500");
        // A dividend with more than 1000 decimals: the quotient is cut to 1000, rounded.
        let long = n(&format!("0.{}", "7".repeat(1100))).avg(3).to_text();
        assert_eq!((long.len(), &long[..6], &long[long.len() - 5..]), (1002, "0.2592", "92593"));
    }
}
