//! What every benchmark page shares: the page's opening, the marked blocks each command
//! replaces on its own, ratios; the run's [`environment`]; the [`plot`] font and colours.

pub mod environment;
pub mod plot;

use crate::support::units::sig3;

/// The page's opening when the file does not exist yet.
pub const PAGE_HEADER: &str = "# Benchmarks\n\n\
Figures written by `refract bench sweep` (`lab/`); do not edit by hand. Each \
section is one sweep and is replaced whole when that sweep is rerun: `1gbit` has every lab \
link shaped like a 1 Gbit/s NIC (the paper's setting), `none` leaves the veth links unshaped; `refract bench paper` writes `paper-*` sections and a \
summary. Raw figures are in `benchmarks.csv`.\n";

/// Replaces (or appends) the block between `<!-- KIND:NAME -->` and `<!-- /KIND:NAME -->`,
/// leaving everything else in `doc` as it is; an empty `doc` starts with `header`.
pub fn replace_marked(doc: &str, kind: &str, name: &str, body: &str, header: &str) -> String {
    let (start, end) = (format!("<!-- {kind}:{name} -->"), format!("<!-- /{kind}:{name} -->"));
    let block = format!("{start}\n{}\n{end}", body.trim_end());
    if let (Some(s), Some(e)) = (doc.find(&start), doc.find(&end)) {
        if s < e {
            return format!("{}{block}{}", &doc[..s], &doc[e + end.len()..]);
        }
    }
    let base = if doc.trim().is_empty() { header } else { doc };
    format!("{}\n\n{block}\n", base.trim_end())
}

/// Replaces the `KIND:NAME` block of the page at `out` with `body` (creating the page, with
/// [`PAGE_HEADER`], and its directory when missing).
pub fn write_marked(out: &std::path::Path, kind: &str, name: &str, body: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let existing = std::fs::read_to_string(out).unwrap_or_default();
    let page = replace_marked(&existing, kind, name, body, PAGE_HEADER);
    std::fs::write(out, page).with_context(|| format!("writing {}", out.display()))
}

/// `0.98×`, or `–` when the denominator is zero.
pub fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{}×", sig3(a / b))
    } else {
        "–".into()
    }
}
