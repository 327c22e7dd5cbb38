//! Fixtures shared by the agent's tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::net::{SocketAddr, SocketAddrV4};
use std::time::Duration;

use refract_agent::LocalOptions;
use refract_handover::{FlowKey, Msg, RepairWindow, Serving, SockOpts, Socket, TcpOptions, TcpState, Transfer};

/// A `HandOff` of connection `conn` at `epoch` for the flow 198.18.2.1:40000 → VIP
/// 198.18.2.100:8080, with `recv_queue` as the bytes the dispatcher read but did not consume.
/// Its state is made up: restoring it fails (no such socket), which is what these tests need.
pub fn hand_off(conn: u64, epoch: u64, recv_queue: &[u8]) -> Msg {
    let client: SocketAddrV4 = "198.18.2.1:40000".parse().unwrap();
    let vip: SocketAddrV4 = "198.18.2.100:8080".parse().unwrap();
    let tcp_state = TcpState {
        local: vip.into(),
        peer: client.into(),
        options: TcpOptions::from_bits(7),
        snd_wscale: 7,
        rcv_wscale: 7,
        mss_clamp: 1460,
        mss: 1448,
        timestamp: 1,
        window: RepairWindow::default(),
        recv_seq: 1,
        send_seq: 1,
        recv_queue: recv_queue.to_vec(),
        send_queue: Vec::new(),
        unsent: 0,
        sockopts: SockOpts::default(),
    };
    let flow = FlowKey::new(client, vip);
    let socket = Socket::Repair { flow, tcp_state };
    Msg::HandOff(Box::new(Transfer { conn, epoch, socket, pending: vec![], serving: Serving::default(), sent: 0 }))
}

/// The agent's options in these tests: `backend` over TCP, no passed socket, no guard, a 5 s
/// backend timeout and a 30 s write stall.
pub fn local_options(backend: SocketAddr) -> LocalOptions {
    LocalOptions {
        backend,
        backend_socket: None,
        pass_socket: false,
        backend_timeout: Duration::from_secs(5),
        write_stall: Duration::from_secs(30),
        guard: None,
        pg: Default::default(),
    }
}
