//! The protocol-neutral hand-over client (`refract_handover::seam`) driven by a toy protocol
//! (no HTTP): what travels at the cut, the `Next` verdicts, and each way the agent's ownership
//! ends, against a scripted agent on a real same-host link (no root needed).
#![allow(clippy::unwrap_used)]

use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use refract_handover::local::LocalLink;
use refract_handover::seam::{self, Back, Offer, Refusal, Seam};
use refract_handover::{EpochTracker, Msg, Serving, Socket, Transfer};
use tokio::net::{TcpListener, TcpStream, UnixStream};

/// A line protocol: a message is a line; only lines starting with "get" may be served there.
struct Lines {
    socket: TcpStream,
    buffered: Vec<u8>,
    asked: Vec<Vec<u8>>,
}

impl Seam for Lines {
    fn socket(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
    fn travelling(&self) -> Vec<u8> {
        self.buffered.clone()
    }
    fn moved(&mut self) {
        self.buffered.clear();
    }
    fn may_serve(&mut self, bytes: &[u8]) -> bool {
        self.asked.push(bytes.to_vec());
        bytes.starts_with(b"get")
    }
}

async fn setup() -> (LocalLink, LocalLink, Lines, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (socket, _) = listener.accept().await.unwrap();
    let (d, a) = UnixStream::pair().unwrap();
    let lines = Lines { socket, buffered: b"get a\nget b\n".to_vec(), asked: vec![] };
    (LocalLink::new(d), LocalLink::new(a), lines, client)
}

fn offer(epochs: &mut EpochTracker) -> Offer {
    let serving = Serving { idle_ms: 20, backend: None };
    Offer { conn: 7, epoch: epochs.advance(7), socket: Socket::Passed, serving, answer: Duration::from_secs(5) }
}

fn hand_back(epoch: u64, pending: &[u8]) -> Msg {
    let t = Transfer {
        conn: 7,
        epoch,
        socket: Socket::Passed,
        pending: pending.to_vec(),
        serving: Serving::default(),
        sent: 42,
    };
    Msg::HandBack(Box::new(t))
}

#[tokio::test]
async fn the_travelling_bytes_move_and_next_is_judged_by_the_protocol() {
    let (mut d, mut a, mut lines, _client) = setup().await;
    let mut epochs = EpochTracker::new();
    let agent = tokio::spawn(async move {
        let (Msg::HandOff(t), Some(fd)) = a.recv().await.unwrap() else { panic!("no hand-off with a socket") };
        assert_eq!(t.pending, b"get a\nget b\n");
        a.send(&Msg::HandOffOk { conn: 7, epoch: t.epoch }, None).await.unwrap();
        a.send(&Msg::Next { conn: 7, request: 2, bytes: b"get c\n".to_vec() }, None).await.unwrap();
        assert_eq!(a.recv().await.unwrap().0, Msg::Serve { conn: 7, request: 2 });
        a.send(&Msg::Next { conn: 7, request: 3, bytes: b"put d\n".to_vec() }, None).await.unwrap();
        assert_eq!(a.recv().await.unwrap().0, Msg::Return { conn: 7, request: 3 });
        a.send(&hand_back(t.epoch + 1, b"put d\n"), Some(fd.as_fd())).await.unwrap();
    });
    let o = offer(&mut epochs);
    seam::hand_off(&mut d, &mut lines, &epochs, o).await.unwrap();
    assert!(lines.buffered.is_empty(), "the bytes are the agent's now");
    match seam::take_back(&mut d, &mut lines, &mut epochs, 7).await {
        Back::Here(t, Some(_)) => assert_eq!((t.epoch, t.sent, &t.pending[..]), (2, 42, &b"put d\n"[..])),
        other => panic!("{other:?}"),
    }
    assert_eq!(lines.asked, [b"get c\n".to_vec(), b"put d\n".to_vec()]);
    agent.await.unwrap();
}

#[tokio::test]
async fn a_refusal_is_clean_and_keeps_the_bytes_here() {
    let (mut d, mut a, mut lines, _client) = setup().await;
    let mut epochs = EpochTracker::new();
    tokio::spawn(async move {
        let (Msg::HandOff(t), _) = a.recv().await.unwrap() else { panic!() };
        a.send(&Msg::HandOffErr { conn: 7, epoch: t.epoch, reason: "no".into() }, None).await.unwrap();
        // An acceptance of another epoch is not an acceptance.
        let (Msg::HandOff(t), _) = a.recv().await.unwrap() else { panic!() };
        a.send(&Msg::HandOffOk { conn: 7, epoch: t.epoch + 5 }, None).await.unwrap();
    });
    let o = offer(&mut epochs);
    let r = seam::hand_off(&mut d, &mut lines, &epochs, o).await.unwrap_err();
    assert!(matches!(&r, Refusal::Refused(why) if why == "no") && r.is_clean(), "{r:?}");
    assert_eq!(lines.buffered, b"get a\nget b\n");
    let o = offer(&mut epochs);
    let r = seam::hand_off(&mut d, &mut lines, &epochs, o).await.unwrap_err();
    assert!(matches!(r, Refusal::Stale(_)) && !r.is_clean(), "{r:?}");
    assert_eq!(lines.buffered, b"get a\nget b\n");
}

#[tokio::test]
async fn a_link_lost_while_the_client_is_idle_gives_the_connection_back_else_it_is_lost() {
    for idle in [true, false] {
        let (mut d, mut a, mut lines, _client) = setup().await;
        let mut epochs = EpochTracker::new();
        epochs.advance(7);
        if idle {
            a.send(&Msg::Idle { conn: 7, request: 1 }, None).await.unwrap();
        }
        drop(a);
        match seam::take_back(&mut d, &mut lines, &mut epochs, 7).await {
            Back::TakenBack(_) => assert!(idle),
            Back::Lost { sent: None, .. } => assert!(!idle),
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn a_stale_hand_back_is_lost_and_closed_says_what_was_sent() {
    let (mut d, mut a, mut lines, _client) = setup().await;
    let mut epochs = EpochTracker::new();
    epochs.advance(7);
    a.send(&hand_back(1, b""), Some(lines.socket.as_fd())).await.unwrap();
    let back = seam::take_back(&mut d, &mut lines, &mut epochs, 7).await;
    assert!(matches!(back, Back::Lost { sent: Some(42), .. }), "{back:?}");
    a.send(&Msg::Closed { conn: 7, epoch: 1, sent: 9, reason: "client left".into() }, None).await.unwrap();
    let back = seam::take_back(&mut d, &mut lines, &mut epochs, 7).await;
    assert!(matches!(back, Back::Closed { sent: 9, .. }), "{back:?}");
}
