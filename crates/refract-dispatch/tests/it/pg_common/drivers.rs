//! What the driver suites (`pg_drivers`, `pg_sharded_drivers`) share: where the suites and the
//! venv are, the switches in the environment, and running a suite's process with a time limit.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The repository (two levels above this crate).
pub fn repo() -> PathBuf {
    let krate = Path::new(env!("CARGO_MANIFEST_DIR"));
    krate.ancestors().nth(2).unwrap_or(krate).to_path_buf()
}

/// The driver suites (`tests/drivers`).
pub fn drivers_dir() -> PathBuf {
    repo().join("tests/drivers")
}

/// Where build outputs live: `$CARGO_TARGET_DIR`, else the repository's `target/`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| repo().join("target"))
}

/// Whether the environment variable `name` is `value`.
pub fn flag(name: &str, value: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == value)
}

/// The venv's interpreter.
pub fn python() -> PathBuf {
    let venv = std::env::var_os("REFRACT_PYENV").map(PathBuf::from).unwrap_or_else(|| target_dir().join("pyenv"));
    venv.join("bin/python")
}

/// What a suite's process did.
pub struct Ran {
    /// Its exit status; `None` when it was killed at the time limit.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` in [`drivers_dir`] (no stdin), killing it after `limit`; prints its output with
/// the time it took.
pub fn run(driver: &str, mut cmd: Command, limit: Duration) -> Ran {
    let started = Instant::now();
    let mut child = cmd
        .current_dir(drivers_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{driver}: cannot start {cmd:?}: {e}"));
    let out = drain(child.stdout.take().unwrap());
    let err = drain(child.stderr.take().unwrap());
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (stdout, stderr) = (out.join().unwrap(), err.join().unwrap());
    println!("{driver} suite ({:.1} s):\n{stdout}", started.elapsed().as_secs_f64());
    Ran { status, stdout, stderr }
}

/// Reads a child's pipe to the end on a thread.
pub fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}
