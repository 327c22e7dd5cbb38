//! Message text in any client encoding, held losslessly in a `String`.
//!
//! PostgreSQL reads a message's strings (query text, statement and portal names, CopyFail
//! messages, startup values) in the session's `client_encoding`, which need not be UTF-8
//! (LATIN1, WIN1252, SJIS ...). refract relays such text as sent, so decoding must never lose a
//! byte. Bytes that are not part of valid UTF-8 are *escaped*: byte `b` becomes the character
//! `U+10FF00 + b`, at the end of the last private-use plane, which no encoding maps text to.
//! So that the mapping is a bijection, a valid UTF-8 character in that range is escaped too (its
//! four bytes one by one); encoding turns every character of the range back into its byte.
//! Valid UTF-8 without such characters, which is nearly all text, passes unchanged.
//!
//! Text holding escapes is *raw* ([`is_raw`]): its meaning depends on an encoding refract does
//! not know, so callers treat it conservatively.

use bytes::{BufMut, BytesMut};

/// The first character of the escape range (byte 0x00).
const ESCAPE_BASE: u32 = 0x10_FF00;

/// The UTF-8 lead bytes of the escape range's characters (U+10FF00..=U+10FFFF are
/// `F4 8F BC..=BF xx`): text without `0xF4` cannot hold one.
const ESCAPE_LEAD: u8 = 0xF4;

fn is_escape(c: char) -> bool {
    u32::from(c) >= ESCAPE_BASE
}

fn escape(b: u8) -> char {
    char::from_u32(ESCAPE_BASE + u32::from(b)).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// Decodes `bytes` losslessly (see the module header).
pub fn decode(bytes: &[u8]) -> String {
    if let Ok(s) = std::str::from_utf8(bytes) {
        if !s.chars().any(is_escape) {
            return s.to_owned();
        }
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if is_escape(c) {
                let mut utf8 = [0u8; 4];
                c.encode_utf8(&mut utf8).bytes().for_each(|b| out.push(escape(b)));
            } else {
                out.push(c);
            }
        }
        chunk.invalid().iter().for_each(|&b| out.push(escape(b)));
    }
    out
}

/// Whether `text` holds bytes that were not UTF-8.
pub fn is_raw(text: &str) -> bool {
    text.as_bytes().contains(&ESCAPE_LEAD) && text.chars().any(is_escape)
}

/// Appends the bytes `text` was decoded from.
pub fn encode(text: &str, dst: &mut BytesMut) {
    if !text.as_bytes().contains(&ESCAPE_LEAD) {
        dst.put_slice(text.as_bytes());
        return;
    }
    let mut utf8 = [0u8; 4];
    for c in text.chars() {
        if is_escape(c) {
            dst.put_u8((u32::from(c) - ESCAPE_BASE) as u8);
        } else {
            dst.put_slice(c.encode_utf8(&mut utf8).as_bytes());
        }
    }
}

/// The bytes `text` was decoded from.
pub fn to_bytes(text: &str) -> Vec<u8> {
    let mut out = BytesMut::with_capacity(text.len());
    encode(text, &mut out);
    out.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn utf8_passes_unchanged_and_other_bytes_are_escaped() {
        assert_eq!(decode("café ☕".as_bytes()), "café ☕");
        assert!(!is_raw("café ☕"));
        let latin1 = decode(b"caf\xe9");
        assert_eq!(latin1.chars().count(), 4);
        assert!(is_raw(&latin1));
        assert_eq!(to_bytes(&latin1), b"caf\xe9");
    }

    #[test]
    fn escape_range_characters_in_utf8_survive() {
        let text = "a\u{10FF41}b";
        let decoded = decode(text.as_bytes());
        assert_ne!(decoded, text, "escaped byte by byte");
        assert_eq!(to_bytes(&decoded), text.as_bytes());
    }

    proptest! {
        #[test]
        fn any_bytes_round_trip(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            prop_assert_eq!(to_bytes(&decode(&bytes)), bytes);
        }

        #[test]
        fn utf8_is_raw_only_with_escape_characters(s in "\\PC{0,16}") {
            prop_assert_eq!(is_raw(&decode(s.as_bytes())), s.chars().any(is_escape));
        }
    }
}
