//! The test kit: starts the real `refract` binary (blob servers, agents, the dispatcher) on
//! loopback ports through the test kit's builder (`cluster().backends(2).dispatcher(extra)
//! .with(Binary::default()).run()`, [`Binary`]) and speaks raw HTTP/1.1 to it, so tests see
//! exactly what a client sees.
#![allow(dead_code)]

use refract_http::{BodyKind, ChunkedDecoder, ResponseHead};
pub use refract_testkit::{cluster, Cluster, ClusterBuilder};
use refract_testkit::{Listening, Rig, Start};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed when dropped.
pub struct Proc {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    /// Sends a signal (e.g. "TERM", "KILL").
    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill").args([format!("-{sig}"), self.child.id().to_string()]).status();
    }

    /// Peak resident memory, in KiB (VmHWM).
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}

impl Listening for Proc {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// This kit for the test kit's builder: the `refract` binary runs the blob servers (`args`
/// after `blob-server --listen ADDR --name NAME`), the agents (same host, in front of a
/// backend, [`Agent`]) and the dispatcher ([`Dispatcher`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Binary {
    /// The dispatcher logs at info, to [`Dispatcher::log`].
    pub logged: bool,
    /// Lines added to the dispatcher's `[listen]`.
    pub listen: &'static str,
}

/// [`Binary`] with the dispatcher's log kept ([`Dispatcher::log`]).
pub const LOGGED: Binary = Binary { logged: true, listen: "" };

/// `refract agent` on a same-host socket in a directory of its own, in front of one backend.
pub struct Agent {
    pub proc: Proc,
    /// Its same-host socket.
    pub sock: PathBuf,
    _dir: tempfile::TempDir,
}

impl Agent {
    /// Sends a signal (e.g. "TERM", "KILL").
    pub fn signal(&self, sig: &str) {
        self.proc.signal(sig);
    }
}

impl Start for Binary {
    type Backend = Proc;
    type Agent = Agent;
    type Dispatcher = Dispatcher;

    fn backend(&self, name: &str, args: &[String]) -> Proc {
        blob_at(name, 0, &args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    fn agent(&self, _: &str, backend: SocketAddr) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("agent.sock");
        let text =
            format!("backend = \"{backend}\"\nlocal = \"{}\"\nkey = \"test key of sixteen+ bytes\"\n", sock.display());
        let proc = start_agent(dir.path(), &text, backend);
        wait_socket(&sock);
        Agent { proc, sock, _dir: dir }
    }

    /// A dispatcher in front of the backends (the first the primary, the others replicas),
    /// `extra` appended to its config; `{agents}` in it stands for the `agents = { .. }` line
    /// of `[handover]` naming the agents' sockets.
    fn dispatcher(&self, extra: &str, rig: Rig<'_, Self>) -> Dispatcher {
        let backends: Vec<(&str, SocketAddr, &str)> = rig
            .backends
            .iter()
            .enumerate()
            .map(|(i, (name, b))| (name.as_str(), b.addr, if i == 0 { "primary" } else { "replica" }))
            .collect();
        let agents: Vec<(&str, &Path)> = rig.agents.iter().map(|(name, a)| (name.as_str(), a.sock.as_path())).collect();
        let extra = extra.replace("{agents}", &agents_line(&agents));
        let http: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let text =
            config(http, admin, &backends, &extra).replace("workers = 2\n", &format!("workers = 2\n{}\n", self.listen));
        assert!(text.contains(self.listen));
        start_dispatcher(&text, http, admin, self.logged)
    }
}

/// `[handover]`'s `agents = { name = "unix:socket", .. }` line.
pub fn agents_line(agents: &[(&str, &Path)]) -> String {
    let each: Vec<String> = agents.iter().map(|(name, sock)| format!("{name} = \"unix:{}\"", sock.display())).collect();
    format!("agents = {{ {} }}", each.join(", "))
}

/// Waits (at most 20 s) until something listens on the Unix socket `sock`.
pub fn wait_socket(sock: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(sock).is_err() {
        assert!(Instant::now() < deadline, "nothing ever listened on {}", sock.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_refract")
}

/// A port free right now on 127.0.0.1, never handed out before in this process.
pub use refract_testkit::free_port;

pub fn wait_listening(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(Instant::now() < deadline, "{addr} never started listening");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes `text` as `agent.toml` in `dir` and starts `refract agent` with it (log level warn),
/// as [`Proc`] at `addr`; the caller waits for what it listens on.
pub fn start_agent(dir: &std::path::Path, text: &str, addr: SocketAddr) -> Proc {
    let cfg = dir.join("agent.toml");
    std::fs::write(&cfg, text).unwrap();
    let child = Command::new(bin())
        .args(["agent", "--config", cfg.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    Proc { child, addr }
}

/// `GET /blob` of `bytes` bytes made from `seed`.
pub fn blob_get(bytes: u64, seed: u64) -> String {
    format!("GET /blob?bytes={bytes}&seed={seed} HTTP/1.1\r\nhost: t\r\n\r\n")
}

/// A blob response: 200, `bytes` long, byte for byte the pattern of `seed`, its
/// `x-refract-handover` tag `via` (the epoch it was handed over at; `None`: relayed).
pub fn check_blob(r: &Response, bytes: u64, seed: u64, via: Option<&str>) {
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.body.len() as u64, bytes);
    assert_eq!(refract_blob::pattern::first_mismatch(&r.body, 0, seed), None, "body differs");
    assert_eq!(r.header("x-refract-handover").as_deref(), via, "{}", r.head);
}

/// One keep-alive connection through an agent in `always` mode that hands back at once: a 3 MiB
/// read handed over (epoch 1), a write relayed, a small read handed over (epoch 3), then three
/// pipelined reads riding with one hand-over (epoch 5).
pub fn check_always_session(c: &mut Client) {
    c.send(blob_get(3 << 20, 5).as_bytes());
    check_blob(&c.read_response(false).unwrap(), 3 << 20, 5, Some("1"));
    c.send(b"POST /blob HTTP/1.1\r\nhost: t\r\ncontent-length: 3\r\n\r\nabc");
    let w = c.read_response(false).unwrap();
    assert_eq!((w.status, w.header("x-refract-handover")), (200, None), "{}", w.head);
    c.send(blob_get(1000, 2).as_bytes());
    check_blob(&c.read_response(false).unwrap(), 1000, 2, Some("3"));
    let sizes = [(70_000u64, 1u64), (0, 0), (1 << 20, 250)];
    c.send(sizes.iter().map(|&(n, s)| blob_get(n, s)).collect::<String>().as_bytes());
    for (n, s) in sizes {
        check_blob(&c.read_response(false).unwrap(), n, s, Some("5"));
    }
}

/// Starts a blob server on `port` (0 = any free port).
pub fn blob_at(name: &str, port: u16, extra: &[&str]) -> Proc {
    let port = if port == 0 { free_port() } else { port };
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let child = Command::new(bin())
        .args(["blob-server", "--listen", &addr.to_string(), "--name", name])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    wait_listening(addr);
    Proc { child, addr }
}

pub fn blob(name: &str) -> Proc {
    blob_at(name, 0, &[])
}

/// A running dispatcher and its admin address.
pub struct Dispatcher {
    pub proc: Proc,
    pub admin: SocketAddr,
    _dir: tempfile::TempDir,
}

/// The admin token of every test dispatcher.
pub const TOKEN: &str = "test-token-0123456789";

/// The config for a dispatcher on fresh ports in front of `backends` (name, addr, role);
/// `extra` is appended verbatim.
pub fn config(http: SocketAddr, admin: SocketAddr, backends: &[(&str, SocketAddr, &str)], extra: &str) -> String {
    let mut text =
        format!("[listen]\nhttp = \"{http}\"\nadmin = \"{admin}\"\nworkers = 2\n[admin]\ntoken = \"{TOKEN}\"\n");
    for (name, addr, role) in backends {
        text += &format!("[[backend]]\nname = \"{name}\"\naddr = \"{addr}\"\nrole = \"{role}\"\n");
    }
    text + extra
}

/// Starts a dispatcher; `extra` is TOML appended to the generated config.
pub fn dispatcher(backends: &[(&str, SocketAddr, &str)], extra: &str) -> Dispatcher {
    let http: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    dispatcher_with(&config(http, admin, backends, extra), http, admin)
}

pub fn dispatcher_with(text: &str, http: SocketAddr, admin: SocketAddr) -> Dispatcher {
    start_dispatcher(text, http, admin, false)
}

/// Like [`dispatcher_with`], its log (level info) going to [`Dispatcher::log`].
pub fn dispatcher_logged(text: &str, http: SocketAddr, admin: SocketAddr) -> Dispatcher {
    start_dispatcher(text, http, admin, true)
}

fn start_dispatcher(text: &str, http: SocketAddr, admin: SocketAddr, logged: bool) -> Dispatcher {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("refract.toml");
    std::fs::write(&path, text).unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["dispatch", "--config", path.to_str().unwrap()]).stdin(Stdio::null());
    if logged {
        cmd.env("RUST_LOG", "info").stderr(std::fs::File::create(dir.path().join("refract.log")).unwrap());
    } else {
        cmd.env("RUST_LOG", "warn");
    }
    let child = cmd.spawn().unwrap();
    wait_listening(http);
    wait_listening(admin);
    Dispatcher { proc: Proc { child, addr: http }, admin, _dir: dir }
}

impl Dispatcher {
    /// The config file it runs with (rewrite it, then SIGHUP to reload).
    pub fn config_path(&self) -> std::path::PathBuf {
        self._dir.path().join("refract.toml")
    }

    /// What it logged so far (started with [`dispatcher_logged`]).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("refract.log")).unwrap_or_default()
    }

    /// Waits (up to 20 s) for the process to exit; its exit code.
    pub fn wait_exit(&mut self) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.proc.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(Instant::now() < deadline, "the dispatcher did not exit");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A response as the client saw it.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

/// A keep-alive client connection.
pub struct Client {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Client { stream, buf: Vec::new() }
    }

    /// A client on a connection made elsewhere (its timeouts as they are).
    pub fn on(stream: TcpStream) -> Client {
        Client { stream, buf: Vec::new() }
    }

    pub fn send(&mut self, raw: &[u8]) {
        self.stream.write_all(raw).unwrap();
    }

    fn fill(&mut self) -> std::io::Result<usize> {
        let mut chunk = [0u8; 65536];
        let n = self.stream.read(&mut chunk)?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    /// Reads one response; `Err` if the connection ends first (e.g. a body cut short).
    pub fn read_response(&mut self, head_request: bool) -> std::io::Result<Response> {
        let rh = loop {
            if let Some(h) = ResponseHead::parse(&self.buf, 1 << 20, head_request).unwrap() {
                break h;
            }
            if self.fill()? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        };
        let head = String::from_utf8_lossy(&self.buf[..rh.len]).to_string();
        self.buf.drain(..rh.len);
        let body = self.read_body(rh.body)?;
        Ok(Response { status: rh.status, head, body })
    }

    fn read_body(&mut self, kind: BodyKind) -> std::io::Result<Vec<u8>> {
        match kind {
            BodyKind::None => Ok(Vec::new()),
            BodyKind::Length(n) => {
                while (self.buf.len() as u64) < n {
                    if self.fill()? == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                }
                Ok(self.buf.drain(..n as usize).collect())
            }
            BodyKind::Chunked => {
                let mut dec = ChunkedDecoder::new();
                let mut seen = 0;
                loop {
                    seen += dec.advance(&self.buf[seen..]).unwrap();
                    if dec.is_done() {
                        let raw: Vec<u8> = self.buf.drain(..seen).collect();
                        return Ok(refract_http::chunked::decode_all(&raw));
                    }
                    if self.fill()? == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                }
            }
            BodyKind::UntilClose => {
                while self.fill()? > 0 {}
                Ok(std::mem::take(&mut self.buf))
            }
        }
    }

    /// Whether the server closed the connection (EOF or reset) within the timeout.
    pub fn is_closed(&mut self) -> bool {
        self.stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 1];
        loop {
            match self.stream.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                    return false
                }
                Err(_) => return true,
            }
        }
    }
}

/// One request on a fresh connection.
pub fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
    let mut c = Client::connect(addr);
    c.send(&raw_request(method, path, headers, body));
    c.read_response(method == "HEAD").unwrap()
}

pub fn raw_request(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\nhost: test\r\n");
    for (k, v) in headers {
        out += &format!("{k}: {v}\r\n");
    }
    if !body.is_empty() || method == "POST" {
        out += &format!("content-length: {}\r\n", body.len());
    }
    let mut raw = (out + "\r\n").into_bytes();
    raw.extend_from_slice(body);
    raw
}

pub fn get(addr: SocketAddr, path: &str) -> Response {
    request(addr, "GET", path, &[], b"")
}

/// An admin request with the test token (and, with a body or for POST, as JSON).
pub fn admin(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> Response {
    let auth = format!("Bearer {TOKEN}");
    let mut headers = vec![("authorization", auth.as_str())];
    if method == "POST" || !body.is_empty() {
        headers.push(("content-type", "application/json"));
    }
    request(addr, method, path, &headers, body)
}

/// `GET path` from the admin listener, with the test token.
pub fn admin_get(addr: SocketAddr, path: &str) -> Response {
    admin(addr, "GET", path, b"")
}

/// A blob server's `/stats`.
pub fn stats(addr: SocketAddr) -> serde_json::Value {
    get(addr, "/stats").json()
}

/// A Hyrise-R form body for a plan.
pub fn plan_body(plan: &str) -> Vec<u8> {
    let mut out = b"query=".to_vec();
    for b in plan.bytes() {
        if b.is_ascii_alphanumeric() {
            out.push(b);
        } else {
            out.extend(format!("%{b:02X}").bytes());
        }
    }
    out
}

pub const TABLE_LOAD: &str = r#"{"operators":{"0":{"type":"TableLoad","table":"t","filename":"t.tbl"}}}"#;

/// The value of one series of the dispatcher's `/metrics` (0 when absent).
pub fn metric(admin: SocketAddr, series: &str) -> u64 {
    let text = String::from_utf8(get(admin, "/metrics").body).unwrap();
    let value = text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' '));
    value.map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
}

/// Waits (at most 10 s) until `series` reaches `want`: an agent's last hand-back may still be
/// on its way to the dispatcher when the client has read the last response.
pub fn wait_metric(admin: SocketAddr, series: &str, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = metric(admin, series);
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{series} is {got}, expected {want}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the client received straight from an agent (tagged responses: head and body).
pub fn direct(r: &Response) -> u64 {
    if r.header("x-refract-handover").is_some() {
        (r.head.len() + r.body.len()) as u64
    } else {
        0
    }
}

/// `writes` in a blob server's `/stats`.
pub fn writes(b: &Proc) -> u64 {
    stats(b.addr)["writes"].as_u64().unwrap()
}

/// A 1 MiB read with a write pipelined behind it, on a dispatcher whose agent fronts b2 (the
/// replica): the read is handed over, the write is sent back to the dispatcher and lands on
/// the primary b1 only; the connection goes on (a 70 000-byte read, byte-exact); the agent kept
/// nothing.
pub fn check_pipelined_write(c: &mut Client, admin: SocketAddr, b1: &Proc, b2: &Proc) {
    let get = |n: u64, seed: u64| format!("GET /blob?bytes={n}&seed={seed} HTTP/1.1\r\nhost: t\r\n\r\n");
    let post = b"POST /blob HTTP/1.1\r\nhost: t\r\ncontent-length: 3\r\n\r\nabc";
    c.send(&[get(1 << 20, 3).as_bytes(), post].concat());
    let r = c.read_response(false).unwrap();
    assert_eq!((r.status, r.body.len(), r.header("x-refract-handover").as_deref()), (200, 1 << 20, Some("1")));
    assert_eq!(refract_blob::pattern::first_mismatch(&r.body, 0, 3), None);
    let w = c.read_response(false).unwrap();
    assert_eq!((w.status, w.header("x-refract-handover")), (200, None), "{}", w.head);
    assert_eq!(w.header("x-served-by").as_deref(), Some("b1"), "{}", w.head);
    assert_eq!((writes(b1), writes(b2)), (1, 0), "the write reached the primary only");
    c.send(get(70_000, 4).as_bytes());
    let r = c.read_response(false).unwrap();
    assert_eq!((r.status, r.body.len()), (200, 70_000));
    assert_eq!(refract_blob::pattern::first_mismatch(&r.body, 0, 4), None);
    assert_eq!(metric(admin, r#"refract_handover_kept_total{backend="b2"}"#), 0);
}

/// Runs `scenario` in a fresh network namespace (root only; otherwise the test is skipped with
/// a printed reason): the test binary re-runs just `test` under `unshare --net`, where
/// `RF_IN_NETNS` says to prepare the namespace (lo up, `vip` on lo, the ARP sysctls an agent
/// host needs) and go. The namespace dies with the process and its children.
#[track_caller]
pub fn in_netns(test: &str, vip: &str, scenario: fn()) {
    let test = &qualified(test);
    if !is_root() {
        let _ = writeln!(std::io::stderr(), "SKIP {test}: needs root (network namespace, TCP_REPAIR, eBPF)");
        return;
    }
    if std::env::var_os("RF_IN_NETNS").is_some() {
        prepare_netns(vip);
        return scenario();
    }
    let me = std::env::current_exe().unwrap();
    let out = Command::new("unshare")
        .args(["--net", "--"])
        .arg(me)
        .args(["--exact", test, "--nocapture"])
        .env("RF_IN_NETNS", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("1 passed"), "in the namespace:\n{text}");
}

/// `test` as the harness of this one test binary names it: `module::test`, the module being the
/// file the (tracked) caller is in.
#[track_caller]
pub fn qualified(test: &str) -> String {
    let file = std::path::Path::new(std::panic::Location::caller().file());
    let module = file.file_stem().and_then(|m| m.to_str()).unwrap_or_default();
    format!("{module}::{test}")
}

fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
}

fn prepare_netns(vip: &str) {
    let cmd = format!("ip link set lo up && ip addr add {vip}/32 dev lo");
    assert!(Command::new("sh").args(["-c", &cmd]).status().unwrap().success(), "{cmd}");
    for iface in ["all", "lo"] {
        std::fs::write(format!("/proc/sys/net/ipv4/conf/{iface}/arp_ignore"), "1").unwrap();
        std::fs::write(format!("/proc/sys/net/ipv4/conf/{iface}/arp_announce"), "2").unwrap();
    }
}
