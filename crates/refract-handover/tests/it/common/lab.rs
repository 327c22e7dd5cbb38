//! A four-namespace lab for hand-over tests: client c, dispatcher d (owns the VIP), agent a
//! (VIP on lo, ARP suppressed), all on a bridge in sw. Names `rf-ho<pid><tag>-*`, addresses in
//! 198.18.0.0/15. Deleted on drop (also when the test panics); leftovers of dead test
//! processes are removed on the next start.

use std::fs::File;
use std::process::Command;

pub const VIP: &str = "198.18.1.100";
pub const CLIENT_IP: &str = "198.18.1.1";
pub const C_MAC: [u8; 6] = [0x02, 0x52, 0x46, 0, 0, 0x01];
pub const D_MAC: [u8; 6] = [0x02, 0x52, 0x46, 0, 0, 0x02];
pub const A_MAC: [u8; 6] = [0x02, 0x52, 0x46, 0, 0, 0x03];

pub struct Lab {
    prefix: String,
}

fn sh(args: &[&str]) {
    let st = Command::new(args[0]).args(&args[1..]).status().expect("spawn");
    assert!(st.success(), "{args:?} failed");
}

pub fn mac(m: [u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// Deletes namespaces `rf-ho<pid>…` whose process is gone.
fn remove_stale() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else { return };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("rf-ho") else { continue };
        let pid: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        if !pid.is_empty() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", &name]).status();
        }
    }
}

impl Lab {
    /// Builds the lab; `tag` (one letter) keeps concurrent tests apart.
    pub fn up(tag: &str) -> Lab {
        remove_stale();
        let lab = Lab { prefix: format!("rf-ho{}{tag}", std::process::id()) };
        let sw = lab.ns("sw");
        sh(&["ip", "netns", "add", &sw]);
        sh(&["ip", "-n", &sw, "link", "add", "br0", "type", "bridge"]);
        sh(&["ip", "-n", &sw, "link", "set", "br0", "up"]);
        for (host, ip, m) in
            [("c", CLIENT_IP, Some(C_MAC)), ("d", "198.18.1.2", Some(D_MAC)), ("a", "198.18.1.3", Some(A_MAC))]
        {
            let ns = lab.ns(host);
            sh(&["ip", "netns", "add", &ns]);
            let port = format!("sw-{host}");
            sh(&["ip", "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns]);
            sh(&["ip", "-n", &sw, "link", "set", &port, "master", "br0", "up"]);
            if let Some(m) = m {
                sh(&["ip", "-n", &ns, "link", "set", "eth0", "address", &mac(m)]);
            }
            sh(&["ip", "-n", &ns, "addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
            sh(&["ip", "-n", &ns, "link", "set", "eth0", "up"]);
            sh(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        }
        sh(&["ip", "-n", &lab.ns("d"), "addr", "add", &format!("{VIP}/32"), "dev", "eth0"]);
        let a = lab.ns("a");
        for key in ["all.arp_ignore=1", "all.arp_announce=2", "eth0.arp_ignore=1", "eth0.arp_announce=2"] {
            sh(&["ip", "netns", "exec", &a, "sysctl", "-qw", &format!("net.ipv4.conf.{key}")]);
        }
        sh(&["ip", "-n", &a, "addr", "add", &format!("{VIP}/32"), "dev", "lo"]);
        lab
    }

    pub fn ns(&self, host: &str) -> String {
        format!("{}-{host}", self.prefix)
    }

    /// Runs `f` on a fresh thread (the caller's namespace never changes), which then moves
    /// between the lab's hosts with [`Lab::enter`].
    pub fn thread<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        std::thread::scope(|s| s.spawn(f).join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    }

    /// Moves the calling thread into host `host`'s namespace; sockets it creates stay there.
    pub fn enter(&self, host: &str) {
        let ns = File::open(format!("/run/netns/{}", self.ns(host))).expect("open netns");
        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
    }

    /// The bridge port (`sw-HOST`) on which the switch has learnt `m`, if any.
    pub fn fdb_port(&self, m: [u8; 6]) -> Option<String> {
        let out =
            Command::new("bridge").args(["-n", &self.ns("sw"), "fdb", "show", "br", "br0"]).output().expect("bridge");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let want = mac(m);
        text.lines()
            .filter(|l| l.starts_with(&want) && !l.contains("permanent"))
            .find_map(|l| l.split_whitespace().skip_while(|w| *w != "dev").nth(1).map(str::to_owned))
    }

    /// `tc filter show dev eth0 ingress` in host `host`.
    pub fn tc_filters(&self, host: &str) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns(host), "tc", "filter", "show", "dev", "eth0", "ingress"])
            .output()
            .expect("tc");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for host in ["c", "d", "a", "sw"] {
            let _ = Command::new("ip").args(["netns", "del", &self.ns(host)]).status();
        }
    }
}
