//! Target for refract-handover: the hand-over messages dispatcher ↔ agent (one codec for the
//! same-host Unix link and the cross-host TCP channel), read from peers.

use bytes::BytesMut;
use refract_handover::msg::{encode, parse};

/// Frames one after another: each decoded frame encodes to the bytes it came from, and a frame
/// cut short is "need more bytes", never an error or another message.
pub fn handover_msg(data: &[u8]) {
    let mut buf = data;
    while let Ok(Some((msg, n))) = parse(buf) {
        assert!(n <= buf.len(), "decoded {n} of {} bytes", buf.len());
        let mut out = BytesMut::new();
        encode(&msg, &mut out);
        assert_eq!(&out[..], &buf[..n], "{} does not encode to the bytes it came from", msg.name());
        assert!(matches!(parse(&buf[..n - 1]), Ok(None)), "a cut {} is not incomplete", msg.name());
        assert!(!(msg.carries_fd() && msg.repairs()), "{} both passes and repairs a socket", msg.name());
        buf = &buf[n..];
    }
}
