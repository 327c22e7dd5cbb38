//! Bad configurations stop `refract dispatch` at once with a message naming the key, the
//! address or the line, and exit code 1: never a panic (134), never a half-started process.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::*;
use std::net::{SocketAddr, TcpListener};
use std::process::Command;

/// Runs `refract dispatch` on `text`; its exit code and stderr.
fn dispatch(text: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("refract.toml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(bin()).args(["dispatch", "--config", path.to_str().unwrap()]).output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn base(http: SocketAddr, admin: SocketAddr) -> String {
    let b = "[[backend]]\nname = \"b1\"\naddr = \"127.0.0.1:9\"\nrole = \"primary\"\n";
    format!("{b}[listen]\nhttp = \"{http}\"\nadmin = \"{admin}\"\n[admin]\ntoken = \"{TOKEN}\"\n")
}

fn addrs() -> (SocketAddr, SocketAddr) {
    (([127, 0, 0, 1], free_port()).into(), ([127, 0, 0, 1], free_port()).into())
}

#[test]
fn absurd_values_and_missing_backends_are_refused_with_their_line() {
    let (http, admin) = addrs();
    let listen = format!("[listen]\nhttp = \"{http}\"\nadmin = \"{admin}\"\n");
    let auth = format!("[admin]\ntoken = \"{TOKEN}\"\n");
    let b1 = "[[backend]]\nname = \"b1\"\naddr = \"127.0.0.1:9\"\nrole = \"primary\"\n";
    let b2 = "[[backend]]\nname = \"b2\"\naddr = \"127.0.0.1:9\"\nrole = \"replica\"\n";
    let cases = [
        (format!("{listen}workers = 100000\n{auth}{b1}"), "line 4: [listen] workers = 100000 is more than 1024"),
        (format!("{listen}{auth}{b1}[timeouts]\ndrain_ms = 0\n"), "line 11: [timeouts] drain_ms must be > 0"),
        (format!("{listen}{auth}"), "no [[backend]]"),
        (format!("{listen}{auth}{b1}{b2}"), "line 10: backend \"b2\" has the address 127.0.0.1:9 of backend \"b1\""),
        (format!("{listen}{auth}{b1}[overload]\nmax_queue = 99999999999\n"), "line 11: [overload] max_queue"),
        (format!("{listen}{b1}"), "[listen] admin 127.0.0.1:"),
    ];
    for (text, want) in cases {
        let (code, err) = dispatch(&text);
        assert_eq!(code, Some(1), "{text}\n{err}");
        assert!(err.contains(want), "want {want:?} in {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn listener_clashes_name_the_key_and_the_address() {
    let (http, _) = addrs();
    let (code, err) = dispatch(&base(http, http));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(&format!("[listen] admin {http} clashes with [listen] http")), "{err}");
    // Taken by someone else: found at bind time, named all the same.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap();
    let (http, admin) = addrs();
    for (text, key) in [(base(busy, admin), "[listen] http"), (base(http, busy), "[listen] admin")] {
        let (code, err) = dispatch(&text);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains(&format!("{key} {busy}: Address already in use")), "{err}");
    }
}

#[test]
fn deprecated_listener_keys_still_work_with_a_warning() {
    let (http, admin) = addrs();
    let d = dispatcher_logged(&format!("{}[health]\npath = \"/stats\"\n", base(http, admin)), http, admin);
    let log = log_once_listening(&d);
    assert!(log.contains("[listen] http is deprecated: write [http] listen instead"), "{log}");
    assert!(log.contains("[health] path is deprecated: write [http] health_path instead"), "{log}");
    let (http, admin) = addrs();
    let b = "[[backend]]\nname = \"b1\"\naddr = \"127.0.0.1:9\"\nrole = \"primary\"\n";
    let auth = format!("[admin]\ntoken = \"{TOKEN}\"\n");
    let text = format!("[http]\nlisten = \"{http}\"\n[listen]\nadmin = \"{admin}\"\n{auth}{b}");
    let log = log_once_listening(&dispatcher_logged(&text, http, admin));
    assert!(!log.contains("deprecated"), "{log}");
}

/// `d`'s log once it says it listens (the front ends have started by then).
fn log_once_listening(d: &Dispatcher) -> String {
    for _ in 0..200 {
        let log = d.log();
        if log.contains("dispatcher listening") {
            return log;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    panic!("never listening: {}", d.log());
}

#[test]
fn one_setting_in_both_spellings_is_refused() {
    let (http, admin) = addrs();
    let (code, err) = dispatch(&format!("[http]\nlisten = \"{http}\"\n{}", base(http, admin)));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("line 1: [http] listen and [listen] http are both set"), "{err}");
}
