//! Large results stream through the dispatcher with bounded memory.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::*;
use refract_blob::pattern;
use std::io::Read;

#[test]
fn a_128_mib_response_is_relayed_byte_exact_in_bounded_memory() {
    const N: u64 = 128 << 20;
    let ([_b1, _b2], d) = cluster().backends(2).dispatcher("").with(Binary::default()).run().split();
    let mut c = Client::connect(d.proc.addr);
    c.send(&raw_request("GET", &format!("/blob?bytes={N}&seed=42"), &[], b""));
    // Read the head, then check the body while streaming it (the test keeps no copy either).
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        c.stream.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.to_ascii_lowercase().contains(&format!("content-length: {N}")));
    let mut offset = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    while offset < N {
        let want = buf.len().min((N - offset) as usize);
        let n = c.stream.read(&mut buf[..want]).unwrap();
        assert!(n > 0, "connection closed at {offset}");
        assert_eq!(pattern::first_mismatch(&buf[..n], offset, 42), None);
        offset += n as u64;
    }
    let rss_mib = d.proc.peak_rss_kib() / 1024;
    assert!(rss_mib < 64, "dispatcher peak RSS {rss_mib} MiB");
    // The connection is still usable afterwards.
    c.send(&raw_request("GET", "/blob?bytes=9", &[], b""));
    assert_eq!(c.read_response(false).unwrap().body.len(), 9);
}
