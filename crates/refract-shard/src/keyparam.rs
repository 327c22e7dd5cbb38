//! Key values bound as parameters: a `$n` in a statement's key restriction
//! ([`crate::shardkey`]) takes its value from the Bind message, in text or binary format, and
//! `key = ANY($n)` takes every element of an array parameter (PostgreSQL's array text form
//! `{1,2,"x y",NULL}` or its binary form, as `array_send` writes it). Multi-dimensional
//! arrays are flattened, as `= ANY` compares every element.

use crate::partition::{Key, KeyError, KeyType};
use crate::shardkey::KeyValue;

/// A Bind message's parameters, as routing needs them.
#[derive(Debug, Clone, Copy)]
pub struct Params<'a> {
    /// Format codes: none (all text), one (for all), or one per parameter (0 text, 1 binary).
    pub formats: &'a [i16],
    /// The values (`None` for NULL).
    pub values: &'a [Option<&'a [u8]>],
}

impl Params<'_> {
    fn binary(&self, i: usize) -> bool {
        match self.formats {
            [] => false,
            [one] => *one == 1,
            all => all.get(i).is_some_and(|f| *f == 1),
        }
    }

    fn value(&self, n: usize, ty: KeyType) -> Result<Option<&[u8]>, KeyError> {
        let i = n.checked_sub(1).ok_or(KeyError { ty, reason: "parameter $0" })?;
        self.values.get(i).copied().ok_or(KeyError { ty, reason: "no such parameter" })
    }

    /// The key `v` stands for: a literal read as text, a parameter in its format.
    pub fn key(&self, v: &KeyValue, ty: KeyType) -> Result<Key, KeyError> {
        match v {
            KeyValue::Null => Ok(Key::Null),
            KeyValue::Literal(text) => ty.parse_text(text.as_bytes()),
            KeyValue::Param(n) => match self.value(*n, ty)? {
                None => Ok(Key::Null),
                Some(b) if self.binary(n - 1) => ty.parse_binary(b),
                Some(b) => ty.parse_text(b),
            },
        }
    }

    /// The keys of array parameter `$n` (of `key = ANY($n)`); a NULL array has none.
    pub fn array(&self, n: usize, ty: KeyType) -> Result<Vec<Key>, KeyError> {
        let err = |reason| KeyError { ty, reason };
        let Some(raw) = self.value(n, ty)? else { return Ok(vec![]) };
        let binary = self.binary(n - 1);
        let elems = if binary { binary_array(raw) } else { text_array(raw) }.ok_or(err("not an array"))?;
        elems
            .into_iter()
            .map(|e| match e {
                None => Ok(Key::Null),
                Some(b) if binary => ty.parse_binary(&b),
                Some(b) => ty.parse_text(&b),
            })
            .collect()
    }
}

/// The elements of an array in PostgreSQL's text form (`array_out`), flattened; `None` if it
/// is not one (or has dimension decorations such as `[1:2]={...}`).
pub fn text_array(raw: &[u8]) -> Option<Vec<Option<Vec<u8>>>> {
    let mut p = TextArray { s: raw.trim_ascii(), at: 0, out: vec![] };
    p.list()?;
    (p.at == p.s.len()).then_some(p.out)
}

struct TextArray<'a> {
    s: &'a [u8],
    at: usize,
    out: Vec<Option<Vec<u8>>>,
}

impl TextArray<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    /// `{ item, item, ... }` where an item is a nested list or an element.
    fn list(&mut self) -> Option<()> {
        (self.peek()? == b'{').then_some(())?;
        self.at += 1;
        self.skip_space();
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(());
        }
        loop {
            self.skip_space();
            if self.peek()? == b'{' {
                self.list()?;
            } else {
                let e = self.element()?;
                self.out.push(e);
            }
            self.skip_space();
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A quoted or unquoted element; unquoted `NULL` is NULL.
    fn element(&mut self) -> Option<Option<Vec<u8>>> {
        let mut v = vec![];
        if self.peek()? == b'"' {
            self.at += 1;
            loop {
                match self.peek()? {
                    b'"' => break,
                    b'\\' => {
                        self.at += 1;
                        v.push(self.peek()?);
                    }
                    c => v.push(c),
                }
                self.at += 1;
            }
            self.at += 1;
            return Some(Some(v));
        }
        // Trailing whitespace is not part of an unquoted element, unless escaped.
        let (mut keep, mut escaped) = (0, false);
        while let Some(c) = self.peek().filter(|c| !matches!(c, b',' | b'}' | b'{' | b'"')) {
            if c == b'\\' {
                self.at += 1;
                v.push(self.peek()?);
                escaped = true;
                keep = v.len();
            } else {
                v.push(c);
                if !c.is_ascii_whitespace() {
                    keep = v.len();
                }
            }
            self.at += 1;
        }
        v.truncate(keep);
        if v.is_empty() {
            return None;
        }
        Some((escaped || !v.eq_ignore_ascii_case(b"NULL")).then_some(v))
    }
}

/// The elements of an array in PostgreSQL's binary form (`array_send`), flattened.
pub fn binary_array(raw: &[u8]) -> Option<Vec<Option<Vec<u8>>>> {
    let mut at = 0usize;
    let int = |at: &mut usize| -> Option<i32> {
        let b = raw.get(*at..*at + 4)?;
        *at += 4;
        Some(i32::from_be_bytes(b.try_into().ok()?))
    };
    let ndim = usize::try_from(int(&mut at)?).ok()?;
    let _flags = int(&mut at)?;
    let _elem_type = int(&mut at)?;
    let mut count = usize::from(ndim > 0);
    for _ in 0..ndim {
        count = count.checked_mul(usize::try_from(int(&mut at)?).ok()?)?;
        let _lower = int(&mut at)?;
    }
    let mut out = Vec::with_capacity(count.min(raw.len() / 4));
    for _ in 0..count {
        let len = int(&mut at)?;
        if len < 0 {
            out.push(None);
            continue;
        }
        let end = at.checked_add(usize::try_from(len).ok()?)?;
        out.push(Some(raw.get(at..end)?.to_vec()));
        at = end;
    }
    (at == raw.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(v: &[Option<&str>]) -> Vec<Option<Vec<u8>>> {
        v.iter().map(|e| e.map(|s| s.as_bytes().to_vec())).collect()
    }

    #[test]
    fn text_arrays_read_as_array_out_writes_them() {
        assert_eq!(text_array(b"{1,2,3}"), Some(texts(&[Some("1"), Some("2"), Some("3")])));
        assert_eq!(text_array(b" { 1 , NULL ,\"NULL\", null } "), Some(texts(&[Some("1"), None, Some("NULL"), None])));
        assert_eq!(text_array(br#"{"a b","c\"d",e\,f}"#), Some(texts(&[Some("a b"), Some("c\"d"), Some("e,f")])));
        assert_eq!(text_array(b"{{1,2},{3,4}}"), Some(texts(&[Some("1"), Some("2"), Some("3"), Some("4")])));
        assert_eq!(text_array(b"{}"), Some(vec![]));
        for bad in [&b"1,2"[..], b"{1,2", b"[1:2]={1,2}", b"{1,,2}", b"{1} x", b"{\"a}"] {
            assert_eq!(text_array(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn binary_arrays_are_checked_to_their_last_byte() {
        let mut raw = vec![];
        for w in [1i32, 1, 20, 2, 1, 8] {
            raw.extend_from_slice(&w.to_be_bytes());
        }
        raw.extend_from_slice(&7i64.to_be_bytes());
        raw.extend_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(binary_array(&raw), Some(vec![Some(7i64.to_be_bytes().to_vec()), None]));
        assert_eq!(binary_array(&raw[..raw.len() - 1]), None);
        raw.push(0);
        assert_eq!(binary_array(&raw), None);
        assert_eq!(binary_array(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 20]), Some(vec![]));
    }

    #[test]
    fn parameters_are_read_in_their_format() {
        let seven = 7i64.to_be_bytes();
        let values = [Some(&b"42"[..]), Some(&seven[..]), None];
        let p = Params { formats: &[0, 1, 0], values: &values };
        assert_eq!(p.key(&KeyValue::Param(1), KeyType::Int8), Ok(Key::Int8(42)));
        assert_eq!(p.key(&KeyValue::Param(2), KeyType::Int8), Ok(Key::Int8(7)));
        assert_eq!(p.key(&KeyValue::Param(3), KeyType::Int8), Ok(Key::Null));
        assert_eq!(p.key(&KeyValue::Literal("5".into()), KeyType::Int4), Ok(Key::Int4(5)));
        assert!(p.key(&KeyValue::Param(4), KeyType::Int8).is_err());
        assert!(p.key(&KeyValue::Param(0), KeyType::Int8).is_err());
        let arr = [Some(&b"{3,NULL,4}"[..])];
        let q = Params { formats: &[], values: &arr };
        assert_eq!(q.array(1, KeyType::Int4), Ok(vec![Key::Int4(3), Key::Null, Key::Int4(4)]));
    }
}
