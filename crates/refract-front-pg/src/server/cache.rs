//! What each server's buffer cache does, as PostgreSQL counts it: the health loop reads
//! [`CACHE_PROBE`] on the server's probe connection every `cache_stats_interval_ms`
//! (`probes.rs`), and [`Cache`] turns two samples into figures over the interval between them:
//! blocks found in shared buffers (`hit`) and blocks read from outside them (`read`, the OS
//! page cache or the disk), for the database and for its most used relations.
//!
//! A counter that went down (the server restarted, or its statistics were reset) starts a new
//! baseline: that interval has no figures, never negative ones.
//!
//! A server that starts taking reads again (it joined, came back up, was undrained:
//! [`Cache::start_warming`]) has a cold cache for what it will now serve: it is *warming* until an interval's hit ratio reaches
//! [`WARM_RATIO`] over at least [`WARM_MIN_BLOCKS`] blocks, or for [`WARM_MAX`] at most.

use serde::Serialize;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How many relations a sample reads: the most touched since the server's statistics were
/// reset (the per-interval figures of the others are not known).
pub(crate) const RELATIONS_READ: usize = 200;

/// How many relations a server's view shows: the most touched over the last interval, then
/// since the statistics were reset.
pub(crate) const RELATIONS_SHOWN: usize = 20;

/// Warming ends at the first interval whose hit ratio reaches this...
pub(crate) const WARM_RATIO: f64 = 0.9;

/// ...over at least this many blocks (an interval with a handful of blocks says nothing)...
pub(crate) const WARM_MIN_BLOCKS: u64 = 100;

/// ...or after this long, whatever the ratio.
pub(crate) const WARM_MAX: Duration = Duration::from_secs(300);

/// The database's counters (`pg_stat_database`, one row `d`), then the [`RELATIONS_READ`] user
/// tables touched most (`pg_statio_user_tables`, rows `r`: heap and index blocks), each as
/// (kind, relid, name, hit, read, index hit, index read). A relation is named as in `tables`:
/// `name`, or `schema.name` outside `public`.
pub(crate) const CACHE_PROBE: &str = "\
SELECT 'd', 0::oid, NULL::text, blks_hit, blks_read, 0::bigint, 0::bigint \
FROM pg_stat_database WHERE datname = current_database() \
UNION ALL (\
SELECT 'r', relid, CASE WHEN schemaname = 'public' THEN relname::text ELSE schemaname || '.' || relname END, \
coalesce(heap_blks_hit, 0), coalesce(heap_blks_read, 0), coalesce(idx_blks_hit, 0), coalesce(idx_blks_read, 0) \
FROM pg_statio_user_tables \
ORDER BY coalesce(heap_blks_hit, 0) + coalesce(heap_blks_read, 0) + coalesce(idx_blks_hit, 0) + coalesce(idx_blks_read, 0) DESC, relid \
LIMIT 200)";

/// Blocks found in shared buffers (`hit`) and read from outside them (`read`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Blocks {
    /// Found in shared buffers.
    pub hit: u64,
    /// Read from outside them.
    pub read: u64,
}

impl Blocks {
    /// Both.
    pub fn touched(self) -> u64 {
        self.hit.saturating_add(self.read)
    }

    /// `hit / (hit + read)`; `None` when no block was touched.
    pub fn ratio(self) -> Option<f64> {
        let touched = self.touched();
        (touched > 0).then(|| self.hit as f64 / touched as f64)
    }

    /// The blocks counted from `before` to `self`; `None` when a counter went down (the server
    /// restarted or its statistics were reset: `self` is a new baseline).
    pub fn since(self, before: Blocks) -> Option<Blocks> {
        Some(Blocks { hit: self.hit.checked_sub(before.hit)?, read: self.read.checked_sub(before.read)? })
    }

    fn plus(self, other: Blocks) -> Blocks {
        Blocks { hit: self.hit.saturating_add(other.hit), read: self.read.saturating_add(other.read) }
    }
}

/// One relation's counters as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Relation {
    pub relid: u32,
    pub name: String,
    pub heap: Blocks,
    pub idx: Blocks,
}

/// One reading of [`CACHE_PROBE`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Sample {
    pub db: Blocks,
    pub relations: Vec<Relation>,
}

impl Sample {
    /// From [`CACHE_PROBE`]'s rows; `None` without the database's row (or with a malformed one).
    pub(crate) fn from_rows(rows: &[Vec<Option<String>>]) -> Option<Sample> {
        let num = |row: &[Option<String>], i: usize| -> Option<u64> { row.get(i)?.as_deref()?.parse().ok() };
        let blocks = |row: &[Option<String>], i: usize| Some(Blocks { hit: num(row, i)?, read: num(row, i + 1)? });
        let mut db = None;
        let mut relations = Vec::new();
        for row in rows {
            match row.first().and_then(|k| k.as_deref()) {
                Some("d") => db = Some(blocks(row, 3)?),
                Some("r") if relations.len() < RELATIONS_READ => {
                    let (Some(relid), Some(Some(name))) = (num(row, 1), row.get(2)) else { continue };
                    let (Some(heap), Some(idx)) = (blocks(row, 3), blocks(row, 5)) else { continue };
                    relations.push(Relation { relid: relid as u32, name: name.clone(), heap, idx });
                }
                _ => {}
            }
        }
        Some(Sample { db: db?, relations })
    }
}

/// A server's cache as `/pg/servers` shows it (`cache`). Counters are the server's own, since
/// its statistics were last reset; `interval_*` are over the last interval between two
/// samples (`None`: no interval yet, or a counter went down during it).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CacheView {
    /// When the last sample was read (Unix milliseconds; 0 = never).
    pub sampled_unix_ms: u64,
    /// The last interval's length in seconds.
    pub interval_seconds: Option<f64>,
    /// The database's blocks found in shared buffers (`pg_stat_database.blks_hit`).
    pub blks_hit: Option<u64>,
    /// The database's blocks read from outside them (`blks_read`).
    pub blks_read: Option<u64>,
    /// `blks_hit / (blks_hit + blks_read)`.
    pub hit_ratio: Option<f64>,
    /// `blks_hit` over the last interval.
    pub interval_blks_hit: Option<u64>,
    /// `blks_read` over the last interval.
    pub interval_blks_read: Option<u64>,
    /// The hit ratio over the last interval (`None` also when it touched no block).
    pub interval_hit_ratio: Option<f64>,
    /// Its cache is cold for what it now serves (it joined, came back up or was undrained).
    pub warming: bool,
    /// Since when it is warming (Unix milliseconds).
    pub warming_since_unix_ms: Option<u64>,
    /// The [`RELATIONS_SHOWN`] relations touched most over the last interval, then since the
    /// statistics were reset.
    pub relations: Vec<RelationView>,
}

/// One relation in [`CacheView::relations`]: its heap and index blocks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RelationView {
    /// `name`, or `schema.name` outside `public`.
    pub name: String,
    /// `pg_statio_user_tables.heap_blks_hit`.
    pub heap_blks_hit: u64,
    /// `heap_blks_read`.
    pub heap_blks_read: u64,
    /// `idx_blks_hit` (all its indexes).
    pub idx_blks_hit: u64,
    /// `idx_blks_read`.
    pub idx_blks_read: u64,
    /// Heap and index: hit / (hit + read).
    pub hit_ratio: Option<f64>,
    /// Heap and index blocks hit over the last interval.
    pub interval_blks_hit: Option<u64>,
    /// Heap and index blocks read over the last interval.
    pub interval_blks_read: Option<u64>,
    /// Their ratio.
    pub interval_hit_ratio: Option<f64>,
}

/// A change of warming, for the log.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Warm {
    /// It started warming, for this reason.
    Started(&'static str),
    /// It stopped: its interval hit ratio reached [`WARM_RATIO`] (`timed_out` false) or
    /// [`WARM_MAX`] passed; after this long, at that last interval's ratio.
    Ended { after: Duration, ratio: Option<f64>, timed_out: bool },
}

/// Each relation's (heap, index) counters by relid, as of a sample.
type Baselines = HashMap<u32, (Blocks, Blocks)>;

/// A server's cache knowledge: the last sample (the next interval's baseline) and the view.
#[derive(Debug, Default)]
pub(crate) struct Cache {
    /// When the last sample was read, the database's and each relation's counters then.
    last: Option<(Instant, Blocks, Baselines)>,
    view: CacheView,
    /// Since when it is warming (monotonic).
    warming: Option<Instant>,
}

impl Cache {
    /// What `/pg/servers` shows.
    pub(crate) fn view(&self) -> CacheView {
        self.view.clone()
    }

    /// What the gauges show: the last interval's hit ratio and whether it is warming (`None`:
    /// never sampled).
    pub(crate) fn gauges(&self) -> Option<(Option<f64>, bool)> {
        (self.view.sampled_unix_ms > 0).then_some((self.view.interval_hit_ratio, self.view.warming))
    }

    /// Whether a sample is due at `now`, `every` after the last.
    pub(crate) fn due(&self, now: Instant, every: Duration) -> bool {
        self.last.as_ref().is_none_or(|(at, _, _)| now.duration_since(*at) >= every)
    }

    /// Records `sample`, read at `now` (`unix_ms`); returns the database's blocks over the
    /// interval (none for the first sample or after a counter went down) and whether warming
    /// ended.
    pub(crate) fn record(&mut self, sample: Sample, now: Instant, unix_ms: u64) -> (Option<Blocks>, Option<Warm>) {
        let last = self.last.take();
        let (interval, db, before) = match &last {
            Some((at, db, rels)) => (Some(now.duration_since(*at)), sample.db.since(*db), Some(rels)),
            None => (None, None, None),
        };
        let warming = (self.view.warming, self.view.warming_since_unix_ms);
        self.view = CacheView {
            sampled_unix_ms: unix_ms,
            interval_seconds: interval.map(|d| d.as_secs_f64()),
            blks_hit: Some(sample.db.hit),
            blks_read: Some(sample.db.read),
            hit_ratio: sample.db.ratio(),
            interval_blks_hit: db.map(|b| b.hit),
            interval_blks_read: db.map(|b| b.read),
            interval_hit_ratio: db.and_then(Blocks::ratio),
            warming: warming.0,
            warming_since_unix_ms: warming.1,
            relations: relations_view(&sample.relations, before),
        };
        let rels = sample.relations.iter().map(|r| (r.relid, (r.heap, r.idx))).collect();
        self.last = Some((now, sample.db, rels));
        (db, self.warm_check(db, now))
    }

    /// Ends warming when `db` (the last interval) reached [`WARM_RATIO`] or [`WARM_MAX`] passed.
    fn warm_check(&mut self, db: Option<Blocks>, now: Instant) -> Option<Warm> {
        let since = self.warming?;
        let ratio = db.filter(|b| b.touched() >= WARM_MIN_BLOCKS).and_then(Blocks::ratio);
        let after = now.duration_since(since);
        let warm = ratio.is_some_and(|r| r >= WARM_RATIO);
        if !warm && after < WARM_MAX {
            return None;
        }
        self.warming = None;
        self.view.warming = false;
        self.view.warming_since_unix_ms = None;
        Some(Warm::Ended { after, ratio: db.and_then(Blocks::ratio), timed_out: !warm })
    }

    /// Starts warming for `reason` (`Warm::Started`), or starts its clock again when it already
    /// is warming (`None`: it was logged then). The interval that was running when it went cold
    /// counts nothing: the next sample is a new baseline.
    pub(crate) fn start_warming(&mut self, reason: &'static str, now: Instant, unix_ms: u64) -> Option<Warm> {
        let already = self.warming.replace(now).is_some();
        self.view.warming = true;
        self.view.warming_since_unix_ms = Some(unix_ms);
        self.last = None;
        (!already).then_some(Warm::Started(reason))
    }
}

/// The relations of a sample as shown: the [`RELATIONS_SHOWN`] touched most over the interval
/// (from `before`, the last sample's counters by relid), then since the statistics were reset;
/// relations never touched are left out.
fn relations_view(now: &[Relation], before: Option<&Baselines>) -> Vec<RelationView> {
    let mut list: Vec<RelationView> = now
        .iter()
        .filter(|r| r.heap.plus(r.idx).touched() > 0)
        .map(|r| {
            let interval = before.and_then(|b| b.get(&r.relid)).and_then(|(heap, idx)| {
                let heap = r.heap.since(*heap)?;
                let idx = r.idx.since(*idx)?;
                Some(heap.plus(idx))
            });
            RelationView {
                name: r.name.clone(),
                heap_blks_hit: r.heap.hit,
                heap_blks_read: r.heap.read,
                idx_blks_hit: r.idx.hit,
                idx_blks_read: r.idx.read,
                hit_ratio: r.heap.plus(r.idx).ratio(),
                interval_blks_hit: interval.map(|b| b.hit),
                interval_blks_read: interval.map(|b| b.read),
                interval_hit_ratio: interval.and_then(Blocks::ratio),
            }
        })
        .collect();
    let touched = |v: &RelationView| {
        let interval = v.interval_blks_hit.unwrap_or(0).saturating_add(v.interval_blks_read.unwrap_or(0));
        let total = [v.heap_blks_hit, v.heap_blks_read, v.idx_blks_hit, v.idx_blks_read]
            .iter()
            .fold(0u64, |a, b| a.saturating_add(*b));
        (interval, total)
    };
    list.sort_by(|a, b| touched(b).cmp(&touched(a)).then_with(|| a.name.cmp(&b.name)));
    list.truncate(RELATIONS_SHOWN);
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(hit: u64, read: u64) -> Blocks {
        Blocks { hit, read }
    }

    fn rel(relid: u32, name: &str, heap: Blocks, idx: Blocks) -> Relation {
        Relation { relid, name: name.into(), heap, idx }
    }

    fn sample(db: Blocks, relations: Vec<Relation>) -> Sample {
        Sample { db, relations }
    }

    #[test]
    fn probe_reads_as_many_relations_as_it_says() {
        assert!(CACHE_PROBE.ends_with(&format!("LIMIT {RELATIONS_READ})")), "{CACHE_PROBE}");
    }

    #[test]
    fn ratio_and_deltas() {
        assert_eq!(b(0, 0).ratio(), None);
        assert_eq!(b(3, 1).ratio(), Some(0.75));
        assert_eq!(b(5, 0).ratio(), Some(1.0));
        assert_eq!(b(0, 5).ratio(), Some(0.0));
        assert_eq!(b(10, 4).since(b(7, 4)), Some(b(3, 0)));
        assert_eq!(b(10, 4).since(b(10, 4)), Some(b(0, 0)));
        // A counter that went down is a new baseline, never a negative delta.
        assert_eq!(b(2, 9).since(b(7, 4)), None);
        assert_eq!(b(9, 2).since(b(7, 4)), None);
        assert_eq!(b(u64::MAX, 1).touched(), u64::MAX);
    }

    #[test]
    fn rows_parse_into_a_sample() {
        let row = |cols: &[Option<&str>]| cols.iter().map(|c| c.map(str::to_owned)).collect::<Vec<_>>();
        let rows = vec![
            row(&[Some("d"), Some("0"), None, Some("100"), Some("7"), Some("0"), Some("0")]),
            row(&[Some("r"), Some("16384"), Some("t"), Some("40"), Some("2"), Some("8"), Some("1")]),
            row(&[Some("r"), Some("16390"), Some("s.u"), Some("1"), Some("1"), Some("0"), Some("0")]),
            row(&[Some("r"), Some("16391"), None, Some("1"), Some("1"), Some("0"), Some("0")]),
        ];
        let s = Sample::from_rows(&rows).unwrap();
        assert_eq!(s.db, b(100, 7));
        assert_eq!(
            s.relations,
            vec![rel(16384, "t", b(40, 2), b(8, 1)), rel(16390, "s.u", b(1, 1), b(0, 0))],
            "a row without a name is skipped"
        );
        assert_eq!(Sample::from_rows(&rows[1..]), None, "no database row");
        assert_eq!(Sample::from_rows(&[row(&[Some("d"), Some("0"), None, Some("x"), Some("1")])]), None);
    }

    #[test]
    fn intervals_between_samples_and_a_reset_is_a_new_baseline() {
        let mut c = Cache::default();
        let t0 = Instant::now();
        assert!(c.due(t0, Duration::from_secs(5)));
        assert_eq!(c.gauges(), None, "never sampled: no gauges");
        let (db, warm) = c.record(sample(b(100, 50), vec![rel(1, "t", b(10, 10), b(0, 0))]), t0, 1000);
        assert_eq!((db, warm), (None, None), "the first sample is a baseline");
        let v = c.view();
        assert_eq!((v.blks_hit, v.blks_read, v.hit_ratio), (Some(100), Some(50), Some(100.0 / 150.0)));
        assert_eq!((v.interval_hit_ratio, v.interval_seconds, v.sampled_unix_ms), (None, None, 1000));
        assert_eq!(v.relations[0].interval_blks_hit, None);
        assert_eq!(v.relations[0].hit_ratio, Some(0.5));
        assert!(!c.due(t0 + Duration::from_secs(4), Duration::from_secs(5)));
        assert!(c.due(t0 + Duration::from_secs(5), Duration::from_secs(5)));

        let t1 = t0 + Duration::from_secs(5);
        let (db, _) = c.record(sample(b(190, 60), vec![rel(1, "t", b(40, 10), b(5, 5))]), t1, 6000);
        assert_eq!(db, Some(b(90, 10)));
        let v = c.view();
        assert_eq!((v.interval_blks_hit, v.interval_blks_read, v.interval_hit_ratio), (Some(90), Some(10), Some(0.9)));
        assert_eq!(v.interval_seconds, Some(5.0));
        assert_eq!(c.gauges(), Some((Some(0.9), false)));
        let r = &v.relations[0];
        assert_eq!((r.interval_blks_hit, r.interval_blks_read, r.interval_hit_ratio), (Some(35), Some(5), Some(0.875)));

        // The server restarted: its counters went down. No interval, no negative figures.
        let t2 = t1 + Duration::from_secs(5);
        let (db, _) = c.record(sample(b(20, 5), vec![rel(1, "t", b(2, 1), b(0, 0))]), t2, 11000);
        assert_eq!(db, None);
        let v = c.view();
        assert_eq!((v.interval_blks_hit, v.interval_hit_ratio), (None, None));
        assert_eq!((v.blks_hit, v.hit_ratio), (Some(20), Some(0.8)));
        assert_eq!(v.relations[0].interval_blks_hit, None);

        // ...and the next interval counts from the new baseline.
        let (db, _) = c.record(sample(b(30, 5), vec![rel(1, "t", b(4, 1), b(0, 0))]), t2 + Duration::from_secs(5), 0);
        assert_eq!(db, Some(b(10, 0)));
        assert_eq!(c.view().relations[0].interval_blks_hit, Some(2));

        // An idle interval has blocks (zero) but no ratio.
        let (db, _) = c.record(sample(b(30, 5), vec![rel(1, "t", b(4, 1), b(0, 0))]), t2 + Duration::from_secs(10), 0);
        assert_eq!(db, Some(b(0, 0)));
        assert_eq!(c.view().interval_hit_ratio, None);
    }

    #[test]
    fn relations_shown_are_the_busiest_of_the_interval_bounded() {
        let before: Baselines = (0..30).map(|i| (i, (b(1000 - u64::from(i), 0), b(0, 0)))).collect();
        // Relation 29 has the least in total but the most in the interval; 30 is new (no
        // baseline), 31 was never touched.
        let mut now: Vec<Relation> =
            (0..30).map(|i| rel(i, &format!("t{i}"), b(1000 - u64::from(i), 0), b(0, 0))).collect();
        now[29].heap = b(1000 - 29 + 50, 0);
        now[3].idx = b(0, 7);
        now.push(rel(30, "new", b(5000, 0), b(0, 0)));
        now.push(rel(31, "idle", b(0, 0), b(0, 0)));
        let v = relations_view(&now, Some(&before));
        assert_eq!(v.len(), RELATIONS_SHOWN);
        assert_eq!((v[0].name.as_str(), v[0].interval_hit_ratio), ("t29", Some(1.0)));
        assert_eq!((v[1].name.as_str(), v[1].interval_hit_ratio), ("t3", Some(0.0)));
        assert_eq!((v[2].name.as_str(), v[2].interval_blks_hit), ("new", None));
        assert_eq!(v[3].name, "t0");
        assert!(v.iter().all(|r| r.name != "idle"));
        assert!(relations_view(&[], None).is_empty());
    }

    #[test]
    fn warming_starts_when_it_takes_reads_again_and_ends_when_warm() {
        let mut c = Cache::default();
        let t0 = Instant::now();
        assert!(!c.view().warming);
        assert_eq!(c.start_warming("back up", t0, 5), Some(Warm::Started("back up")));
        assert!(c.warming.is_some() && c.view().warming);
        assert_eq!(c.view().warming_since_unix_ms, Some(5));

        // A baseline, then an interval with too few blocks, then a cold one: still warming.
        let t = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(c.record(sample(b(0, 0), vec![]), t(1), 0).1, None);
        assert_eq!(c.record(sample(b(10, 0), vec![]), t(2), 0).1, None, "10 blocks say nothing");
        assert_eq!(c.record(sample(b(60, 200), vec![]), t(3), 0).1, None, "cold");
        assert!(c.view().warming, "the view keeps it");
        let (_, warm) = c.record(sample(b(260, 210), vec![]), t(4), 0);
        assert_eq!(
            warm,
            Some(Warm::Ended { after: Duration::from_secs(4), ratio: Some(200.0 / 210.0), timed_out: false })
        );
        assert!(c.warming.is_none() && !c.view().warming);
        assert_eq!(c.view().warming_since_unix_ms, None);
        assert_eq!(c.record(sample(b(270, 210), vec![]), t(5), 0).1, None);

        // Undrained: warming again, the running interval dropped (the next sample is a baseline).
        assert!(!c.due(t(6), Duration::from_secs(5)));
        assert_eq!(c.start_warming("undrained", t(6), 0), Some(Warm::Started("undrained")));
        assert!(c.due(t(6), Duration::from_secs(5)));
        assert_eq!(c.record(sample(b(1000, 210), vec![]), t(7), 0), (None, None));
        // A second start while warming restarts its clock, unlogged.
        assert_eq!(c.start_warming("joined", t(8), 0), None);
        // It never gets warm: it stops after WARM_MAX, saying so.
        let (_, warm) = c.record(sample(b(1000, 500), vec![]), t(8) + WARM_MAX, 0);
        assert_eq!(warm, Some(Warm::Ended { after: WARM_MAX, ratio: None, timed_out: true }));
    }
}
