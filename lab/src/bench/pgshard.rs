//! `refract bench pg-shard`: what sharding's routing costs on keyed reads. One PostgreSQL
//! server with `pgbench -i` data; refract `unsharded` over it, and refract `sharded` with two
//! shards that both point at that same server and database, `pgbench_accounts` sharded by
//! `aid` (hash, integer). Each shard then holds every row, so whichever shard a key names
//! answers it correctly, and the two refracts differ only in the routing (the key read from
//! the statement or the Bind, the shard picked): the data placement and the server's work are
//! the same. pgbench runs the keyed read of `-S` as a script through each, in paired
//! alternating runs ([`run`](mod@run)); [`report`] writes the section.
//!
//! Here: the options, the pgbench load and the two refract configs.

pub mod report;
pub mod run;

use crate::bench::pgbench::client::Load;
use crate::bench::pgbench::options::pick;
use crate::bench::pgbench::targets::Placement;
use anyhow::{Context, Result};
use clap::Args;
use refract_testkit::{DATABASE, PASSWORD, USER};
use std::fmt::Write;
use std::path::{Path, PathBuf};

pub use run::run;

/// The pgbench protocols measured, in report order.
pub const MODES: [&str; 2] = ["simple", "extended"];

/// Shards of the sharded refract (all on the one server).
pub const SHARDS: usize = 2;

/// The two refracts, in report order: A (the ratio's denominator), then B.
pub const TARGETS: [&str; 2] = ["unsharded", "sharded"];

/// The keyed read of `pgbench -S`, as a script, so that `-s` sets `:scale` and both refracts
/// run the very same statement.
pub const SCRIPT: &str = "\\set aid random(1, 100000 * :scale)\n\
                          SELECT abalance FROM pgbench_accounts WHERE aid = :aid;\n";

/// The script's file name in the run's temp directory (and in the report).
pub const SCRIPT_FILE: &str = "keyed-read.sql";

/// Options of `bench pg-shard`.
#[derive(Debug, Clone, Args)]
pub struct PgShardArgs {
    /// Pairs per protocol (one run through each refract, back to back, the order alternating).
    #[arg(long, default_value_t = 12)]
    pairs: usize,
    /// Seconds per pgbench run (`-T`).
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// pgbench clients (`-c`); also refract's `pool_size` per server.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// pgbench threads (`-j`).
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    /// pgbench scale factor (`-i -s`; 100 000 accounts each).
    #[arg(long, default_value_t = 10)]
    scale: u32,
    /// The protocols (`-M`), comma-separated (default: simple,extended).
    #[arg(long, value_delimiter = ',')]
    modes: Vec<String>,
    /// A smoke run (2 pairs of 2 s runs, scale 1, no warm-up; well under a minute).
    #[arg(long)]
    quick: bool,
    /// The markdown page; the section between `<!-- pgshard:loopback -->` markers is replaced.
    #[arg(long, default_value = "docs/benchmarks.md")]
    out: PathBuf,
    /// Where the refracts run: `own` (each in a session of its own) or `shared` (with pgbench).
    #[arg(long, value_enum, default_value_t = Placement::Own)]
    placement: Placement,
    /// The refract binary to benchmark (default: this one).
    #[arg(long, hide = true)]
    refract_bin: Option<PathBuf>,
}

/// What `bench pg-shard` does, resolved.
#[derive(Debug, Clone)]
pub struct PgShardOptions {
    /// Pairs per protocol.
    pub pairs: usize,
    /// Seconds per run.
    pub seconds: u64,
    /// `-c`, and `pool_size`.
    pub clients: usize,
    /// `-j`.
    pub jobs: usize,
    /// `pgbench -i -s`.
    pub scale: u32,
    /// The protocols, in [`MODES`] order.
    pub modes: Vec<&'static str>,
    /// A short unrecorded run through each refract first.
    pub warmup: bool,
    /// The markdown page.
    pub out: PathBuf,
    /// The refract binary.
    pub refract_bin: PathBuf,
    /// Where the refracts run.
    pub placement: Placement,
    /// The command line that reruns it, for the report.
    pub command: String,
}

impl PgShardArgs {
    /// Resolves the options (`--quick` overrides pairs, seconds and scale).
    pub fn into_options(self) -> Result<PgShardOptions> {
        let refract_bin = match self.refract_bin {
            Some(p) => p,
            None => std::env::current_exe().context("locating the refract binary")?,
        };
        let modes = pick("mode", &self.modes, &MODES)?;
        let (pairs, seconds, scale) =
            if self.quick { (2, 2, 1) } else { (self.pairs.max(2), self.seconds.max(1), self.scale.max(1)) };
        let clients = self.clients.max(1);
        let mut command = if self.quick {
            "sudo refract bench pg-shard --quick".to_string()
        } else {
            format!("sudo refract bench pg-shard --pairs {pairs} --seconds {seconds} --scale {scale}")
        };
        let _ = write!(command, " --clients {clients} --jobs {}", self.jobs);
        if modes.len() < MODES.len() {
            let _ = write!(command, " --modes {}", modes.join(","));
        }
        if self.placement == Placement::Shared {
            command.push_str(" --placement shared");
        }
        if self.out != Path::new("docs/benchmarks.md") {
            let _ = write!(command, " --out {}", self.out.display());
        }
        Ok(PgShardOptions {
            pairs,
            seconds,
            clients,
            jobs: self.jobs.clamp(1, clients),
            scale,
            modes,
            warmup: !self.quick,
            out: self.out,
            refract_bin,
            placement: self.placement,
            command,
        })
    }
}

/// The keyed-read script as a pgbench load in `mode`, `seconds` long; `-s` sets `:scale`
/// (a script is not told the scale otherwise).
pub fn load(opts: &PgShardOptions, script: &Path, mode: &str, seconds: u64) -> Load {
    let script = vec!["-f".into(), script.to_string_lossy().into_owned(), "-s".into(), opts.scale.to_string()];
    Load { clients: opts.clients, jobs: opts.jobs, seconds, mode: mode.into(), script }
}

/// The load as the report shows it (the script by its name).
pub fn shown(opts: &PgShardOptions, mode: &str) -> String {
    load(opts, Path::new(SCRIPT_FILE), mode, opts.seconds).shown()
}

/// Where a refract listens: PostgreSQL, HTTP, admin (loopback ports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    /// Clients' PostgreSQL port.
    pub pg: u16,
    /// `[listen] http`.
    pub http: u16,
    /// `[listen] admin`.
    pub admin: u16,
}

/// The config of refract `target` ([`TARGETS`]) over the server on 127.0.0.1:`server`, with
/// `pool` connections per server: `unsharded` has the server as its one `[[postgres.server]]`,
/// `sharded` has it as the primary of each of [`SHARDS`] shards.
pub fn config(target: &str, server: u16, pool: usize, ports: Ports) -> String {
    let mut s = format!(
        "# Generated by refract-lab (lab/src/bench/pgshard.rs) for `refract bench pg-shard`.\n\
         [http]\nlisten = \"127.0.0.1:{http}\"\n\n[listen]\nadmin = \"127.0.0.1:{admin}\"\n\n\
         [admin]\ninsecure_loopback = true\n\n\
         [postgres]\nlisten = \"127.0.0.1:{pg}\"\ndatabase = \"{DATABASE}\"\npool_mode = \"transaction\"\n\
         pool_size = {pool}\nserver_user = \"{USER}\"\nserver_password = \"{PASSWORD}\"\n\n\
         [[postgres.user]]\nname = \"{USER}\"\npassword = \"{PASSWORD}\"\nauth = \"scram-sha-256\"\n",
        http = ports.http,
        admin = ports.admin,
        pg = ports.pg,
    );
    if target == "sharded" {
        s.push_str("\n# Every shard is the same server and database: each holds every row.\n");
        for i in 0..SHARDS {
            let _ = write!(
                s,
                "[[postgres.shard]]\nname = \"s{i}\"\n[[postgres.shard.server]]\nname = \"s{i}\"\n\
                 addr = \"127.0.0.1:{server}\"\nrole = \"primary\"\n\n"
            );
        }
        s.push_str(
            "[[postgres.sharded_table]]\nname = \"pgbench_accounts\"\nkey = \"aid\"\nmethod = \"hash\"\n\
             type = \"integer\"\n",
        );
    } else {
        let _ =
            write!(s, "\n[[postgres.server]]\nname = \"primary\"\naddr = \"127.0.0.1:{server}\"\nrole = \"primary\"\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: PgShardArgs,
    }

    fn options(args: &[&str]) -> Result<PgShardOptions> {
        let mut v = vec!["x", "--refract-bin", "/bin/true"];
        v.extend(args);
        Cli::parse_from(v).args.into_options()
    }

    #[test]
    fn defaults_quick_and_the_rerun_line() {
        let o = options(&[]).expect("options");
        assert_eq!((o.pairs, o.seconds, o.clients, o.jobs, o.scale, o.warmup), (12, 5, 16, 2, 10, true));
        assert_eq!(o.modes, MODES.to_vec());
        assert_eq!(o.command, "sudo refract bench pg-shard --pairs 12 --seconds 5 --scale 10 --clients 16 --jobs 2");
        let q = options(&["--quick", "--modes", "extended"]).expect("quick");
        assert_eq!((q.pairs, q.seconds, q.scale, q.warmup, q.modes), (2, 2, 1, false, vec!["extended"]));
        assert_eq!(q.command, "sudo refract bench pg-shard --quick --clients 16 --jobs 2 --modes extended");
        let e = options(&["--modes", "prepared"]).expect_err("prepared is not measured").to_string();
        assert!(e.contains("unknown mode `prepared`") && e.contains("simple, extended"), "{e}");
        assert_eq!(options(&["--pairs", "1"]).expect("options").pairs, 2, "an interval needs two pairs");
    }

    #[test]
    fn both_configs_are_valid_refract_configs_over_the_same_server() {
        let ports = Ports { pg: 6432, http: 8080, admin: 8081 };
        for target in TARGETS {
            let text = config(target, 5433, 16, ports);
            if let Err(e) = refract_dispatch::config::parse(&text) {
                panic!("{target}: {e}\n{text}");
            }
            let v: toml::Value = toml::from_str(&text).expect("toml");
            let pg = &v["postgres"];
            assert_eq!((pg["pool_size"].as_integer(), pg["listen"].as_str()), (Some(16), Some("127.0.0.1:6432")));
            assert_eq!(pg["pool_mode"].as_str(), Some("transaction"));
        }
        let v: toml::Value = toml::from_str(&config("sharded", 5433, 16, ports)).expect("toml");
        let shards = v["postgres"]["shard"].as_array().expect("shards");
        assert_eq!(shards.len(), SHARDS);
        for s in shards {
            assert_eq!(s["server"][0]["addr"].as_str(), Some("127.0.0.1:5433"), "every shard is the one server");
        }
        let t = &v["postgres"]["sharded_table"][0];
        assert_eq!((t["name"].as_str(), t["key"].as_str()), (Some("pgbench_accounts"), Some("aid")));
        assert_eq!((t["method"].as_str(), t["type"].as_str()), (Some("hash"), Some("integer")));
        let u: toml::Value = toml::from_str(&config("unsharded", 5433, 16, ports)).expect("toml");
        assert!(u["postgres"].get("shard").is_none() && u["postgres"].get("sharded_table").is_none());
        assert_eq!(u["postgres"]["server"][0]["addr"].as_str(), Some("127.0.0.1:5433"));
    }

    #[test]
    fn the_script_is_the_keyed_read_of_select_only() {
        assert!(SCRIPT.contains("random(1, 100000 * :scale)"));
        assert!(SCRIPT.contains("SELECT abalance FROM pgbench_accounts WHERE aid = :aid;"));
    }
}
