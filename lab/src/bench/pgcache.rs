//! `refract bench pg-cache`: does cache-affinity routing make a cluster's replicas cache more
//! than one replica's worth of data? On loopback, a PostgreSQL primary and streaming replicas
//! whose memory each holds about half of the table (`shared_buffers = 32MB`, each replica's
//! PostgreSQL in a cgroup v1 memory cgroup of 384 MB, so its page cache is bounded too;
//! [`cluster`]); keyed reads by pgbench through refract under `[balance] policy = "peak-ewma"`
//! (today's default) and `"affinity"` (each key's range on a bounded-load consistent-hash
//! ring of the replicas), and the reference `ideal` (each replica's share of the clients
//! straight to it, reading only its own key range); [`run`](mod@run) takes the runs in
//! rotating order, [`report`] writes the section of docs/benchmarks.md.
//!
//! Here: the options, the workloads (pgbench scripts), the key ranges of the ideal and the
//! refract configs.

pub mod cluster;
pub mod report;
pub mod run;

use crate::bench::pgbench::client::Load;
use crate::support::units::ByteSize;
use anyhow::{bail, Context, Result};
use clap::Args;
use refract_testkit::{DATABASE, PASSWORD, USER};
use std::fmt::Write;
use std::path::{Path, PathBuf};

pub use run::run;

/// The table every read goes to.
pub const TABLE: &str = "rf_cache";
/// Its key column.
pub const COLUMN: &str = "id";
/// The length of each row's `pad` (a heap tuple of about 224 bytes, 35 to a page).
pub const PAD_CHARS: usize = 185;
/// The seed of `permute` in the scattered Zipf workload (fixed, so that its hot keys are the
/// same keys in every run and the warm-ups warm what the runs read).
pub const PERMUTE_SEED: u64 = 5432;
/// The Zipf exponent.
pub const ZIPF_S: f64 = 1.1;
/// pgbench's query mode.
pub const MODE: &str = "prepared";

/// The targets, in report order: two refract policies, the reference (`ideal`: each
/// replica's clients straight to it, its key range only), and the reference through refract
/// (`ideal-refract`, opt-in: the same clients through one refract per replica whose only
/// replica is that one, so that refract's own cost per query is in it too).
pub const TARGETS: [&str; 4] = ["peak-ewma", "affinity", "ideal", "ideal-refract"];

/// The targets run unless `--targets` says otherwise.
pub const DEFAULT_TARGETS: &str = "peak-ewma,affinity,ideal";

/// How keys are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Dist {
    /// Every key alike: `random(1, rows)`.
    Uniform,
    /// Zipf, s = 1.1, the hot keys in key order (1 the hottest; neighbours stored together).
    Zipf,
    /// Zipf, s = 1.1, the hot keys scattered over the key space by `permute`.
    ZipfScattered,
}

impl Dist {
    /// Every workload, in report order.
    pub const ALL: [Dist; 3] = [Dist::Uniform, Dist::Zipf, Dist::ZipfScattered];

    /// The name on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Dist::Uniform => "uniform",
            Dist::Zipf => "zipf",
            Dist::ZipfScattered => "zipf-scattered",
        }
    }

    /// The pgbench script: keys from `:lo` to `:lo + :len - 1` (through refract the whole
    /// table, `lo = 1`, `len = rows`; for the ideal one replica's range).
    pub fn script(self) -> String {
        let draw = match self {
            Dist::Uniform => "\\set id :lo + random(0, :len - 1)".to_string(),
            Dist::Zipf => format!("\\set id :lo - 1 + random_zipfian(1, :len, {ZIPF_S})"),
            Dist::ZipfScattered => {
                format!("\\set id :lo + permute(random_zipfian(1, :len, {ZIPF_S}) - 1, :len, {PERMUTE_SEED})")
            }
        };
        format!("{draw}\nSELECT pad FROM {TABLE} WHERE {COLUMN} = :id;\n")
    }

    /// The script's file name in the run's directory (and in the report).
    pub fn file(self) -> String {
        format!("{}.sql", self.name())
    }
}

/// A read cap per replica (`blkio.throttle.read_iops_device`), or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Iops(pub Option<u32>);

impl Iops {
    /// `none` or a number of reads per second.
    pub fn parse(s: &str) -> Result<Iops> {
        match s.trim() {
            "none" | "" => Ok(Iops(None)),
            n => {
                let v: u32 = n.parse().with_context(|| format!("--iops: {n:?} is neither `none` nor a number"))?;
                if v == 0 {
                    bail!("--iops: 0 would stop every read; `none` is no cap");
                }
                Ok(Iops(Some(v)))
            }
        }
    }

    /// `unthrottled` or `5000 IOPS`.
    pub fn label(self) -> String {
        match self.0 {
            None => "unthrottled".into(),
            Some(n) => format!("{n} IOPS"),
        }
    }

    /// `none` or `5000`, as `--iops` takes it.
    pub fn arg(self) -> String {
        self.0.map_or_else(|| "none".into(), |n| n.to_string())
    }
}

/// Options of `bench pg-cache`.
#[derive(Debug, Clone, Args)]
#[command(after_long_help = "Needs root (cgroups) and PostgreSQL 15's server and pgbench. \
A very small smoke run: `refract bench pg-cache --rows 20000 --duration 3 --warmup 1 --pairs 1 \
--out /tmp/pgcache.md`. The full shape takes about (variants × workloads × pairs × targets × \
(warm-up + duration)) plus a few minutes of loading: the start prints its estimate.")]
pub struct PgCacheArgs {
    /// Streaming replicas (each in its own memory cgroup).
    #[arg(long, default_value_t = 2)]
    pub replicas: usize,
    /// Each replica's memory cgroup limit (`memory.limit_in_bytes`; K, M, G binary).
    #[arg(long, default_value = "384M", value_parser = ByteSize::parse)]
    pub replica_mem: ByteSize,
    /// Rows of `rf_cache` (about 255 bytes each with the index: 2.1 M ≈ 530 MB).
    #[arg(long, default_value_t = 2_100_000)]
    pub rows: u64,
    /// Each replica's read cap: `none`, or IOPS (`blkio.throttle.read_iops_device` on the data
    /// disk), comma-separated for several variants on the same cluster.
    #[arg(long, default_value = "none,5000", value_delimiter = ',', value_parser = Iops::parse)]
    pub iops: Vec<Iops>,
    /// The workloads, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "uniform,zipf,zipf-scattered")]
    pub dists: Vec<Dist>,
    /// The targets, comma-separated: `peak-ewma`, `affinity` (refract's policies), `ideal`
    /// (straight to the replica owning the key range) and `ideal-refract` (the same through one
    /// refract per replica, that replica its only one; not run unless named).
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_TARGETS)]
    pub targets: Vec<String>,
    /// pgbench clients (`-c`); refract's `pool_size` per server.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// pgbench threads (`-j`) through refract (the ideal runs one pgbench per replica).
    #[arg(long, default_value_t = 2)]
    pub jobs: usize,
    /// Seconds of unrecorded load before every run, through the same target.
    #[arg(long, default_value_t = 60)]
    pub warmup: u64,
    /// Seconds per recorded run (`-T`).
    #[arg(long, default_value_t = 60)]
    pub duration: u64,
    /// Pairs per workload and variant: one run of every target each, the order rotating.
    #[arg(long, default_value_t = 5)]
    pub pairs: usize,
    /// `[balance] affinity_load_factor` of the affinity runs.
    #[arg(long, default_value_t = 1.25)]
    pub load_factor: f64,
    /// The markdown page; the section between `<!-- pgcache:loopback -->` markers is replaced.
    #[arg(long, default_value = "docs/benchmarks.md")]
    pub out: PathBuf,
    /// The refract binary to benchmark (default: this one).
    #[arg(long, hide = true)]
    pub refract_bin: Option<PathBuf>,
}

/// What `bench pg-cache` does, resolved.
#[derive(Debug, Clone)]
pub struct PgCacheOptions {
    /// Streaming replicas.
    pub replicas: usize,
    /// Memory cgroup limit per replica, bytes.
    pub replica_mem: u64,
    /// Rows.
    pub rows: u64,
    /// The read-cap variants, in order.
    pub iops: Vec<Iops>,
    /// The workloads, in [`Dist::ALL`] order.
    pub dists: Vec<Dist>,
    /// The targets, in [`TARGETS`] order.
    pub targets: Vec<&'static str>,
    /// `-c`.
    pub clients: usize,
    /// `-j` through refract.
    pub jobs: usize,
    /// Warm-up seconds before each run.
    pub warmup: u64,
    /// Seconds per run.
    pub duration: u64,
    /// Pairs.
    pub pairs: usize,
    /// `affinity_load_factor`.
    pub load_factor: f64,
    /// The page.
    pub out: PathBuf,
    /// The refract binary.
    pub refract_bin: PathBuf,
    /// The command line that reruns it.
    pub command: String,
}

impl PgCacheArgs {
    /// Resolves and checks the options.
    pub fn into_options(self) -> Result<PgCacheOptions> {
        let refract_bin = match self.refract_bin {
            Some(p) => p,
            None => std::env::current_exe().context("locating the refract binary")?,
        };
        if self.replicas == 0 {
            bail!("--replicas must be at least 1");
        }
        if self.clients < self.replicas {
            bail!(
                "--clients ({}) must be at least --replicas ({}): the ideal gives each replica clients",
                self.clients,
                self.replicas
            );
        }
        if self.rows < (self.replicas as u64) * 1024 {
            bail!("--rows must be at least 1024 per replica");
        }
        if self.load_factor.is_nan() || self.load_factor < 1.0 {
            bail!("--load-factor must be at least 1");
        }
        let asked: Vec<String> = self.targets.iter().map(|t| t.trim().to_string()).collect();
        let targets = crate::bench::pgbench::options::pick("target", &asked, &TARGETS)?;
        let dists: Vec<Dist> = Dist::ALL.into_iter().filter(|d| self.dists.contains(d)).collect();
        let mut iops: Vec<Iops> = vec![];
        for i in self.iops {
            if !iops.contains(&i) {
                iops.push(i);
            }
        }
        if iops.is_empty() || dists.is_empty() {
            bail!("--iops and --dists need at least one value each");
        }
        let (pairs, duration) = (self.pairs.max(1), self.duration.max(1));
        let mut command = format!(
            "sudo refract bench pg-cache --replicas {} --replica-mem {} --rows {} --iops {} --dists {} \
             --clients {} --jobs {} --warmup {} --duration {duration} --pairs {pairs}",
            self.replicas,
            self.replica_mem.human().replace(' ', "").replace("iB", ""),
            self.rows,
            iops.iter().map(|i| i.arg()).collect::<Vec<_>>().join(","),
            dists.iter().map(|d| d.name()).collect::<Vec<_>>().join(","),
            self.clients,
            self.jobs,
            self.warmup,
        );
        if targets.join(",") != DEFAULT_TARGETS {
            let _ = write!(command, " --targets {}", targets.join(","));
        }
        if self.load_factor != 1.25 {
            let _ = write!(command, " --load-factor {}", self.load_factor);
        }
        if self.out != Path::new("docs/benchmarks.md") {
            let _ = write!(command, " --out {}", self.out.display());
        }
        Ok(PgCacheOptions {
            replicas: self.replicas,
            replica_mem: self.replica_mem.0,
            rows: self.rows,
            iops,
            dists,
            targets,
            clients: self.clients,
            jobs: self.jobs.clamp(1, self.clients),
            warmup: self.warmup,
            duration,
            pairs,
            load_factor: self.load_factor,
            out: self.out,
            refract_bin,
            command,
        })
    }
}

impl PgCacheOptions {
    /// Runs of `targets` targets: every variant, workload and pair.
    pub fn runs(&self, targets: usize) -> usize {
        self.iops.len() * self.dists.len() * self.pairs * targets
    }

    /// Seconds those runs take (not the loading), each a warm-up and a run, and a few
    /// seconds of starting and counting.
    pub fn estimate_secs(&self, targets: usize) -> u64 {
        self.runs(targets) as u64 * (self.warmup + self.duration + 3)
    }
}

/// The ideal's split: replica `i` of `n` owns keys `lo..=hi` of `1..=rows` (contiguous, sizes
/// differing by at most one) and gets `clients` of the clients (likewise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// First key.
    pub lo: u64,
    /// Last key.
    pub hi: u64,
    /// Clients.
    pub clients: usize,
}

impl Part {
    /// Keys in the range (never none: a part has at least one key).
    pub fn keys(&self) -> u64 {
        self.hi + 1 - self.lo
    }
}

/// `rows` keys and `clients` clients over `n` replicas: halves with two, thirds with three.
pub fn split(rows: u64, clients: usize, n: usize) -> Vec<Part> {
    let n64 = n.max(1) as u64;
    let n = n.max(1);
    (0..n)
        .map(|i| {
            let i64_ = i as u64;
            let lo = 1 + i64_ * rows / n64;
            let hi = (i64_ + 1) * rows / n64;
            let clients = (i + 1) * clients / n - i * clients / n;
            Part { lo, hi, clients }
        })
        .collect()
}

/// The pgbench load of one script over keys `lo..lo+len`.
pub fn load(script: &Path, clients: usize, jobs: usize, seconds: u64, lo: u64, len: u64) -> Load {
    let script = vec![
        "-f".into(),
        script.to_string_lossy().into_owned(),
        "-D".into(),
        format!("lo={lo}"),
        "-D".into(),
        format!("len={len}"),
    ];
    Load { clients, jobs, seconds, mode: MODE.into(), script }
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

/// refract's config for `policy` (`peak-ewma` or `affinity`) over the primary and the replicas
/// (ports on 127.0.0.1), `pool` connections per server. Everything else is a shipped default;
/// the affinity runs add `affinity_load_factor` and the `[[postgres.affinity]]` table.
pub fn config(policy: &str, primary: u16, replicas: &[u16], pool: usize, load_factor: f64, ports: Ports) -> String {
    let mut s = format!(
        "# Generated by refract-lab (lab/src/bench/pgcache.rs) for `refract bench pg-cache`.\n\
         [http]\nlisten = \"127.0.0.1:{http}\"\n\n[listen]\nadmin = \"127.0.0.1:{admin}\"\n\n\
         [admin]\ninsecure_loopback = true\n\n\
         [balance]\npolicy = \"{policy}\"\n",
        http = ports.http,
        admin = ports.admin,
    );
    if policy == "affinity" {
        let _ = writeln!(s, "affinity_load_factor = {}", toml_float(load_factor));
    }
    let _ = write!(
        s,
        "\n[postgres]\nlisten = \"127.0.0.1:{pg}\"\ndatabase = \"{DATABASE}\"\npool_mode = \"transaction\"\n\
         pool_size = {pool}\nserver_user = \"{USER}\"\nserver_password = \"{PASSWORD}\"\n\n\
         [[postgres.user]]\nname = \"{USER}\"\npassword = \"{PASSWORD}\"\nauth = \"scram-sha-256\"\n\n\
         [[postgres.server]]\nname = \"primary\"\naddr = \"127.0.0.1:{primary}\"\nrole = \"primary\"\n",
        pg = ports.pg,
    );
    for (i, port) in replicas.iter().enumerate() {
        let _ = write!(
            s,
            "\n[[postgres.server]]\nname = \"{}\"\naddr = \"127.0.0.1:{port}\"\nrole = \"replica\"\n",
            replica_name(i)
        );
    }
    if policy == "affinity" {
        let _ = write!(s, "\n[[postgres.affinity]]\ntable = \"{TABLE}\"\ncolumn = \"{COLUMN}\"\n");
    }
    s
}

/// `1.25`, `2.0`: a TOML float even when whole.
fn toml_float(v: f64) -> String {
    let s = v.to_string();
    if s.contains('.') || s.contains('e') {
        s
    } else {
        format!("{s}.0")
    }
}

/// `replica1`, `replica2`, … (also the cgroups' `rf-cache-replica1`).
pub fn replica_name(i: usize) -> String {
    format!("replica{}", i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: PgCacheArgs,
    }

    fn options(args: &[&str]) -> Result<PgCacheOptions> {
        let mut v = vec!["x", "--refract-bin", "/bin/true"];
        v.extend(args);
        Cli::try_parse_from(v).map_err(|e| anyhow::anyhow!("{e}"))?.args.into_options()
    }

    #[test]
    fn halves_and_thirds_cover_every_key_and_client_once() {
        assert_eq!(
            split(2_100_000, 16, 2),
            vec![Part { lo: 1, hi: 1_050_000, clients: 8 }, Part { lo: 1_050_001, hi: 2_100_000, clients: 8 }]
        );
        let thirds = split(20_000, 16, 3);
        assert_eq!(thirds.iter().map(|p| p.clients).sum::<usize>(), 16);
        assert_eq!(thirds.iter().map(Part::keys).sum::<u64>(), 20_000);
        assert_eq!((thirds[0].lo, thirds[2].hi), (1, 20_000));
        for w in thirds.windows(2) {
            assert_eq!(w[0].hi + 1, w[1].lo, "contiguous");
        }
        assert!(thirds.iter().all(|p| (6666..=6667).contains(&p.keys()) && (5..=6).contains(&p.clients)));
        assert_eq!(split(10, 3, 1), vec![Part { lo: 1, hi: 10, clients: 3 }]);
    }

    #[test]
    fn scripts_draw_from_their_range() {
        let u = Dist::Uniform.script();
        assert!(u.starts_with("\\set id :lo + random(0, :len - 1)\n"), "{u}");
        assert!(u.ends_with("SELECT pad FROM rf_cache WHERE id = :id;\n"), "{u}");
        assert!(Dist::Zipf.script().contains("random_zipfian(1, :len, 1.1)"));
        let s = Dist::ZipfScattered.script();
        assert!(s.contains(":lo + permute(random_zipfian(1, :len, 1.1) - 1, :len, 5432)"), "{s}");
        let l = load(Path::new("/w/uniform.sql"), 8, 1, 20, 1_050_001, 1_050_000);
        assert_eq!(l.shown(), "pgbench -n -f /w/uniform.sql -D lo=1050001 -D len=1050000 -c 8 -j 1 -T 20 -M prepared");
    }

    #[test]
    fn defaults_and_the_rerun_line() {
        let o = options(&[]).expect("options");
        assert_eq!((o.replicas, o.replica_mem, o.rows, o.clients, o.jobs), (2, 384 << 20, 2_100_000, 16, 2));
        assert_eq!((o.warmup, o.duration, o.pairs), (60, 60, 5));
        assert_eq!(o.iops, vec![Iops(None), Iops(Some(5000))]);
        assert_eq!(o.targets, TARGETS[..3].to_vec());
        assert_eq!(o.dists, Dist::ALL.to_vec());
        assert_eq!(
            o.command,
            "sudo refract bench pg-cache --replicas 2 --replica-mem 384M --rows 2100000 --iops none,5000 \
             --dists uniform,zipf,zipf-scattered --clients 16 --jobs 2 --warmup 60 --duration 60 --pairs 5"
        );
        let q = options(&["--rows", "20000", "--duration", "3", "--warmup", "1", "--pairs", "1", "--iops", "none"])
            .expect("smoke");
        assert_eq!((q.rows, q.duration, q.warmup, q.pairs, q.iops.clone()), (20_000, 3, 1, 1, vec![Iops(None)]));
        assert_eq!((q.runs(3), q.estimate_secs(2)), (9, 3 * 2 * (1 + 3 + 3)));
        let t = options(&["--targets", "ideal,peak-ewma", "--dists", "zipf,uniform"]).expect("subset");
        assert_eq!((t.targets, t.dists), (vec!["peak-ewma", "ideal"], vec![Dist::Uniform, Dist::Zipf]));
        assert!(options(&["--targets", "round-robin"]).is_err());
        let r = options(&["--targets", "peak-ewma,ideal-refract,ideal"]).expect("ideal-refract");
        assert_eq!(r.targets, vec!["peak-ewma", "ideal", "ideal-refract"]);
        assert!(r.command.ends_with(" --targets peak-ewma,ideal,ideal-refract"), "{}", r.command);
        assert!(options(&["--iops", "0"]).is_err());
        assert!(options(&["--replicas", "3", "--clients", "2"]).is_err());
    }

    #[test]
    fn configs_name_every_server_and_only_affinity_has_its_keys() {
        let ports = Ports { pg: 6432, http: 8080, admin: 8081 };
        let p = config("peak-ewma", 5433, &[5434, 5435], 16, 1.25, ports);
        if let Err(e) = refract_dispatch::config::parse(&p) {
            panic!("peak-ewma: {e}\n{p}");
        }
        let v: toml::Value = toml::from_str(&p).expect("toml");
        assert_eq!(v["balance"]["policy"].as_str(), Some("peak-ewma"));
        assert!(v["balance"].get("affinity_load_factor").is_none() && v["postgres"].get("affinity").is_none());
        let servers = v["postgres"]["server"].as_array().expect("servers");
        let roles: Vec<_> = servers.iter().map(|s| (s["name"].as_str(), s["role"].as_str())).collect();
        assert_eq!(
            roles,
            vec![
                (Some("primary"), Some("primary")),
                (Some("replica1"), Some("replica")),
                (Some("replica2"), Some("replica"))
            ]
        );
        assert_eq!(v["postgres"]["pool_size"].as_integer(), Some(16));
        let a: toml::Value = toml::from_str(&config("affinity", 5433, &[5434], 16, 2.0, ports)).expect("toml");
        assert_eq!(a["balance"]["policy"].as_str(), Some("affinity"));
        assert_eq!(a["balance"]["affinity_load_factor"].as_float(), Some(2.0));
        let t = &a["postgres"]["affinity"][0];
        assert_eq!((t["table"].as_str(), t["column"].as_str()), (Some("rf_cache"), Some("id")));
    }
}
