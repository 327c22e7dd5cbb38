//! The PostgreSQL result hand-over on one host (docs/handover.md, "PostgreSQL"): refract reaches
//! the primary through an agent (in this process, as `refract agent` runs it), hybrid mode with a
//! 64 KiB threshold. A large result is written to the client by the agent (counted in
//! `refract_handover_total{result="ok"}`) and reads exactly as it does straight from
//! PostgreSQL: the same messages in the same order, the same rows, the same error and the same
//! transaction status; the session goes on after it.
#![allow(clippy::unwrap_used)]

mod pg_common;

use pg_common::{Answer, Client};
use refract_dispatch::{config, run_sharded, Ctx};
use refract_pg::frontend::Bind;
use refract_pg::testkit::{PgCluster, PASSWORD, USER};
use refract_pg::FrontendMessage;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// refract with hybrid hand-over in front of the cluster's primary, through an agent.
struct Hybrid {
    port: u16,
    admin: u16,
    _ctx: Arc<Ctx>,
    _dir: TempDir,
    cluster: PgCluster,
}

/// A directory removed on drop (the agent's socket lives in it).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap().local_addr().unwrap().port()
}

/// Starts the agent in front of `server`: its PostgreSQL listener and its same-host link.
fn agent(server: SocketAddr, sock: PathBuf) -> SocketAddr {
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let opts = refract_agent::LocalOptions {
        backend: server,
        backend_socket: None,
        pass_socket: false,
        backend_timeout: Duration::from_secs(30),
        write_stall: Duration::from_secs(10),
        guard: None,
        pg: Default::default(),
    };
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            listener.set_nonblocking(true).unwrap();
            let pg = tokio::net::TcpListener::from_std(listener).unwrap();
            let local = refract_agent::bind_local(&sock, None).unwrap();
            tokio::select! {
                r = refract_agent::serve_postgres(pg, opts.clone()) => r.unwrap(),
                r = refract_agent::serve_local(local, opts) => r.unwrap(),
            }
        });
    });
    addr
}

impl Hybrid {
    fn start() -> Hybrid {
        let cluster = PgCluster::start().expect("PostgreSQL test cluster");
        let dir = std::env::temp_dir().join(format!("refract-pg-handover-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("agent.sock");
        let through = agent(cluster.primary.addr(), sock.clone());
        let (port, admin) = (free_port(), free_port());
        let text = format!(
            r#"
[listen]
http = "127.0.0.1:0"
admin = "127.0.0.1:{admin}"

[admin]
token = "t0ken-for-the-pg-handover-test"

[postgres]
listen = "127.0.0.1:{port}"
server_user = "{USER}"
server_password = "{PASSWORD}"
health_interval_ms = 200

[[postgres.user]]
name = "{USER}"
password = "{PASSWORD}"

[[postgres.server]]
name = "primary"
addr = "{through}"
role = "primary"

[handover]
mode = "hybrid"
threshold = 65536
agents = {{ primary = "unix:{}" }}
"#,
            sock.display()
        );
        let cfg = config::parse(&text).unwrap();
        refract_core::shard::set_count(2);
        let ctx = Ctx::new(cfg);
        let run = ctx.clone();
        std::thread::spawn(move || run_sharded(run, 2).unwrap());
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "refract never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
        Hybrid { port, admin, _ctx: ctx, _dir: TempDir(dir), cluster }
    }

    fn client(&self) -> Client {
        Client::connect(SocketAddr::from((Ipv4Addr::LOCALHOST, self.port)), USER, PASSWORD).unwrap()
    }

    fn direct(&self) -> Client {
        Client::connect(self.cluster.primary.addr(), USER, PASSWORD).unwrap()
    }

    /// Hand-overs that succeeded so far.
    fn handed_over(&self) -> u64 {
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, self.admin)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out.lines()
            .filter(|l| l.starts_with("refract_handover_total{") && l.contains("result=\"ok\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }
}

/// Same messages, rows, error and status.
fn same(what: &str, through: &Answer, direct: &Answer) {
    assert_eq!(through.tags, direct.tags, "{what}: message types differ");
    assert_eq!(through.rows, direct.rows, "{what}: rows differ");
    assert_eq!(through.code(), direct.code(), "{what}: errors differ");
    assert_eq!(through.status, direct.status, "{what}: status differs");
}

/// About 900 KB of rows.
const LARGE: &str = "select n, md5(n::text) from generate_series(1, 20000) n";

#[test]
fn large_results_are_handed_over_and_read_as_from_postgresql() {
    let h = Hybrid::start();
    let (mut c, mut d) = (h.client(), h.direct());
    let before = h.handed_over();

    // Simple query, then a small one on the same session (the socket came back).
    same("simple query", &c.query(LARGE), &d.query(LARGE));
    assert!(h.handed_over() > before, "the large result was handed over");
    same("small query after", &c.query("select 1"), &d.query("select 1"));

    // Several statements, the large one in the middle.
    let multi = format!("select 1; {LARGE}; select 2");
    same("multi-statement query", &c.query(&multi), &d.query(&multi));

    // An error in the middle of a large result.
    let failing = "select n, 1/(n - 15000) from generate_series(1, 20000) n";
    same("error mid-result", &c.query(failing), &d.query(failing));
    same("after the error", &c.query("select 3"), &d.query("select 3"));

    // Inside a transaction: the transaction's own connection, status kept.
    same("begin", &c.query("begin"), &d.query("begin"));
    same("read in a transaction", &c.query(LARGE), &d.query(LARGE));
    same("commit", &c.query("commit"), &d.query("commit"));

    // COPY TO STDOUT.
    let copy = format!("copy ({LARGE}) to stdout with (format csv)");
    same("copy out", &c.query(&copy), &d.query(&copy));

    // Extended protocol, binary results, pipelined with a second batch behind it.
    let batch = |c: &mut Client| {
        c.send(&[
            FrontendMessage::Parse { name: String::new(), query: LARGE.into(), param_types: vec![] },
            FrontendMessage::Bind(Bind {
                portal: String::new(),
                statement: String::new(),
                param_formats: vec![],
                params: vec![],
                result_formats: vec![1],
            }),
            FrontendMessage::Execute { portal: String::new(), max_rows: 0 },
            FrontendMessage::Sync,
            FrontendMessage::Query("select 4".into()),
        ]);
        (c.until_ready(), c.until_ready())
    };
    let (through, direct) = (batch(&mut c), batch(&mut d));
    same("extended, binary", &through.0, &direct.0);
    same("pipelined behind it", &through.1, &direct.1);

    let handed = h.handed_over() - before;
    assert!(handed >= 6, "{handed} hand-overs, expected one per large result");
}
