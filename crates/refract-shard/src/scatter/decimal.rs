//! PostgreSQL `numeric` in its text form, exactly: comparing, adding partial sums, and dividing
//! a sum by a count as `avg` does (`numeric_div` with `select_div_scale`), so an average rebuilt
//! from the shards' sums and counts prints as one server would print it. Also the binary
//! form (`numeric_send`/`numeric_recv`): [`Numeric::from_binary`] and [`Numeric::to_binary`].

use std::cmp::Ordering;

/// `NUMERIC_MIN_SIG_DIGITS`: a quotient gets at least this many significant digits.
const MIN_SIG_DIGITS: i64 = 16;
/// `NUMERIC_MAX_DISPLAY_SCALE`.
const MAX_DISPLAY_SCALE: i64 = 1000;
/// `DEC_DIGITS`: PostgreSQL stores numerics in base 10000, four decimal digits per word.
const DEC_DIGITS: i64 = 4;
/// `NBASE`.
const NBASE: u16 = 10000;
/// The binary form's sign words (`NUMERIC_POS`, `NUMERIC_NEG`, `NUMERIC_NAN`, `NUMERIC_PINF`,
/// `NUMERIC_NINF`).
const SIGN_POS: u16 = 0x0000;
const SIGN_NEG: u16 = 0x4000;
const SIGN_NAN: u16 = 0xC000;
const SIGN_PINF: u16 = 0xD000;
const SIGN_NINF: u16 = 0xF000;
/// `NUMERIC_DSCALE_MAX`: the largest display scale the binary form carries.
const DSCALE_MAX: usize = 0x3FFF;

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

    /// Reads `numeric_send`'s binary form: int16 ndigits, int16 weight, uint16 sign, int16
    /// dscale, then ndigits base-10000 digits (int16), the first of weight `weight`. Digits
    /// below the display scale are dropped, as `numeric_recv` does. `None` if it is not one.
    pub fn from_binary(v: &[u8]) -> Option<Numeric> {
        let word = |i: usize| v.get(2 * i..2 * i + 2).map(|w| u16::from_be_bytes([w[0], w[1]]));
        let ndigits = usize::try_from(word(0)? as i16).ok()?;
        let weight = i64::from(word(1)? as i16);
        let sign = word(2)?;
        let dscale = word(3)? as usize;
        if v.len() != 8 + 2 * ndigits || dscale > DSCALE_MAX {
            return None;
        }
        let neg = match sign {
            SIGN_NAN => return Some(Numeric::NaN),
            SIGN_PINF => return Some(Numeric::PosInf),
            SIGN_NINF => return Some(Numeric::NegInf),
            SIGN_POS => false,
            SIGN_NEG => true,
            _ => return None,
        };
        let mut digits = Vec::with_capacity(4 * ndigits + dscale);
        for i in 0..ndigits {
            let w = word(4 + i).filter(|&w| w < NBASE)?;
            digits.extend([w / 1000, w / 100 % 10, w / 10 % 10, w % 10].map(|d| d as u8));
        }
        // The last digit read has exponent 4 * (weight - ndigits + 1); at scale `dscale` it
        // is followed by `low + dscale` zeros, or that many digits go if it is negative.
        let low = DEC_DIGITS * (weight - ndigits as i64 + 1);
        let shift = low + dscale as i64;
        if shift >= 0 {
            digits.resize(digits.len() + shift as usize, 0);
        } else {
            digits.truncate(digits.len().saturating_sub(shift.unsigned_abs() as usize));
        }
        Some(Numeric::Finite(Dec::new(neg, digits, dscale)))
    }

    /// `numeric_send`'s binary form of this value at its display scale: base-10000 digits
    /// without leading or trailing zero words, zero as no digits with weight 0 and sign
    /// positive. `None` if it does not fit the form (weight or scale out of range).
    pub fn to_binary(&self) -> Option<Vec<u8>> {
        // A special value's weight and dscale are read from its short header's bits
        // (`NUMERIC_DSCALE`): the infinities' 0x1000 bit lands in dscale as 32, NaN's as 0.
        let special = |sign: u16| {
            let dscale = (sign & 0x1F80) >> 7;
            Some([0u16, 0, sign, dscale].iter().flat_map(|w| w.to_be_bytes()).collect())
        };
        let d = match self {
            Numeric::NaN => return special(SIGN_NAN),
            Numeric::PosInf => return special(SIGN_PINF),
            Numeric::NegInf => return special(SIGN_NINF),
            Numeric::Finite(d) => d,
        };
        if d.scale > DSCALE_MAX {
            return None;
        }
        // Decimal digits padded so that the point falls between two base-10000 words.
        let mut digits = d.digits.clone();
        let int_len = digits.len().saturating_sub(d.scale);
        let lead = (d.scale + int_len).saturating_sub(digits.len()) + (4 - int_len % 4) % 4;
        digits.splice(0..0, std::iter::repeat_n(0, lead));
        digits.resize(digits.len() + (4 - d.scale % 4) % 4, 0);
        let mut words: Vec<u16> =
            digits.chunks(4).map(|c| c.iter().fold(0u16, |w, &x| w * 10 + u16::from(x))).collect();
        let mut weight = int_len.div_ceil(4) as i64 - 1;
        let first = words.iter().position(|&w| w != 0).unwrap_or(words.len());
        words.drain(..first);
        weight -= first as i64;
        let end = words.iter().rposition(|&w| w != 0).map_or(0, |p| p + 1);
        words.truncate(end);
        let sign = if d.neg { SIGN_NEG } else { SIGN_POS };
        let (weight, sign) = if words.is_empty() { (0, SIGN_POS) } else { (weight, sign) };
        let ndigits = i16::try_from(words.len()).ok()?;
        let weight = i16::try_from(weight).ok()?;
        let mut out = Vec::with_capacity(8 + 2 * words.len());
        for w in [ndigits as u16, weight as u16, sign, d.scale as u16].into_iter().chain(words) {
            out.extend(w.to_be_bytes());
        }
        Some(out)
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

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// Values whose binary form is checked, by hand below and against a server.
    const VALUES: [&str; 22] = [
        "0",
        "-0.00",
        "0.00",
        "1",
        "-1",
        "10000",
        "9999",
        "12345.6789",
        "0.0001",
        "0.00001",
        "-999999999999.99999",
        "-1.50",
        "100000000.000000",
        "1.10",
        "0.000000000012340",
        "123456789012345678901234567890.5",
        "20000000",
        "0.5000",
        "NaN",
        "Infinity",
        "-Infinity",
        "3.3333333333333333",
    ];

    #[test]
    fn binary_round_trips_through_text() {
        for s in VALUES.iter().copied().chain(["0.66666666666666666667", "1763668.285714285714", "-0.000000001"]) {
            let b = n(s).to_binary().unwrap();
            let back = Numeric::from_binary(&b).unwrap_or_else(|| panic!("{s}: {}", hex(&b)));
            let want = if s == "-0.00" { "0.00" } else { s };
            assert_eq!(back.to_text(), want, "{s}: {}", hex(&b));
            assert_eq!(back.to_binary().unwrap(), b);
        }
        let long = format!("-{}.{}", "9".repeat(300), "1".repeat(1000));
        assert_eq!(Numeric::from_binary(&n(&long).to_binary().unwrap()).unwrap().to_text(), long);
    }

    /// `numeric_send`'s bytes derived by hand from the format: ndigits, weight, sign, dscale,
    /// base-10000 digits (the server test below checks the same against PostgreSQL).
    #[test]
    fn binary_is_numeric_sends_form() {
        let cases = [
            ("0", "0000000000000000"),
            ("-0.00", "0000000000000002"),
            ("1", "00010000000000000001"),
            ("-1.50", "000200004000000200011388"),
            ("10000", "00010001000000000001"),
            ("12345.6789", "0003000100000004000109291a85"),
            ("0.0001", "0001ffff000000040001"),
            ("0.00001", "0001fffe0000000503e8"),
            ("100000000.000000", "00010002000000060001"),
            ("NaN", "00000000c0000000"),
            ("Infinity", "00000000d0000020"),
            ("-Infinity", "00000000f0000020"),
        ];
        for (s, want) in cases {
            assert_eq!(hex(&n(s).to_binary().unwrap()), want, "{s}");
        }
    }

    #[test]
    fn binary_reading_is_strict_and_truncates_below_the_scale() {
        let from = |h: &str| {
            let b: Vec<u8> = (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap()).collect();
            Numeric::from_binary(&b).map(|x| x.to_text())
        };
        // Digits beyond the display scale go (numeric_recv's trunc_var): 1.2345 at scale 2.
        assert_eq!(from("00020000000000020001092d").as_deref(), Some("1.23"));
        assert_eq!(from("0001000300000000000c").as_deref(), Some("12000000000000"));
        assert_eq!(from("0001000000000000000100"), None); // a stray byte
        assert_eq!(from("000100000000000027"), None);
        assert_eq!(from("00010000000000002710"), None);
        assert_eq!(from("0000000012340000"), None); // no such sign
        assert_eq!(from("ffff000000000000"), None);
        assert_eq!(from("000000"), None);
    }

    /// The binary form is byte for byte what PostgreSQL's `numeric_send` (the function behind
    /// binary result format) gives for the same values.
    #[test]
    fn binary_matches_a_real_server() {
        let cluster = refract_pg::testkit::PgCluster::start_with_replicas(0).expect("start PostgreSQL");
        let list = VALUES.iter().map(|v| format!("'{v}'")).collect::<Vec<_>>().join(",");
        let sql = format!(
            "SELECT string_agg(encode(numeric_send(x::numeric), 'hex'), ',' ORDER BY i) \
             FROM unnest(ARRAY[{list}]::text[]) WITH ORDINALITY AS t(x, i)"
        );
        let got = cluster.psql(&cluster.primary, &sql).expect("psql");
        let ours = VALUES.iter().map(|v| hex(&n(v).to_binary().unwrap())).collect::<Vec<_>>().join(",");
        assert_eq!(ours, got);
        // And what it sends for computed values: sums and averages at their scales.
        let sql = "SELECT encode(numeric_send(sum(x)), 'hex') || ',' || encode(numeric_send(avg(x)), 'hex') \
                   FROM (VALUES (1.005), (2.5), (-0.0001)) v(x)";
        let got = cluster.psql(&cluster.primary, sql).expect("psql");
        let sum = n("1.005").add(&n("2.5")).add(&n("-0.0001"));
        let avg = sum.avg(3);
        assert_eq!(format!("{},{}", hex(&sum.to_binary().unwrap()), hex(&avg.to_binary().unwrap())), got);
    }
}
