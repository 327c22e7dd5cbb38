//! The demo's PostgreSQL section (lab only): the PostgreSQL cluster of `lab up --cluster --db
//! postgres` takes the HTTP cluster's place on the same fabric, rf-c1 and rf-c2 fetch a 64 MiB
//! result at once through the relay (VIP:6433) and through hybrid (VIP:6432) with
//! `bench pg-large`'s psql fetch, and one line gives both rates, their ratio and the hand-overs
//! the hybrid dispatcher counted.

use crate::bench::pglarge::{fetch, run::hybrid_stats};
use crate::bench::sweep::handover_stats::HandoverStats;
use crate::pglab::{self, layout, pgbouncer};
use crate::report::ratio;
use crate::support::units::{format_bytes, sig3, ByteSize};
use crate::support::{interrupt, sh};
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The result both clients fetch: the story's large end (64 rows of 1 MiB).
pub const RESULT: ByteSize = ByteSize(64 << 20);

/// The programs the PostgreSQL lab runs, PostgreSQL's server programs first.
const PG_TOOLS: [&str; 4] = ["initdb", "pg_ctl", "pg_basebackup", "psql"];

/// Why the section cannot run on this machine, if it cannot: a program the PostgreSQL lab
/// needs is missing.
pub fn unavailable() -> Option<String> {
    let installed = |t: &str| refract_testkit::tool(t).ok().filter(|p| p.exists());
    let others = [("runuser", sh::have("runuser")), (pgbouncer::BINARY, Path::new(pgbouncer::BINARY).exists())];
    missing(installed, &others)
}

/// The first missing program, said as what to install: `installed` finds a PostgreSQL
/// program, `others` says which other programs are there.
fn missing(installed: impl Fn(&str) -> Option<PathBuf>, others: &[(&str, bool)]) -> Option<String> {
    if let Some(tool) = PG_TOOLS.iter().find(|t| installed(t).is_none()) {
        return Some(format!(
            "PostgreSQL's `{tool}` is not installed (Debian: apt-get install postgresql; or set REFRACT_PG_BINDIR)"
        ));
    }
    let (program, _) = others.iter().find(|(_, there)| !there)?;
    Some(format!("`{program}` is not installed (Debian: apt-get install pgbouncer util-linux)"))
}

/// The PostgreSQL cluster, started for the section; dropping it stops it and deletes its data
/// (also when the section fails or is interrupted).
pub struct PgCluster {
    /// How long it took to come up: initdb, base backup, both servers, agents, dispatchers.
    pub took: Duration,
}

impl PgCluster {
    /// Start it in the lab's fabric (which must be up, without the HTTP cluster), `refract_bin`
    /// as its agents and dispatchers; on failure what was started is stopped.
    pub fn start(refract_bin: &Path) -> Result<Self> {
        eprintln!("starting the PostgreSQL cluster (initdb, a base backup for the replica, agents, refract)…");
        let started = Instant::now();
        pglab::start(refract_bin)?;
        Ok(PgCluster { took: started.elapsed() })
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        eprintln!("stopping the PostgreSQL cluster");
        pglab::stop();
    }
}

/// What the section shows.
#[derive(Debug, Clone, Default)]
pub struct Story {
    /// Bytes/s over both clients through the relay.
    pub relay: f64,
    /// Bytes/s over both clients through hybrid.
    pub hybrid: f64,
    /// The hybrid dispatcher's hand-over counters over both fetches.
    pub handovers: HandoverStats,
    /// How long the cluster took to come up.
    pub cluster_up: Duration,
}

/// Both clients fetch [`RESULT`] through the relay, then through hybrid; the hand-overs are the
/// hybrid dispatcher's `/metrics` difference over the two.
pub fn measure(cluster: &PgCluster) -> Result<Story> {
    let before = hybrid_stats()?;
    let relay = fetch::measure("relay", RESULT.0)?;
    interrupt::check()?;
    let hybrid = fetch::measure("hybrid", RESULT.0)?;
    let handovers = hybrid_stats()?.since(&before);
    Ok(Story { relay, hybrid, handovers, cluster_up: cluster.took })
}

/// MiB/s of bytes/s.
fn mib(bps: f64) -> String {
    format!("{} MiB/s", sig3(bps / f64::from(1u32 << 20)))
}

impl Story {
    /// The section: a heading and one line.
    pub fn render(&self) -> String {
        let h = &self.handovers;
        let declined: Vec<String> = h.declined().iter().map(|(r, v)| format!(", {v:.0} declined ({r})")).collect();
        format!(
            "== PostgreSQL: a {} result (`{}`), rf-c1 and rf-c2 at once with psql; primary and \
             streaming replica with an agent each, up in {:.1} s\n\n\
             relay ({}) {}, hybrid ({}) {}: hybrid / relay {}; hand-overs {:.0}{}, {} sent by the agents\n",
            RESULT.human(),
            fetch::query(RESULT.0),
            self.cluster_up.as_secs_f64(),
            layout::vip(6433),
            mib(self.relay),
            layout::vip(6432),
            mib(self.hybrid),
            ratio(self.hybrid, self.relay),
            h.handovers(),
            declined.concat(),
            format_bytes(h.bytes_direct),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_gives_both_rates_their_ratio_and_the_hand_overs() {
        let mib = f64::from(1u32 << 20);
        let handovers = HandoverStats::parse(
            "refract_handover_total{backend=\"b1\",front=\"postgres\",result=\"ok\"} 1\n\
             refract_handover_total{backend=\"b2\",front=\"postgres\",result=\"ok\"} 1\n\
             refract_bytes_direct_total{backend=\"b1\",front=\"postgres\"} 134217728\n",
        );
        let story =
            Story { relay: 110.0 * mib, hybrid: 220.0 * mib, handovers, cluster_up: Duration::from_millis(7400) };
        let s = story.render();
        assert!(
            s.starts_with("== PostgreSQL: a 64 MiB result (`select repeat('x', 1048576) from generate_series(1, 64)`)")
        );
        assert!(s.contains("up in 7.4 s\n"), "{s}");
        let line = "relay (198.18.0.100:6433) 110 MiB/s, hybrid (198.18.0.100:6432) 220 MiB/s: hybrid / relay \
                    2.00×; hand-overs 2, 128 MiB sent by the agents\n";
        assert!(s.ends_with(line), "{s}");
    }

    #[test]
    fn declined_hand_overs_are_named() {
        let handovers = HandoverStats::parse(
            "refract_handover_total{backend=\"b1\",front=\"postgres\",result=\"not_quiescent\"} 2\n",
        );
        let s = Story { relay: 1.0, hybrid: 1.0, handovers, ..Story::default() }.render();
        assert!(s.contains("hand-overs 0, 2 declined (not_quiescent), 0 B sent"), "{s}");
    }

    #[test]
    fn a_missing_server_program_or_pooler_is_named() {
        let all = |_: &str| Some(PathBuf::from("/bin/true"));
        assert_eq!(missing(all, &[("runuser", true)]), None);
        let no_initdb = |t: &str| (t != "initdb").then(|| PathBuf::from("/bin/true"));
        let why = missing(no_initdb, &[("runuser", true)]).expect("initdb missing");
        assert!(why.starts_with("PostgreSQL's `initdb` is not installed"), "{why}");
        let why = missing(all, &[("runuser", true), ("/usr/sbin/pgbouncer", false)]).expect("pgbouncer missing");
        assert!(why.starts_with("`/usr/sbin/pgbouncer` is not installed"), "{why}");
    }
}
