//! Snapshot → restore round trips on loopback inside throw-away network namespaces.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use refract_handover::{conn_info, snapshot, unacked, TcpOptions};

#[test]
fn two_thousand_round_trips_with_both_queues_non_empty() {
    const ROUNDS: usize = 2000;
    in_netns_as_root("two_thousand_round_trips_with_both_queues_non_empty", None, || {
        // A small client receive buffer closes the window, so part of what the server writes
        // stays unsent in its send queue.
        let mut f = flow(Some(4096));
        let (mut snap_ns, mut restore_ns) = (0u128, 0u128);
        let (mut max_inq, mut max_outq, mut max_unsent) = (0, 0, 0u32);
        for i in 0..ROUNDS {
            f.fill_recv_queue(1 + (i * 37) % 3000);
            f.fill_send_queue(16 * 1024 + (i * 101) % 4096);
            let (st, s, r) = f.move_server();
            assert!(!st.recv_queue.is_empty(), "round {i}: empty receive queue");
            assert!(!st.send_queue.is_empty(), "round {i}: empty send queue");
            max_inq = max_inq.max(st.recv_queue.len());
            max_outq = max_outq.max(st.send_queue.len());
            max_unsent = max_unsent.max(st.unsent);
            snap_ns += s;
            restore_ns += r;
            f.drain_and_check();
        }
        // The connection still works after all the moves, both ways.
        f.fill_recv_queue(100);
        f.fill_send_queue(100);
        f.drain_and_check();
        println!(
            "{ROUNDS} round trips: snapshot {:.1} µs, restore {:.1} µs (mean); queues up to \
             recv {max_inq} B, send {max_outq} B ({max_unsent} B unsent); streams {} B + {} B byte-exact",
            snap_ns as f64 / ROUNDS as f64 / 1e3,
            restore_ns as f64 / ROUNDS as f64 / 1e3,
            f.b2a_read,
            f.a2b_read
        );
    });
}

#[test]
fn options_on_and_off_and_mss_are_preserved() {
    if !root_or_skip("options_on_and_off_and_mss_are_preserved") {
        return;
    }
    for bits in 0u8..8 {
        let want = TcpOptions::from_bits(bits);
        // MTU 1500 on lo gives the MSS of an Ethernet link (1460, or 1448 with timestamps).
        in_netns(Some(1500), move || {
            sysctl_ipv4("tcp_timestamps", if want.timestamps { "1" } else { "0" });
            sysctl_ipv4("tcp_sack", if want.sack { "1" } else { "0" });
            sysctl_ipv4("tcp_window_scaling", if want.window_scaling { "1" } else { "0" });
            let mut f = flow(None);
            let before = conn_info(&f.server).unwrap();
            assert_eq!(before.options, want);
            assert_eq!(before.mss, if want.timestamps { 1448 } else { 1460 });
            for i in 0..20 {
                f.fill_recv_queue(500 + i * 100);
                f.fill_send_queue(100 + i * 10);
                let (st, _, _) = f.move_server();
                assert_eq!(st.options, want);
                let after = conn_info(&f.server).unwrap();
                assert_eq!(after, before, "restored socket differs (options {want:?})");
                f.drain_and_check();
            }
            // Larger than one MSS both ways, to use the restored MSS and window scaling.
            f.fill_recv_queue(60_000);
            f.fill_send_queue(60_000);
            f.drain_and_check();
        });
    }
}

#[test]
fn refuses_a_socket_that_is_not_established() {
    in_netns_as_root("refuses_a_socket_that_is_not_established", None, || {
        let mut f = flow(None);
        f.client.shutdown(std::net::Shutdown::Write).unwrap(); // server goes to CLOSE_WAIT
        let mut buf = [0u8; 1];
        let mut server = TcpStream::from(f.server.try_clone().unwrap());
        assert_eq!(server.read(&mut buf).unwrap(), 0);
        let err = snapshot(&f.server).unwrap_err();
        assert!(matches!(err, refract_handover::Error::NotEstablished(8)), "{err}");
        assert_eq!(err.side(), refract_handover::Side::Client);
        // Aborting resumed the socket: it still sends.
        server.write_all(b"still here").unwrap();
        expect_bytes(&mut f.client, b"still here");
    });
}

#[test]
fn unacked_reports_quiescence() {
    in_netns_as_root("unacked_reports_quiescence", None, || {
        let mut f = flow(Some(4096));
        assert_eq!(unacked(&f.server).unwrap(), 0);
        f.fill_send_queue(64 * 1024);
        assert!(unacked(&f.server).unwrap() > 0);
        f.drain_and_check();
        assert!(wait_until(Duration::from_secs(5), || unacked(&f.server).unwrap() == 0));
    });
}

fn expect_bytes(r: &mut impl Read, want: &[u8]) {
    let mut buf = vec![0u8; want.len()];
    r.read_exact(&mut buf).unwrap();
    assert_eq!(buf, want);
}
