//! The figure: throughput vs payload size, log-log, one line per target (the paper's Fig. 4).

use crate::bench::sweep::run::Results;
use crate::report::plot::{colour, ensure_font};
use crate::support::units::ByteSize;
use anyhow::{anyhow, Context, Result};
use plotters::prelude::*;

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
    ensure_font()?;
    let data = series(results, targets, sizes);
    let ys = data.iter().flat_map(|(_, p)| p.iter().map(|&(_, y)| y));
    let (ymin, ymax) = ys.fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let xmax = sizes.iter().map(|s| s.0 as f64).fold(1.0, f64::max);
    if ymin > ymax {
        return Err(anyhow!("nothing to plot"));
    }
    let root = BitMapBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 26))
        .margin(16)
        .x_label_area_size(56)
        .y_label_area_size(80)
        .build_cartesian_2d((0.7..xmax * 1.5).log_scale(), (ymin / 2.0..ymax * 2.0).log_scale())
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("payload size (bytes)")
        .y_desc("throughput (bit/s)")
        .x_label_formatter(&|v| si(*v))
        .y_label_formatter(&|v| si(*v))
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    for (i, (name, points)) in data.into_iter().enumerate() {
        let c = colour(i);
        chart
            .draw_series(LineSeries::new(points.clone(), c.stroke_width(2)).point_size(4))
            .map_err(|e| anyhow!("{e}"))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(3)));
        chart.draw_series(points.into_iter().map(|p| Circle::new(p, 4, c.filled()))).map_err(|e| anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 18))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    root.present().with_context(|| format!("writing {}", path.display()))
}
