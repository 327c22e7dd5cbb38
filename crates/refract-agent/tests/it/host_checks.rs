//! Host checks in throw-away network namespaces: each wrong condition gives its message.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::process::Command;

use refract_agent::{check_host, Error, HostSpec, Problem};

const VIP: &str = "198.18.2.100";

fn root_or_skip(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    let _ = writeln!(std::io::stderr(), "SKIP {test}: needs root (builds network namespaces, attaches eBPF)");
    false
}

fn ip(args: &[&str]) {
    assert!(Command::new("ip").args(args).status().unwrap().success(), "ip {args:?}");
}

fn netns_ino(path: &str) -> u64 {
    std::fs::metadata(path).unwrap().ino()
}

/// Sets `net.ipv4.conf.IFACE.NAME`; refuses outside a test namespace.
fn sysctl(iface: &str, name: &str, value: u32) {
    assert_ne!(netns_ino("/proc/thread-self/ns/net"), netns_ino("/proc/self/ns/net"), "not in a test namespace");
    std::fs::write(format!("/proc/sys/net/ipv4/conf/{iface}/{name}"), value.to_string()).unwrap();
}

/// A ready host: lo up with the VIP, `eth0` (a veth whose peer stays in the namespace), ARP suppressed on `all` and `eth0`.
fn good_host() {
    ip(&["link", "set", "lo", "up"]);
    ip(&["link", "add", "eth0", "type", "veth", "peer", "name", "peer0"]);
    ip(&["link", "set", "eth0", "up"]);
    ip(&["link", "set", "peer0", "up"]);
    ip(&["addr", "add", "198.18.2.21/24", "dev", "eth0"]);
    ip(&["addr", "add", &format!("{VIP}/32"), "dev", "lo"]);
    for iface in ["all", "eth0"] {
        sysctl(iface, "arp_ignore", 1);
        sysctl(iface, "arp_announce", 2);
    }
}

/// Runs `f` on a fresh thread in a new anonymous network namespace holding a ready host, after
/// `spoil` broke it. The namespace dies with the thread, also when the test fails.
fn in_host<R: Send + 'static>(spoil: impl FnOnce() + Send + 'static, f: impl FnOnce() -> R + Send + 'static) -> R {
    std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        good_host();
        spoil();
        f()
    })
    .join()
    .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

fn spec(iface: &str) -> HostSpec {
    HostSpec { vip: VIP.parse().unwrap(), interface: iface.into(), map_capacity: 16 }
}

/// The problems `check_host` reports for a host broken by `spoil`.
fn problems(iface: &'static str, spoil: impl FnOnce() + Send + 'static) -> Vec<Problem> {
    in_host(spoil, move || match check_host(&spec(iface)) {
        Err(Error::Host(p)) => p,
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("the checks passed on a broken host"),
    })
}

fn one(mut p: Vec<Problem>) -> Problem {
    assert_eq!(p.len(), 1, "{p:?}");
    p.remove(0)
}

#[test]
fn a_ready_host_passes_and_gets_the_guard() {
    if !root_or_skip("a_ready_host_passes_and_gets_the_guard") {
        return;
    }
    in_host(
        || {},
        || {
            let guard = check_host(&spec("eth0")).unwrap();
            let out = Command::new("tc").args(["filter", "show", "dev", "eth0", "ingress"]).output().unwrap();
            assert!(String::from_utf8_lossy(&out.stdout).contains("refract_guard"));
            drop(guard);
            let out = Command::new("tc").args(["filter", "show", "dev", "eth0", "ingress"]).output().unwrap();
            assert!(!String::from_utf8_lossy(&out.stdout).contains("refract_guard"), "guard left behind");
        },
    );
}

#[test]
fn the_vip_missing_on_lo_is_named_with_its_fix() {
    if !root_or_skip("the_vip_missing_on_lo_is_named_with_its_fix") {
        return;
    }
    let p = one(problems("eth0", || ip(&["addr", "del", &format!("{VIP}/32"), "dev", "lo"])));
    assert!(p.what.contains("the VIP 198.18.2.100 is not on lo"), "{p}");
    assert_eq!(p.fix, "ip addr add 198.18.2.100/32 dev lo");
}

#[test]
fn arp_ignore_on_all_is_named_with_its_fix() {
    if !root_or_skip("arp_ignore_on_all_is_named_with_its_fix") {
        return;
    }
    let p = one(problems("eth0", || sysctl("all", "arp_ignore", 0)));
    assert!(p.what.starts_with("net.ipv4.conf.all.arp_ignore is 0, must be 1"), "{p}");
    assert_eq!(p.fix, "sysctl -w net.ipv4.conf.all.arp_ignore=1");
}

#[test]
fn arp_settings_on_the_interface_are_named_with_their_fixes() {
    if !root_or_skip("arp_settings_on_the_interface_are_named_with_their_fixes") {
        return;
    }
    let p = one(problems("eth0", || sysctl("eth0", "arp_announce", 0)));
    assert!(p.what.starts_with("net.ipv4.conf.eth0.arp_announce is 0, must be 2"), "{p}");
    assert_eq!(p.fix, "sysctl -w net.ipv4.conf.eth0.arp_announce=2");
    let p = one(problems("eth0", || sysctl("eth0", "arp_ignore", 0)));
    assert_eq!(p.fix, "sysctl -w net.ipv4.conf.eth0.arp_ignore=1");
    let p = one(problems("eth0", || sysctl("all", "arp_announce", 1)));
    assert!(p.what.starts_with("net.ipv4.conf.all.arp_announce is 1, must be 2"), "{p}");
}

#[test]
fn a_missing_interface_is_named() {
    if !root_or_skip("a_missing_interface_is_named") {
        return;
    }
    let p = one(problems("eth9", || {}));
    assert!(p.what.contains("interface eth9 does not exist"), "{p}");
    assert!(p.fix.contains("`interface`"), "{p}");
}

#[test]
fn every_problem_is_reported_at_once() {
    if !root_or_skip("every_problem_is_reported_at_once") {
        return;
    }
    let p = problems("eth0", || {
        ip(&["addr", "del", &format!("{VIP}/32"), "dev", "lo"]);
        sysctl("all", "arp_ignore", 0);
        sysctl("eth0", "arp_announce", 1);
    });
    assert_eq!(p.len(), 3, "{p:?}");
    let msg = Error::Host(p).to_string();
    assert!(msg.starts_with("this host is not ready for `refract agent`:"), "{msg}");
    assert!(msg.contains("fix: sysctl -w net.ipv4.conf.eth0.arp_announce=2"), "{msg}");
}

const PROBE_ENV: &str = "REFRACT_AGENT_GUARD_PROBE";

/// Without privileges the guard cannot attach: the check runs in a child process that has no
/// capabilities (setpriv), in a ready host's namespace (children inherit the thread's).
#[test]
fn a_guard_that_cannot_attach_is_named_with_its_fix() {
    if !root_or_skip("a_guard_that_cannot_attach_is_named_with_its_fix") {
        return;
    }
    let out = in_host(
        || {},
        || {
            let exe = std::env::current_exe().unwrap();
            Command::new("setpriv")
                .args(["--inh-caps=-all", "--bounding-set=-all", "--"])
                .arg(exe)
                .args(["--exact", "host_checks::guard_probe_child", "--nocapture", "--test-threads=1"])
                .env(PROBE_ENV, "1")
                .output()
                .unwrap()
        },
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("PROBE: cannot attach the guard to eth0's ingress"), "{text}");
    assert!(text.contains("fix: run the agent as root (or with CAP_BPF, CAP_NET_ADMIN"), "{text}");
    assert!(!text.contains("PROBE: problem"), "only the guard is wrong: {text}");
}

/// The child half of the test above; does nothing unless started by it.
#[test]
fn guard_probe_child() {
    if std::env::var_os(PROBE_ENV).is_none() {
        return;
    }
    match check_host(&spec("eth0")) {
        Err(Error::Host(p)) => {
            for x in p {
                let tag = if x.what.contains("guard") { "PROBE" } else { "PROBE: problem" };
                println!("{tag}: {x}");
            }
        }
        Err(e) => println!("PROBE: problem: unexpected {e}"),
        Ok(_) => println!("PROBE: problem: the guard attached without privileges"),
    }
}
