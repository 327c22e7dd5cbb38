//! `refract bench sweep`: bring the lab up if needed, run the sweep, write the report section,
//! the CSV and the plot.
//!
//! Inside: [`run`] (the sweep itself and its results), [`wrk`], [`switch`] (which steering
//! dispatcher runs), [`handover_stats`] (`/metrics`), and the outputs [`report`], [`csv`],
//! [`plot`].

pub mod csv;
pub mod handover_stats;
pub mod plot;
pub mod report;
pub mod run;
pub mod switch;
pub mod wrk;

use crate::cluster::layout::Layout;
use crate::fabric::shaping;
use crate::lab::LabGuard;
use crate::report::environment::Environment;
use crate::support::interrupt;
use crate::support::units::{ByteSize, Rate};
use anyhow::{Context, Result};
use report::Section;
use run::{Plan, Results};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The sweep's options, parsed.
#[derive(Debug, Clone)]
pub struct SweepOptions {
    /// What to measure.
    pub plan: Plan,
    /// Link rate.
    pub rate: Rate,
    /// The markdown page.
    pub out: PathBuf,
    /// Section name (defaults to the rate's label).
    pub section: String,
    /// The command line that reruns it, for the report.
    pub command: String,
}

/// Run the sweep in the lab and write the report files.
pub fn sweep(opts: &SweepOptions) -> Result<()> {
    interrupt::install();
    let guard = LabGuard::ensure(opts.rate)?;
    let results = measure(&guard.layout, opts)?;
    let layout = guard.layout.clone();
    drop(guard);
    write_outputs(opts, &layout, &results)
}

/// The sweep of `opts` in a lab that is up (at `opts.rate`).
pub fn measure(layout: &Layout, opts: &SweepOptions) -> Result<Results> {
    run::check_targets(layout, &opts.plan.targets)?;
    run::run(layout, &opts.plan)
}

/// Where the configs of the dispatchers a sweep measured come from (their files).
fn refract_sources(layout: &Layout, targets: &[String]) -> Vec<String> {
    let measured = layout.dispatchers.iter().filter(|d| targets.iter().any(|t| t == d.target));
    measured.map(|d| format!("`{}`", d.source)).collect()
}

/// The report's paragraph on what each target is.
fn targets_note(layout: &Layout, targets: &[String]) -> String {
    let notes: Vec<String> = targets.iter().filter_map(|t| layout.target_note(t)).collect();
    let mut s = format!("Targets: {}.", notes.join("; "));
    if targets.iter().any(|t| t != "direct" && t != "haproxy") {
        s.push_str(
            " Every refract config has `read_from_primary = true` so that, as with HAProxy's \
             `balance roundrobin`, reads go to both b1 and b2.",
        );
    }
    s
}

/// The plot's path: `benchmarks.png` for the 1gbit section, `benchmarks-NAME.png` otherwise.
pub fn plot_path(out: &Path, section: &str) -> PathBuf {
    let stem = out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "benchmarks".into());
    let name = if section == "1gbit" { format!("{stem}.png") } else { format!("{stem}-{section}.png") };
    out.with_file_name(name)
}

/// Write the section, the CSV rows and the plot of one sweep.
pub fn write_outputs(opts: &SweepOptions, layout: &Layout, results: &Results) -> Result<()> {
    let env = Environment::detect();
    let refract_sources = refract_sources(layout, &opts.plan.targets);
    let targets_note = targets_note(layout, &opts.plan.targets);
    if let Some(dir) = opts.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let png = plot_path(&opts.out, &opts.section);
    let title = format!("Throughput vs payload size (links: {})", opts.rate);
    let plotted = match plot::draw(&png, &title, results, &opts.plan.targets, &opts.plan.sizes) {
        Ok(()) => true,
        Err(e) => {
            eprintln!("warning: no plot: {e:#}");
            false
        }
    };
    let png_name = png.file_name().map(|n| n.to_string_lossy().into_owned());
    let shaping = shaping::describe(opts.rate);
    let section = Section {
        name: &opts.section,
        shaping: &shaping,
        duration_s: opts.plan.duration.as_secs_f64().round().max(1.0),
        repeat: opts.plan.repeat.max(1),
        command: &opts.command,
        env: &env,
        sizes: &opts.plan.sizes,
        targets: &opts.plan.targets,
        results,
        plot: png_name.as_deref().filter(|_| plotted),
        haproxy: opts.plan.targets.iter().any(|t| t == "haproxy"),
        refract_sources: &refract_sources,
        targets_note: &targets_note,
    };
    let existing = std::fs::read_to_string(&opts.out).unwrap_or_default();
    let page = report::replace_section(&existing, &opts.section, &report::render(&section));
    std::fs::write(&opts.out, page).with_context(|| format!("writing {}", opts.out.display()))?;
    let csv_path = opts.out.with_extension("csv");
    let old_csv = std::fs::read_to_string(&csv_path).unwrap_or_default();
    let merged = csv::merge(&old_csv, &opts.section, &csv::rows(&opts.section, results));
    std::fs::write(&csv_path, merged).with_context(|| format!("writing {}", csv_path.display()))?;
    println!("{}", report::tables(&section));
    let png_note = if plotted { format!(", {}", png.display()) } else { String::new() };
    eprintln!("wrote {} (section {}), {}{png_note}", opts.out.display(), opts.section, csv_path.display());
    Ok(())
}

/// The command line that reproduces a sweep.
pub fn rerun_command(
    sizes: &[ByteSize],
    targets: &[String],
    duration: Duration,
    rate: Rate,
    out: &Path,
    section: Option<&str>,
) -> String {
    let sizes: Vec<String> = sizes.iter().map(ByteSize::to_string).collect();
    let mut c = format!(
        "sudo refract bench sweep --rate {rate} --duration {} --sizes {} --targets {} --out {}",
        crate::support::units::wrk_duration(duration),
        sizes.join(","),
        targets.join(","),
        out.display()
    );
    if let Some(s) = section {
        c.push_str(&format!(" --section {s}"));
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plot_names() {
        assert_eq!(plot_path(Path::new("docs/benchmarks.md"), "1gbit"), PathBuf::from("docs/benchmarks.png"));
        assert_eq!(plot_path(Path::new("docs/benchmarks.md"), "none"), PathBuf::from("docs/benchmarks-none.png"));
    }

    #[test]
    fn rerun_line() {
        let c = rerun_command(
            &[ByteSize(1), ByteSize(4096)],
            &["direct".into()],
            Duration::from_secs(5),
            Rate::Unlimited,
            Path::new("docs/benchmarks.md"),
            None,
        );
        assert_eq!(
            c,
            "sudo refract bench sweep --rate none --duration 5s --sizes 1,4K --targets direct --out docs/benchmarks.md"
        );
    }
}
