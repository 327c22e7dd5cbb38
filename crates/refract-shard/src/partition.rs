//! PostgreSQL's hash partitioning, computed outside the server: which remainder a key value
//! gets under `PARTITION BY HASH (key)` with a given `MODULUS`. A sharded cluster that places
//! rows by this function puts each row on the shard whose number is the remainder PostgreSQL
//! itself would give it, so a shard can also hold a plain hash-partitioned copy of its share
//! and the two agree.
//!
//! The value is PostgreSQL's: each key column is hashed by its type's extended hash function
//! (`hashint4extended`, `hashtextextended`, ...) with the partitioning seed, the column hashes
//! are folded with `hash_combine64`, and the row goes to `hash % modulus`. The underlying hash
//! is Bob Jenkins' lookup3 as PostgreSQL adapted it (`hash_bytes_extended`), in its
//! little-endian form: PostgreSQL's hash partitioning is itself byte-order dependent, and
//! refract runs on little-endian machines only (checked at compile time below).
//!
//! Supported key types: int2, int4, int8, text and varchar (the bytes in the server's encoding,
//! deterministic collations), uuid. A NULL key hashes to nothing, so a row whose keys are all
//! NULL lands on remainder 0, as in PostgreSQL.

use thiserror::Error;

#[cfg(target_endian = "big")]
compile_error!("PostgreSQL hash partitioning differs on big-endian machines; refract computes the little-endian form");

/// `HASH_PARTITION_SEED` of PostgreSQL's `partition.h`.
pub const SEED: u64 = 0x7A5B_2236_7996_DCFD;

/// The type of a partition key column, as far as hashing goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    Int2,
    Int4,
    Int8,
    /// text and varchar, hashed as their bytes (not `char(n)`, whose hash ignores trailing blanks).
    Text,
    Uuid,
}

/// One key value, typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    Null,
    Int2(i16),
    Int4(i32),
    Int8(i64),
    Text(Vec<u8>),
    Uuid([u8; 16]),
}

/// A key value refract cannot read as its column's type.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid input for a {ty:?} partition key: {reason}")]
pub struct KeyError {
    pub ty: KeyType,
    pub reason: &'static str,
}

impl KeyType {
    /// Reads a value in PostgreSQL's text format (a literal in SQL, a text-format parameter).
    pub fn parse_text(self, text: &[u8]) -> Result<Key, KeyError> {
        let err = |reason| KeyError { ty: self, reason };
        let int = |bits: u32| -> Result<i64, KeyError> {
            let s = std::str::from_utf8(text).map_err(|_| err("not UTF-8"))?.trim();
            let v: i64 = s.parse().map_err(|_| err("not a decimal integer"))?;
            // int8 is i64 itself (and -(1 << 63) would overflow); narrower types are checked.
            let half = 1i64.checked_shl(bits - 1).filter(|_| bits < 64);
            if half.is_some_and(|h| !(-h..h).contains(&v)) {
                return Err(err("out of range"));
            }
            Ok(v)
        };
        Ok(match self {
            KeyType::Int2 => Key::Int2(int(16)? as i16),
            KeyType::Int4 => Key::Int4(int(32)? as i32),
            KeyType::Int8 => Key::Int8(int(64)?),
            KeyType::Text => Key::Text(text.to_vec()),
            KeyType::Uuid => Key::Uuid(parse_uuid(text).ok_or(err("not a UUID"))?),
        })
    }

    /// Reads a value in PostgreSQL's binary format (a binary-format Bind parameter). An
    /// integer may come as int2, int4 or int8 whatever the key column's type (drivers such as
    /// psycopg 3 pick the parameter type by the value's size; PostgreSQL compares and assigns
    /// across integer types by value): it is the key of that value, if the column's type holds it.
    pub fn parse_binary(self, bytes: &[u8]) -> Result<Key, KeyError> {
        let err = |reason| KeyError { ty: self, reason };
        let fixed = |n: usize| (bytes.len() == n).then_some(bytes).ok_or(err("wrong length"));
        let int = || -> Result<i64, KeyError> {
            Ok(match bytes.len() {
                2 => i64::from(i16::from_be_bytes([bytes[0], bytes[1]])),
                4 => i64::from(i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])),
                8 => i64::from_be_bytes(bytes.try_into().map_err(|_| err("wrong length"))?),
                _ => return Err(err("wrong length")),
            })
        };
        Ok(match self {
            KeyType::Int2 => Key::Int2(i16::try_from(int()?).map_err(|_| err("out of range"))?),
            KeyType::Int4 => Key::Int4(i32::try_from(int()?).map_err(|_| err("out of range"))?),
            KeyType::Int8 => Key::Int8(int()?),
            KeyType::Text => Key::Text(bytes.to_vec()),
            KeyType::Uuid => Key::Uuid(fixed(16)?.try_into().map_err(|_| err("wrong length"))?),
        })
    }
}

/// PostgreSQL's `uuid_in`: 32 hex digits, optionally in braces, with a hyphen allowed after
/// any group of four digits.
fn parse_uuid(text: &[u8]) -> Option<[u8; 16]> {
    let inner = match text {
        [b'{', inner @ .., b'}'] => inner,
        _ => text,
    };
    let mut out = [0u8; 16];
    let mut digits = 0usize;
    let mut prev_hyphen = true;
    for &c in inner {
        if c == b'-' {
            if prev_hyphen || !digits.is_multiple_of(4) || digits == 32 {
                return None;
            }
            prev_hyphen = true;
            continue;
        }
        let v = (c as char).to_digit(16)? as u8;
        if digits == 32 {
            return None;
        }
        out[digits / 2] |= if digits.is_multiple_of(2) { v << 4 } else { v };
        digits += 1;
        prev_hyphen = false;
    }
    (digits == 32 && !prev_hyphen).then_some(out)
}

impl Key {
    /// The column's hash under the partitioning seed; `None` for NULL.
    pub fn hash(&self) -> Option<u64> {
        Some(match self {
            Key::Null => return None,
            Key::Int2(v) => hash_u32(*v as i32 as u32, SEED),
            Key::Int4(v) => hash_u32(*v as u32, SEED),
            Key::Int8(v) => hash_u32(fold_int8(*v), SEED),
            Key::Text(b) => hash_bytes(b, SEED),
            Key::Uuid(b) => hash_bytes(b, SEED),
        })
    }
}

/// The row's partitioning hash: the column hashes folded left to right (NULLs skipped).
pub fn row_hash(keys: &[Key]) -> u64 {
    keys.iter().filter_map(Key::hash).fold(0, combine)
}

/// The remainder (shard number) of a row under `MODULUS modulus`. `modulus` must be > 0.
pub fn remainder(keys: &[Key], modulus: u64) -> u64 {
    row_hash(keys) % modulus.max(1)
}

/// `hashint8extended` folds the high half into the low one (negative values inverted) so that
/// an int8 equal to an int4 hashes alike.
fn fold_int8(v: i64) -> u32 {
    let (lo, hi) = (v as u32, (v >> 32) as u32);
    lo ^ if v >= 0 { hi } else { !hi }
}

/// `hash_combine64`.
fn combine(a: u64, b: u64) -> u64 {
    a ^ b.wrapping_add(0x49a0_f4dd_15e5_a8e3).wrapping_add(a << 54).wrapping_add(a >> 7)
}

/// lookup3's three-word state.
struct State(u32, u32, u32);

impl State {
    fn new(len: u32, seed: u64) -> State {
        let init = 0x9e37_79b9u32.wrapping_add(len).wrapping_add(3_923_095);
        let mut s = State(init, init, init);
        if seed != 0 {
            s.0 = s.0.wrapping_add((seed >> 32) as u32);
            s.1 = s.1.wrapping_add(seed as u32);
            s.mix();
        }
        s
    }

    fn mix(&mut self) {
        let State(a, b, c) = self;
        for (r1, r2, r3) in [(4, 6, 8), (16, 19, 4)] {
            step(a, c, b, r1);
            step(b, a, c, r2);
            step(c, b, a, r3);
        }
    }

    fn finish(mut self) -> u64 {
        let State(a, b, c) = &mut self;
        *c = (*c ^ *b).wrapping_sub(b.rotate_left(14));
        *a = (*a ^ *c).wrapping_sub(c.rotate_left(11));
        *b = (*b ^ *a).wrapping_sub(a.rotate_left(25));
        *c = (*c ^ *b).wrapping_sub(b.rotate_left(16));
        *a = (*a ^ *c).wrapping_sub(c.rotate_left(4));
        *b = (*b ^ *a).wrapping_sub(a.rotate_left(14));
        *c = (*c ^ *b).wrapping_sub(b.rotate_left(24));
        ((*b as u64) << 32) | *c as u64
    }
}

/// One line of lookup3's `mix`: `x -= y; x ^= rot(y, r); y += z`.
fn step(x: &mut u32, y: &mut u32, z: &mut u32, r: u32) {
    *x = x.wrapping_sub(*y) ^ y.rotate_left(r);
    *y = y.wrapping_add(*z);
}

/// `hash_bytes_uint32_extended`.
fn hash_u32(k: u32, seed: u64) -> u64 {
    let mut s = State::new(4, seed);
    s.0 = s.0.wrapping_add(k);
    s.finish()
}

/// `hash_bytes_extended` (little-endian).
fn hash_bytes(key: &[u8], seed: u64) -> u64 {
    let mut s = State::new(key.len() as u32, seed);
    let mut chunks = key.chunks_exact(12);
    for c in &mut chunks {
        s.0 = s.0.wrapping_add(le(&c[0..4]));
        s.1 = s.1.wrapping_add(le(&c[4..8]));
        s.2 = s.2.wrapping_add(le(&c[8..12]));
        s.mix();
    }
    let tail = chunks.remainder();
    let part = |from: usize, to: usize| le(&tail[from.min(tail.len())..to.min(tail.len())]);
    s.0 = s.0.wrapping_add(part(0, 4));
    s.1 = s.1.wrapping_add(part(4, 8));
    // The lowest byte of c is reserved for the length: the last three bytes go above it.
    s.2 = s.2.wrapping_add(part(8, 11) << 8);
    s.finish()
}

/// Up to four bytes as a little-endian word (missing high bytes zero).
fn le(bytes: &[u8]) -> u32 {
    bytes.iter().rev().fold(0, |w, &b| (w << 8) | b as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_integers_of_any_width_are_the_key_of_their_value() {
        assert_eq!(KeyType::Int8.parse_binary(&5i16.to_be_bytes()), Ok(Key::Int8(5)));
        assert_eq!(KeyType::Int8.parse_binary(&(-7i32).to_be_bytes()), Ok(Key::Int8(-7)));
        assert_eq!(KeyType::Int4.parse_binary(&9i64.to_be_bytes()), Ok(Key::Int4(9)));
        assert_eq!(KeyType::Int2.parse_binary(&(-300i32).to_be_bytes()), Ok(Key::Int2(-300)));
        assert!(KeyType::Int4.parse_binary(&(1i64 << 40).to_be_bytes()).is_err(), "out of int4's range");
        assert!(KeyType::Int8.parse_binary(&[0, 0, 1]).is_err(), "three bytes are no integer");
        let same = |k: Key, n: u64| remainder(&[k], n);
        assert_eq!(same(KeyType::Int8.parse_binary(&42i16.to_be_bytes()).unwrap(), 3), same(Key::Int8(42), 3));
    }

    #[test]
    fn uuid_text_forms_are_postgresqls() {
        let want = parse_uuid(b"a0eebc999c0b4ef8bb6d6bb9bd380a11").unwrap();
        for ok in [
            &b"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"[..],
            b"{a0eebc99-9c0b4ef8-bb6d6bb9-bd380a11}",
            b"a0ee-bc99-9c0b-4ef8-bb6d-6bb9-bd38-0a11",
        ] {
            assert_eq!(parse_uuid(ok), Some(want), "{}", String::from_utf8_lossy(ok));
        }
        for bad in [
            &b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1"[..],
            b"-a0eebc999c0b4ef8bb6d6bb9bd380a11",
            b"a0e-ebc999c0b4ef8bb6d6bb9bd380a11",
            b"{a0eebc999c0b4ef8bb6d6bb9bd380a11",
            b"a0eebc999c0b4ef8bb6d6bb9bd380a11-",
        ] {
            assert_eq!(parse_uuid(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn integers_parse_in_range_only() {
        assert_eq!(KeyType::Int2.parse_text(b" -32768 "), Ok(Key::Int2(i16::MIN)));
        assert!(KeyType::Int2.parse_text(b"32768").is_err());
        assert_eq!(KeyType::Int2.parse_text(b"32767"), Ok(Key::Int2(i16::MAX)));
        assert!(KeyType::Int4.parse_text(b"-2147483649").is_err());
        // The fuzzer's find (fuzz/regressions/pg_keyparam/): the int8 bounds overflowed.
        assert_eq!(KeyType::Int8.parse_text(b"99"), Ok(Key::Int8(99)));
        assert_eq!(KeyType::Int8.parse_text(b"-9223372036854775808"), Ok(Key::Int8(i64::MIN)));
        assert!(KeyType::Int4.parse_text(b"1.5").is_err());
        assert_eq!(KeyType::Int8.parse_binary(&(-5i64).to_be_bytes()), Ok(Key::Int8(-5)));
        assert!(KeyType::Int4.parse_binary(&[0, 1, 2]).is_err());
    }

    #[test]
    fn equal_integers_of_any_width_hash_alike() {
        for v in [0i64, 1, -1, 42, -40_000, 70_000] {
            let h4 = Key::Int4(v as i32).hash();
            assert_eq!(Key::Int8(v).hash(), h4, "{v}");
            if let Ok(v2) = i16::try_from(v) {
                assert_eq!(Key::Int2(v2).hash(), h4, "{v}");
            }
        }
    }

    #[test]
    fn nulls_are_skipped_and_all_null_is_remainder_zero() {
        assert_eq!(remainder(&[Key::Null], 7), 0);
        assert_eq!(row_hash(&[Key::Null, Key::Int4(3)]), row_hash(&[Key::Int4(3)]));
    }
}
