//! Test kit: root check, throw-away network namespaces, connected socket pairs, byte patterns.
#![allow(dead_code)]

pub mod lab;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sched::CloneFlags;
use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, SockaddrStorage};
use refract_handover::{discard, restore, snapshot};

/// True when running as root; otherwise prints why the test is skipped.
pub fn root_or_skip(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    // Written to stderr directly, not through `println!`, so the test harness does not hide it.
    let _ = writeln!(
        std::io::stderr(),
        "SKIP {test}: needs root (TCP_REPAIR needs CAP_NET_ADMIN; tests build network namespaces)"
    );
    false
}

/// [`in_netns`] for the test named `test`, which needs root: skipped otherwise, saying why
/// ([`root_or_skip`]).
pub fn in_netns_as_root(test: &str, lo_mtu: Option<u32>, f: impl FnOnce() + Send + 'static) {
    if root_or_skip(test) {
        in_netns(lo_mtu, f);
    }
}

fn thread_netns() -> u64 {
    std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino()
}

fn process_netns() -> u64 {
    std::fs::metadata("/proc/self/ns/net").unwrap().ino()
}

/// Runs `f` on a fresh thread inside a new anonymous network namespace with `lo` up (and its
/// MTU set when given). The namespace dies with the thread: nothing is left behind, even when
/// `f` panics, and the host's interfaces and sysctls are never touched.
pub fn in_netns<R: Send + 'static>(lo_mtu: Option<u32>, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let _done = Defer(Some(move || {
            let _ = tx.send(());
        }));
        let before = thread_netns();
        nix::sched::unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
        assert_ne!(thread_netns(), before, "not in a new network namespace");
        ip(&["link", "set", "lo", "up"]);
        if let Some(mtu) = lo_mtu {
            ip(&["link", "set", "lo", "mtu", &mtu.to_string()]);
        }
        f()
    });
    // A watchdog: a stuck test fails instead of hanging CI (the thread is left behind).
    if rx.recv_timeout(Duration::from_secs(WATCHDOG_SECS)).is_err() && !t.is_finished() {
        panic!("test thread still running after {WATCHDOG_SECS} s");
    }
    t.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
}

const WATCHDOG_SECS: u64 = 60;

/// Runs a closure when dropped (also while unwinding).
pub struct Defer<F: FnOnce()>(pub Option<F>);

impl<F: FnOnce()> Drop for Defer<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// Runs `ip ARGS` in the calling thread's network namespace (children inherit it).
pub fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("run ip");
    assert!(st.success(), "ip {args:?} failed");
}

/// Sets `net.ipv4.NAME` in the calling thread's namespace; refuses in the process's own
/// namespace so a test can never change the host's settings.
pub fn sysctl_ipv4(name: &str, value: &str) {
    assert_ne!(thread_netns(), process_netns(), "refusing to set a sysctl outside a test namespace");
    std::fs::write(format!("/proc/sys/net/ipv4/{name}"), value).unwrap();
    let now = std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}")).unwrap();
    assert_eq!(now.trim(), value);
}

/// A connected loopback pair: the server side (the one that moves) and the client.
pub struct Pair {
    pub listener: TcpListener,
    pub client: TcpStream,
    pub server: OwnedFd,
}

/// Connects a client to a fresh listener on 127.0.0.1; `client_rcvbuf` is set before connect.
pub fn pair(client_rcvbuf: Option<usize>) -> Pair {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let fd = socket::socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).unwrap();
    if let Some(n) = client_rcvbuf {
        socket::setsockopt(&fd, sockopt::RcvBuf, &n).unwrap();
    }
    socket::connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrStorage::from(addr)).unwrap();
    let client = TcpStream::from(fd);
    let (server, _) = listener.accept().unwrap();
    client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    Pair { listener, client, server: OwnedFd::from(server) }
}

/// Byte `offset` of stream `id`: position-dependent, so a lost, duplicated or reordered byte
/// shows.
pub fn pattern_byte(id: u8, offset: u64) -> u8 {
    let x = offset.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (offset >> 11);
    (x >> 24) as u8 ^ id
}

pub fn pattern(id: u8, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| pattern_byte(id, offset + i)).collect()
}

/// Reads exactly `len` bytes and checks them against stream `id` from `offset`.
pub fn expect_stream(r: &mut impl Read, id: u8, offset: u64, len: usize) {
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).unwrap_or_else(|e| panic!("reading {len} bytes at {offset}: {e}"));
    for (i, b) in buf.iter().enumerate() {
        assert_eq!(*b, pattern_byte(id, offset + i as u64), "stream {id}: byte {} differs", offset + i as u64);
    }
}

/// Polls `cond` every 50 µs until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    cond()
}

/// Bytes in the receive queue of `fd`.
pub fn inq(fd: impl AsFd) -> usize {
    refract_handover::queued_bytes(fd.as_fd()).unwrap() as usize
}

pub fn local_addr(fd: impl AsFd) -> SocketAddr {
    let sa: SockaddrStorage = socket::getsockname(std::os::fd::AsRawFd::as_raw_fd(&fd.as_fd())).unwrap();
    SocketAddr::V4((*sa.as_sockaddr_in().unwrap()).into())
}

pub const B2A: u8 = 1; // client → server stream
pub const A2B: u8 = 2; // server → client stream

/// Both directions of one connection, with how far each stream has got.
pub struct Flow {
    pub listener: TcpListener,
    pub client: TcpStream,
    pub server: OwnedFd,
    pub b2a_sent: u64,
    pub b2a_read: u64,
    pub a2b_sent: u64,
    pub a2b_read: u64,
}

impl Flow {
    /// Client writes `n` bytes the server does not read; waits until they are all queued.
    pub fn fill_recv_queue(&mut self, n: usize) {
        self.client.write_all(&pattern(B2A, self.b2a_sent, n)).unwrap();
        self.b2a_sent += n as u64;
        let want = (self.b2a_sent - self.b2a_read) as usize;
        assert!(wait_until(Duration::from_secs(5), || inq(&self.server) == want));
    }

    /// Server writes `n` bytes without blocking (what does not fit the window stays unsent).
    pub fn fill_send_queue(&mut self, n: usize) {
        let data = pattern(A2B, self.a2b_sent, n);
        let fd = self.server.as_fd();
        let sent = nix::sys::socket::send(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &data,
            nix::sys::socket::MsgFlags::MSG_DONTWAIT,
        )
        .unwrap();
        self.a2b_sent += sent as u64;
    }

    /// Drains both directions and checks every byte.
    pub fn drain_and_check(&mut self) {
        let mut server = TcpStream::from(self.server.try_clone().unwrap());
        server.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = (self.b2a_sent - self.b2a_read) as usize;
        expect_stream(&mut server, B2A, self.b2a_read, n);
        self.b2a_read = self.b2a_sent;
        let n = (self.a2b_sent - self.a2b_read) as usize;
        expect_stream(&mut self.client, A2B, self.a2b_read, n);
        self.a2b_read = self.a2b_sent;
    }

    /// One hand-over of the server side: snapshot, silent close, restore. Returns (µs, µs).
    pub fn move_server(&mut self) -> (refract_handover::TcpState, u128, u128) {
        let t0 = Instant::now();
        let state = snapshot(&self.server).unwrap();
        let t1 = Instant::now();
        // Discarded in repair mode: no FIN, no RST, and the 4-tuple is free at once.
        let dummy = self.client.try_clone().unwrap().into();
        discard(std::mem::replace(&mut self.server, dummy)).unwrap();
        self.server = match restore(&state) {
            Ok(fd) => fd,
            Err(e) => {
                let _ = std::process::Command::new("ss").args(["-tanoei"]).status();
                panic!("restore: {e} ({state:?})");
            }
        };
        let t2 = Instant::now();
        (state, (t1 - t0).as_nanos(), (t2 - t1).as_nanos())
    }
}

pub fn flow(client_rcvbuf: Option<usize>) -> Flow {
    let p = pair(client_rcvbuf);
    Flow {
        listener: p.listener,
        client: p.client,
        server: p.server,
        b2a_sent: 0,
        b2a_read: 0,
        a2b_sent: 0,
        a2b_read: 0,
    }
}
