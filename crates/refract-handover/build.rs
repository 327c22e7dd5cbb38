//! Compiles the eBPF programs in `bpf/` with clang (`-O2 -g -target bpf`) into `OUT_DIR`,
//! where `src/bpf.rs` embeds them with `include_bytes!`.

use std::path::PathBuf;
use std::process::Command;

const PROGRAMS: &[&str] = &["ingress", "guard"];

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into());
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    println!("cargo:rerun-if-changed=bpf");
    println!("cargo:rerun-if-env-changed=CLANG");
    for name in PROGRAMS {
        let src = format!("bpf/{name}.bpf.c");
        let obj = out.join(format!("{name}.bpf.o"));
        let status = Command::new(&clang)
            .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
            // Debian keeps <asm/types.h> (needed by <linux/bpf.h>) under the multiarch dir.
            .arg(format!("-I/usr/include/{arch}-linux-gnu"))
            .args(["-c", &src, "-o"])
            .arg(&obj)
            .status()
            .unwrap_or_else(|e| panic!("cannot run {clang} (install clang and libbpf-dev): {e}"));
        assert!(status.success(), "{clang} failed on {src}");
    }
}
