//! Target for refract-handover: the control messages (dispatcher ↔ agent, over TCP) and the
//! same-host link messages, both read from peers.

use bytes::BytesMut;
use refract_handover::control::{self, AppState, Msg};
use refract_handover::local;

/// Both codecs on the same bytes (frames one after another), and the `app_state` of a
/// hand-over: each decoded frame encodes to the bytes it came from, and a frame cut short is
/// "need more bytes", never an error or another message.
pub fn handover_msg(data: &[u8]) {
    control_frames(data);
    local_frames(data);
    if let Ok(state) = AppState::parse(data) {
        assert_eq!(state.encode(), data, "{state:?} does not encode to its bytes");
    }
}

fn control_frames(data: &[u8]) {
    let mut buf = data;
    while let Ok(Some((msg, n))) = control::parse(buf) {
        assert!(n <= buf.len(), "decoded {n} of {} bytes", buf.len());
        let mut out = BytesMut::new();
        control::encode(&msg, &mut out);
        assert_eq!(&out[..], &buf[..n], "{} does not encode to the bytes it came from", msg.name());
        assert!(matches!(control::parse(&buf[..n - 1]), Ok(None)), "a cut {} is not incomplete", msg.name());
        if let Msg::HandOff(t) | Msg::HandBack(t) = &msg {
            let _ = AppState::parse(&t.app_state).map(|s| assert_eq!(s.encode(), t.app_state));
        }
        buf = &buf[n..];
    }
}

fn local_frames(data: &[u8]) {
    let mut buf = data;
    while let Ok(Some((msg, n))) = local::parse(buf) {
        assert!(n <= buf.len(), "decoded {n} of {} bytes", buf.len());
        let mut out = BytesMut::new();
        local::encode(&msg, &mut out);
        assert_eq!(&out[..], &buf[..n], "{} does not encode to the bytes it came from", msg.name());
        assert!(matches!(local::parse(&buf[..n - 1]), Ok(None)), "a cut {} is not incomplete", msg.name());
        let _ = msg.carries_fd();
        buf = &buf[n..];
    }
}
