//! The lab's PostgreSQL servers, from the installed PostgreSQL (the binaries the refract-pg test
//! kit finds): `initdb` of the primary with SCRAM, its settings and `pg_hba.conf`, the replica
//! by `pg_basebackup -R` from the primary over the lab network, `pg_ctl start` inside each
//! host's namespace (the server listens on the host's own address) and `pg_ctl stop -m fast`.
//!
//! PostgreSQL refuses to run as root, so, as the test kit and `bench pgbench` do, every server
//! tool runs as an unprivileged user (`nobody`, or `$REFRACT_PG_RUN_AS`) through `runuser`, and
//! the servers' directories and logs are handed to that user.

use crate::fabric::topology::{B1, PREFIX};
use crate::pglab::layout::{pg_dir, Server, PG_PORT};
use crate::support::{sh, state};
use anyhow::{Context, Result};
use refract_testkit::{self as testkit, PASSWORD, USER};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Settings for the lab's servers (appended to the primary's `postgresql.conf`, which the
/// replica's base backup copies). The data is thrown away by `lab down`, so no durability.
const SETTINGS: &str = "
# refract lab (lab/src/pglab/server.rs); listen_addresses, port and
# unix_socket_directories are given to each server by pg_ctl -o (they differ per host).
max_connections = 200
shared_buffers = 128MB
fsync = off
synchronous_commit = off
full_page_writes = off
wal_receiver_status_interval = 1s
hot_standby_feedback = on
log_min_messages = warning
";

/// The installed PostgreSQL and the user its servers run as.
#[derive(Debug, Clone)]
pub struct Pg {
    bindir: PathBuf,
    /// `(name, uid, gid)` when root (always, in the lab).
    run_as: Option<(String, u32, u32)>,
}

impl Pg {
    /// Find the binaries (as the test kit does) and the unprivileged user.
    pub fn find() -> Result<Self> {
        let initdb = testkit::tool("initdb").context("finding PostgreSQL's binaries")?;
        let bindir = initdb.parent().context("initdb has no directory")?.to_path_buf();
        if !initdb.exists() {
            anyhow::bail!("PostgreSQL is not installed: no {} (set REFRACT_PG_BINDIR)", initdb.display());
        }
        Ok(Pg { bindir, run_as: crate::bench::pgbench::run::run_as()? })
    }

    /// The user servers run as (for PgBouncer's `-u` too), if root.
    pub fn user(&self) -> Option<&str> {
        self.run_as.as_ref().map(|(u, _, _)| u.as_str())
    }

    /// A PostgreSQL program (psql, pgbench, ...) of this installation.
    pub fn tool(&self, name: &str) -> PathBuf {
        self.bindir.join(name)
    }

    /// `tool ARGS` as the server user, in namespace `ns` (or the root namespace).
    fn cmd(&self, ns: Option<&str>, tool: &str, args: &[&str]) -> Command {
        let program = self.tool(tool).to_string_lossy().into_owned();
        let mut argv: Vec<&str> = Vec::new();
        if let Some(user) = self.user() {
            argv.extend(["-u", user, "--"]);
        }
        argv.push(&program);
        argv.extend_from_slice(args);
        let mut c = match self.user() {
            Some(_) => sh::cmd(ns, "runuser", &argv),
            None => sh::cmd(ns, &program, args),
        };
        // The user may not enter our working directory; the servers' own files are absolute.
        c.current_dir("/").env("PGPASSWORD", PASSWORD);
        c
    }

    /// Give `path` to the server user.
    pub fn give(&self, path: &Path) -> Result<()> {
        if let Some((_, uid, gid)) = &self.run_as {
            std::os::unix::fs::chown(path, Some(*uid), Some(*gid))
                .with_context(|| format!("chown {}", path.display()))?;
        }
        Ok(())
    }

    /// A directory (created if missing) the server user owns.
    pub fn owned_dir(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        self.give(dir)
    }

    /// `initdb` the primary (user `refract`, password `refract` as a SCRAM verifier), then its
    /// settings and `pg_hba.conf`.
    pub fn init_primary(&self, s: &Server) -> Result<()> {
        self.owned_dir(&s.dir())?;
        let pwfile = pg_dir().join("pwfile");
        std::fs::write(&pwfile, PASSWORD)?;
        self.give(&pwfile)?;
        let (data, pw) = (path_str(&s.data())?, path_str(&pwfile)?);
        let args = ["-D", &data, "-U", USER, "--auth=scram-sha-256", "--pwfile", &pw, "-N", "-E", "UTF8", "--locale=C"];
        let made = sh::run(self.cmd(None, "initdb", &args));
        let _ = std::fs::remove_file(&pwfile);
        made.with_context(|| format!("initdb for {}", s.name()))?;
        append(&s.data().join("postgresql.conf"), SETTINGS)?;
        std::fs::write(s.data().join("pg_hba.conf"), hba())?;
        Ok(())
    }

    /// The replica `s`: a base backup of `primary` over the lab network, taken from `s`'s
    /// namespace, with `-R` (standby.signal and `primary_conninfo`).
    pub fn base_backup(&self, s: &Server, primary: &Server) -> Result<()> {
        self.owned_dir(&s.dir())?;
        let data = path_str(&s.data())?;
        let port = PG_PORT.to_string();
        let args = ["-h", primary.host.addr, "-p", &port, "-U", USER, "-D", &data, "-R", "-X", "stream", "-c", "fast"];
        sh::run(self.cmd(Some(&s.host.ns()), "pg_basebackup", &args))
            .with_context(|| format!("pg_basebackup of {} for {}", primary.name(), s.name()))
            .map(drop)
    }

    /// Start a server in its host's namespace, on its host's address, port 5432; its log is
    /// `STATE/pg-HOST.log` (kept after `lab down`, like every log of the lab).
    pub fn start(&self, s: &Server) -> Result<()> {
        let log = log_path(s);
        std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        self.give(&log)?;
        let opts = format!(
            "-c listen_addresses={} -p {PG_PORT} -c unix_socket_directories={}",
            s.host.addr,
            path_str(&s.dir())?
        );
        let (data, log) = (path_str(&s.data())?, path_str(&log)?);
        let args = ["-D", &data, "-l", &log, "-w", "-t", "60", "-o", &opts, "start"];
        sh::run(self.cmd(Some(&s.host.ns()), "pg_ctl", &args))
            .with_context(|| format!("starting {}; its log:\n{}", s.name(), state::log_tail(&log_name(s), 20)))
            .map(drop)
    }

    /// `pg_ctl stop -m fast`; whether a server was running.
    pub fn stop(&self, s: &Server) -> bool {
        if pid(s).is_none() {
            return false;
        }
        let Ok(data) = path_str(&s.data()) else { return false };
        sh::ok(self.cmd(None, "pg_ctl", &["-D", &data, "-m", "fast", "-w", "-t", "30", "stop"]))
    }
}

/// `pg_hba.conf`: SCRAM for everything (local, the lab subnet, replication from it).
pub fn hba() -> String {
    let subnet = lab_subnet();
    format!(
        "# refract lab (lab/src/pglab/server.rs): SCRAM only.\n\
         local all all scram-sha-256\n\
         host all all {subnet} scram-sha-256\n\
         host replication all {subnet} scram-sha-256\n"
    )
}

/// The lab subnet, `198.18.0.0/24`, from the topology.
pub fn lab_subnet() -> String {
    let ip: Ipv4Addr = B1.addr.parse().unwrap_or(Ipv4Addr::UNSPECIFIED);
    let mask = u32::MAX.checked_shl(32 - u32::from(PREFIX)).unwrap_or(0);
    format!("{}/{PREFIX}", Ipv4Addr::from(u32::from(ip) & mask))
}

/// The postmaster's pid, from `postmaster.pid`, if it runs.
pub fn pid(s: &Server) -> Option<u32> {
    let text = std::fs::read_to_string(s.data().join("postmaster.pid")).ok()?;
    let pid: u32 = text.lines().next()?.trim().parse().ok()?;
    sh::alive(pid).then_some(pid)
}

/// The server's log name in the state directory: `pg-b1.log`.
pub fn log_name(s: &Server) -> String {
    format!("{}.log", s.name())
}

fn log_path(s: &Server) -> PathBuf {
    state::path(&log_name(s))
}

fn path_str(p: &Path) -> Result<String> {
    p.to_str().map(str::to_string).with_context(|| format!("path {} is not UTF-8", p.display()))
}

/// Appends `text` to the file at `path` (a server's `postgresql.conf`).
pub(crate) fn append(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(path).with_context(|| format!("{}", path.display()))?;
    f.write_all(text.as_bytes()).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scram_for_the_lab_subnet_and_replication() {
        assert_eq!(lab_subnet(), "198.18.0.0/24");
        let h = hba();
        assert!(h.contains("host replication all 198.18.0.0/24 scram-sha-256\n"), "{h}");
        assert!(h.lines().filter(|l| !l.starts_with('#')).all(|l| l.ends_with("scram-sha-256")), "{h}");
    }
}
