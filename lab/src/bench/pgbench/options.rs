//! The options of `refract bench pgbench`: what to measure, how long, where to write; the modes
//! and the server settings every run uses.

use crate::bench::pgbench::targets::{Placement, TARGETS};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};

/// The pgbench modes measured, in report order.
pub const MODES: [&str; 2] = ["simple", "prepared"];

/// Server settings appended to the test kit's (which keeps `fsync = off`): room for four
/// poolers' connections at once and for the whole data set in memory.
pub const SERVER_SETTINGS: &str = "max_connections = 200\nshared_buffers = 256MB\n";

/// Options of `bench pgbench`.
#[derive(Debug, Clone, Args)]
pub struct PgbenchArgs {
    /// Seconds per pgbench run (`-T`).
    #[arg(long, default_value_t = 20)]
    duration: u64,
    /// pgbench clients (`-c`); also every pooler's pool size.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// pgbench threads (`-j`).
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    /// Interleaved runs per target and mode; the median is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// pgbench scale factor (`-i -s`; 100 000 accounts each).
    #[arg(long, default_value_t = 10)]
    scale: u32,
    /// A smoke run (2 s runs, 1 repeat, scale 1, no warm-up; well under a minute).
    #[arg(long)]
    quick: bool,
    /// The markdown page; the section between `<!-- pgbench:loopback -->` markers is replaced.
    #[arg(long, default_value = "docs/benchmarks.md")]
    out: PathBuf,
    /// The targets to run, comma-separated (default: all of direct, direct-replica, refract,
    /// pgbouncer, pgpool). A subset runs faster, for a closer look at two of them.
    #[arg(long, value_delimiter = ',')]
    targets: Vec<String>,
    /// The pgbench modes to run, comma-separated (default: simple,prepared).
    #[arg(long, value_delimiter = ',')]
    modes: Vec<String>,
    /// Skip the read/write mix (Table P2).
    #[arg(long)]
    no_mix: bool,
    /// Where the poolers run: `own` (each in a session of its own, like the PostgreSQL servers)
    /// or `shared` (in this command's session, with pgbench).
    #[arg(long, value_enum, default_value_t = Placement::Own)]
    placement: Placement,
    /// The refract binary to benchmark (default: this one).
    #[arg(long, hide = true)]
    refract_bin: Option<PathBuf>,
}

/// What `bench pgbench` does, resolved.
#[derive(Debug, Clone)]
pub struct PgbenchOptions {
    /// Seconds per `-S` run.
    pub seconds: u64,
    /// Seconds per read/write-mix run.
    pub mix_seconds: u64,
    /// `-c` and pool sizes.
    pub clients: usize,
    /// `-j`.
    pub jobs: usize,
    /// Interleaved runs per cell.
    pub repeat: usize,
    /// `pgbench -i -s`.
    pub scale: u32,
    /// A short unrecorded run through every target first (fills caches and pools).
    pub warmup: bool,
    /// The markdown page (the CSV goes next to it as `pgbench.csv`).
    pub out: PathBuf,
    /// The refract binary.
    pub refract_bin: PathBuf,
    /// The `-S` targets, in [`TARGETS`] order.
    pub targets: Vec<&'static str>,
    /// The `-S` modes, in [`MODES`] order.
    pub modes: Vec<&'static str>,
    /// Run the read/write mix.
    pub mix: bool,
    /// Where the poolers run.
    pub placement: Placement,
    /// The command line that reruns it, for the report.
    pub command: String,
}

impl PgbenchOptions {
    /// The `--quick` settings, writing to `out`, benchmarking `refract_bin`.
    pub fn quick(out: PathBuf, refract_bin: PathBuf) -> Self {
        PgbenchOptions {
            seconds: 2,
            mix_seconds: 2,
            clients: 16,
            jobs: 2,
            repeat: 1,
            scale: 1,
            warmup: false,
            out,
            refract_bin,
            targets: TARGETS.to_vec(),
            modes: MODES.to_vec(),
            mix: true,
            placement: Placement::Own,
            command: "sudo refract bench pgbench --quick".into(),
        }
    }

    /// The CSV's path: `pgbench.csv` next to the page.
    pub fn csv_path(&self) -> PathBuf {
        self.out.with_file_name("pgbench.csv")
    }
}

impl PgbenchArgs {
    /// Resolves the options (`--quick` overrides durations, repeat and scale).
    pub fn into_options(self) -> Result<PgbenchOptions> {
        let refract_bin = match self.refract_bin {
            Some(p) => p,
            None => std::env::current_exe().context("locating the refract binary")?,
        };
        let targets = pick("target", &self.targets, &TARGETS)?;
        let modes = pick("mode", &self.modes, &MODES)?;
        let mut filters = String::new();
        if targets.len() < TARGETS.len() {
            filters.push_str(&format!(" --targets {}", targets.join(",")));
        }
        if modes.len() < MODES.len() {
            filters.push_str(&format!(" --modes {}", modes.join(",")));
        }
        if self.no_mix {
            filters.push_str(" --no-mix");
        }
        if self.placement == Placement::Shared {
            filters.push_str(" --placement shared");
        }
        if self.out != Path::new("docs/benchmarks.md") {
            filters.push_str(&format!(" --out {}", self.out.display()));
        }
        if self.quick {
            let mut o = PgbenchOptions::quick(self.out.clone(), refract_bin);
            o.clients = self.clients;
            o.jobs = self.jobs;
            o.targets = targets;
            o.modes = modes;
            o.mix = !self.no_mix;
            o.placement = self.placement;
            o.command.push_str(&filters);
            return Ok(o);
        }
        let command = format!(
            "sudo refract bench pgbench --duration {} --clients {} --jobs {} --repeat {} --scale {}{filters}",
            self.duration, self.clients, self.jobs, self.repeat, self.scale
        );
        Ok(PgbenchOptions {
            seconds: self.duration.max(1),
            mix_seconds: self.duration.max(1),
            clients: self.clients.max(1),
            jobs: self.jobs.clamp(1, self.clients.max(1)),
            repeat: self.repeat.max(1),
            scale: self.scale.max(1),
            warmup: true,
            out: self.out,
            refract_bin,
            targets,
            modes,
            mix: !self.no_mix,
            placement: self.placement,
            command,
        })
    }
}

/// The entries of `all` named in `asked` (all of them when none is), in `all`'s order; an
/// unknown name is an error that lists the known ones.
pub(crate) fn pick(what: &str, asked: &[String], all: &[&'static str]) -> Result<Vec<&'static str>> {
    if let Some(bad) = asked.iter().find(|a| !all.contains(&a.as_str())) {
        bail!("unknown {what} `{bad}` (known: {})", all.join(", "));
    }
    Ok(all.iter().copied().filter(|t| asked.is_empty() || asked.iter().any(|a| a == t)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: PgbenchArgs,
    }

    #[test]
    fn options() {
        let o = Cli::parse_from(["x", "--refract-bin", "/bin/true"]).args.into_options().expect("options");
        assert_eq!((o.seconds, o.clients, o.jobs, o.repeat, o.scale), (20, 16, 2, 3, 10));
        assert_eq!(o.command, "sudo refract bench pgbench --duration 20 --clients 16 --jobs 2 --repeat 3 --scale 10");
        assert_eq!(o.csv_path(), PathBuf::from("docs/pgbench.csv"));
        let q = Cli::parse_from(["x", "--quick", "--refract-bin", "/bin/true"]).args.into_options().expect("quick");
        assert_eq!((q.seconds, q.repeat, q.scale, q.warmup), (2, 1, 1, false));
        assert_eq!((o.targets, o.modes, o.mix), (TARGETS.to_vec(), MODES.to_vec(), true));
    }

    #[test]
    fn a_subset_of_targets_and_modes_keeps_report_order_and_is_in_the_rerun_line() {
        let args =
            ["x", "--refract-bin", "/bin/true", "--targets", "pgbouncer,refract", "--modes", "simple", "--no-mix"];
        let o = Cli::parse_from(args).args.into_options().expect("options");
        assert_eq!((o.targets, o.modes, o.mix), (vec!["refract", "pgbouncer"], vec!["simple"], false));
        assert!(o.command.ends_with(" --targets refract,pgbouncer --modes simple --no-mix"), "{}", o.command);
        assert_eq!(o.placement, Placement::Own);
        let shared = Cli::parse_from(["x", "--refract-bin", "/bin/true", "--placement", "shared"]).args;
        let s = shared.into_options().expect("options");
        assert_eq!((s.placement, s.command.ends_with(" --placement shared")), (Placement::Shared, true));
        let bad = Cli::parse_from(["x", "--refract-bin", "/bin/true", "--targets", "pgbouncr"]).args.into_options();
        let e = bad.expect_err("an unknown target is refused").to_string();
        assert!(e.contains("unknown target `pgbouncr`") && e.contains("pgpool"), "{e}");
    }
}
