//! Signals and reload: SIGHUP (and `refract reload`) applies a changed config without cutting
//! a connection and keeps the old one when the new one is invalid; SIGTERM drains, marking
//! the last responses `connection: close`, and exits 3 when the drain timed out.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::*;
use refract_blob::pattern;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

/// `build`'s two backends (b1 the primary, b2 a replica) and a logged dispatcher in front of
/// them with `extra` appended to its config; and that config.
fn logged(build: ClusterBuilder, extra: &str) -> ([Proc; 2], Dispatcher, String) {
    let (backends, d) = build.dispatcher(extra).with(LOGGED).run().split();
    let text = std::fs::read_to_string(d.config_path()).unwrap();
    (backends, d, text)
}

/// Reads a response head byte by byte (leaving the body on the socket).
fn read_head(c: &mut Client) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        c.stream.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

/// Reads `n` body bytes and checks them against the blob pattern from `offset` on.
fn check_body(c: &mut Client, mut offset: u64, n: u64, seed: u64) {
    let mut buf = vec![0u8; 1 << 20];
    while offset < n {
        let want = buf.len().min((n - offset) as usize);
        let got = c.stream.read(&mut buf[..want]).unwrap();
        assert!(got > 0, "connection closed at {offset}");
        assert_eq!(pattern::first_mismatch(&buf[..got], offset, seed), None, "at {offset}");
        offset += got as u64;
    }
}

/// Waits until the replica b2 has a request in flight.
fn wait_in_flight_on_b2(d: &Dispatcher) {
    wait_for("a request in flight on b2", || admin_get(d.admin, "/backends").json()[1]["in_flight"] == 1);
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !ok() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sighup_applies_a_new_backend_list_while_a_long_response_streams_on() {
    const N: u64 = 64 << 20;
    let ([_b1, b2], d, text) = logged(cluster().backends(2), "");
    let b3 = blob("b3");
    let mut long = Client::connect(d.proc.addr);
    long.send(&raw_request("GET", &format!("/blob?bytes={N}&seed=7"), &[], b""));
    let head = read_head(&mut long);
    assert!(head.contains("x-served-by: b2"), "{head}");
    check_body(&mut long, 0, 1 << 20, 7);
    // b2 out, b3 in, a route added; the long response (from b2) is not read meanwhile.
    let b2_line = format!("[[backend]]\nname = \"b2\"\naddr = \"{}\"\nrole = \"replica\"\n", b2.addr);
    let b3_line = format!("[[backend]]\nname = \"b3\"\naddr = \"{}\"\nrole = \"replica\"\n", b3.addr);
    let next =
        text.replace(&b2_line, &b3_line) + "[[route]]\nmethod = \"GET\"\npath_prefix = \"/stats\"\nclass = \"write\"\n";
    std::fs::write(d.config_path(), next).unwrap();
    d.proc.signal("HUP");
    wait_for("the reload took effect", || {
        get(d.proc.addr, "/blob?bytes=1").header("x-served-by").as_deref() == Some("b3")
    });
    for _ in 0..5 {
        assert_eq!(get(d.proc.addr, "/blob?bytes=1").header("x-served-by").as_deref(), Some("b3"));
    }
    let writes = r#"refract_requests_total{class="write",backend="b1"}"#;
    assert_eq!(metric(d.admin, writes), 0);
    assert_eq!(get(d.proc.addr, "/stats").status, 200);
    // A request is counted when its exchange is booked, just after its last byte went out.
    wait_for("the new route sent GET /stats to the primary as a write", || metric(d.admin, writes) == 1);
    assert_eq!(metric(d.admin, writes), 1);
    let names: Vec<_> =
        admin_get(d.admin, "/backends").json().as_array().unwrap().iter().map(|b| b["name"].to_string()).collect();
    assert_eq!(names, ["\"b1\"", "\"b3\""]);
    check_body(&mut long, 1 << 20, N, 7);
    long.send(&raw_request("GET", "/blob?bytes=5", &[], b""));
    assert_eq!(long.read_response(false).unwrap().header("x-served-by").as_deref(), Some("b3"), "still open");
    assert!(d.log().contains("config reloaded"), "{}", d.log());
}

#[test]
fn an_invalid_config_on_reload_keeps_the_old_one_and_says_why() {
    let ([_b1, b2], d, text) = logged(cluster().backends(2), "");
    std::fs::write(d.config_path(), format!("{text}[timeouts]\ndrain_ms = 0\n")).unwrap();
    d.proc.signal("HUP");
    wait_for("the refusal is logged", || d.log().contains("reload refused"));
    let log = d.log();
    let line = log.lines().find(|l| l.contains("reload refused")).unwrap();
    assert!(line.contains("ERROR") && line.contains("drain_ms must be > 0") && line.contains("line "), "{line}");
    assert_eq!(get(d.proc.addr, "/blob?bytes=1").header("x-served-by").as_deref(), Some("b2"));
    // `refract reload` says the same, and fails.
    let out = Command::new(bin()).args(["reload", "--config", d.config_path().to_str().unwrap()]).output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("drain_ms must be > 0"), "{err}");
    // A listener change needs a restart: reported, left as it was; the rest applies.
    let moved = text.replace(&d.proc.addr.to_string(), "127.0.0.1:1").replace("workers = 2", "workers = 1");
    let b2_line = format!("name = \"b2\"\naddr = \"{}\"", b2.addr);
    std::fs::write(d.config_path(), moved.replace(&b2_line, &b2_line.replace("b2\"", "b2x\""))).unwrap();
    let out = Command::new(bin()).args(["reload", "--config", d.config_path().to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("added b2x"), "{out:?}");
    assert!(d.log().contains("needs restart") && d.log().contains("[listen]"), "{}", d.log());
    assert_eq!(get(d.proc.addr, "/blob?bytes=1").header("x-served-by").as_deref(), Some("b2"), "same listener");
    assert_eq!(admin_get(d.admin, "/backends").json()[1]["name"], "b2x");
}

#[test]
fn a_response_finished_during_the_drain_says_connection_close() {
    let ([_b1, _b2], mut d, _) = logged(cluster().backends(1).backend("b2", &["--delay-ms", "1000"]), "");
    let mut c = Client::connect(d.proc.addr);
    c.send(&raw_request("GET", "/blob?bytes=10", &[], b""));
    wait_in_flight_on_b2(&d);
    d.proc.signal("TERM");
    let r = c.read_response(false).unwrap();
    assert_eq!((r.status, r.body.len()), (200, 10));
    assert_eq!(r.header("connection").as_deref(), Some("close"), "{}", r.head);
    assert!(c.is_closed());
    assert_eq!(d.wait_exit(), Some(0), "drained in time");
}

#[test]
fn a_drain_that_times_out_exits_3() {
    let build = cluster().backends(1).backend("b2", &["--delay-ms", "5000"]);
    let ([_b1, _b2], mut d, _) = logged(build, "[timeouts]\ndrain_ms = 300\n");
    let mut c = Client::connect(d.proc.addr);
    c.send(&raw_request("GET", "/blob?bytes=10", &[], b""));
    wait_in_flight_on_b2(&d);
    d.proc.signal("TERM");
    assert_eq!(d.wait_exit(), Some(3));
    assert!(d.log().contains("drain timeout"), "{}", d.log());
}

// ---- Stopping whatever happens to the log's reader, and panics ----------------------------

/// What reads the pipe a process logs to.
#[derive(Clone, Copy, Debug)]
enum Reader {
    /// Reads the first line, then exits (a `| head -1`, a log shipper that died).
    FirstLine,
    /// Never reads: the pipe (shrunk to one page) fills and stays full.
    Never,
}

/// `drain_ms` of the test dispatchers: the bound is `drain_ms` + 1 s.
const DRAIN_MS: u64 = 200;

/// A process whose stdout and stderr are one pipe, and that pipe's read end (while held).
struct Piped {
    child: std::process::Child,
    _read: Option<std::fs::File>,
}

impl Drop for Piped {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `refract ARGS` (log level debug, `env` added) logging to a pipe read as `reader`
/// says; with [`Reader::FirstLine`] returns once the reader has exited. Both ends of the pipe
/// are close-on-exec, so no other process started meanwhile holds them open.
fn spawn_piped(args: &[&str], env: &[(&str, &str)], reader: Reader) -> Piped {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(args).env("RUST_LOG", "debug").envs(env.iter().copied()).stdin(std::process::Stdio::null());
    cmd.stdout(write.try_clone().unwrap()).stderr(write);
    let child = cmd.spawn().unwrap();
    drop(cmd); // our copies of the write end
    let mut read = std::fs::File::from(read);
    match reader {
        Reader::FirstLine => {
            let mut byte = [0u8; 1];
            while read.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {}
            Piped { child, _read: None }
        }
        Reader::Never => {
            fcntl(&read, FcntlArg::F_SETPIPE_SZ(4096)).unwrap();
            Piped { child, _read: Some(read) }
        }
    }
}

/// Sends `sig` and returns the exit code and how long the exit took; fails past `bound`.
fn stop_within(p: &mut Piped, sig: &str, bound: Duration) -> (Option<i32>, Duration) {
    let sent = Instant::now();
    let _ = Command::new("kill").args([format!("-{sig}"), p.child.id().to_string()]).status();
    loop {
        if let Some(status) = p.child.try_wait().unwrap() {
            return (status.code(), sent.elapsed());
        }
        assert!(sent.elapsed() < bound, "{sig}: still running {:?} after the signal", sent.elapsed());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A dispatcher in front of a backend that is down, on fresh ports, with `runtime`.
fn down_dispatcher_config(runtime: &str) -> (tempfile::TempDir, std::path::PathBuf, SocketAddr, SocketAddr) {
    // Both held while picked: `free_port` twice can return one port twice.
    let (a, b) =
        (std::net::TcpListener::bind("127.0.0.1:0").unwrap(), std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let (http, admin) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    drop((a, b));
    // Nothing listens on port 1 (a port taken from `free_port` may come back as `http`).
    let down: SocketAddr = ([127, 0, 0, 1], 1).into();
    let text = config(http, admin, &[("b1", down, "primary")], &format!("[timeouts]\ndrain_ms = {DRAIN_MS}\n"));
    let text = text.replace("workers = 2\n", &format!("workers = 2\nruntime = \"{runtime}\"\n"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("refract.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path, http, admin)
}

/// Requests the dispatcher refuses (its one backend is down), each logged.
fn refused_requests(http: SocketAddr, n: usize) {
    for _ in 0..n {
        let r = get(http, "/blob?bytes=1");
        assert!(r.status >= 500, "{}", r.head);
    }
}

/// `runs` dispatchers in a row, each logging to a pipe read as `reader` says, refusing
/// requests, then stopped by `sig`: each exits 0 within `drain_ms` + 1 s. The slowest exit.
fn dispatcher_stops(reader: Reader, sig: &str, runs: usize, runtime: &str) -> Duration {
    let mut slowest = Duration::ZERO;
    for run in 0..runs {
        let (_dir, path, http, admin) = down_dispatcher_config(runtime);
        let mut p = spawn_piped(&["dispatch", "--config", path.to_str().unwrap()], &[], reader);
        wait_listening(http);
        wait_listening(admin);
        refused_requests(http, 40);
        let (code, took) = stop_within(&mut p, sig, Duration::from_millis(DRAIN_MS + 1000));
        assert_eq!(code, Some(0), "run {run} ({reader:?}, {sig}): drained, nothing open");
        slowest = slowest.max(took);
    }
    slowest
}

#[test]
fn a_dispatcher_whose_log_reader_exited_stops_on_sigterm_and_sigint() {
    let term = dispatcher_stops(Reader::FirstLine, "TERM", 20, "per-core");
    let int = dispatcher_stops(Reader::FirstLine, "INT", 20, "per-core");
    let stealing = dispatcher_stops(Reader::FirstLine, "TERM", 5, "work-stealing");
    eprintln!("slowest exit: SIGTERM {term:?}, SIGINT {int:?}, work-stealing SIGTERM {stealing:?}");
}

#[test]
fn a_dispatcher_whose_log_pipe_is_full_stops_on_sigterm_and_sigint() {
    let term = dispatcher_stops(Reader::Never, "TERM", 20, "per-core");
    let int = dispatcher_stops(Reader::Never, "INT", 20, "per-core");
    let stealing = dispatcher_stops(Reader::Never, "TERM", 5, "work-stealing");
    eprintln!("slowest exit: SIGTERM {term:?}, SIGINT {int:?}, work-stealing SIGTERM {stealing:?}");
}

#[test]
fn lines_a_full_log_pipe_cannot_take_are_dropped_and_counted() {
    let (_dir, path, http, admin) = down_dispatcher_config("per-core");
    let mut p = spawn_piped(&["dispatch", "--config", path.to_str().unwrap()], &[], Reader::Never);
    wait_listening(http);
    wait_listening(admin);
    // The queue holds 1 MiB; each refused request logs a line of about 150 bytes.
    let dropped = "refract_log_lines_dropped_total";
    let started = Instant::now();
    while metric(admin, dropped) == 0 {
        assert!(started.elapsed() < Duration::from_secs(60), "nothing dropped");
        refused_requests(http, 500);
    }
    assert_eq!(get(admin, "/health").status, 200, "serving on, logging or not");
    let (code, _) = stop_within(&mut p, "TERM", Duration::from_millis(DRAIN_MS + 1000));
    assert_eq!(code, Some(0));
}

/// An agent on a same-host socket in `dir`, in front of a backend that is down.
fn agent_config(dir: &std::path::Path) -> std::path::PathBuf {
    let down: SocketAddr = ([127, 0, 0, 1], 1).into();
    let sock = dir.join("agent.sock");
    let text = format!("backend = \"{down}\"\nlocal = \"{}\"\nkey = \"0123456789abcdef\"\n", sock.display());
    let path = dir.join("agent.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Links the agent refuses (a frame of length 0), each logged at warn.
fn refused_links(sock: &std::path::Path, n: usize) {
    for _ in 0..n {
        let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
        s.write_all(&[0, 0, 0, 0]).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest); // closed by the agent
    }
}

fn wait_socket(sock: &std::path::Path) {
    wait_for("the agent listens", || std::os::unix::net::UnixStream::connect(sock).is_ok());
}

/// As [`dispatcher_stops`], for `refract agent`; it drains nothing, so its bound is its
/// `STOP_BOUND`: within 1 s is asked of it here.
fn agent_stops(reader: Reader, sig: &str, runs: usize) -> Duration {
    let mut slowest = Duration::ZERO;
    for run in 0..runs {
        let dir = tempfile::tempdir().unwrap();
        let path = agent_config(dir.path());
        let mut p = spawn_piped(&["agent", "--config", path.to_str().unwrap()], &[], reader);
        let sock = dir.path().join("agent.sock");
        wait_socket(&sock);
        refused_links(&sock, 40);
        let (code, took) = stop_within(&mut p, sig, Duration::from_millis(DRAIN_MS + 1000));
        assert_eq!(code, Some(0), "run {run} ({reader:?}, {sig})");
        slowest = slowest.max(took);
    }
    slowest
}

#[test]
fn an_agent_whose_log_reader_exited_stops_on_sigterm_and_sigint() {
    let term = agent_stops(Reader::FirstLine, "TERM", 20);
    let int = agent_stops(Reader::FirstLine, "INT", 20);
    eprintln!("slowest exit: SIGTERM {term:?}, SIGINT {int:?}");
}

#[test]
fn an_agent_whose_log_pipe_is_full_stops_on_sigterm_and_sigint() {
    let term = agent_stops(Reader::Never, "TERM", 20);
    let int = agent_stops(Reader::Never, "INT", 20);
    eprintln!("slowest exit: SIGTERM {term:?}, SIGINT {int:?}");
}

#[test]
fn a_blob_server_whose_log_pipe_is_full_or_gone_stops_on_sigterm() {
    for reader in [Reader::FirstLine, Reader::Never] {
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let args = ["blob-server", "--listen", &addr.to_string(), "--name", "b"];
        let mut p = spawn_piped(&args, &[], reader);
        wait_listening(addr);
        for _ in 0..40 {
            assert_eq!(get(addr, "/blob?bytes=1").status, 200);
        }
        let (code, _) = stop_within(&mut p, "TERM", Duration::from_secs(1));
        assert_eq!(code, Some(0), "{reader:?}");
    }
}

/// A dispatcher with `failpoint` set, logging to a file in the returned directory.
fn dispatcher_at_failpoint(failpoint: &str) -> (Piped, tempfile::TempDir, SocketAddr, SocketAddr) {
    let (dir, path, http, admin) = down_dispatcher_config("per-core");
    let log = std::fs::File::create(dir.path().join("refract.log")).unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["dispatch", "--config", path.to_str().unwrap()]).stdin(std::process::Stdio::null());
    cmd.env("RUST_LOG", "info").env("REFRACT_FAILPOINT", failpoint).stderr(log);
    let p = Piped { child: cmd.spawn().unwrap(), _read: None };
    wait_listening(http);
    wait_listening(admin);
    (p, dir, http, admin)
}

fn log_of(dir: &tempfile::TempDir) -> String {
    std::fs::read_to_string(dir.path().join("refract.log")).unwrap()
}

/// Waits (at most 10 s) for the process to exit on its own; its exit code.
fn exits_on_its_own(p: &mut Piped) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = p.child.try_wait().unwrap() {
            return status.code();
        }
        assert!(Instant::now() < deadline, "still running");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn an_event_loop_that_panics_ends_the_dispatcher_with_status_101_and_the_panic_logged() {
    let (mut p, dir, http, _) = dispatcher_at_failpoint("worker-panic");
    // Placing this connection on an event loop makes that loop panic.
    let _ = std::net::TcpStream::connect(http).and_then(|mut c| c.write_all(b"GET / HTTP/1.1\r\n\r\n"));
    assert_eq!(exits_on_its_own(&mut p), Some(101));
    let log = log_of(&dir);
    let line = log.lines().find(|l| l.contains("panicked")).unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains("ERROR") && line.contains("failpoint worker-panic"), "{line}");
    assert!(line.contains("exiting with status 101") && line.contains("refract-"), "{line}");
}

#[test]
fn a_session_that_panics_closes_its_connection_and_the_dispatcher_serves_on() {
    let (mut p, dir, http, admin) = dispatcher_at_failpoint("session-panic");
    let mut c = Client::connect(http);
    c.send(&raw_request("GET", "/blob?bytes=1", &[], b""));
    assert!(c.read_response(false).is_err(), "closed without an answer");
    assert_eq!(get(admin, "/health").status, 200);
    assert_eq!(p.child.try_wait().unwrap(), None, "still running");
    let log = log_of(&dir);
    let line = log.lines().find(|l| l.contains("panicked")).unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains("failpoint session-panic") && line.contains("the process goes on"), "{line}");
    let (code, _) = stop_within(&mut p, "TERM", Duration::from_millis(DRAIN_MS + 1000));
    assert_eq!(code, Some(0));
}

#[test]
fn a_stop_that_hangs_is_ended_by_the_watchdog_with_status_4() {
    let (mut p, dir, _, _) = dispatcher_at_failpoint("stop-hang");
    let (code, took) = stop_within(&mut p, "TERM", Duration::from_millis(DRAIN_MS + 1000));
    assert_eq!(code, Some(4), "{}", log_of(&dir));
    assert!(took >= Duration::from_millis(DRAIN_MS + 500), "not before drain_ms + 0.5 s: {took:?}");
    assert!(log_of(&dir).contains("shutdown watchdog"), "{}", log_of(&dir));
}
