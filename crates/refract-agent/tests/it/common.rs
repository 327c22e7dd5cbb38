//! Fixtures shared by the agent's tests: made-up hand-offs, the agent's options, and blob
//! servers and agents in this process started through the test kit's builder ([`Local`]).
#![allow(dead_code, clippy::unwrap_used)]

use std::net::{SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use refract_agent::{serve_local, LocalOptions};
use refract_blob::{serve as blob_serve, BlobServer};
use refract_handover::{FlowKey, Msg, RepairWindow, Serving, SockOpts, Socket, TcpOptions, TcpState, Transfer};
use refract_testkit::{cluster, Cluster, Rig, Start};

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

/// This kit for the test kit's builder: blob servers and agents as tasks of the test's tokio
/// runtime, each agent on a same-host socket of its own with the options `.0` makes for its
/// backend (the tests stand in for the dispatcher themselves).
#[derive(Clone, Copy)]
pub struct Local(pub fn(SocketAddr) -> LocalOptions);

impl Default for Local {
    fn default() -> Local {
        Local(local_options)
    }
}

impl Start for Local {
    type Backend = SocketAddr;
    type Agent = PathBuf;
    type Dispatcher = ();

    fn backend(&self, name: &str, _: &[String]) -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(blob_serve(tokio::net::TcpListener::from_std(l).unwrap(), BlobServer::new(name.into(), 0, 0)));
        addr
    }

    fn agent(&self, _: &str, backend: SocketAddr) -> PathBuf {
        agent((self.0)(backend))
    }

    fn dispatcher(&self, _: &str, _: Rig<'_, Self>) {
        panic!("the agent's tests stand in for the dispatcher themselves");
    }
}

/// An agent with `opts` on a fresh same-host socket, a task of the test's tokio runtime; the
/// socket's path.
pub fn agent(opts: LocalOptions) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("rf-agent-{}-{n}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
    l.set_nonblocking(true).unwrap();
    tokio::spawn(serve_local(tokio::net::UnixListener::from_std(l).unwrap(), opts));
    path
}

/// What most adoption tests start from: a blob server b1 and an agent in front of it
/// ([`Local`]): the backend's address and the agent's socket.
pub fn blob_and_agent() -> (SocketAddr, PathBuf) {
    let Cluster { backends, agents, .. } = cluster().backends(1).agent("b1").with(Local::default()).run();
    (backends[0].1, agents[0].1.clone())
}
