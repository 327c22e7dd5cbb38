//! Running external tools (`ip`, `tc`, `wrk`, `curl`, `haproxy`), optionally inside a namespace.

use anyhow::{bail, Context, Result};
use std::process::{Command, Output, Stdio};

/// A command, run in the root namespace or (with `ns`) via `ip netns exec NS`.
pub fn cmd(ns: Option<&str>, program: &str, args: &[&str]) -> Command {
    match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, program]).args(args);
            c
        }
        None => {
            let mut c = Command::new(program);
            c.args(args);
            c
        }
    }
}

/// A human-readable rendering of a command, for error messages.
pub fn show(c: &Command) -> String {
    let mut s = c.get_program().to_string_lossy().into_owned();
    for a in c.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Run and capture; fail with the command and its stderr when it exits non-zero.
pub fn run(mut c: Command) -> Result<String> {
    let out = output(&mut c)?;
    if !out.status.success() {
        bail!("`{}` failed ({}): {}", show(&c), out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Run and capture, whatever the exit status.
pub fn output(c: &mut Command) -> Result<Output> {
    c.stdin(Stdio::null()).output().with_context(|| format!("cannot run `{}`", show(c)))
}

/// Run; report only whether it succeeded (for probes and best-effort cleanup).
pub fn ok(mut c: Command) -> bool {
    output(&mut c).map(|o| o.status.success()).unwrap_or(false)
}

/// `ip ARGS…` in the root namespace.
pub fn ip(args: &[&str]) -> Result<String> {
    run(cmd(None, "ip", args))
}

/// Whether a program is on PATH (or an absolute path that exists).
pub fn have(program: &str) -> bool {
    if program.contains('/') {
        return std::path::Path::new(program).exists();
    }
    std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file())).unwrap_or(false)
}

/// Whether we run as root (effective uid 0).
pub fn is_root() -> bool {
    euid() == Some(0)
}

/// The effective uid, read from /proc so that no unsafe `geteuid` is needed.
pub fn euid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Send a signal with the `kill` tool (no unsafe libc call needed); best effort.
pub fn signal(pid: u32, sig: &str) {
    let _ = output(Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]));
}

/// Whether a process with this pid exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the parenthesised command name.
        Ok(stat) => stat.rsplit_once(')').map(|(_, rest)| !rest.trim_start().starts_with('Z')).unwrap_or(false),
        Err(_) => false,
    }
}

/// TERM, up to 2 s of grace, then KILL.
pub fn stop_pids(pids: &[u32]) {
    for pid in pids {
        signal(*pid, "TERM");
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while pids.iter().any(|p| alive(*p)) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for pid in pids.iter().filter(|p| alive(**p)) {
        signal(*pid, "KILL");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaced_command_shape() {
        let c = cmd(Some("rf-c1"), "wrk", &["-t1", "http://x/"]);
        assert_eq!(show(&c), "ip netns exec rf-c1 wrk -t1 http://x/");
        assert_eq!(show(&cmd(None, "tc", &["qdisc"])), "tc qdisc");
    }

    #[test]
    fn probes() {
        assert!(have("sh"));
        assert!(!have("definitely-not-a-program-rf"));
        assert!(alive(std::process::id()));
    }
}
