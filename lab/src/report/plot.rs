//! What every figure shares: a TrueType font registered once, a colour-blind-safe palette, and
//! the log-log line figure of throughput against size ([`log_log`]).

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use std::sync::OnceLock;

/// Fonts tried in order (Debian's fonts-dejavu-core first).
const FONTS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Register a TrueType font as "sans-serif" once; plotters (ab_glyph) has none built in.
pub(crate) fn ensure_font() -> Result<()> {
    static LOADED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let bytes = FONTS
                .iter()
                .find_map(|p| std::fs::read(p).ok())
                .ok_or_else(|| format!("no font found (install fonts-dejavu-core): tried {}", FONTS.join(", ")))?;
            // The font must live as long as the process; it is loaded once.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            register_font("sans-serif", FontStyle::Normal, bytes).map_err(|_| "bad font file".to_string())
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

/// A line colour per target (colour-blind safe).
pub(crate) fn colour(i: usize) -> RGBColor {
    const PALETTE: [RGBColor; 5] = [
        RGBColor(0, 114, 178),
        RGBColor(213, 94, 0),
        RGBColor(0, 158, 115),
        RGBColor(204, 121, 167),
        RGBColor(86, 180, 233),
    ];
    PALETTE[i % PALETTE.len()]
}

/// A log-log figure with one line per target and a dot on each measurement (sweep, pg-large).
pub(crate) struct LogLog<'a> {
    pub title: &'a str,
    pub x_desc: &'a str,
    pub y_desc: &'a str,
    /// Where the x axis starts (it ends at 1.5 × the largest x).
    pub x_from: f64,
    pub x_label: &'a dyn Fn(&f64) -> String,
    /// The y labels, when not plotters' own.
    pub y_label: Option<&'a dyn Fn(&f64) -> String>,
}

/// Draws `data` (`(target, [(x, y)])`, y > 0) as `fig` says into the PNG at `path`.
pub(crate) fn log_log(path: &std::path::Path, fig: &LogLog<'_>, data: Vec<(String, Vec<(f64, f64)>)>) -> Result<()> {
    use anyhow::Context;
    ensure_font()?;
    let ys = data.iter().flat_map(|(_, p)| p.iter().map(|&(_, y)| y));
    let (ymin, ymax) = ys.fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let xmax = data.iter().flat_map(|(_, p)| p.iter().map(|&(x, _)| x)).fold(1.0, f64::max);
    if ymin > ymax {
        return Err(anyhow!("nothing to plot"));
    }
    let root = BitMapBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(fig.title, ("sans-serif", 26))
        .margin(16)
        .x_label_area_size(56)
        .y_label_area_size(80)
        .build_cartesian_2d((fig.x_from..xmax * 1.5).log_scale(), (ymin / 2.0..ymax * 2.0).log_scale())
        .map_err(|e| anyhow!("{e}"))?;
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(fig.x_desc).y_desc(fig.y_desc).x_label_formatter(fig.x_label);
    if let Some(f) = fig.y_label {
        mesh.y_label_formatter(f);
    }
    mesh.label_style(("sans-serif", 16)).axis_desc_style(("sans-serif", 18)).draw().map_err(|e| anyhow!("{e}"))?;
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
