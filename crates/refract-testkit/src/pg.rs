//! Real PostgreSQL for tests: a primary and streaming replicas on free loopback ports in a
//! temporary directory, removed on drop; for tests and the lab only (it starts processes and
//! probes ports).
//!
//! PostgreSQL refuses to run as root, so when the tests run as root the servers run as an
//! unprivileged user (`nobody`, or `$REFRACT_PG_RUN_AS`) through `runuser`, and the directory
//! is handed to that user. Binaries come from `$REFRACT_PG_BINDIR`, else from wherever
//! `initdb` on the `PATH` really lives, else the newest `/usr/lib/postgresql/*/bin`.

use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The user every server has, a superuser with replication rights.
pub const USER: &str = "refract";
/// Its password (stored as a SCRAM-SHA-256 verifier; all connections must use SCRAM).
pub const PASSWORD: &str = "refract";
/// The database to connect to.
pub const DATABASE: &str = "postgres";

/// Settings for a fast, throw-away server (no durability).
const SETTINGS: &str = "
listen_addresses = '127.0.0.1'
fsync = off
full_page_writes = off
shared_buffers = 16MB
max_connections = 120
wal_receiver_status_interval = 1s
wal_level = logical
hot_standby_feedback = on
log_min_messages = warning
max_prepared_transactions = 20
";

/// refract's `[postgres]` section in front of this kit's servers: clients at `listen`, the
/// kit's login towards the servers and for clients ([`USER`] / [`PASSWORD`]), `extra` lines in
/// the section. More `[[postgres.user]]` and `[[postgres.server]]` tables may follow.
pub fn postgres_section(listen: &str, extra: &str) -> String {
    format!(
        "[postgres]\nlisten = \"{listen}\"\nserver_user = \"{USER}\"\nserver_password = \"{PASSWORD}\"\n{extra}\n\n\
         [[postgres.user]]\nname = \"{USER}\"\npassword = \"{PASSWORD}\"\n"
    )
}

/// The path of a PostgreSQL client or server program (`psql`, `pgbench`, ...) of the kit's
/// installation.
pub fn tool(name: &str) -> io::Result<PathBuf> {
    Ok(Tools::find()?.bindir.join(name))
}

/// One running server.
#[derive(Debug)]
pub struct PgServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    data: PathBuf,
    log: PathBuf,
    running: bool,
}

impl PgServer {
    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The data directory (e.g. to edit `pg_hba.conf`).
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A primary and its streaming replicas; everything is stopped and deleted on drop.
#[derive(Debug)]
pub struct PgCluster {
    /// The primary.
    pub primary: PgServer,
    /// The hot-standby replicas, streaming from the primary.
    pub replicas: Vec<PgServer>,
    /// Servers of their own ([`PgCluster::add_standalone`]), e.g. logical replicas.
    pub standalone: Vec<PgServer>,
    tools: Tools,
    // Declared last so it is removed after the servers are stopped.
    dir: tempfile::TempDir,
}

impl PgCluster {
    /// A primary and one replica.
    pub fn start() -> io::Result<PgCluster> {
        Self::start_with_replicas(1)
    }

    /// A primary and `n` replicas.
    pub fn start_with_replicas(n: usize) -> io::Result<PgCluster> {
        let tools = Tools::find()?;
        let dir = tempfile::Builder::new().prefix("refract-pg-").tempdir()?;
        tools.hand_over(dir.path())?;
        let data = dir.path().join("primary");
        let primary = PgServer { port: 0, log: dir.path().join("primary.log"), data, running: false };
        let mut cluster = PgCluster { primary, replicas: vec![], standalone: vec![], tools, dir };
        cluster.init(&cluster.primary.data)?;
        start_server(&cluster.tools, &mut cluster.primary)?;
        for i in 0..n {
            let replica = cluster.add_replica(i)?;
            cluster.replicas.push(replica);
        }
        Ok(cluster)
    }

    /// The first replica.
    ///
    /// # Panics
    /// If the cluster was started without replicas (a test bug).
    pub fn replica(&self) -> &PgServer {
        &self.replicas[0]
    }

    /// A server of its own, not a replica (its own `initdb`, the same user and settings),
    /// started; `self.standalone[i]` where `i` is returned. With `wal_level = logical` on
    /// every server, it can subscribe to the primary's publications.
    pub fn add_standalone(&mut self) -> io::Result<usize> {
        self.add_standalone_with("")
    }

    /// [`PgCluster::add_standalone`] with `conf` appended to its `postgresql.conf` (e.g.
    /// `max_prepared_transactions = 0`).
    pub fn add_standalone_with(&mut self, conf: &str) -> io::Result<usize> {
        let i = self.standalone.len();
        let data = self.dir.path().join(format!("standalone{i}"));
        self.init(&data)?;
        append(&data.join("postgresql.conf"), &format!("{conf}\n"))?;
        let log = self.dir.path().join(format!("standalone{i}.log"));
        let mut server = PgServer { port: 0, log, data, running: false };
        start_server(&self.tools, &mut server)?;
        self.standalone.push(server);
        Ok(i)
    }

    fn init(&self, data: &Path) -> io::Result<()> {
        let pwfile = self.dir.path().join("pwfile");
        std::fs::write(&pwfile, PASSWORD)?;
        self.tools.hand_over(&pwfile)?;
        let data_dir = data;
        let data = path_str(data)?;
        let pw = path_str(&pwfile)?;
        let args = ["-D", data, "-U", USER, "--auth=scram-sha-256", "--pwfile", pw, "-N", "-E", "UTF8", "--locale=C"];
        self.tools.run_as_server("initdb", &args)?;
        let socket_dir = path_str(self.dir.path())?;
        let conf = format!("{SETTINGS}unix_socket_directories = '{socket_dir}'\n");
        append(&data_dir.join("postgresql.conf"), &conf)
    }

    fn add_replica(&self, i: usize) -> io::Result<PgServer> {
        let data = self.dir.path().join(format!("replica{i}"));
        let port = self.primary.port.to_string();
        let args =
            ["-h", "127.0.0.1", "-p", &port, "-U", USER, "-D", path_str(&data)?, "-R", "-X", "stream", "-c", "fast"];
        self.tools.run_as_server("pg_basebackup", &args)?;
        let mut replica =
            PgServer { port: 0, log: self.dir.path().join(format!("replica{i}.log")), data, running: false };
        start_server(&self.tools, &mut replica)?;
        Ok(replica)
    }

    /// Runs `sql` with psql on `server`; returns its unaligned, tuples-only output, trimmed.
    pub fn psql(&self, server: &PgServer, sql: &str) -> io::Result<String> {
        let port = server.port.to_string();
        let args =
            ["-h", "127.0.0.1", "-p", &port, "-U", USER, "-d", DATABASE, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql];
        let out = self
            .tools
            .command("psql")
            .args(args)
            .env("PGPASSWORD", PASSWORD)
            .env("PGCONNECT_TIMEOUT", "10")
            .output()?;
        checked("psql", out).map(|s| s.trim().to_owned())
    }

    /// Polls `sql` on `server` until it prints `expected`, for at most `timeout`.
    pub fn wait_for(&self, server: &PgServer, sql: &str, expected: &str, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self.psql(server, sql);
            if got.as_deref().ok() == Some(expected) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let msg = format!("after {timeout:?}, `{sql}` gives {got:?}, not {expected:?}");
                return Err(io::Error::new(io::ErrorKind::TimedOut, msg));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every replica has replayed everything the primary has written so far.
    pub fn wait_replicated(&self, timeout: Duration) -> io::Result<()> {
        let lsn = self.psql(&self.primary, "SELECT pg_current_wal_insert_lsn()")?;
        let sql = format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn");
        self.replicas.iter().try_for_each(|r| self.wait_for(r, &sql, "t", timeout))
    }

    /// Stops `server` at once (as a crash would), e.g. to test failover.
    pub fn kill(&self, server: &mut PgServer) -> io::Result<()> {
        stop_server(&self.tools, server)
    }
}

impl PgCluster {
    /// Stops the primary at once (as a crash would), e.g. to test failover.
    pub fn kill_primary(&mut self) -> io::Result<()> {
        stop_server(&self.tools, &mut self.primary)
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        for r in self.replicas.iter_mut().chain(self.standalone.iter_mut()) {
            let _ = stop_server(&self.tools, r);
        }
        let _ = stop_server(&self.tools, &mut self.primary);
    }
}

/// Starts `server` on a free port, retrying with another port if that one was taken meanwhile.
fn start_server(tools: &Tools, server: &mut PgServer) -> io::Result<()> {
    let mut last = None;
    for _ in 0..3 {
        server.port = crate::try_free_port()?;
        let opts = format!("-p {}", server.port);
        let (data, log) = (path_str(&server.data)?, path_str(&server.log)?);
        match tools.run_as_server("pg_ctl", &["-D", data, "-l", log, "-w", "-t", "60", "-o", &opts, "start"]) {
            Ok(_) => {
                server.running = true;
                return Ok(());
            }
            Err(e) => last = Some(io::Error::other(format!("{e}\n{}", server.log()))),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("pg_ctl start failed")))
}

fn stop_server(tools: &Tools, server: &mut PgServer) -> io::Result<()> {
    if !std::mem::take(&mut server.running) {
        return Ok(());
    }
    tools.run_as_server("pg_ctl", &["-D", path_str(&server.data)?, "-m", "immediate", "-w", "stop"]).map(drop)
}

fn path_str(p: &Path) -> io::Result<&str> {
    p.to_str().ok_or_else(|| io::Error::other(format!("path {p:?} is not UTF-8")))
}

fn append(path: &Path, text: &str) -> io::Result<()> {
    std::fs::OpenOptions::new().append(true).open(path)?.write_all(text.as_bytes())
}

fn checked(what: &str, out: Output) -> io::Result<String> {
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(io::Error::other(format!("{what} failed ({}): {stderr}", out.status)))
}

/// Where the PostgreSQL binaries are and whom to run the servers as.
#[derive(Debug, Clone)]
struct Tools {
    bindir: PathBuf,
    /// `Some((name, uid, gid))` when running as root.
    run_as: Option<(String, u32, u32)>,
}

impl Tools {
    fn find() -> io::Result<Tools> {
        let bindir = find_bindir().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "PostgreSQL binaries not found; set REFRACT_PG_BINDIR")
        })?;
        let run_as = if is_root() { Some(unprivileged_user()?) } else { None };
        Ok(Tools { bindir, run_as })
    }

    fn command(&self, tool: &str) -> Command {
        Command::new(self.bindir.join(tool))
    }

    /// Runs a server-side tool (initdb, pg_ctl, pg_basebackup) as the unprivileged user.
    fn run_as_server(&self, tool: &str, args: &[&str]) -> io::Result<String> {
        let mut cmd = match &self.run_as {
            Some((user, _, _)) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(self.bindir.join(tool));
                c
            }
            None => self.command(tool),
        };
        let out = cmd.args(args).env("PGPASSWORD", PASSWORD).current_dir("/").output()?;
        checked(tool, out)
    }

    /// Gives `path` to the unprivileged user.
    fn hand_over(&self, path: &Path) -> io::Result<()> {
        match &self.run_as {
            Some((_, uid, gid)) => std::os::unix::fs::chown(path, Some(*uid), Some(*gid)),
            None => Ok(()),
        }
    }
}

fn is_root() -> bool {
    // /proc/self belongs to the process's effective user; no libc call (and no unsafe) needed.
    std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

fn unprivileged_user() -> io::Result<(String, u32, u32)> {
    let name = std::env::var("REFRACT_PG_RUN_AS").unwrap_or_else(|_| "nobody".to_owned());
    let id = |flag: &str| -> io::Result<u32> {
        let out = checked("id", Command::new("id").args([flag, &name]).output()?)?;
        out.trim().parse().map_err(|_| io::Error::other(format!("id {flag} {name}: {out}")))
    };
    Ok((name.clone(), id("-u")?, id("-g")?))
}

fn find_bindir() -> Option<PathBuf> {
    let has_tools =
        |d: &Path| ["initdb", "pg_ctl", "postgres", "pg_basebackup", "psql"].iter().all(|t| d.join(t).exists());
    if let Some(d) = std::env::var_os("REFRACT_PG_BINDIR").map(PathBuf::from) {
        return Some(d);
    }
    let on_path = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|p| p.join("initdb")).find(|p| p.exists()));
    // /usr/local/bin/initdb is often a link into the real bindir, which also has pg_basebackup.
    let real = on_path.and_then(|p| std::fs::canonicalize(p).ok()).and_then(|p| p.parent().map(Path::to_path_buf));
    if let Some(d) = real.filter(|d| has_tools(d)) {
        return Some(d);
    }
    let mut versions: Vec<PathBuf> =
        std::fs::read_dir("/usr/lib/postgresql").ok()?.flatten().map(|e| e.path().join("bin")).collect();
    versions.sort_by_key(|p| {
        p.parent().and_then(|v| v.file_name()).and_then(|v| v.to_str()).and_then(|v| v.parse::<u32>().ok())
    });
    versions.into_iter().rev().find(|d| has_tools(d))
}
