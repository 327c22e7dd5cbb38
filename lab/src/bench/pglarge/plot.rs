//! The figure: MiB/s over both clients vs result size, log-log, one line per target.

use super::fetch::TARGETS;
use super::report::Results;
use crate::report::plot::{log_log, LogLog};
use anyhow::Result;
use std::path::Path;

/// Decimal labels for the log axis's decade ticks: `1k`, `100k`, `10M`.
fn size_label(v: f64) -> String {
    match v {
        v if v >= 1e6 => format!("{}M", (v / 1e6).round()),
        v if v >= 1e3 => format!("{}k", (v / 1e3).round()),
        v => format!("{}", v.round()),
    }
}

/// Draw the PNG.
pub fn draw(path: &Path, res: &Results) -> Result<()> {
    let data: Vec<(String, Vec<(f64, f64)>)> = TARGETS
        .iter()
        .map(|t| {
            let points =
                res.sizes.iter().filter_map(|&s| Some((s as f64, res.median(s, t)?))).filter(|&(_, y)| y > 0.0);
            (t.to_string(), points.collect())
        })
        .collect();
    let xmin = res.sizes.iter().map(|&s| s as f64).fold(f64::MAX, f64::min);
    let title = format!("PostgreSQL results, 2 clients, links {}", res.rate.label());
    let fig = LogLog {
        title: &title,
        x_desc: "result size (bytes)",
        y_desc: "MiB/s over both clients",
        x_from: xmin / 1.5,
        x_label: &|v| size_label(*v),
        y_label: None,
    };
    log_log(path, &fig, data)
}
