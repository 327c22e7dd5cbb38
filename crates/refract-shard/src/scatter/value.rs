//! One column's values as PostgreSQL orders them, read from DataRow bytes in text or binary
//! format, for the types whose order refract reproduces exactly. Text types compare as bytes,
//! which is PostgreSQL's order only under the C (or POSIX) collation: [`ColType::of`] is told
//! whether the shards use it and refuses text comparisons otherwise.

use std::cmp::Ordering;

use bytes::Bytes;

use super::decimal::Numeric;

/// One DataRow's values (`None` is NULL).
pub type Row = Vec<Option<Bytes>>;

/// Type OIDs of `pg_type`.
pub mod oid {
    pub const BOOL: u32 = 16;
    pub const BYTEA: u32 = 17;
    pub const NAME: u32 = 19;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const TEXT: u32 = 25;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const BPCHAR: u32 = 1042;
    pub const VARCHAR: u32 = 1043;
    pub const DATE: u32 = 1082;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const NUMERIC: u32 = 1700;
    pub const UUID: u32 = 2950;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Int,
    Float,
    Numeric,
    /// Bytes in order; `trim` drops trailing blanks first (bpchar compares without them).
    Bytes {
        trim: bool,
    },
    /// bytea's text form, `\x` and lowercase hex: the hex digits sort as the bytes do.
    HexBytes,
    Bool,
    Date,
    Timestamp {
        tz: bool,
    },
}

/// How to read and compare one column's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColType {
    kind: Kind,
    binary: bool,
}

/// A value read for comparison.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Int(i64),
    Float(f64),
    Num(Numeric),
    Bytes(Bytes),
    Bool(bool),
    /// Dates as days, timestamps as microseconds, both since 2000-01-01 (UTC); infinities at
    /// the ends.
    Time(i128),
}

impl ColType {
    /// The comparison for a column of type `oid` sent in `format` (0 text, 1 binary); `Err`
    /// says why refract cannot compare it exactly. `c_collation`: the shards' text order is
    /// the C collation's (byte order).
    pub fn of(oid: u32, format: i16, c_collation: bool) -> Result<ColType, String> {
        let binary = format == 1;
        let kind = match oid {
            oid::INT2 | oid::INT4 | oid::INT8 => Kind::Int,
            oid::FLOAT4 | oid::FLOAT8 => Kind::Float,
            oid::NUMERIC => Kind::Numeric,
            oid::NAME => Kind::Bytes { trim: false },
            oid::TEXT | oid::VARCHAR | oid::BPCHAR if !c_collation => {
                return Err("text is compared exactly only under the C collation, and the shards use another".into())
            }
            oid::TEXT | oid::VARCHAR => Kind::Bytes { trim: false },
            oid::BPCHAR => Kind::Bytes { trim: true },
            oid::BYTEA if binary => Kind::Bytes { trim: false },
            oid::BYTEA => Kind::HexBytes,
            oid::UUID if binary => Kind::Bytes { trim: false },
            // uuid_out prints fixed-width lowercase hex: its bytes sort as the value does.
            oid::UUID => Kind::Bytes { trim: false },
            oid::BOOL => Kind::Bool,
            oid::DATE => Kind::Date,
            oid::TIMESTAMP => Kind::Timestamp { tz: false },
            oid::TIMESTAMPTZ => Kind::Timestamp { tz: true },
            other => return Err(format!("values of type OID {other} are not compared across shards")),
        };
        Ok(ColType { kind, binary })
    }

    /// Reads one non-NULL value; `Err` says what is wrong with it.
    pub fn read(&self, v: &Bytes) -> Result<Val, String> {
        let bad = || format!("cannot read {:?} as {:?} ({})", String::from_utf8_lossy(v), self.kind, self.format());
        if self.binary {
            return self.read_binary(v).ok_or_else(bad);
        }
        let text = || std::str::from_utf8(v).ok();
        let val = match self.kind {
            Kind::Int => text().and_then(|t| t.parse().ok()).map(Val::Int),
            Kind::Float => text().and_then(parse_float).map(Val::Float),
            Kind::Numeric => Numeric::parse(v).map(Val::Num),
            Kind::Bytes { trim } => Some(Val::Bytes(if trim { trim_blanks(v) } else { v.clone() })),
            Kind::HexBytes => v.starts_with(b"\\x").then(|| Val::Bytes(v.slice(2..))),
            Kind::Bool => match &v[..] {
                b"t" => Some(Val::Bool(true)),
                b"f" => Some(Val::Bool(false)),
                _ => None,
            },
            Kind::Date => text().and_then(super::datetime::date).map(Val::Time),
            Kind::Timestamp { tz } => text().and_then(|t| super::datetime::timestamp(t, tz)).map(Val::Time),
        };
        val.ok_or_else(bad)
    }

    fn read_binary(&self, v: &Bytes) -> Option<Val> {
        let be = |n: usize| -> Option<i64> {
            (v.len() == n && (1..=8).contains(&n)).then(|| v.iter().fold(0i64, |acc, &b| (acc << 8) | i64::from(b)))
        };
        // Sign-extend a big-endian integer of `n` bytes.
        let signed = |n: usize| be(n).map(|x| (x << (64 - 8 * n)) >> (64 - 8 * n));
        Some(match self.kind {
            Kind::Int => Val::Int(signed(v.len()).filter(|_| matches!(v.len(), 2 | 4 | 8))?),
            Kind::Float => Val::Float(match v.len() {
                4 => f64::from(f32::from_bits(be(4)? as u32)),
                8 => f64::from_bits(be(8)? as u64),
                _ => return None,
            }),
            Kind::Bytes { trim } => Val::Bytes(if trim { trim_blanks(v) } else { v.clone() }),
            Kind::Bool => Val::Bool(*v.first().filter(|_| v.len() == 1)? != 0),
            // PostgreSQL's infinities are the integer extremes: integer order is time order.
            Kind::Date => Val::Time(i128::from(signed(4)?)),
            Kind::Timestamp { .. } => Val::Time(i128::from(signed(8)?)),
            Kind::Numeric => Val::Num(Numeric::from_binary(v)?),
            Kind::HexBytes => return None,
        })
    }

    fn format(&self) -> &'static str {
        if self.binary {
            "binary"
        } else {
            "text"
        }
    }
}

impl Val {
    /// PostgreSQL's order of two values of one column.
    pub fn order(&self, other: &Val) -> Ordering {
        match (self, other) {
            (Val::Int(a), Val::Int(b)) => a.cmp(b),
            (Val::Float(a), Val::Float(b)) => cmp_float(*a, *b),
            (Val::Num(a), Val::Num(b)) => a.cmp(b),
            (Val::Bytes(a), Val::Bytes(b)) => a.cmp(b),
            (Val::Bool(a), Val::Bool(b)) => a.cmp(b),
            (Val::Time(a), Val::Time(b)) => a.cmp(b),
            // One column has one type; mixed variants do not occur.
            _ => Ordering::Equal,
        }
    }
}

/// Values that may be NULL in an ORDER BY key's order: values reversed when `desc`, NULLs
/// placed as `nulls_first` says whatever the direction.
pub fn cmp_nullable(a: Option<&Val>, b: Option<&Val>, desc: bool, nulls_first: bool) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) if nulls_first => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) if nulls_first => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(a), Some(b)) if desc => b.order(a),
        (Some(a), Some(b)) => a.order(b),
    }
}

/// `float8_cmp`: NaN is above every other value and equal to itself; -0 equals 0.
fn cmp_float(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

/// `float8out`'s forms, including `NaN`, `Infinity` and `-Infinity`.
fn parse_float(t: &str) -> Option<f64> {
    match t {
        "NaN" => Some(f64::NAN),
        "Infinity" => Some(f64::INFINITY),
        "-Infinity" => Some(f64::NEG_INFINITY),
        _ if t.bytes().all(|c| c.is_ascii_digit() || b"+-.e".contains(&c)) => t.parse().ok(),
        _ => None,
    }
}

fn trim_blanks(v: &Bytes) -> Bytes {
    let end = v.iter().rposition(|&c| c != b' ').map_or(0, |p| p + 1);
    v.slice(..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(oid: u32, format: i16, v: &[u8]) -> Val {
        ColType::of(oid, format, true).unwrap().read(&Bytes::copy_from_slice(v)).unwrap()
    }

    #[test]
    fn orders_match_postgresqls() {
        let lt = |a: Val, b: Val| assert_eq!(a.order(&b), Ordering::Less, "{a:?} < {b:?}");
        lt(read(oid::INT4, 0, b"-5"), read(oid::INT4, 0, b"3"));
        lt(read(oid::INT2, 1, &(-5i16).to_be_bytes()), read(oid::INT2, 1, &3i16.to_be_bytes()));
        lt(read(oid::FLOAT8, 0, b"Infinity"), read(oid::FLOAT8, 0, b"NaN"));
        lt(read(oid::FLOAT4, 1, &(-1.5f32).to_be_bytes()), read(oid::FLOAT4, 1, &f32::NAN.to_be_bytes()));
        assert_eq!(read(oid::FLOAT8, 0, b"-0").order(&read(oid::FLOAT8, 0, b"0")), Ordering::Equal);
        lt(read(oid::NUMERIC, 0, b"9.99"), read(oid::NUMERIC, 0, b"10"));
        // numeric_send's 9.99 (weight 0, dscale 2: 9, 9900) below 10 (10), and 1.0 = 1.00.
        let bin = |h: &[u16]| h.iter().flat_map(|w| w.to_be_bytes()).collect::<Vec<u8>>();
        lt(read(oid::NUMERIC, 1, &bin(&[2, 0, 0, 2, 9, 9900])), read(oid::NUMERIC, 1, &bin(&[1, 0, 0, 0, 10])));
        lt(read(oid::NUMERIC, 1, &bin(&[1, 0, 0x4000, 0, 10])), read(oid::NUMERIC, 1, &bin(&[0, 0, 0, 0])));
        lt(read(oid::NUMERIC, 1, &bin(&[0, 0, 0xD000, 32])), read(oid::NUMERIC, 1, &bin(&[0, 0, 0xC000, 0])));
        let (a, b) = (read(oid::NUMERIC, 1, &bin(&[1, 0, 0, 1, 1])), read(oid::NUMERIC, 1, &bin(&[1, 0, 0, 2, 1])));
        assert_eq!(a.order(&b), Ordering::Equal);
        assert!(ColType::of(oid::NUMERIC, 1, true).unwrap().read(&Bytes::from_static(b"\0\0")).is_err());
        lt(read(oid::TEXT, 0, b"B"), read(oid::TEXT, 0, b"a"));
        lt(read(oid::TEXT, 0, b"ab"), read(oid::TEXT, 0, b"abc"));
        assert_eq!(read(oid::BPCHAR, 0, b"ab  ").order(&read(oid::BPCHAR, 0, b"ab")), Ordering::Equal);
        lt(read(oid::BYTEA, 0, b"\\x00ff"), read(oid::BYTEA, 0, b"\\x01"));
        lt(read(oid::BOOL, 0, b"f"), read(oid::BOOL, 0, b"t"));
        lt(read(oid::DATE, 0, b"0044-03-15 BC"), read(oid::DATE, 0, b"0001-01-01"));
        lt(read(oid::DATE, 0, b"9999-12-31"), read(oid::DATE, 0, b"10000-01-01"));
        lt(read(oid::DATE, 0, b"10000-01-01"), read(oid::DATE, 0, b"infinity"));
        lt(read(oid::TIMESTAMPTZ, 0, b"2020-01-01 10:00:00+05"), read(oid::TIMESTAMPTZ, 0, b"2020-01-01 06:00:00+00"));
        lt(read(oid::TIMESTAMP, 0, b"2020-01-01 10:00:00"), read(oid::TIMESTAMP, 0, b"2020-01-01 10:00:00.5"));
    }

    #[test]
    fn what_is_not_compared_says_why() {
        assert!(ColType::of(oid::TEXT, 0, false).unwrap_err().contains("C collation"));
        assert!(ColType::of(114, 0, true).unwrap_err().contains("OID 114"));
        let t = ColType::of(oid::INT4, 0, true).unwrap();
        assert!(t.read(&Bytes::from_static(b"x1")).unwrap_err().contains("cannot read"));
        assert!(ColType::of(oid::INT4, 1, true).unwrap().read(&Bytes::from_static(b"\0\0\x01")).is_err());
    }
}
