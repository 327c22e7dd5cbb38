//! Replays every seed (`corpus/<target>/`) and every saved crash (`regressions/<target>/`)
//! through its target, so `make test` keeps them passing without cargo-afl (docs/fuzzing.md).

use std::path::{Path, PathBuf};

use refract_fuzz::targets::{ALL, PEER_KEY, PEER_NOW_MS};

/// The files in `dir` (none if it does not exist), sorted so failures name the same file.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()).collect();
    files.sort();
    files
}

fn replay(kind: &str) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(kind);
    let mut n = 0;
    for (name, target) in ALL {
        for file in inputs(&root.join(name)) {
            let data = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            eprintln!("{name}: {}", file.display());
            target(&data);
            n += 1;
        }
    }
    n
}

#[test]
fn every_target_has_seeds_and_they_pass() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (name, _) in ALL {
        assert!(!inputs(&root.join(name)).is_empty(), "no seeds in corpus/{name}");
    }
    assert!(replay("corpus") >= ALL.len());
}

#[test]
fn every_saved_crash_passes() {
    replay("regressions");
}

#[test]
fn every_prefix_of_every_seed_passes() {
    // Bytes arrive in pieces: each seed cut short is an input a decoder sees too.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (name, target) in ALL {
        for file in inputs(&root.join(name)) {
            let data = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            (0..data.len()).for_each(|cut| target(&data[..cut]));
        }
    }
}

#[test]
fn the_handover_seeds_are_whole_frames_of_the_current_wire_format() {
    // A seed the decoder refuses early only exercises the refusal: when the wire format changes,
    // the seeds are rewritten with it (docs/fuzzing.md).
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/handover_msg");
    for file in inputs(&root) {
        let data = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut at = 0;
        while at < data.len() {
            match refract_handover::msg::parse(&data[at..]) {
                Ok(Some((_, n))) => at += n,
                other => panic!("{}: at byte {at}: {other:?}", file.display()),
            }
        }
    }
}

#[test]
fn the_peer_cancel_seed_valid_opens_with_the_target_key_and_clock() {
    // Only a frame sealed with the target's key near its clock reaches the accepting side of
    // `open` from a connection's bytes: when the frame or the key changes, it is sealed again.
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/peer_cancel/valid");
    let data = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let frame = data.first_chunk().unwrap_or_else(|| panic!("{}: short", file.display()));
    assert!(refract_pg::peer_cancel::open(PEER_KEY, frame, PEER_NOW_MS).is_some(), "{}: refused", file.display());
}
