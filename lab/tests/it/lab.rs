//! The lab itself (root only): up, reachability inside the namespaces, exec, repair after a
//! partial failure, shaping, down leaving no `rf-*` namespace.

use refract_lab::fabric::{self, congestion};
use refract_lab::support::sh::{self, cmd};
use refract_lab::support::units::Rate;

/// Tears the lab down however the test ends.
struct Down;

impl Drop for Down {
    fn drop(&mut self) {
        if let Err(e) = fabric::down() {
            eprintln!("cleanup failed: {e:#}");
        }
    }
}

/// Say why the test is skipped, past the harness's output capture (a skip must be seen).
fn skip(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "skipped: {why}");
}

/// Why the test cannot run here, if it cannot.
fn skip_reason() -> Option<String> {
    if !sh::is_root() {
        return Some("not root (network namespaces need CAP_NET_ADMIN)".into());
    }
    if !sh::have("ip") || !sh::have("tc") {
        return Some("iproute2 (ip, tc) is not installed".into());
    }
    match fabric::lab_namespaces() {
        Ok(ns) if !ns.is_empty() => Some(format!("a lab is up ({}); not touching it", ns.join(" "))),
        Ok(_) => None,
        Err(e) => Some(format!("`ip netns list` failed: {e:#}")),
    }
}

/// c1 reaches `addr`: ICMP when ping is installed, else a TCP connect (bash's /dev/tcp) to a
/// closed port, which the host answers with a reset: "Connection refused" proves the path.
fn reachable(addr: &str) -> bool {
    if sh::have("ping") {
        return sh::ok(cmd(Some("rf-c1"), "ping", &["-c1", "-W2", addr]));
    }
    let script = format!("exec 3<>/dev/tcp/{addr}/9");
    let mut c = cmd(Some("rf-c1"), "timeout", &["3", "bash", "-c", &script]);
    let out = sh::output(&mut c).expect("run bash");
    String::from_utf8_lossy(&out.stderr).contains("Connection refused")
}

fn qdisc(ns: &str, dev: &str) -> String {
    sh::run(cmd(Some(ns), "tc", &["qdisc", "show", "dev", dev])).expect("tc qdisc show")
}

/// Puts the host's allowed congestion controls back as the test found them.
struct RestoreAllowed(String);

impl Drop for RestoreAllowed {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(congestion::ALLOWED, &self.0) {
            eprintln!("restoring {}: {e}", congestion::ALLOWED);
        }
    }
}

fn allowed() -> String {
    std::fs::read_to_string(congestion::ALLOWED).expect("read allowed list").trim().to_string()
}

fn kernel_has(cc: &str) -> bool {
    let available = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control").unwrap_or_default();
    available.split_whitespace().any(|a| a == cc)
}

/// The lab on a host that allows only `reno bbr` (a fresh cloud machine): it comes up with
/// `cubic` in every namespace by allowing it for its lifetime, and `lab down` puts the host's
/// list back; asked for the host's own default, it changes nothing on the host.
#[test]
fn lab_up_exec_repair_down() {
    let _lab = crate::common::lab_lock();
    if let Some(why) = skip_reason() {
        skip(&why);
        return;
    }
    let _restore = RestoreAllowed(allowed());
    std::fs::write(congestion::ALLOWED, "reno bbr").expect("set the allowed list to `reno bbr`");
    let host_default = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").expect("default");
    let host_default = host_default.trim();
    let _down = Down;
    let gbit = Rate::parse("1gbit").expect("rate");
    assert!(fabric::up_with(gbit, "cubic").expect("lab up"), "first up builds");
    assert!(fabric::is_complete());
    let expected = if kernel_has("cubic") { "cubic" } else { host_default };
    for ns in ["rf-c1", "rf-c2", "rf-d", "rf-b1", "rf-b2"] {
        assert_eq!(congestion::in_namespace(ns).as_deref(), Some(expected), "congestion control in {ns}");
    }
    if expected == "cubic" {
        assert_eq!(allowed(), "reno bbr cubic", "cubic allowed while the lab is up");
    }
    assert!(congestion::describe().contains(expected), "report header: {}", congestion::describe());
    assert!(!fabric::up(gbit).expect("second up"), "second up keeps the lab");

    for addr in ["198.18.0.100", "198.18.0.21", "198.18.0.2", "198.18.0.22"] {
        assert!(reachable(addr), "c1 cannot reach {addr}");
    }
    let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(fabric::exec("c1", &args(&["sh", "-c", "exit 3"])).expect("exec"), 3);
    assert_eq!(fabric::exec("rf-b1", &args(&["ip", "-o", "addr", "show", "dev", "eth0"])).expect("exec"), 0);
    assert!(fabric::exec("x9", &args(&["true"])).is_err(), "unknown host");

    assert!(qdisc("rf-d", "eth0").contains("tbf"), "host end shaped");
    assert!(qdisc("rf-sw", "p-d").contains("tbf"), "switch end shaped");
    fabric::shape(Rate::Unlimited).expect("unshape");
    assert!(!qdisc("rf-d", "eth0").contains("tbf"));

    sh::ip(&["netns", "del", "rf-b2"]).expect("break the lab");
    assert!(!fabric::is_complete());
    assert!(fabric::up(gbit).expect("repair"), "a partial lab is rebuilt");
    assert!(fabric::is_complete());
    assert!(reachable("198.18.0.22"), "b2 back after repair");

    fabric::down().expect("lab down");
    assert_eq!(fabric::lab_namespaces().expect("list"), Vec::<String>::new());
    assert_eq!(allowed(), "reno bbr", "lab down restores the host's allowed list");

    // The host's default needs no change on the host.
    assert!(fabric::up_with(gbit, host_default).expect("lab up with the host default"));
    assert_eq!(congestion::in_namespace("rf-d").as_deref(), Some(host_default));
    assert_eq!(allowed(), "reno bbr", "nothing allowed for the host default");
    fabric::down().expect("lab down");
    assert_eq!(allowed(), "reno bbr");
}
