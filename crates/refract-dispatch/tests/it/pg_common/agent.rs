//! An agent in front of one PostgreSQL server, in this process as `refract agent` runs it (its
//! PostgreSQL listener and its same-host link), for the hand-over tests: refract's
//! `[[postgres.server]] through` is [`Agent::through`], its `[handover] agents` entry
//! `"unix:"` + [`Agent::sock`]. [`Agent::kill`] ends it the way a crash would for its sockets
//! (its runtime, with every task and socket, is dropped).

#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// A running agent.
pub struct Agent {
    /// Its PostgreSQL listener.
    pub through: SocketAddr,
    /// Its same-host link.
    pub sock: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Agent {
    /// Starts an agent in front of `server`, its link at `sock`.
    pub fn start(server: SocketAddr, sock: PathBuf) -> Agent {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let through = listener.local_addr().unwrap();
        let opts = refract_agent::LocalOptions {
            backend: server,
            backend_socket: None,
            pass_socket: false,
            backend_timeout: Duration::from_secs(30),
            write_stall: Duration::from_secs(60),
            guard: None,
            pg: Default::default(),
        };
        let (ready, is_ready) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let path = sock.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                listener.set_nonblocking(true).unwrap();
                let pg = tokio::net::TcpListener::from_std(listener).unwrap();
                let local = refract_agent::bind_local(&path, None).unwrap();
                ready.send(()).unwrap();
                tokio::select! {
                    r = refract_agent::serve_postgres(pg, opts.clone()) => r.unwrap(),
                    r = refract_agent::serve_local(local, opts) => r.unwrap(),
                    _ = stopped => {}
                }
            });
        });
        is_ready.recv().unwrap();
        Agent { through, sock, stop: Some(stop), thread: Some(thread) }
    }

    /// Ends the agent and waits until its sockets are closed.
    pub fn kill(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.sock);
    }
}

/// A fresh path for an agent's link (unique in this process).
pub fn sock_path(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("rf-pg-agent-{}-{tag}-{n}.sock", std::process::id()))
}

/// The admin listener's `/metrics` on `admin`.
pub fn metrics(admin: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, admin)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Every `refract_handover*` / `refract_handback*` series at `admin`, one per line.
pub fn handover_lines(admin: u16) -> String {
    let text = metrics(admin);
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("refract_hand")).collect();
    lines.join("\n")
}

/// Statements (and synced batches) that went through server `server`'s agent so far.
pub fn through_agent(admin: u16, server: &str) -> u64 {
    let line = format!("refract_handover_forwarded_total{{backend=\"{server}\",front=\"postgres\"}} ");
    let text = metrics(admin);
    text.lines().find_map(|l| l.strip_prefix(&line)?.parse::<f64>().ok()).unwrap_or(0.0) as u64
}

/// Successful hand-overs counted at the admin listener on `admin` (its `/metrics`).
pub fn handed_over(admin: u16) -> u64 {
    metrics(admin)
        .lines()
        .filter(|l| l.starts_with("refract_handover_total{") && l.contains("result=\"ok\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}
