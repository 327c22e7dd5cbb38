//! Ctrl-C handling: the handler only raises a flag; long-running loops check it and unwind,
//! so the usual drop guards tear the cluster down.

use anyhow::{bail, Result};
use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Install the handler (once; later calls are no-ops).
pub fn install() {
    // An error means a handler is already installed, which is all we need.
    let _ = ctrlc::set_handler(|| {
        eprintln!("\ninterrupted; cleaning up…");
        INTERRUPTED.store(true, Ordering::SeqCst);
    });
}

/// Whether Ctrl-C was pressed.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Fail with "interrupted" once Ctrl-C was pressed.
pub fn check() -> Result<()> {
    if interrupted() {
        bail!("interrupted");
    }
    Ok(())
}
