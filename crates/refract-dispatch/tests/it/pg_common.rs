//! Shared by the `pg_*` tests: a real primary + replica (refract-testkit), refract in
//! front of them as the binary runs it (two per-core event loops, each with its own PostgreSQL
//! listener on the same port), psql/pgbench runners and a tiny raw client.
#![allow(dead_code, clippy::unwrap_used)]

pub mod agent;
pub mod drivers;

use bytes::BytesMut;
use refract_dispatch::config;
use refract_dispatch::{run_workers, Ctx};
use refract_pg::auth::{ClientAuth, ClientStep};
use refract_pg::startup::{CancelRequest, PROTOCOL_3_0};
use refract_pg::{BackendMessage, ErrorFields, FrontendMessage, Limits, Startup, StartupPacket, TxStatus};
use refract_testkit::{
    self as testkit, cluster, postgres_section, Cluster, NoBackend, PgCluster, PgServer, Rig, Start, DATABASE,
    PASSWORD, USER,
};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// A cluster with refract in front.
pub struct Fixture {
    /// refract's PostgreSQL port.
    pub port: u16,
    /// refract's admin port.
    pub admin: u16,
    /// Declared first: stopped before the agents and the servers.
    refract: Refract,
    /// The agents in front of the servers ([`Fixture::start_hybrid`]; none otherwise).
    pub agents: Vec<agent::Agent>,
    /// Declared last: stopped after refract.
    pub cluster: PgCluster,
}

/// refract as the binary runs it (two event loops, each with its own PostgreSQL listener on
/// the same port), in this process; stopped when dropped.
pub struct Refract {
    ctx: Arc<Ctx>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Refract {
    /// Starts refract with the config `text`; returns once it accepts on `port`.
    pub fn start(text: &str, port: u16) -> Refract {
        let cfg = config::parse(text).unwrap();
        refract_core::worker::set_count(WORKERS);
        let ctx = Ctx::new(cfg);
        let run = ctx.clone();
        let thread = std::thread::spawn(move || run_workers(run, WORKERS).unwrap());
        wait_listening(port);
        Refract { ctx, thread: Some(thread) }
    }
}

impl Drop for Refract {
    fn drop(&mut self) {
        self.ctx.stop.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// This kit for the test kit's builder: agents and refract in this process.
pub struct InProcess<'a> {
    /// Lines in `[listen]`.
    pub listen: &'a str,
}

impl Start for InProcess<'_> {
    type Backend = NoBackend;
    type Agent = agent::Agent;
    type Dispatcher = (u16, u16, Refract);

    fn agent(&self, _: &str, server: SocketAddr) -> agent::Agent {
        agent::Agent::start(server, agent::sock_path("fixture"))
    }

    /// refract with `extra` lines in `[postgres]` in front of the primary and the replica
    /// (through their agents, in hybrid hand-over, when there are agents): (port, admin, it).
    fn dispatcher(&self, extra: &str, rig: Rig<'_, Self>) -> (u16, u16, Refract) {
        launch(self.listen, extra, &(USERS.to_owned() + &servers(rig.pg(), rig.agents)))
    }
}

/// The `[[postgres.server]]` tables of the primary and the replica of `pg`, through `agents`
/// (hybrid hand-over, threshold 64 KiB) when there are.
fn servers(pg: &PgCluster, agents: &[(String, agent::Agent)]) -> String {
    let agent = |i: usize| agents.get(i).map(|(_, a)| a);
    server_tables(&[("primary", pg.primary.addr(), agent(0)), ("replica", pg.replica().addr(), agent(1))], 65536)
}

/// `[[postgres.server]]` tables, one per `(name, addr, agent)`, each named after its role
/// (`primary`, `replica`) and reached through its agent when it has one; when any has, the
/// `[handover]` naming the agents, in hybrid mode with results past `threshold` bytes handed
/// over.
pub fn server_tables(servers: &[(&str, SocketAddr, Option<&agent::Agent>)], threshold: usize) -> String {
    let mut text = String::new();
    for (name, addr, agent) in servers {
        let through = agent.map_or(String::new(), |a| format!("through = \"{}\"\n", a.through));
        text += &format!("\n[[postgres.server]]\nname = \"{name}\"\naddr = \"{addr}\"\n{through}role = \"{name}\"\n");
    }
    let agents: Vec<String> = servers
        .iter()
        .filter_map(|(name, _, agent)| Some(format!("{name} = \"unix:{}\"", (*agent)?.sock.display())))
        .collect();
    if !agents.is_empty() {
        text += &format!(
            "\n[handover]\nmode = \"hybrid\"\npostgres_threshold = {threshold}\nagents = {{ {} }}\n",
            agents.join(", ")
        );
    }
    text
}

/// Where a shared fixture is kept while tests hold it.
type Slot = &'static Mutex<Weak<Fixture>>;

/// One slot per test file (module) of this binary.
static SHARED: Mutex<Vec<(&'static str, Slot)>> = Mutex::new(Vec::new());

/// The fixture shared by the tests of the caller's file that run at the same time (started
/// once while any test holds it; stopped when the last lets go).
#[track_caller]
pub fn shared() -> Arc<Fixture> {
    let file = std::panic::Location::caller().file();
    let slot = {
        let mut slots = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        match slots.iter().find(|(f, _)| *f == file) {
            Some((_, slot)) => *slot,
            None => {
                let slot: Slot = Box::leak(Box::new(Mutex::new(Weak::new())));
                slots.push((file, slot));
                slot
            }
        }
    };
    shared_in(slot, "")
}

/// For a test that measures this process (its peak memory): whether to run the test's body
/// here. In the test binary, it re-runs `test` (of the caller's file) alone in a child process
/// of its own, prints what the child printed, asserts that it passed and returns false; in that
/// child (`RF_ALONE` set) it returns true.
#[track_caller]
pub fn alone(test: &str) -> bool {
    if std::env::var_os("RF_ALONE").is_some() {
        return true;
    }
    let file = std::path::Path::new(std::panic::Location::caller().file());
    let module = file.file_stem().and_then(|m| m.to_str()).unwrap_or_default();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &format!("{module}::{test}"), "--nocapture", "--test-threads=1"])
        .env("RF_ALONE", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    eprintln!("{text}");
    assert!(out.status.success() && text.contains("1 passed"), "{test} in a process of its own:\n{text}");
    false
}

/// The fixture with `extra` lines in `[postgres]` kept in `slot`, shared the same way (a test
/// binary whose tests need settings of their own keeps its own slot).
pub fn shared_in(slot: &Mutex<Weak<Fixture>>, extra: &str) -> Arc<Fixture> {
    shared_with(slot, || Fixture::start(extra))
}

/// The fixture `start` makes, kept in `slot` and shared the same way.
pub fn shared_with(slot: &Mutex<Weak<Fixture>>, start: impl FnOnce() -> Fixture) -> Arc<Fixture> {
    let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(f) = slot.upgrade() {
        return f;
    }
    let f = Arc::new(start());
    *slot = Arc::downgrade(&f);
    f
}

/// Waits (at most 20 s, polling every 20 ms) until `cond` holds; panics with `what` if it never does.
pub fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The admin token of the dispatcher under test.
pub const ADMIN_TOKEN: &str = "pg-test-admin-token";

/// Event loops of the dispatcher under test (as `[listen] workers = 2`).
const WORKERS: usize = 2;

/// Waits (at most 30 s) until refract accepts on `port`.
fn wait_listening(port: u16) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "refract never listened on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

use refract_testkit::free_port;

impl Fixture {
    /// Starts a cluster and refract with `extra` lines in `[postgres]`.
    pub fn start(extra: &str) -> Fixture {
        Fixture::start_with("", extra)
    }

    /// Starts a cluster and refract with `listen` lines in `[listen]` and `extra` lines in
    /// `[postgres]`.
    pub fn start_with(listen: &str, extra: &str) -> Fixture {
        Fixture::start_in(listen, extra, false)
    }

    /// Like [`Fixture::start`], with an agent in front of each server and `[handover] mode =
    /// "hybrid"` (threshold 64 KiB): large results are handed over (docs/handover.md,
    /// "PostgreSQL").
    pub fn start_hybrid(extra: &str) -> Fixture {
        Fixture::start_in("", extra, true)
    }

    fn start_in(listen: &str, extra: &str, hybrid: bool) -> Fixture {
        let mut build = cluster().primary().replica();
        if hybrid {
            build = build.agent("primary").agent("replica");
        }
        let Cluster { dispatcher, agents, pg, .. } = build.dispatcher(extra).with(InProcess { listen }).run();
        let (port, admin, refract) = dispatcher.expect("a dispatcher");
        let cluster = pg.expect("the PostgreSQL servers");
        Fixture { port, admin, refract, agents: agents.into_iter().map(|(_, a)| a).collect(), cluster }
    }

    /// refract in front of `cluster` with `servers` (the `[[postgres.server]]` tables and what
    /// follows them) and `extra` lines in `[postgres]`.
    pub fn start_servers(cluster: PgCluster, extra: &str, servers: &str) -> Fixture {
        let (port, admin, refract) = launch("", extra, &(USERS.to_owned() + servers));
        Fixture { port, admin, refract, agents: vec![], cluster }
    }

    /// refract's address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// psql through refract as `refract`, one `-c` per statement, in one session.
    pub fn psql(&self, statements: &[&str]) -> Result<String, String> {
        self.psql_as(USER, PASSWORD, statements, None)
    }

    /// psql through refract as `user`, with `stdin`.
    pub fn psql_as(
        &self,
        user: &str,
        password: &str,
        statements: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, String> {
        let mut cmd = Command::new(testkit::tool("psql").unwrap());
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", user, "-d", DATABASE]);
        cmd.args(["-XAtq", "-v", "ON_ERROR_STOP=1"]);
        for s in statements {
            cmd.args(["-c", s]);
        }
        run(cmd.env("PGPASSWORD", password).env("PGCONNECT_TIMEOUT", "10"), stdin)
    }

    /// psql through refract with `conninfo` added to the connection string (e.g. `sslmode=require`).
    pub fn psql_conninfo(&self, conninfo: &str, statements: &[&str]) -> Result<String, String> {
        let base = format!("host=127.0.0.1 port={} user={USER} dbname={DATABASE} {conninfo}", self.port);
        let mut cmd = Command::new(testkit::tool("psql").unwrap());
        cmd.arg(base).args(["-XAtq", "-v", "ON_ERROR_STOP=1"]);
        for s in statements {
            cmd.args(["-c", s]);
        }
        run(cmd.env("PGPASSWORD", PASSWORD).env("PGCONNECT_TIMEOUT", "10"), None)
    }

    /// `GET path` from the admin listener, as JSON.
    pub fn admin_json(&self, path: &str) -> serde_json::Value {
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, self.admin)).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN_TOKEN}\r\nconnection: close\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "GET {path}: {out}");
        serde_json::from_str(body).unwrap()
    }

    /// `method path` with a JSON `body` to the admin listener: (status, body).
    pub fn admin_call(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, self.admin)).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN_TOKEN}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        (head[9..12].parse().unwrap(), body.to_owned())
    }

    /// pgbench through refract.
    pub fn pgbench(&self, args: &[&str]) -> Result<String, String> {
        let mut cmd = Command::new(testkit::tool("pgbench").unwrap());
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER]);
        cmd.args(args).arg(DATABASE);
        run(cmd.env("PGPASSWORD", PASSWORD), None)
    }

    /// `GET /metrics` from the admin listener.
    pub fn metrics(&self) -> String {
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, self.admin)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    /// Waits until the replica has replayed everything written so far.
    pub fn replicated(&self) {
        self.cluster.wait_replicated(Duration::from_secs(20)).unwrap();
    }
}

fn run(cmd: &mut Command, stdin: Option<&str>) -> Result<String, String> {
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or_default().as_bytes()).unwrap();
    drop(input);
    let out: Output = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{}{}", text, String::from_utf8_lossy(&out.stderr)))
    }
}

/// The users the fixture's refract knows besides the kit's own: one with md5 authentication,
/// one trusted, one in session mode.
const USERS: &str = r#"
[[postgres.user]]
name = "md5user"
password = "md5pass"
auth = "md5"

[[postgres.user]]
name = "trusted"
auth = "trust"

[[postgres.user]]
name = "sessionuser"
password = "sessionpass"
pool_mode = "session"
"#;

/// refract in this process, its config written out here and nowhere else: `listen` lines in
/// `[listen]`, `extra` lines in `[postgres]` (with a health interval of 200 ms unless they set
/// one) and `tables` after it (more `[[postgres.user]]`, the servers ([`server_tables`]),
/// `[handover]`, other sections); admin token [`ADMIN_TOKEN`]: (port, admin, it).
pub fn launch(listen: &str, extra: &str, tables: &str) -> (u16, u16, Refract) {
    let (port, admin) = (free_port(), free_port());
    let health = if extra.contains("health_interval_ms") { "" } else { "health_interval_ms = 200" };
    let postgres = postgres_section(&format!("127.0.0.1:{port}"), &format!("{health}\n{extra}"));
    let text = format!(
        r#"
[listen]
http = "127.0.0.1:0"
admin = "127.0.0.1:{admin}"
{listen}

[admin]
token = "{ADMIN_TOKEN}"

{postgres}
{tables}
"#
    );
    (port, admin, Refract::start(&text, port))
}

/// A blocking client made of refract-pg's codec.
pub struct Client {
    pub stream: TcpStream,
    buf: BytesMut,
    /// refract's BackendKeyData.
    pub key: (i32, bytes::Bytes),
    /// The ParameterStatus messages of the login, in order.
    pub params: Vec<(String, String)>,
}

/// What a query returned.
#[derive(Debug, Default)]
pub struct Answer {
    /// Rows, text columns.
    pub rows: Vec<Vec<Option<String>>>,
    /// The error, if one came.
    pub error: Option<ErrorFields>,
    /// The notices and warnings, in order.
    pub notices: Vec<ErrorFields>,
    /// Every message type byte, in order.
    pub tags: String,
    /// The final transaction status.
    pub status: Option<TxStatus>,
}

impl Answer {
    /// The first column of the first row.
    pub fn value(&self) -> &str {
        self.rows.first().and_then(|r| r.first()).and_then(|c| c.as_deref()).unwrap_or("<none>")
    }

    /// The SQLSTATE of the error.
    pub fn code(&self) -> Option<&str> {
        self.error.as_ref().and_then(|e| e.code())
    }
}

impl Client {
    /// Opens a socket to `addr` without a startup message.
    pub fn raw(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Client { stream, buf: BytesMut::new(), key: (0, bytes::Bytes::new()), params: vec![] }
    }

    /// Logs in; an ErrorResponse during login is returned as `Err`.
    pub fn connect(addr: SocketAddr, user: &str, password: &str) -> Result<Client, ErrorFields> {
        Client::connect_with(addr, user, password, &[])
    }

    /// Logs in with `extra` startup parameters (e.g. `application_name`, as libpq sends).
    pub fn connect_with(
        addr: SocketAddr,
        user: &str,
        password: &str,
        extra: &[(&str, &str)],
    ) -> Result<Client, ErrorFields> {
        let mut c = Client::raw(addr);
        let mut params = vec![("user".into(), user.into()), ("database".into(), DATABASE.into())];
        params.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        let mut out = BytesMut::new();
        StartupPacket::Startup(Startup { protocol: PROTOCOL_3_0, params }).encode(&mut out);
        c.stream.write_all(&out).unwrap();
        let mut auth = ClientAuth::new(user, Some(password));
        loop {
            match c.recv().expect("message during login") {
                BackendMessage::Authentication(a) => {
                    if let ClientStep::Send(b) = auth.step(&a).unwrap() {
                        c.stream.write_all(&b).unwrap();
                    }
                }
                BackendMessage::BackendKeyData { pid, secret } => c.key = (pid, secret),
                BackendMessage::ParameterStatus { name, value } => c.params.push((name, value)),
                BackendMessage::ErrorResponse(e) => return Err(e),
                BackendMessage::ReadyForQuery(_) => return Ok(c),
                _ => {}
            }
        }
    }

    /// The next message; `None` when the server closed.
    pub fn recv(&mut self) -> Option<BackendMessage> {
        loop {
            if let Some((msg, n)) = BackendMessage::parse(&self.buf, &Limits::default()).unwrap() {
                let _ = self.buf.split_to(n);
                return Some(msg);
            }
            let mut chunk = [0u8; 16384];
            let n = match self.stream.read(&mut chunk) {
                Ok(n) => n,
                // A signal (e.g. a child process of another test exiting) interrupts a read
                // with a timeout even under SA_RESTART: not the end of the stream.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => 0,
            };
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Sends messages.
    pub fn send(&mut self, msgs: &[FrontendMessage]) {
        let mut out = BytesMut::new();
        msgs.iter().for_each(|m| m.encode(&mut out));
        self.stream.write_all(&out).unwrap();
    }

    /// Everything up to ReadyForQuery.
    pub fn until_ready(&mut self) -> Answer {
        let mut a = Answer::default();
        while let Some(m) = self.recv() {
            a.tags.push(char::from(m.tag()));
            match m {
                BackendMessage::DataRow(cols) => {
                    a.rows.push(cols.into_iter().map(|c| c.map(|b| String::from_utf8_lossy(&b).into_owned())).collect())
                }
                BackendMessage::ErrorResponse(e) => a.error = Some(e),
                BackendMessage::NoticeResponse(n) => a.notices.push(n),
                BackendMessage::ReadyForQuery(s) => {
                    a.status = Some(s);
                    break;
                }
                _ => {}
            }
        }
        a
    }

    /// A simple query.
    /// Runs `sql` through the extended protocol (unnamed statement and portal, text results,
    /// Sync) and reads the answer.
    pub fn extended(&mut self, sql: &str) -> Answer {
        self.send(&[
            FrontendMessage::Parse { name: String::new(), query: sql.into(), param_types: vec![] },
            FrontendMessage::Bind(refract_pg::frontend::Bind {
                portal: String::new(),
                statement: String::new(),
                param_formats: vec![],
                params: vec![],
                result_formats: vec![],
            }),
            FrontendMessage::Execute { portal: String::new(), max_rows: 0 },
            FrontendMessage::Sync,
        ]);
        self.until_ready()
    }

    pub fn query(&mut self, sql: &str) -> Answer {
        self.send(&[FrontendMessage::Query(sql.into())]);
        self.until_ready()
    }

    /// Sends a CancelRequest for this client's key on a new connection.
    pub fn cancel(&self, addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).unwrap();
        let mut out = BytesMut::new();
        StartupPacket::Cancel(CancelRequest { pid: self.key.0, secret: self.key.1.clone() }).encode(&mut out);
        s.write_all(&out).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    }
}

/// The next message's tag and body, read raw (its text may be in any encoding).
pub fn raw_message(s: &mut std::net::TcpStream) -> (u8, Vec<u8>) {
    use std::io::Read;
    let mut head = [0u8; 5];
    s.read_exact(&mut head).unwrap();
    let len = usize::try_from(i32::from_be_bytes([head[1], head[2], head[3], head[4]])).unwrap() - 4;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (head[0], body)
}

/// A DataRow body's columns.
pub fn columns(body: &[u8]) -> Vec<Option<Vec<u8>>> {
    let (n, mut at, mut cols) = (u16::from_be_bytes([body[0], body[1]]), 2, vec![]);
    for _ in 0..n {
        let len = i32::from_be_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
        at += 4;
        cols.push(usize::try_from(len).ok().map(|l| {
            at += l;
            body[at - l..at].to_vec()
        }));
    }
    cols
}

/// The `[[postgres.shard]]` sections of shards `names` (shard i on `servers[i]`, one primary
/// each, named `NAME-primary`) and a `[[postgres.sharded_table]]` per `(table, key)`, hash on
/// an integer key.
pub fn shard_config(names: &[&str], servers: &[&PgServer], tables: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (name, s) in names.iter().zip(servers) {
        out += &format!(
            "[[postgres.shard]]\nname = \"{name}\"\n\n[[postgres.shard.server]]\nname = \"{name}-primary\"\n\
             addr = \"{}\"\nrole = \"primary\"\n\n",
            s.addr()
        );
    }
    for (table, key) in tables {
        out += &format!(
            "[[postgres.sharded_table]]\nname = \"{table}\"\nkey = \"{key}\"\nmethod = \"hash\"\ntype = \"integer\"\n\n"
        );
    }
    out
}

/// A TCP proxy to `upstream` that holds every chunk the server sends for `delay`: a replica
/// that answers slowly. Runs until the test process ends.
pub fn slow_proxy(upstream: SocketAddr, delay: Duration) -> SocketAddr {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(upstream) else { continue };
            let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || copy(&mut c_in, &mut s_out, Duration::ZERO));
            let (mut s_in, mut c_out) = (server, client);
            std::thread::spawn(move || copy(&mut s_in, &mut c_out, delay));
        }
    });
    addr
}

fn copy(from: &mut TcpStream, to: &mut TcpStream, delay: Duration) {
    let mut buf = [0u8; 16 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf) {
        std::thread::sleep(delay);
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}
