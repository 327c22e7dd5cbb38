//! The frame in which dispatchers forward a PostgreSQL CancelRequest to each other (several
//! dispatchers behind one address, `[cluster] cancel_listen`): magic `RFC1`, the key's process
//! id and secret, the sender's time in milliseconds since the epoch, and an HMAC-SHA256 of
//! those under the key every dispatcher shares. [`open`] accepts only a frame [`seal`] wrote
//! with that key whose time is within [`WINDOW_MS`] of the receiver's clock.

use hmac::{Hmac, Mac};
use sha2::Sha256;

const MAGIC: &[u8; 4] = b"RFC1";
/// magic, pid, secret, milliseconds since the epoch, HMAC.
pub const FRAME: usize = 4 + 4 + 4 + 8 + 32;
/// How far a forwarded request's time may be from the receiver's clock.
pub const WINDOW_MS: u64 = 30_000;

fn mac(key: &[u8], body: &[u8]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    m.update(body);
    m
}

/// A forwarded request for (`pid`, `secret`) at `at_ms`.
pub fn seal(key: &[u8], pid: i32, secret: [u8; 4], at_ms: u64) -> [u8; FRAME] {
    let mut f = [0u8; FRAME];
    f[..4].copy_from_slice(MAGIC);
    f[4..8].copy_from_slice(&pid.to_be_bytes());
    f[8..12].copy_from_slice(&secret);
    f[12..20].copy_from_slice(&at_ms.to_be_bytes());
    let tag = mac(key, &f[..20]).finalize().into_bytes();
    f[20..].copy_from_slice(&tag);
    f
}

/// The (`pid`, `secret`) of a genuine, fresh request; `None` for anything else.
pub fn open(key: &[u8], f: &[u8; FRAME], now_ms: u64) -> Option<(i32, [u8; 4])> {
    if &f[..4] != MAGIC || mac(key, &f[..20]).verify_slice(&f[20..]).is_err() {
        return None;
    }
    let at = u64::from_be_bytes(f[12..20].try_into().ok()?);
    if at.abs_diff(now_ms) > WINDOW_MS {
        return None;
    }
    Some((i32::from_be_bytes(f[4..8].try_into().ok()?), f[8..12].try_into().ok()?))
}
