//! `refract`: the one binary. It parses the command line and hands over to the crates; it
//! holds no logic of its own. The `lab`, `bench` and `demo` subcommands exist only with the
//! `lab` feature (on by default); `--no-default-features` builds the data-path-only binary.

use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// jemalloc with its background thread: memory freed when connections close goes back to the
/// system within seconds (glibc's heaps keep it; docs/operations.md, "Memory per idle
/// connection").
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(name = "refract", version, about = "A query dispatcher for scale-out database clusters")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the dispatcher.
    Dispatch {
        /// The TOML configuration file (see examples/ and docs/config.md).
        #[arg(long)]
        config: PathBuf,
    },
    /// Ask the dispatcher running with this config file to reload it (`POST /reload` on its
    /// admin listener, with the file's token); prints what changed, or why it was refused.
    Reload {
        /// The dispatcher's configuration file.
        #[arg(long)]
        config: PathBuf,
    },
    /// Run the test backend: returns results of a requested size (the paper's stored procedure).
    BlobServer(refract_blob::BlobArgs),
    /// Build, inspect or remove the network-namespace lab.
    #[cfg(feature = "lab")]
    #[command(subcommand)]
    Lab(refract_lab::LabCmd),
    /// Benchmarks, run in the lab; figures go to docs/benchmarks.md.
    #[cfg(feature = "lab")]
    #[command(subcommand)]
    Bench(refract_lab::BenchCmd),
    /// Run the agent on a backend host (host checks, guard, control listener).
    Agent(refract_agent::AgentArgs),
    /// The main job end to end: a cluster, routing shown, a short sweep.
    #[cfg(feature = "lab")]
    Demo(refract_lab::DemoArgs),
}

/// How long a process that is ending waits for its last log lines to be written.
const LOG_GRACE: Duration = Duration::from_millis(250);

fn main() -> ExitCode {
    if let Err(e) = refract_process::start() {
        let _ = writeln!(std::io::stderr(), "refract: cannot start the log writer: {e}");
        return ExitCode::FAILURE;
    }
    let code = match run(Cli::parse().cmd) {
        Ok(code) => code,
        Err(e) => {
            refract_process::log::line(&format!("Error: {e:?}"));
            1
        }
    };
    refract_process::log::flush(LOG_GRACE);
    ExitCode::from(code)
}

/// Runs a subcommand; the exit status (docs/operations.md, "Exit status").
fn run(cmd: Cmd) -> anyhow::Result<u8> {
    match cmd {
        Cmd::Dispatch { config } => {
            let exit = refract_dispatch::run_dispatcher_from_file(&config)?;
            if exit != refract_dispatch::Exit::Drained {
                tracing::error!(code = exit.code(), "exiting: the drain timed out with connections still open");
            }
            Ok(exit.code() as u8)
        }
        Cmd::Reload { config } => {
            let changes = refract_dispatch::request_reload(&config).map_err(anyhow::Error::msg)?;
            writeln!(std::io::stdout(), "reloaded: {changes}")?;
            Ok(0)
        }
        Cmd::BlobServer(args) => refract_blob::run(args).map(|()| 0),
        #[cfg(feature = "lab")]
        Cmd::Lab(cmd) => cmd.run().map(|()| 0),
        #[cfg(feature = "lab")]
        Cmd::Bench(cmd) => cmd.run().map(|()| 0),
        #[cfg(feature = "lab")]
        Cmd::Demo(args) => args.run().map(|()| 0),
        Cmd::Agent(args) => refract_agent::run(args).map(|()| 0),
    }
}
