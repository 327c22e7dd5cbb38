//! PostgreSQL cancels through several dispatchers: clients in both client hosts each start
//! `SELECT pg_sleep(10)` through the VIP and cancel it with psycopg2's own cancel, whose
//! CancelRequest rf-r may send to either dispatcher (`cancels.py`).

use crate::fabric::topology::{C1, C2, VIP};
use crate::support::sh::{self, cmd};
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::process::Stdio;

/// The client script (run with a python3 that has psycopg2).
pub const SCRIPT: &str = include_str!("cancels.py");

/// One client's statement.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Cancelled {
    /// How it ended: its SQLSTATE (`57014` when the cancel took effect).
    pub code: Option<String>,
    /// Seconds from the cancel to the statement's end.
    pub seconds: Option<f64>,
    /// The error's text.
    pub message: Option<String>,
    /// A connect failure.
    pub error: Option<String>,
}

/// A python3 with psycopg2 (Debian's python3-psycopg2 is in /usr/bin/python3), if any.
pub fn python() -> Option<&'static str> {
    ["/usr/bin/python3", "python3"].into_iter().find(|p| sh::ok(cmd(None, p, &["-c", "import psycopg2"])))
}

/// `per_host` clients in each client host through VIP:`port`, at once.
pub fn run(port: u16, per_host: usize) -> Result<Vec<Cancelled>> {
    let python = python().context("no python3 with psycopg2 (apt-get install python3-psycopg2)")?;
    let (port, n) = (port.to_string(), per_host.to_string());
    let mut children = vec![];
    for c in [C1, C2] {
        let mut p = cmd(Some(&c.ns()), python, &["-c", SCRIPT, VIP, &port, &n]);
        p.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        children.push(p.spawn().with_context(|| format!("cannot start `{}`", sh::show(&p)))?);
    }
    let mut all = vec![];
    for child in children {
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("cancels.py failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
        }
        let got: Vec<Option<Cancelled>> = serde_json::from_slice(&out.stdout).context("cancels.py's output")?;
        all.extend(got.into_iter().map(Option::unwrap_or_default));
    }
    Ok(all)
}
