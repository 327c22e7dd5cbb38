//! Running `pgbench` against one target and reading its summary: TPS (without connection
//! time), mean latency, transactions, failures, transactions per script, the first error.

use crate::support::{interrupt, sh};
use anyhow::{Context, Result};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What one pgbench run is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Load {
    /// `-c`.
    pub clients: usize,
    /// `-j`.
    pub jobs: usize,
    /// `-T`, whole seconds.
    pub seconds: u64,
    /// `-M simple|prepared`.
    pub mode: String,
    /// The workload: `["-S"]`, or `["-b", "select-only@8", "-b", "simple-update@2"]`.
    pub script: Vec<String>,
}

impl Load {
    /// `pgbench -S` in `mode`.
    pub fn select_only(clients: usize, jobs: usize, seconds: u64, mode: &str) -> Self {
        Load { clients, jobs, seconds, mode: mode.into(), script: vec!["-S".into()] }
    }

    /// 80 % `select-only`, 20 % `simple-update` (pgbench's built-in scripts), simple mode.
    pub fn read_write_mix(clients: usize, jobs: usize, seconds: u64) -> Self {
        let script = ["-b", "select-only@8", "-b", "simple-update@2"].map(String::from).to_vec();
        Load { clients, jobs, seconds, mode: "simple".into(), script }
    }

    /// The arguments after `pgbench`, for a server on 127.0.0.1:`port`.
    pub fn args(&self, port: u16) -> Vec<String> {
        let mut v: Vec<String> = vec!["-h".into(), "127.0.0.1".into(), "-p".into(), port.to_string()];
        v.extend(["-U", refract_pg::testkit::USER, "-n"].map(String::from));
        v.extend(self.script.iter().cloned());
        v.extend([
            "-c".into(),
            self.clients.to_string(),
            "-j".into(),
            self.jobs.to_string(),
            "-T".into(),
            self.seconds.to_string(),
            "-M".into(),
            self.mode.clone(),
        ]);
        v.push(refract_pg::testkit::DATABASE.into());
        v
    }

    /// The command line as a user would type it (for the report).
    pub fn shown(&self) -> String {
        let mut v = vec!["pgbench".to_string(), "-n".into()];
        v.extend(self.script.iter().cloned());
        v.push(format!("-c {} -j {} -T {} -M {}", self.clients, self.jobs, self.seconds, self.mode));
        v.join(" ")
    }
}

/// pgbench's summary of a completed run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// `tps = … (without initial connection time)`.
    pub tps: f64,
    /// `latency average = … ms`.
    pub latency_ms: f64,
    /// `number of transactions actually processed`.
    pub transactions: u64,
    /// `number of failed transactions` (PostgreSQL 15+; 0 when absent).
    pub failed: u64,
    /// `(script name, transactions)` per script, when there are several.
    pub scripts: Vec<(String, u64)>,
}

/// A run's outcome: the summary, or why there is none.
pub type Outcome = std::result::Result<Summary, String>;

/// Runs pgbench (`bin`) with `load` against 127.0.0.1:`port`; fails only when pgbench cannot
/// be started or Ctrl-C was pressed. A run pgbench itself reports as failed (an aborted client,
/// a refused connection) is an `Err` outcome carrying pgbench's first error.
pub fn run(bin: &Path, load: &Load, port: u16) -> Result<Outcome> {
    let mut c = Command::new(bin);
    c.args(load.args(port))
        .env("PGPASSWORD", refract_pg::testkit::PASSWORD)
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().with_context(|| format!("cannot run `{}`", sh::show(&c)))?;
    // Read both pipes on threads so that a chatty run cannot block on a full pipe.
    let out = child.stdout.take().map(reader);
    let err = child.stderr.take().map(reader);
    let deadline = Instant::now() + Duration::from_secs(load.seconds + 60);
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if interrupt::interrupted() || Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    interrupt::check()?;
    let text = |h: Option<std::thread::JoinHandle<String>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
    let (stdout, stderr) = (text(out), text(err));
    let Some(status) = status else {
        return Ok(Err(format!("pgbench did not finish within {} s", load.seconds + 60)));
    };
    Ok(outcome(status.success(), &stdout, &stderr))
}

fn reader(mut r: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// Reads pgbench's output: a summary if the run succeeded as a whole, else its first error.
pub fn outcome(success: bool, stdout: &str, stderr: &str) -> Outcome {
    let error = first_error(stderr);
    match (success, parse(stdout), error) {
        (true, Some(s), None) => Ok(s),
        (_, _, Some(e)) => Err(e),
        (true, None, None) => Err("pgbench printed no summary".into()),
        (false, _, None) => Err(stderr.lines().last().unwrap_or("pgbench failed").trim().to_string()),
    }
}

/// The summary lines of pgbench's stdout, if there is a TPS.
pub fn parse(stdout: &str) -> Option<Summary> {
    let mut s = Summary::default();
    let mut tps = None;
    let mut script: Option<String> = None;
    for line in stdout.lines() {
        let l = line.trim();
        if let Some(v) = l.strip_prefix("tps = ") {
            if l.contains("without initial connection time") {
                tps = first_number(v);
            }
        } else if let Some(v) = l.strip_prefix("latency average = ") {
            s.latency_ms = first_number(v).unwrap_or(0.0);
        } else if let Some(v) = l.strip_prefix("number of transactions actually processed:") {
            s.transactions = first_number(v).map(|n| n as u64).unwrap_or(0);
        } else if let Some(v) = l.strip_prefix("number of failed transactions:") {
            s.failed = first_number(v).map(|n| n as u64).unwrap_or(0);
        } else if let Some(rest) = l.strip_prefix("SQL script ") {
            script = rest.split_once(": ").map(|(_, name)| name.trim().to_string());
        } else if let (Some(v), Some(name)) = (l.strip_prefix("- "), script.as_ref()) {
            if v.contains("transactions") {
                s.scripts.push((name.clone(), first_number(v).map(|n| n as u64).unwrap_or(0)));
                script = None;
            }
        }
    }
    s.tps = tps?;
    Some(s)
}

/// The first number in `s` (`"0.990 ms"` → 0.99, `"64000/64000"` → 64000).
fn first_number(s: &str) -> Option<f64> {
    let t = s.trim_start();
    let end = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    t[..end].parse().ok()
}

/// pgbench's first `error:` line, without the client/script prefix (`client 3 script 0
/// aborted in command 1 query 0: `), so that identical errors of many clients read as one.
pub fn first_error(stderr: &str) -> Option<String> {
    let line = stderr.lines().find(|l| l.contains("error:") || l.contains("FATAL:"))?;
    let msg = line.split_once("error: ").map(|(_, m)| m).unwrap_or(line).trim();
    let msg = match msg.find(" query ").and_then(|i| msg[i..].find(": ").map(|j| i + j + 2)) {
        Some(i) if msg.starts_with("client ") => &msg[i..],
        _ => msg,
    };
    Some(msg.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = "pgbench (15.18 (Debian 15.18-0+deb12u1))
transaction type: <builtin: select only>
scaling factor: 10
query mode: simple
number of clients: 16
number of threads: 2
maximum number of tries: 1
duration: 4 s
number of transactions actually processed: 64000
number of failed transactions: 0 (0.000%)
latency average = 0.990 ms
initial connection time = 12.345 ms
tps = 16162.353781 (without initial connection time)
";

    const MIX: &str = "number of transactions actually processed: 24661
number of failed transactions: 0 (0.000%)
latency average = 2.553 ms
tps = 6267.007127 (without initial connection time)
SQL script 1: <builtin: select only>
 - weight: 8 (targets 80.0% of total)
 - 19728 transactions (80.0% of total, tps = 5012.386143)
 - number of failed transactions: 0 (0.000%)
SQL script 2: <builtin: simple update>
 - weight: 2 (targets 20.0% of total)
 - 4933 transactions (20.0% of total, tps = 1253.350610)
";

    #[test]
    fn summary() {
        let s = parse(OK).expect("summary");
        assert_eq!(s.tps, 16162.353781);
        assert_eq!(s.latency_ms, 0.99);
        assert_eq!(s.transactions, 64000);
        assert_eq!(s.failed, 0);
        assert!(s.scripts.is_empty());
        assert_eq!(outcome(true, OK, ""), Ok(s));
    }

    #[test]
    fn scripts() {
        let s = parse(MIX).expect("summary");
        assert_eq!(
            s.scripts,
            vec![("<builtin: select only>".into(), 19728), ("<builtin: simple update>".into(), 4933)]
        );
    }

    #[test]
    fn errors() {
        let stderr = "pgbench: error: ERROR:  prepared statement \"P_0\" already exists\n\
                      pgbench: error: client 14 script 0 aborted in command 1 query 0: ERROR:  prepared \
                      statement \"P_0\" does not exist\npgbench: error: Run was aborted; the above results \
                      are incomplete.\n";
        assert_eq!(outcome(false, OK, stderr), Err("ERROR:  prepared statement \"P_0\" already exists".into()));
        let aborted = "pgbench: error: client 3 script 0 aborted in command 1 query 0: ERROR:  boom\n";
        assert_eq!(first_error(aborted).as_deref(), Some("ERROR:  boom"));
        let refused = "pgbench: error: connection to server at \"127.0.0.1\", port 1 failed: Connection refused\n";
        assert!(outcome(false, "", refused).unwrap_err().contains("Connection refused"));
        assert_eq!(outcome(true, "nothing", ""), Err("pgbench printed no summary".into()));
    }

    #[test]
    fn arguments() {
        let l = Load::select_only(16, 2, 20, "prepared");
        assert_eq!(l.shown(), "pgbench -n -S -c 16 -j 2 -T 20 -M prepared");
        let a = l.args(6432).join(" ");
        assert_eq!(a, "-h 127.0.0.1 -p 6432 -U refract -n -S -c 16 -j 2 -T 20 -M prepared postgres");
        assert!(Load::read_write_mix(4, 1, 2).shown().contains("-b select-only@8 -b simple-update@2"));
    }
}
