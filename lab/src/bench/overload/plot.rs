//! The overload figures: goodput vs offered load, p50/p99 vs offered load (one line per
//! target), and the slow replica's share of the answers over time.

use crate::bench::overload::results::{OverloadResults, ScenarioRun};
use crate::report::plot::{colour, ensure_font};
use anyhow::{anyhow, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// One named line.
type Series = (String, Vec<(f64, f64)>);

/// Goodput (req/s) against offered load (req/s), with the ideal `y = min(x, capacity)`.
pub fn goodput(path: &Path, res: &OverloadResults) -> Result<()> {
    let data: Vec<Series> = res
        .targets()
        .into_iter()
        .map(|t| {
            let pts = res.points(&t).iter().map(|p| (p.rate, p.summary.goodput)).collect();
            (t, pts)
        })
        .collect();
    let cap = res.capacity.total();
    let xmax = max_of(&data, |p| p.0).max(cap) * 1.05;
    let ideal: Series = ("capacity".into(), vec![(0.0, 0.0), (cap, cap), (xmax, cap)]);
    let root = canvas(path, (1000, 640))?;
    let ymax = max_of(&data, |p| p.1).max(cap) * 1.15;
    let spec = Axes { title: "Goodput vs offered load", x: "offered load (req/s)", y: "goodput (req/s)", log_y: false };
    chart(&root, &spec, (0.0, xmax), (0.0, ymax), &data, Some(&ideal))?;
    root.present().with_context(|| format!("writing {}", path.display()))
}

/// p50 (left) and p99 (right) of successful requests against offered load, log scale.
pub fn latency(path: &Path, res: &OverloadResults) -> Result<()> {
    let root = canvas(path, (1400, 600))?;
    let panels = root.split_evenly((1, 2));
    let xmax = res.sweep.iter().map(|p| p.rate).fold(1.0, f64::max) * 1.05;
    for (panel, (name, pick)) in panels.iter().zip([("p50", 50), ("p99", 99)]) {
        let data: Vec<Series> = res
            .targets()
            .into_iter()
            .map(|t| {
                let pts = res
                    .points(&t)
                    .iter()
                    .filter_map(|p| if pick == 50 { p.summary.p50_ms } else { p.summary.p99_ms }.map(|y| (p.rate, y)))
                    .collect();
                (t, pts)
            })
            .collect();
        let ymax = max_of(&data, |p| p.1).max(1.0) * 2.0;
        let ymin = data.iter().flat_map(|(_, p)| p.iter().map(|p| p.1)).fold(f64::MAX, f64::min).min(ymax / 4.0) / 2.0;
        let title = format!("{name} latency of successful requests");
        let spec = Axes { title: &title, x: "offered load (req/s)", y: "latency (ms)", log_y: true };
        chart(panel, &spec, (0.0, xmax), (ymin.max(0.01), ymax), &data, None)?;
    }
    root.present().with_context(|| format!("writing {}", path.display()))
}

/// The share of answers served by `backend`, per second, one line per target.
pub fn slow_share(path: &Path, runs: &[ScenarioRun], backend: &str) -> Result<()> {
    if runs.is_empty() {
        return Err(anyhow!("no slow-replica runs"));
    }
    let data: Vec<Series> = runs
        .iter()
        .map(|r| (r.target.clone(), r.timeline.iter().map(|b| (b.t_s + 0.5, b.share(backend) * 100.0)).collect()))
        .collect();
    let xmax = max_of(&data, |p| p.0).ceil() + 0.5;
    let root = canvas(path, (1000, 560))?;
    let title = format!("Share of answers from the slow replica ({backend})");
    let spec = Axes { title: &title, x: "time (s)", y: "share (%)", log_y: false };
    chart(&root, &spec, (0.0, xmax), (0.0, 100.0), &data, None)?;
    root.present().with_context(|| format!("writing {}", path.display()))
}

fn max_of(data: &[Series], f: impl Fn(&(f64, f64)) -> f64) -> f64 {
    data.iter().flat_map(|(_, p)| p.iter().map(&f)).fold(0.0, f64::max)
}

fn canvas(path: &Path, size: (u32, u32)) -> Result<DrawingArea<BitMapBackend<'_>, Shift>> {
    ensure_font()?;
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    Ok(root)
}

/// Titles and scale of one chart.
struct Axes<'a> {
    title: &'a str,
    x: &'a str,
    y: &'a str,
    log_y: bool,
}

/// One chart on `area`: lines with points, an optional dashed-grey reference line, a legend.
fn chart(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    axes: &Axes,
    x: (f64, f64),
    y: (f64, f64),
    data: &[Series],
    reference: Option<&Series>,
) -> Result<()> {
    let mut b = ChartBuilder::on(area);
    b.caption(axes.title, ("sans-serif", 24)).margin(16).x_label_area_size(50).y_label_area_size(70);
    if axes.log_y {
        let mut c = b.build_cartesian_2d(x.0..x.1, (y.0..y.1).log_scale()).map_err(|e| anyhow!("{e}"))?;
        mesh_and_lines(&mut c, axes, data, reference)
    } else {
        let mut c = b.build_cartesian_2d(x.0..x.1, y.0..y.1).map_err(|e| anyhow!("{e}"))?;
        mesh_and_lines(&mut c, axes, data, reference)
    }
}

fn mesh_and_lines<'a, Y>(
    c: &mut ChartContext<'a, BitMapBackend<'a>, Cartesian2d<plotters::coord::types::RangedCoordf64, Y>>,
    axes: &Axes,
    data: &[Series],
    reference: Option<&Series>,
) -> Result<()>
where
    Y: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
{
    c.configure_mesh()
        .x_desc(axes.x)
        .y_desc(axes.y)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| if *v >= 1.0 { format!("{v:.0}") } else { format!("{v}") })
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    if let Some((name, pts)) = reference {
        let grey = RGBColor(150, 150, 150);
        c.draw_series(LineSeries::new(pts.clone(), grey.stroke_width(1)))
            .map_err(|e| anyhow!("{e}"))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], grey.stroke_width(1)));
    }
    for (i, (name, pts)) in data.iter().enumerate() {
        let col = colour(i);
        c.draw_series(LineSeries::new(pts.clone(), col.stroke_width(2)))
            .map_err(|e| anyhow!("{e}"))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], col.stroke_width(3)));
        c.draw_series(pts.iter().map(|&p| Circle::new(p, 4, col.filled()))).map_err(|e| anyhow!("{e}"))?;
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::loadgen::summary::{Bucket, Summary};
    use crate::bench::overload::results::Point;

    fn results() -> OverloadResults {
        let mut r = OverloadResults::default();
        r.capacity.per_backend = vec![("b1".into(), 800.0), ("b2".into(), 800.0)];
        for (t, f) in [("refract", 1.0), ("haproxy", 0.8)] {
            for level in [0.5f64, 1.0, 3.0] {
                let s = Summary {
                    goodput: 1600.0 * level.min(1.0) * f,
                    p50_ms: Some(10.0 * level),
                    p99_ms: Some(20.0 * level),
                    ..Default::default()
                };
                r.sweep.push(Point { target: t.into(), level, rate: 1600.0 * level, summary: s });
            }
        }
        let mut b = Bucket::default();
        b.by_backend.insert("b2".into(), 3);
        b.by_backend.insert("b1".into(), 7);
        r.slow.push(ScenarioRun {
            target: "refract".into(),
            rate: 640.0,
            summary: Summary::default(),
            timeline: vec![b],
            served: vec![],
        });
        r
    }

    #[test]
    fn draws_the_three_figures() {
        if ensure_font().is_err() {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "skipped: no font for plotters");
            return;
        }
        let dir = std::env::temp_dir().join(format!("rf-ov-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let r = results();
        goodput(&dir.join("g.png"), &r).expect("goodput");
        latency(&dir.join("l.png"), &r).expect("latency");
        slow_share(&dir.join("s.png"), &r.slow, "b2").expect("slow");
        for f in ["g.png", "l.png", "s.png"] {
            assert!(std::fs::metadata(dir.join(f)).expect("png").len() > 1000);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
