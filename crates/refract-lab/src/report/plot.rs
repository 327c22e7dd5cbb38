//! What every figure shares: a TrueType font registered once and a colour-blind-safe palette.

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
