//! Every example dispatcher configuration parses and validates.
#![allow(clippy::unwrap_used)]

use refract_dispatch::config;
use std::path::Path;

fn toml_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            toml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "toml")
            && !path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("agent-"))
        {
            // agent-*.toml configure `refract agent`; refract-agent's tests parse those.
            out.push(path);
        }
    }
}

#[test]
fn every_example_parses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut files = Vec::new();
    toml_files(&root, &mut files);
    assert!(files.iter().any(|f| f.ends_with("loopback.toml")), "{files:?}");
    for f in files {
        if let Err(e) = config::load(&f) {
            panic!("{e}");
        }
    }
}

#[test]
fn loopback_example_has_the_documented_addresses() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/loopback.toml");
    let cfg = config::load(&path).unwrap();
    let http = refract_front_http::config::HttpConfig::of(&cfg).listening.listen.map(|(_, a)| a.to_string());
    assert_eq!(http.as_deref(), Some("127.0.0.1:8080"));
    assert_eq!(cfg.listen.admin.map(|a| a.to_string()).as_deref(), Some("127.0.0.1:8081"));
    let b: Vec<_> = cfg.backend_list().iter().map(|b| format!("{} {:?} {}", b.name, b.role, b.addr)).collect();
    assert_eq!(b, ["b1 Primary 127.0.0.1:9001", "b2 Replica 127.0.0.1:9002", "b3 Replica 127.0.0.1:9003"]);
}
