//! Target for the frames dispatchers forward PostgreSQL CancelRequests to each other in
//! (`refract_pg::peer_cancel`, `[cluster] cancel_listen`): `open` checking a peer's frame's
//! magic, HMAC-SHA256 and time, and `seal`, which writes them.

use refract_pg::peer_cancel::{open, seal, FRAME, WINDOW_MS};

/// The key the dispatchers share here; the seeds (`corpus/peer_cancel/`) are sealed with it.
pub const PEER_KEY: &[u8] = b"refract fuzz peer key";
/// A key that must not open [`PEER_KEY`]'s frames. Not [`PEER_KEY`] with zero bytes appended:
/// HMAC pads a key shorter than its block with zeros, so that key would sign the same.
const OTHER_KEY: &[u8] = b"refract fuzz peer kez";
/// This dispatcher's clock (milliseconds since the epoch): fixed, so a run is deterministic. The
/// seed `valid` is sealed 1 s before it.
pub const PEER_NOW_MS: u64 = 1_750_000_000_000;

/// The input twice: as what a peer sends (its first [`FRAME`] bytes opened at [`PEER_NOW_MS`]),
/// and as the fields of a request (`pid`, `secret`, time at bytes 4..20, as in a frame) that
/// this side seals and then alters.
pub fn peer_cancel(data: &[u8]) {
    received(data);
    sealed(data);
}

/// A peer's frame is accepted exactly when it is what `seal` writes for its own fields, at a
/// time within the window.
fn received(data: &[u8]) {
    let Some(f) = data.first_chunk::<FRAME>() else { return };
    let got = open(PEER_KEY, f, PEER_NOW_MS);
    let (pid, secret, at) = fields(f);
    let genuine = seal(PEER_KEY, pid, secret, at) == *f;
    let fresh = at.abs_diff(PEER_NOW_MS) <= WINDOW_MS;
    assert_eq!(got, (genuine && fresh).then_some((pid, secret)), "genuine {genuine}, fresh {fresh}");
    if got.is_some() {
        altered_refused(f, PEER_NOW_MS, data.get(FRAME).copied());
    }
}

/// A request this side seals opens with its own fields, at any time within the window of its
/// own and at none outside it, and with no other key; every altered byte is refused.
fn sealed(data: &[u8]) {
    let mut b = [0u8; FRAME];
    data.iter().take(FRAME).enumerate().for_each(|(i, d)| b[i] = *d);
    let (pid, secret, at) = fields(&b);
    let f = seal(PEER_KEY, pid, secret, at);
    assert_eq!((&f[..4], fields(&f)), (&b"RFC1"[..], (pid, secret, at)), "sealed fields moved");
    for now in [Some(at), at.checked_sub(WINDOW_MS), at.checked_add(WINDOW_MS)].into_iter().flatten() {
        assert_eq!(open(PEER_KEY, &f, now), Some((pid, secret)), "sealed at {at}, refused at {now}");
    }
    for now in [at.checked_sub(WINDOW_MS + 1), at.checked_add(WINDOW_MS + 1)].into_iter().flatten() {
        assert_eq!(open(PEER_KEY, &f, now), None, "sealed at {at}, accepted at {now}");
    }
    assert_eq!(open(OTHER_KEY, &f, at), None, "opened with another key");
    altered_refused(&f, at, data.get(FRAME).copied());
}

/// `f`, which opens at `now`, refused with any one byte altered (xor `mask`, 1 if none or 0).
fn altered_refused(f: &[u8; FRAME], now: u64, mask: Option<u8>) {
    let mask = mask.filter(|m| *m != 0).unwrap_or(1);
    for i in 0..FRAME {
        let mut bad = *f;
        bad[i] ^= mask;
        assert_eq!(open(PEER_KEY, &bad, now), None, "byte {i} xor {mask:#04x} accepted");
    }
}

/// A frame's pid, secret and time (bytes 4..20).
fn fields(f: &[u8; FRAME]) -> (i32, [u8; 4], u64) {
    let mut pid = [0u8; 4];
    let mut secret = [0u8; 4];
    let mut at = [0u8; 8];
    pid.copy_from_slice(&f[4..8]);
    secret.copy_from_slice(&f[8..12]);
    at.copy_from_slice(&f[12..20]);
    (i32::from_be_bytes(pid), secret, u64::from_be_bytes(at))
}
