//! A real etcd server in a temporary directory (Debian's `etcd-server`), for the tests of
//! the dispatchers' shared state: started on free loopback ports, stopped and started again
//! on the same ports and data (an outage), killed and deleted on drop.

use crate::port::try_free_port;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One etcd member serving clients on 127.0.0.1.
#[derive(Debug)]
pub struct Etcd {
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    // Declared last so it is removed after the server is stopped.
    dir: tempfile::TempDir,
}

impl Etcd {
    /// Starts a one-member cluster and waits until it accepts connections.
    pub fn start() -> io::Result<Etcd> {
        let dir = tempfile::Builder::new().prefix("refract-etcd-").tempdir()?;
        let mut etcd = Etcd { client_port: try_free_port()?, peer_port: try_free_port()?, child: None, dir };
        etcd.resume()?;
        Ok(etcd)
    }

    /// The client endpoint, `http://127.0.0.1:PORT`, as `[cluster] etcd` names it.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// The client address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.client_port))
    }

    /// Kills the server (SIGKILL): its clients see their connections end, as in a crash.
    pub fn stop(&mut self) -> io::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Starts the server again on the same ports and data; waits until it accepts
    /// connections (at most 20 s).
    pub fn resume(&mut self) -> io::Result<()> {
        let child = spawn(self.dir.path(), self.client_port, self.peer_port)?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect_timeout(&self.addr(), Duration::from_millis(200)).is_err() {
            if Instant::now() > deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "etcd did not start within 20 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

fn spawn(dir: &Path, client_port: u16, peer_port: u16) -> io::Result<Child> {
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("etcd.log"))?;
    let found = Command::new("etcd")
        .arg("--name=rf-etcd")
        .arg(format!("--data-dir={}", dir.join("data").display()))
        .arg(format!("--listen-client-urls={client}"))
        .arg(format!("--advertise-client-urls={client}"))
        .arg(format!("--listen-peer-urls={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .arg(format!("--initial-cluster=rf-etcd={peer}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn();
    found.map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => io::Error::new(e.kind(), "etcd is not installed (`make test` installs etcd-server)"),
        _ => e,
    })
}
