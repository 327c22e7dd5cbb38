//! The cluster of `bench pg-cache`, on loopback: a PostgreSQL primary and `n` streaming
//! replicas in a temporary directory on the data disk (not tmpfs: the page cache and the disk
//! are what is measured), each replica's postmaster started inside its own cgroup v1 memory
//! and blkio cgroups (`/sys/fs/cgroup/{memory,blkio}/rf-cache-replicaN/`), so every process it
//! forks, its page cache and its reads are charged there: `memory.limit_in_bytes` bounds what
//! the replica can cache, `blkio.throttle.read_iops_device` caps its reads on the disk (with
//! no cap, a limit of 10⁹ is set only so that the kernel counts the reads,
//! `blkio.throttle.io_serviced`). [`Cluster::load`] fills `rf_cache` on the primary in key
//! order, waits for the replicas, checkpoints, stops each replica and evicts its relation
//! files from the page cache one by one (`fdatasync`, `posix_fadvise(POSIX_FADV_DONTNEED)`),
//! then starts it again, cold. Dropping the cluster stops the servers, removes the cgroups
//! (once their processes have exited) and the directory.
//!
//! PostgreSQL refuses to run as root: as root, every server tool runs as the test kit's
//! unprivileged user (`nobody`, or `$REFRACT_PG_RUN_AS`) through `runuser`.

use super::{replica_name, PAD_CHARS, TABLE};
use crate::pglab::server::append;
use crate::support::{interrupt, sh};
use anyhow::{bail, Context, Result};
use refract_testkit::{self as testkit, DATABASE, PASSWORD, USER};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Where cgroup v1 hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The read limit set when reads are not capped: the kernel counts a cgroup's throttled
/// reads only where a rule exists, and 10⁹ IOPS never holds a read back.
pub const COUNT_ONLY_IOPS: u32 = 1_000_000_000;

/// Settings of every server (the replicas' come with the base backup). Throw-away data, so no
/// durability; `shared_buffers` small so that the page cache, bounded by the cgroup, is most
/// of a replica's cache; `track_io_timing` for the time spent reading.
pub const SETTINGS: &str = "
# refract bench pg-cache (lab/src/bench/pgcache/cluster.rs)
listen_addresses = '127.0.0.1'
shared_buffers = 32MB
max_connections = 100
fsync = off
synchronous_commit = off
full_page_writes = off
wal_level = replica
max_wal_size = 4GB
checkpoint_timeout = 30min
hot_standby_feedback = on
wal_receiver_status_interval = 1s
track_io_timing = on
log_min_messages = warning
";

/// How long loading, replaying and restarting may take at most.
const SLOW: Duration = Duration::from_secs(900);

/// A replica's memory and blkio cgroups (`rf-cache-NAME` in both hierarchies).
#[derive(Debug)]
pub struct Cgroup {
    /// `rf-cache-replica1`.
    pub name: String,
    removed: bool,
}

impl Cgroup {
    fn path(&self, controller: &str) -> PathBuf {
        Path::new(CGROUP_ROOT).join(controller).join(&self.name)
    }

    /// Creates both cgroups (a leftover empty one of an earlier run is removed first; one
    /// with processes is an error) and sets the memory limit.
    pub fn create(replica: &str, memory_limit: u64) -> Result<Cgroup> {
        let cg = Cgroup { name: format!("rf-cache-{replica}"), removed: false };
        for controller in ["memory", "blkio"] {
            let root = Path::new(CGROUP_ROOT).join(controller);
            if !root.join("cgroup.procs").exists() {
                bail!("no cgroup v1 {controller} hierarchy at {}", root.display());
            }
            let dir = cg.path(controller);
            if dir.exists() {
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                if !procs.trim().is_empty() {
                    bail!("{} exists and has processes ({}): another pg-cache run?", dir.display(), procs.trim());
                }
                std::fs::remove_dir(&dir).with_context(|| format!("removing the leftover {}", dir.display()))?;
            }
            std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let limit = cg.path("memory").join("memory.limit_in_bytes");
        std::fs::write(&limit, memory_limit.to_string()).with_context(|| format!("writing {}", limit.display()))?;
        Ok(cg)
    }

    /// The `cgroup.procs` files a process writes its pid into to join both.
    pub fn procs_files(&self) -> [PathBuf; 2] {
        [self.path("memory").join("cgroup.procs"), self.path("blkio").join("cgroup.procs")]
    }

    /// Caps reads on `device` (`MAJ:MIN`) at `iops`, or counts them only ([`COUNT_ONLY_IOPS`]).
    pub fn set_read_iops(&self, device: &str, iops: Option<u32>) -> Result<()> {
        let file = self.path("blkio").join("blkio.throttle.read_iops_device");
        let rule = format!("{device} {}", iops.unwrap_or(COUNT_ONLY_IOPS));
        std::fs::write(&file, &rule).with_context(|| format!("writing `{rule}` to {}", file.display()))
    }

    /// Reads on `device` so far: (IOs, bytes).
    pub fn reads(&self, device: &str) -> (u64, u64) {
        let read = |f: &str| std::fs::read_to_string(self.path("blkio").join(f)).unwrap_or_default();
        (
            blkio_reads(&read("blkio.throttle.io_serviced"), device),
            blkio_reads(&read("blkio.throttle.io_service_bytes"), device),
        )
    }

    /// Page cache charged to the memory cgroup now (`memory.stat` `cache`), bytes.
    pub fn cache_bytes(&self) -> u64 {
        let stat = std::fs::read_to_string(self.path("memory").join("memory.stat")).unwrap_or_default();
        stat_value(&stat, "cache").unwrap_or(0)
    }

    /// Whether `pid` is in both cgroups (`/proc/PID/cgroup`).
    pub fn holds(&self, pid: u32) -> bool {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let mine = format!("/{}", self.name);
        ["memory", "blkio"].iter().all(|c| {
            text.lines().any(|l| {
                let mut f = l.splitn(3, ':');
                let (_, ctrls, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
                ctrls.split(',').any(|x| x == *c) && path == mine
            })
        })
    }

    /// Removes both cgroups once their processes have exited (waits up to 10 s).
    pub fn remove(&mut self) -> Result<()> {
        if self.removed {
            return Ok(());
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for controller in ["memory", "blkio"] {
            let dir = self.path(controller);
            while dir.exists() {
                match std::fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if Instant::now() > deadline => {
                        return Err(e).with_context(|| format!("removing {}", dir.display()));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        }
        self.removed = true;
        Ok(())
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            eprintln!("    warning: {e:#}");
        }
    }
}

/// The `MAJ:MIN Read N` figure of a `blkio.throttle.io_serviced`-style file (0 if absent).
pub fn blkio_reads(text: &str, device: &str) -> u64 {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            (f.next()? == device && f.next()? == "Read").then(|| f.next()?.parse::<u64>().ok())?
        })
        .sum()
}

/// A `KEY VALUE` line's value in a `memory.stat`-style file.
pub fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// `MAJ:MIN` of a Linux `st_dev` (glibc's `gnu_dev_major`/`minor` encoding).
pub fn dev_name(dev: u64) -> String {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    format!("{major}:{minor}")
}

/// One server of the cluster.
#[derive(Debug)]
pub struct Server {
    /// `primary`, `replica1`, …
    pub name: String,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its data directory.
    pub data: PathBuf,
    log: PathBuf,
    /// Its cgroups (replicas only).
    pub cgroup: Option<Cgroup>,
    running: bool,
}

impl Server {
    /// The postmaster's pid, from `postmaster.pid`.
    pub fn pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.data.join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// The end of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

/// The installed PostgreSQL and whom its servers run as.
#[derive(Debug, Clone)]
struct Tools {
    bindir: PathBuf,
    run_as: Option<(String, u32, u32)>,
}

impl Tools {
    /// `tool ARGS` as the server user.
    fn server_cmd(&self, tool: &str, args: &[&str]) -> Command {
        let program = self.bindir.join(tool);
        let mut c = match &self.run_as {
            Some((user, _, _)) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(program);
                c
            }
            None => Command::new(program),
        };
        c.args(args).env("PGPASSWORD", PASSWORD).current_dir("/");
        c
    }

    fn give(&self, path: &Path) -> Result<()> {
        if let Some((_, uid, gid)) = &self.run_as {
            std::os::unix::fs::chown(path, Some(*uid), Some(*gid))
                .with_context(|| format!("chown {}", path.display()))?;
        }
        Ok(())
    }
}

/// The sizes of what was loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Loaded {
    /// `pg_relation_size` of the table, bytes.
    pub table: u64,
    /// `pg_indexes_size`, bytes.
    pub index: u64,
    /// Seconds from the first insert to the replicas restarted cold.
    pub secs: u64,
    /// Relation files evicted per replica.
    pub files: usize,
    /// Bytes of the replicas' relation files still in the page cache after the eviction
    /// (`fincore`; `None` without it).
    pub resident: Option<u64>,
}

/// The primary and its replicas.
#[derive(Debug)]
pub struct Cluster {
    /// The primary.
    pub primary: Server,
    /// The streaming replicas, each in its cgroups.
    pub replicas: Vec<Server>,
    /// The data disk, `MAJ:MIN` (254:0 for /dev/vda).
    pub device: String,
    tools: Tools,
    psql: PathBuf,
    // Last: removed after the servers are stopped.
    dir: tempfile::TempDir,
}

impl Cluster {
    /// initdb, the primary, `replicas` base backups, each replica started in its cgroups with
    /// `memory_limit` bytes.
    pub fn start(replicas: usize, memory_limit: u64) -> Result<Cluster> {
        let initdb = testkit::tool("initdb").context("finding PostgreSQL's binaries")?;
        let bindir = initdb.parent().context("initdb has no directory")?.to_path_buf();
        for t in ["initdb", "pg_ctl", "pg_basebackup", "postgres", "psql"] {
            if !bindir.join(t).exists() {
                bail!("{} is missing (PostgreSQL's server package)", bindir.join(t).display());
            }
        }
        let tools = Tools { bindir: bindir.clone(), run_as: crate::bench::pgbench::run::run_as()? };
        // On the data disk: /var/tmp is never tmpfs here (checked below through its device).
        let dir = tempfile::Builder::new().prefix("refract-pgcache-").tempdir_in("/var/tmp")?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        }
        tools.give(dir.path())?;
        let dev = std::fs::metadata(dir.path())?.dev();
        let device = dev_name(dev);
        if !Path::new(&format!("/sys/dev/block/{device}")).exists() {
            bail!(
                "{} is not on a block device ({device}): the page cache and disk reads would not be measured",
                dir.path().display()
            );
        }
        let base = dir.path().to_path_buf();
        let server = |name: &str| Server {
            name: name.to_string(),
            port: 0,
            data: base.join(name),
            log: base.join(format!("{name}.log")),
            cgroup: None,
            running: false,
        };
        let mut c =
            Cluster { primary: server("primary"), replicas: vec![], device, tools, psql: bindir.join("psql"), dir };
        c.init_primary()?;
        let mut primary = std::mem::replace(&mut c.primary, server("primary"));
        let started = c.start_server(&mut primary);
        c.primary = primary;
        started?;
        for i in 0..replicas {
            let name = replica_name(i);
            let mut r = server(&name);
            r.cgroup = Some(Cgroup::create(&name, memory_limit)?);
            c.base_backup(&r)?;
            let started = c.start_server(&mut r);
            c.replicas.push(r);
            started?;
        }
        Ok(c)
    }

    fn init_primary(&self) -> Result<()> {
        let pwfile = self.dir.path().join("pwfile");
        std::fs::write(&pwfile, PASSWORD)?;
        self.tools.give(&pwfile)?;
        let data = path_str(&self.primary.data)?;
        let pw = path_str(&pwfile)?;
        let args = ["-D", data, "-U", USER, "--auth=scram-sha-256", "--pwfile", pw, "-N", "-E", "UTF8", "--locale=C"];
        sh::run(self.tools.server_cmd("initdb", &args)).context("initdb")?;
        let _ = std::fs::remove_file(&pwfile);
        let conf = format!("{SETTINGS}unix_socket_directories = '{}'\n", path_str(self.dir.path())?);
        append(&self.primary.data.join("postgresql.conf"), &conf)
    }

    fn base_backup(&self, r: &Server) -> Result<()> {
        let port = self.primary.port.to_string();
        let data = path_str(&r.data)?;
        let args = ["-h", "127.0.0.1", "-p", &port, "-U", USER, "-D", data, "-R", "-X", "stream", "-c", "fast"];
        sh::run(self.tools.server_cmd("pg_basebackup", &args))
            .with_context(|| format!("pg_basebackup for {}", r.name))?;
        Ok(())
    }

    /// `pg_ctl start` on a free port; a replica's through `sh`, which first moves itself into
    /// the replica's cgroups, so the postmaster and everything it forks are charged there.
    fn start_server(&self, s: &mut Server) -> Result<()> {
        if s.port == 0 {
            s.port = crate::bench::pgbench::targets::free_port()?;
        }
        std::fs::File::create(&s.log).with_context(|| format!("creating {}", s.log.display()))?;
        self.tools.give(&s.log)?;
        let opts = format!("-p {}", s.port);
        let (data, log) = (path_str(&s.data)?, path_str(&s.log)?);
        let ctl = self.tools.server_cmd("pg_ctl", &["-D", data, "-l", log, "-w", "-t", "300", "-o", &opts, "start"]);
        let c = match &s.cgroup {
            Some(cg) => {
                let [mem, blkio] = cg.procs_files();
                let script = format!("echo $$ > {} && echo $$ > {} && exec \"$@\"", mem.display(), blkio.display());
                let mut c = Command::new("sh");
                c.arg("-c").arg(script).arg("sh").arg(ctl.get_program()).args(ctl.get_args());
                c.env("PGPASSWORD", PASSWORD).current_dir("/");
                c
            }
            None => ctl,
        };
        sh::run(c).with_context(|| format!("starting {}; its log:\n{}", s.name, s.log_tail()))?;
        s.running = true;
        if let Some(cg) = &s.cgroup {
            let pid = s.pid().with_context(|| format!("{} wrote no postmaster.pid", s.name))?;
            if !cg.holds(pid) {
                bail!("{}'s postmaster ({pid}) is not in {}", s.name, cg.name);
            }
        }
        Ok(())
    }

    fn stop_server(&self, s: &mut Server, mode: &str) -> Result<()> {
        if !std::mem::take(&mut s.running) {
            return Ok(());
        }
        let data = path_str(&s.data)?;
        sh::run(self.tools.server_cmd("pg_ctl", &["-D", data, "-m", mode, "-w", "-t", "120", "stop"]))
            .with_context(|| format!("stopping {}", s.name))
            .map(drop)
    }

    /// `psql -XAtq -c SQL` on the server on 127.0.0.1:`port`; trimmed output.
    pub fn psql(&self, port: u16, sql: &str) -> Result<String> {
        let mut c = Command::new(&self.psql);
        c.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", USER, "-d", DATABASE, "-XAtq"])
            .args(["-v", "ON_ERROR_STOP=1", "-c", sql])
            .env("PGPASSWORD", PASSWORD)
            .env("PGCONNECT_TIMEOUT", "10");
        Ok(sh::run(c)?.trim().to_string())
    }

    /// The replicas' ports, in order.
    pub fn replica_ports(&self) -> Vec<u16> {
        self.replicas.iter().map(|r| r.port).collect()
    }

    /// Fills `rf_cache` with `rows` rows in key order on the primary, waits until every
    /// replica replayed it, checkpoints, and restarts every replica with its relation files
    /// evicted from the page cache. `say` reports progress.
    pub fn load(&mut self, rows: u64, say: &dyn Fn(&str)) -> Result<Loaded> {
        let started = Instant::now();
        let p = self.primary.port;
        say(&format!("loading {rows} rows into {TABLE} on the primary, in key order"));
        self.psql(
            p,
            &format!("DROP TABLE IF EXISTS {TABLE}; CREATE TABLE {TABLE} (id bigint NOT NULL, pad text NOT NULL)"),
        )?;
        self.psql(
            p,
            &format!(
                "INSERT INTO {TABLE} SELECT g, left(repeat(md5(g::text), {}), {PAD_CHARS}) \
                 FROM generate_series(1, {rows}) AS g ORDER BY g",
                PAD_CHARS / 32 + 1
            ),
        )?;
        interrupt::check()?;
        say("primary key; VACUUM (FREEZE, ANALYZE), so no replica sets hint bits while it is read");
        self.psql(p, &format!("ALTER TABLE {TABLE} ADD PRIMARY KEY (id)"))?;
        self.psql(p, &format!("VACUUM (FREEZE, ANALYZE) {TABLE}"))?;
        self.psql(p, "CHECKPOINT")?;
        let table: u64 = self.psql(p, &format!("SELECT pg_relation_size('{TABLE}')"))?.parse().unwrap_or(0);
        let index: u64 = self.psql(p, &format!("SELECT pg_indexes_size('{TABLE}')"))?.parse().unwrap_or(0);
        say("waiting for the replicas to replay it");
        self.wait_replicated()?;
        let mut loaded = Loaded { table, index, ..Loaded::default() };
        let mut resident = Some(0);
        for i in 0..self.replicas.len() {
            interrupt::check()?;
            let port = self.replicas[i].port;
            // A restartpoint, then a clean stop: what the replica replayed is on disk.
            self.psql(port, "CHECKPOINT")?;
            let mut r = std::mem::replace(&mut self.replicas[i], placeholder());
            let cycled = (|| -> Result<(usize, Option<u64>)> {
                self.stop_server(&mut r, "fast")?;
                let files = evict(&r.data.join("base"))?;
                let res = resident_bytes(&r.data.join("base"));
                self.start_server(&mut r)?;
                Ok((files, res))
            })();
            self.replicas[i] = r;
            let (files, res) = cycled?;
            loaded.files = files;
            resident = resident.zip(res).map(|(a, b)| a + b);
        }
        loaded.resident = resident;
        self.wait_replicated()?;
        for r in &self.replicas {
            let n: u64 = self
                .psql(r.port, &format!("SELECT count(*) FROM pg_class WHERE relname = '{TABLE}'"))?
                .parse()
                .unwrap_or(0);
            if n != 1 {
                bail!("{} has no {TABLE} after its restart", r.name);
            }
        }
        loaded.secs = started.elapsed().as_secs();
        Ok(loaded)
    }

    /// Until every replica has replayed what the primary has written so far.
    pub fn wait_replicated(&self) -> Result<()> {
        let lsn = self.psql(self.primary.port, "SELECT pg_current_wal_insert_lsn()")?;
        let sql = format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn");
        let deadline = Instant::now() + SLOW;
        for r in &self.replicas {
            while self.psql(r.port, &sql).ok().as_deref() != Some("t") {
                interrupt::check()?;
                if Instant::now() > deadline {
                    bail!("{} did not replay up to {lsn} within {SLOW:?}; its log:\n{}", r.name, r.log_tail());
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Ok(())
    }

    /// Sets every replica's read cap on the data disk (`None`: counted only).
    pub fn set_read_iops(&self, iops: Option<u32>) -> Result<()> {
        self.replicas.iter().filter_map(|r| r.cgroup.as_ref()).try_for_each(|cg| cg.set_read_iops(&self.device, iops))
    }

    /// Every replica's counters now.
    pub fn counters(&self) -> Result<Vec<Counters>> {
        let sql = "SELECT blks_hit, blks_read, xact_commit, blk_read_time::bigint FROM pg_stat_database \
                   WHERE datname = current_database()";
        self.replicas
            .iter()
            .map(|r| {
                let line = self.psql(r.port, sql).with_context(|| format!("pg_stat_database of {}", r.name))?;
                let f: Vec<u64> = line.split('|').map(|x| x.trim().parse().unwrap_or(0)).collect();
                let (ios, bytes) = r.cgroup.as_ref().map_or((0, 0), |cg| cg.reads(&self.device));
                let cache = r.cgroup.as_ref().map_or(0, Cgroup::cache_bytes);
                Ok(Counters {
                    hit: f.first().copied().unwrap_or(0),
                    read: f.get(1).copied().unwrap_or(0),
                    xact: f.get(2).copied().unwrap_or(0),
                    read_ms: f.get(3).copied().unwrap_or(0),
                    dev_reads: ios,
                    dev_bytes: bytes,
                    cache_bytes: cache,
                })
            })
            .collect()
    }

    /// Stops every server (replicas first), then removes the cgroups and the directory.
    pub fn shutdown(&mut self) {
        let mut replicas = std::mem::take(&mut self.replicas);
        for r in &mut replicas {
            if let Err(e) = self.stop_server(r, "immediate") {
                eprintln!("    warning: {e:#}");
            }
        }
        let mut primary = std::mem::replace(&mut self.primary, placeholder());
        if let Err(e) = self.stop_server(&mut primary, "immediate") {
            eprintln!("    warning: {e:#}");
        }
        // Dropping each replica removes its cgroups (they are empty once the servers stopped).
        drop(replicas);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn placeholder() -> Server {
    Server { name: String::new(), port: 0, data: PathBuf::new(), log: PathBuf::new(), cgroup: None, running: false }
}

/// One replica's cumulative counters: `pg_stat_database` (its database), its cgroups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// `blks_hit`: pages found in shared buffers.
    pub hit: u64,
    /// `blks_read`: pages PostgreSQL read from the kernel (page cache or disk).
    pub read: u64,
    /// `xact_commit`: transactions (each pgbench query is one).
    pub xact: u64,
    /// `blk_read_time`, ms.
    pub read_ms: u64,
    /// Reads its cgroup issued to the data disk (`blkio.throttle.io_serviced`).
    pub dev_reads: u64,
    /// Bytes of those reads.
    pub dev_bytes: u64,
    /// Page cache charged to its memory cgroup at the time (not a counter).
    pub cache_bytes: u64,
}

impl Counters {
    /// What happened between `before` and `self` (the cache as of `self`).
    pub fn since(&self, before: &Counters) -> Counters {
        Counters {
            hit: self.hit.saturating_sub(before.hit),
            read: self.read.saturating_sub(before.read),
            xact: self.xact.saturating_sub(before.xact),
            read_ms: self.read_ms.saturating_sub(before.read_ms),
            dev_reads: self.dev_reads.saturating_sub(before.dev_reads),
            dev_bytes: self.dev_bytes.saturating_sub(before.dev_bytes),
            cache_bytes: self.cache_bytes,
        }
    }
}

/// Evicts every file under `dir` from the page cache: `fdatasync` (dirty pages are not
/// dropped), then `posix_fadvise(POSIX_FADV_DONTNEED)` over the whole file. The number of
/// files.
pub fn evict(dir: &Path) -> Result<usize> {
    use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
    let mut n = 0;
    for path in files_under(dir)? {
        let f = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        f.sync_data().with_context(|| format!("fdatasync {}", path.display()))?;
        posix_fadvise(&f, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED)
            .with_context(|| format!("posix_fadvise {}", path.display()))?;
        n += 1;
    }
    Ok(n)
}

/// Bytes of the files under `dir` in the page cache (`fincore`), if it can tell.
pub fn resident_bytes(dir: &Path) -> Option<u64> {
    let files = files_under(dir).ok()?;
    if files.is_empty() || !sh::have("fincore") {
        return None;
    }
    let mut c = Command::new("fincore");
    c.args(["--bytes", "--noheadings", "--raw", "--output", "RES"]).args(&files);
    let out = sh::run(c).ok()?;
    Some(out.lines().filter_map(|l| l.trim().parse::<u64>().ok()).sum())
}

fn files_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                out.push(e.path());
            }
        }
    }
    out.sort();
    Ok(out)
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str().with_context(|| format!("path {} is not UTF-8", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blkio_and_memory_stat_files() {
        let serviced = "254:0 Read 291\n254:0 Write 7\n254:0 Sync 291\n253:0 Read 5\nTotal 303\n";
        assert_eq!(blkio_reads(serviced, "254:0"), 291);
        assert_eq!(blkio_reads(serviced, "8:0"), 0);
        assert_eq!(blkio_reads("", "254:0"), 0);
        let stat = "cache 67108864\nrss 1024\ntotal_cache 9\n";
        assert_eq!((stat_value(stat, "cache"), stat_value(stat, "total_cache")), (Some(67108864), Some(9)));
        assert_eq!(stat_value(stat, "mapped_file"), None);
    }

    #[test]
    fn device_numbers() {
        assert_eq!(dev_name(0xfe00), "254:0");
        assert_eq!(dev_name(0x0801), "8:1");
        assert_eq!(dev_name((259 << 8) | 3), "259:3");
    }

    #[test]
    fn deltas_keep_the_last_cache_figure() {
        let a = Counters { hit: 10, read: 5, xact: 3, read_ms: 1, dev_reads: 4, dev_bytes: 4096, cache_bytes: 7 };
        let b = Counters { hit: 30, read: 9, xact: 13, read_ms: 2, dev_reads: 6, dev_bytes: 8192, cache_bytes: 9 };
        let d = b.since(&a);
        assert_eq!(
            (d.hit, d.read, d.xact, d.read_ms, d.dev_reads, d.dev_bytes, d.cache_bytes),
            (20, 4, 10, 1, 2, 4096, 9)
        );
    }

    #[test]
    fn eviction_walks_every_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("5")).expect("mkdir");
        std::fs::write(dir.path().join("5/16384"), vec![7u8; 65536]).expect("write");
        std::fs::write(dir.path().join("PG_VERSION"), "15").expect("write");
        assert_eq!(evict(dir.path()).expect("evict"), 2);
    }
}
