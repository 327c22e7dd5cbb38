//! The blob pattern: byte i of a blob with seed S is `(i + S) % 251` (251 is prime, so a
//! shifted or truncated copy never looks right by accident).

/// The byte at `offset` of a blob with `seed`.
pub fn byte_at(offset: u64, seed: u64) -> u8 {
    ((offset + seed) % 251) as u8
}

/// Period of the pattern.
pub const PERIOD: usize = 251;

/// A buffer of whole periods; any blob slice is a sub-slice of it.
pub fn table() -> &'static [u8] {
    static TABLE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| (0..PERIOD * 256).map(|i| (i % PERIOD) as u8).collect())
}

/// The longest slice of the blob (`seed`) that starts at `offset`, at most `max` bytes.
pub fn slice(offset: u64, seed: u64, max: usize) -> &'static [u8] {
    let start = ((offset + seed) % PERIOD as u64) as usize;
    let n = max.min(PERIOD * 255);
    &table()[start..start + n]
}

/// Checks that `data` is the blob (`seed`) from `offset` on; returns the first wrong offset.
pub fn first_mismatch(data: &[u8], offset: u64, seed: u64) -> Option<u64> {
    data.iter().enumerate().find(|&(i, &b)| b != byte_at(offset + i as u64, seed)).map(|(i, _)| offset + i as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_follow_the_pattern() {
        for (off, seed) in [(0, 0), (250, 3), (1_000_003, 77)] {
            let s = slice(off, seed, 70_000);
            assert_eq!(s.len(), PERIOD * 255);
            assert_eq!(first_mismatch(s, off, seed), None);
        }
        assert_eq!(first_mismatch(&[0, 1, 3], 0, 0), Some(2));
    }
}
