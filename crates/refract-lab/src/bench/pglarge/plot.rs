//! The figure: MiB/s over both clients vs result size, log-log, one line per target.

use super::fetch::TARGETS;
use super::report::Results;
use crate::report::plot::{colour, ensure_font};
use anyhow::{anyhow, Context, Result};
use plotters::prelude::*;
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
    ensure_font()?;
    let data: Vec<(&str, Vec<(f64, f64)>)> = TARGETS
        .iter()
        .map(|t| (*t, res.sizes.iter().filter_map(|&s| Some((s as f64, res.median(s, t)?))).collect()))
        .collect();
    let ys = data.iter().flat_map(|(_, p)| p.iter().map(|&(_, y)| y)).filter(|y| *y > 0.0);
    let (ymin, ymax) = ys.fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let (xmin, xmax) = res.sizes.iter().fold((f64::MAX, 1.0f64), |(lo, hi), &s| (lo.min(s as f64), hi.max(s as f64)));
    if ymin > ymax {
        return Err(anyhow!("nothing to plot"));
    }
    let root = BitMapBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let title = format!("PostgreSQL results, 2 clients, links {}", res.rate.label());
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 26))
        .margin(16)
        .x_label_area_size(56)
        .y_label_area_size(80)
        .build_cartesian_2d((xmin / 1.5..xmax * 1.5).log_scale(), (ymin / 2.0..ymax * 2.0).log_scale())
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("result size (bytes)")
        .y_desc("MiB/s over both clients")
        .x_label_formatter(&|v| size_label(*v))
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    for (i, (name, points)) in data.into_iter().enumerate() {
        let c = colour(i);
        chart
            .draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))
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
