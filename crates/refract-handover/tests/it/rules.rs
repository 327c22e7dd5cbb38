//! Negative controls: each ★ rule of the protocol switched off fails the way docs/handover.md
//! says ("Negative controls").
#![allow(clippy::unwrap_used)]

use crate::common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use common::*;
use refract_handover::{conn_info, discard, restore_with, snapshot, unacked, Error, Repair, Rules};

fn without(f: impl FnOnce(&mut Rules)) -> Rules {
    let mut r = Rules::ALL;
    f(&mut r);
    r
}

/// Snapshot the server side, discard it, restore it with `rules`.
fn move_with(f: &mut Flow, rules: Rules) -> refract_handover::TcpState {
    let state = snapshot(&f.server).unwrap();
    let dummy = f.client.try_clone().unwrap().into();
    discard(std::mem::replace(&mut f.server, dummy)).unwrap();
    f.server = restore_with(&state, rules).unwrap();
    state
}

#[test]
fn without_maxseg_before_connect_the_mss_is_524() {
    in_netns_as_root("without_maxseg_before_connect_the_mss_is_524", Some(1500), || {
        let mut f = flow(None);
        assert_eq!(conn_info(&f.server).unwrap().mss, 1448);
        move_with(&mut f, without(|r| r.maxseg_before_connect = false));
        assert_eq!(conn_info(&f.server).unwrap().mss, 524, "536-byte default clamp less timestamps");
        move_with(&mut f, Rules::ALL);
        assert_eq!(conn_info(&f.server).unwrap().mss, 524, "a restore keeps what it was given");

        let mut g = flow(None);
        move_with(&mut g, Rules::ALL);
        assert_eq!(conn_info(&g.server).unwrap().mss, 1448, "with the rule the MSS survives");
        g.fill_recv_queue(10_000);
        g.fill_send_queue(10_000);
        g.drain_and_check();
    });
}

#[test]
fn mss_bounded_by_a_small_peer_window_is_kept() {
    // The kernel bounds the MSS by half the largest window the peer advertised. Restoring with
    // the clamp instead gives an MSS above the peer's window: the socket then sends only from
    // its persist timer. The state carries the MSS in use; the restored socket has it again.
    in_netns_as_root("mss_bounded_by_a_small_peer_window_is_kept", Some(1500), || {
        let mut f = flow(Some(1024));
        f.fill_send_queue(8 * 1024);
        f.drain_and_check();
        let before = conn_info(&f.server).unwrap().mss;
        assert!(before < 1448, "the small window should have bounded the MSS ({before})");
        let st = move_with(&mut f, Rules::ALL);
        assert_eq!(st.mss, before);
        assert_eq!(conn_info(&f.server).unwrap().mss, before);
        f.fill_send_queue(8 * 1024);
        f.drain_and_check();
    });
}

#[test]
fn without_reuseaddr_after_repair_the_listener_cannot_rebind() {
    in_netns_as_root("without_reuseaddr_after_repair_the_listener_cannot_rebind", None, || {
        for rule in [false, true] {
            let mut f = flow(None);
            let addr = f.listener.local_addr().unwrap();
            move_with(&mut f, without(|r| r.reuseaddr_after_repair = rule));
            drop(std::mem::replace(&mut f.listener, TcpListener::bind("127.0.0.1:0").unwrap()));
            // std sets SO_REUSEADDR on listeners, like the dispatcher's.
            let rebind = TcpListener::bind(addr);
            match rule {
                true => assert!(rebind.is_ok(), "rebind with the rule: {:?}", rebind.err()),
                false => assert_eq!(rebind.unwrap_err().kind(), std::io::ErrorKind::AddrInUse),
            }
            f.fill_recv_queue(100);
            f.drain_and_check();
        }
    });
}

/// What happened when the window opened while the server was in repair mode.
struct WindowOpened {
    flow: Flow,
    capture: Result<refract_handover::TcpState, Error>,
    /// Bytes that reached the client within 100 ms of the window update.
    sent: usize,
    /// Whether that observation ended before the retransmission timer (RTO ≥ 200 ms) could
    /// fire: a retransmission leaves even in repair mode with the SEND queue selected.
    before_rto: bool,
}

/// A flow whose server has unsent bytes behind a closed window; the client then reads what it
/// has, which opens the window while the server is in repair mode.
fn open_window_during_repair(rules: Rules) -> WindowOpened {
    let mut f = flow(Some(4096));
    f.fill_send_queue(64 * 1024);
    // The window is closed once everything transmitted is acknowledged.
    assert!(wait_until(Duration::from_secs(2), || unacked(&f.server).unwrap()
        == refract_handover::unsent(&f.server).unwrap()));
    let queued = inq(&f.client);
    assert!(queued > 0);
    let fd = f.server.try_clone().unwrap();
    let repair = Repair::begin(fd.as_fd(), rules).unwrap();
    expect_stream(&mut f.client, A2B, 0, queued); // window update → server
    let t0 = Instant::now();
    f.a2b_read = queued as u64;
    wait_until(Duration::from_millis(100), || inq(&f.client) > 0);
    let sent = inq(&f.client);
    let before_rto = t0.elapsed() < Duration::from_millis(180);
    WindowOpened { flow: f, capture: repair.capture(), sent, before_rto }
}

#[test]
fn without_selecting_the_send_queue_first_bytes_leave_during_the_snapshot() {
    in_netns_as_root("without_selecting_the_send_queue_first_bytes_leave_during_the_snapshot", None, || {
        let mut w = open_window_during_repair(without(|r| r.select_send_queue_first = false));
        assert!(w.sent > 0, "the socket in repair mode should have transmitted");
        assert!(matches!(w.capture, Err(Error::QueueMoved("send"))), "{:?}", w.capture);
        assert!(w.capture.as_ref().unwrap_err().is_retryable());
        w.flow.drain_and_check(); // aborted: resumed locally, nothing lost

        // With the rule nothing leaves: the kernel marks what the window allows as sent
        // without transmitting it; the re-check sees that, and the resumed socket retransmits.
        // (Retried when the machine was too slow to observe before the RTO.)
        for attempt in 0.. {
            let mut w = open_window_during_repair(Rules::ALL);
            if !w.before_rto && attempt < 3 {
                continue;
            }
            assert_eq!(w.sent, 0, "with the SEND queue selected nothing may leave");
            assert!(matches!(w.capture, Err(Error::QueueMoved("send"))), "{:?}", w.capture);
            w.flow.drain_and_check();
            break;
        }
    });
}

/// The client writes while the server's queues are being read; returns the capture's result.
fn data_arrives_during_snapshot(f: &mut Flow, rules: Rules) -> Result<refract_handover::TcpState, Error> {
    f.fill_recv_queue(1000);
    let fd = f.server.try_clone().unwrap();
    let repair = Repair::begin(fd.as_fd(), rules).unwrap();
    let mut client = f.client.try_clone().unwrap();
    let res = repair.capture_interleaved(|| {
        client.write_all(&pattern(B2A, 1000, 500)).unwrap();
        // The socket in repair mode still acknowledges what it receives.
        assert!(wait_until(Duration::from_secs(2), || unacked(&client).unwrap() == 0));
    });
    f.b2a_sent += 500;
    res
}

#[test]
fn without_the_recheck_bytes_received_during_the_snapshot_are_lost() {
    in_netns_as_root("without_the_recheck_bytes_received_during_the_snapshot_are_lost", None, || {
        let mut f = flow(None);
        let res = data_arrives_during_snapshot(&mut f, Rules::ALL);
        assert!(matches!(res, Err(Error::QueueMoved("receive"))), "{res:?}");
        f.drain_and_check(); // aborted: resumed locally with all 1500 bytes

        let mut f = flow(None);
        let state = data_arrives_during_snapshot(&mut f, without(|r| r.recheck_queues = false)).unwrap();
        // Acknowledged to the client, yet not in the snapshot: a restore would lose them.
        assert_eq!(state.recv_queue.len(), 1000);
        assert_eq!(unacked(&f.client).unwrap(), 0);
        let mut server = TcpStream::from(f.server.try_clone().unwrap());
        refract_handover::resume(&f.server).unwrap();
        let mut all = vec![0u8; 1500];
        server.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        server.read_exact(&mut all).unwrap(); // they were only in the old socket
        assert_eq!(all, pattern(B2A, 0, 1500));
    });
}
