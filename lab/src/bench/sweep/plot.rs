//! The figure: throughput vs payload size, log-log, one line per target (the paper's Fig. 4).

use crate::bench::sweep::run::Results;
use crate::report::plot::{log_log, LogLog};
use crate::support::units::ByteSize;
use anyhow::Result;

use std::path::Path;

/// Axis labels on a log scale: `1`, `100`, `10k`, `1M`.
fn si(v: f64) -> String {
    match v {
        v if v >= 1e9 => format!("{}G", v / 1e9),
        v if v >= 1e6 => format!("{}M", v / 1e6),
        v if v >= 1e3 => format!("{}k", v / 1e3),
        v => format!("{v}"),
    }
}

/// The series to draw: `(target, [(payload bytes, bit/s)])`, zero points dropped (log scale).
fn series(results: &Results, targets: &[String], sizes: &[ByteSize]) -> Vec<(String, Vec<(f64, f64)>)> {
    targets
        .iter()
        .map(|t| {
            let points = sizes
                .iter()
                .filter_map(|&s| results.cell(s, t).map(|m| (s.0 as f64, m.throughput() * 8.0)))
                .filter(|&(_, y)| y > 0.0)
                .collect();
            (t.clone(), points)
        })
        .collect()
}

/// Draw the PNG.
pub fn draw(path: &Path, title: &str, results: &Results, targets: &[String], sizes: &[ByteSize]) -> Result<()> {
    let fig = LogLog {
        title,
        x_desc: "payload size (bytes)",
        y_desc: "throughput (bit/s)",
        x_from: 0.7,
        x_label: &|v| si(*v),
        y_label: Some(&|v| si(*v)),
    };
    log_log(path, &fig, series(results, targets, sizes))
}
