//! The dispatcher's configuration: TOML, unknown keys refused, then validated; every error
//! names the line it is about. `docs/config.md` documents every key.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::Path;
use toml::Spanned;

mod admin;
mod checks;
mod sections;
pub use admin::{AdminConfig, MIN_TOKEN_LEN};
pub use checks::{Listener, MAX_COUNT, MAX_MS, MAX_WORKERS};
pub use sections::Sections;

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Listening addresses and threads.
    #[serde(default)]
    pub listen: Listen,
    /// Replica selection.
    #[serde(default)]
    pub balance: Balance,
    /// Timeouts.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// Size limits.
    #[serde(default)]
    pub limits: Limits,
    /// Active health checks.
    #[serde(default)]
    pub health: Health,
    /// Backends at start; more can be added through the admin listener.
    #[serde(default, rename = "backend")]
    pub backends: Vec<Spanned<BackendConfig>>,
    /// Overload control (on by default).
    #[serde(default)]
    pub overload: Overload,
    /// Who may drive the admin listener (docs/operations.md).
    #[serde(default)]
    pub admin: AdminConfig,
    /// The front ends' own sections (`[postgres]`, `[[route]]`, `[handover]`, ...), parsed
    /// and checked by the dispatcher, carried here unread (see [`Sections`]).
    #[serde(skip)]
    pub sections: Sections,
}

/// `[overload]`: admission control, deadlines, retries, ejection. On by default, so an
/// operator who sets nothing is protected.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Overload {
    /// Whether admission limits and queues apply (in-flight counts are kept either way).
    pub enabled: bool,
    /// Hard cap on requests in flight per backend; the adaptive limit stays below it.
    pub max_concurrency: usize,
    /// Adaptive limit at start.
    pub initial_concurrency: usize,
    /// Adaptive limit floor.
    pub min_concurrency: usize,
    /// Requests waiting per backend beyond the limit; more are refused (503).
    pub max_queue: usize,
    /// CoDel target: acceptable standing wait in the queue.
    pub queue_target_ms: u64,
    /// CoDel interval: how long the wait may stay above target before overload mode.
    pub queue_interval_ms: u64,
    /// The longest a request waits in the queue (503 past it); 0 (default) = only its deadline
    /// bounds the wait. A load the backends carry queues for as long as its population needs.
    pub max_queue_wait_ms: u64,
    /// Deadline for requests that carry none (`x-refract-timeout-ms`); 0 = none.
    pub default_timeout_ms: u64,
    /// Retries allowed as a fraction of requests.
    pub retry_budget_ratio: f64,
    /// Retries allowed per second regardless of traffic.
    pub retry_budget_floor: f64,
    /// Consecutive failures (errors or timeouts) that eject a backend for a while.
    pub eject_after_failures: u32,
    /// How long an ejected backend sits out.
    pub eject_ms: u64,
    /// At most this fraction of the replicas is ejected at once.
    pub eject_max_fraction: f64,
    /// A replica whose median latency over a health interval is at least this many times the
    /// median of the other serving members' (and at least `eject_slow_min_ms`), for
    /// `eject_slow_intervals` intervals in a row, is ejected for `eject_ms`; 0 = never.
    pub eject_slow_factor: f64,
    /// The smallest median latency that counts as slow, in milliseconds.
    pub eject_slow_min_ms: u64,
    /// How many health intervals in a row a replica must be slow to be ejected.
    pub eject_slow_intervals: u32,
    /// A client address holding this fraction of a backend's limit waits behind other clients'
    /// requests for it; 1 = no preference.
    pub client_share: f64,
    /// Per-user token buckets (`x-refract-user`); users not listed are not limited.
    #[serde(rename = "user")]
    pub users: Vec<UserLimit>,
}

/// `[[overload.user]]`: one tenant's request rate.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserLimit {
    /// The value of `x-refract-user`.
    pub name: String,
    /// Requests per second.
    pub rate: f64,
    /// Largest burst.
    pub burst: f64,
}

impl Overload {
    /// The admission settings of one backend.
    pub fn admission(&self) -> crate::overload::AdmissionConfig {
        let ms = std::time::Duration::from_millis;
        crate::overload::AdmissionConfig {
            enabled: self.enabled,
            limit: crate::overload::LimitConfig {
                initial: self.initial_concurrency as f64,
                min: self.min_concurrency as f64,
                max: self.max_concurrency as f64,
                ..Default::default()
            },
            max_queue: self.max_queue,
            target: ms(self.queue_target_ms),
            interval: ms(self.queue_interval_ms),
            max_wait: ms(self.max_queue_wait_ms),
            client_share: self.client_share,
        }
    }
}

impl Default for Overload {
    fn default() -> Self {
        Overload {
            enabled: true,
            max_concurrency: 256,
            initial_concurrency: 4,
            min_concurrency: 1,
            max_queue: 1024,
            queue_target_ms: 5,
            queue_interval_ms: 100,
            max_queue_wait_ms: 0,
            default_timeout_ms: 0,
            retry_budget_ratio: 0.2,
            retry_budget_floor: 10.0,
            eject_after_failures: 5,
            eject_ms: 10_000,
            eject_max_fraction: 0.5,
            eject_slow_factor: 5.0,
            eject_slow_min_ms: 50,
            eject_slow_intervals: 3,
            client_share: 0.5,
            users: Vec::new(),
        }
    }
}

/// `[listen]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listen {
    /// The deprecated spelling of `[http] listen` (the HTTP front end's section): the
    /// dispatcher reads it with a warning. The engine does not use it.
    #[serde(default)]
    pub http: Option<SocketAddr>,
    /// Admin address (`/backends`, `/metrics`); absent = no admin listener.
    #[serde(default)]
    pub admin: Option<SocketAddr>,
    /// A Unix socket for the admin API (relative to the config file's directory), created
    /// with `[admin] socket_mode`: whoever may open it may drive the API, without a token.
    #[serde(default)]
    pub admin_socket: Option<std::path::PathBuf>,
    /// Runtime worker threads; 0 = one per core.
    #[serde(default)]
    pub workers: usize,
    /// `per-core` (default): one event loop per worker, each with its own listener and
    /// backend connections; `work-stealing`: one tokio multi-thread runtime.
    #[serde(default)]
    pub runtime: RuntimeKind,
    /// With the per-core runtime, how new client connections are spread over the event loops:
    /// `balanced` (default: one listener; each connection goes to the loop with the fewest
    /// open client connections, so a few long-lived connections never share a loop while
    /// another idles) or `reuseport` (one `SO_REUSEPORT` listener per loop, the kernel hashes
    /// each connection to one).
    #[serde(default)]
    pub accept: AcceptMode,
    /// With the per-core runtime: after a read, an event loop keeps polling its sockets for
    /// this many microseconds instead of sleeping, while its CPU has nothing else to run
    /// (see `crate::spin`). 0 (default) = off.
    #[serde(default)]
    pub busy_poll_us: u64,
}

/// The longest busy-polling window `[listen] busy_poll_us` accepts (10 ms).
pub const MAX_BUSY_POLL_US: u64 = 10_000;

/// How client connections are spread over the per-core event loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AcceptMode {
    /// The kernel spreads them by hash over one `SO_REUSEPORT` listener per loop.
    Reuseport,
    /// One listener; the loop with the fewest open client connections takes the next one.
    #[default]
    Balanced,
}

/// How the dispatcher uses its threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RuntimeKind {
    /// Shared-nothing event loops, one per worker (like HAProxy's threads).
    #[default]
    PerCore,
    /// One work-stealing runtime for all connections.
    WorkStealing,
}

/// How a read picks among replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// In turn.
    RoundRobin,
    /// Power of two random choices, the one with fewer requests in flight.
    LeastOutstanding,
    /// Power of two random choices weighted by peak-EWMA latency × (in flight + 1): a slow
    /// or struggling replica gets a shrinking share. The default.
    #[default]
    PeakEwma,
    /// Consistent hashing with bounded loads: a read with an affinity key goes to the replica
    /// owning the key on a hash ring, unless that one carries more than
    /// `affinity_load_factor` × the average of the reads in flight; then to the next one on
    /// the ring (`membership/ring.rs`). Reads without a key: as `PeakEwma`.
    Affinity,
}

/// `[balance]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Balance {
    /// Replica selection policy.
    pub policy: Policy,
    /// Whether the primary also serves reads.
    pub read_from_primary: bool,
    /// Whether reads go to the primary when no replica is up.
    pub read_fallback_to_primary: bool,
    /// With `policy = "affinity"`: a read leaves its key's owner for the next replica on the
    /// ring when the owner carries this many times its share of the reads in flight (> 1).
    pub affinity_load_factor: f64,
}

/// The default `[balance] affinity_load_factor`: the owner may carry 25 % more than the average.
pub const AFFINITY_LOAD_FACTOR: f64 = 1.25;

impl Default for Balance {
    fn default() -> Self {
        Balance {
            policy: Policy::PeakEwma,
            read_from_primary: false,
            read_fallback_to_primary: true,
            affinity_load_factor: AFFINITY_LOAD_FACTOR,
        }
    }
}

impl Balance {
    /// `affinity_load_factor` must be a number above 1: at 1 or below, the replicas' bounds add
    /// up to no more than the reads in flight, and a read could find every replica full.
    fn validate(&self, text: &str) -> Result<(), String> {
        let f = self.affinity_load_factor;
        if f.is_finite() && f > 1.0 {
            return Ok(());
        }
        Err(format!(
            "line {}: [balance] affinity_load_factor must be a number above 1 (e.g. 1.25: a replica takes up to 25 % more than the average of the reads in flight), not {f}",
            find_key_line(text, "affinity_load_factor")
        ))
    }
}

/// `[timeouts]`, all in milliseconds.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// Connecting to a backend; past it: 504 and the backend is marked down.
    pub connect_ms: u64,
    /// From the request sent to the response head, and between two reads of a response body.
    pub request_ms: u64,
    /// Keep-alive idle: how long a client connection may wait, between requests, before the
    /// first byte of the next one (then it is closed without a word).
    pub client_idle_ms: u64,
    /// On SIGINT/SIGTERM, how long in-flight requests may take to finish.
    pub drain_ms: u64,
    /// Inactivity while a request head arrives (no byte for this long): 408 and close.
    pub head_ms: u64,
    /// Inactivity while a request body arrives: 408 if nothing was answered yet, and close.
    pub body_ms: u64,
    /// No progress writing a response to the client for this long: the client connection is
    /// reset and its backend connection and slot freed.
    pub write_stall_ms: u64,
    /// No progress writing a response to the client for this long while another request waits
    /// for its backend's slot: the backend is let go (the rest of the response spilled, or the
    /// client connection reset).
    pub contended_stall_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect_ms: 1000,
            request_ms: 30_000,
            client_idle_ms: 60_000,
            drain_ms: 10_000,
            head_ms: 10_000,
            body_ms: 30_000,
            write_stall_ms: 30_000,
            contended_stall_ms: 250,
        }
    }
}

impl Timeouts {
    /// The client-side timeouts must be set (a zero would fail every request).
    fn validate_client(&self, text: &str) -> Result<(), String> {
        let keys = [
            ("head_ms", self.head_ms),
            ("body_ms", self.body_ms),
            ("write_stall_ms", self.write_stall_ms),
            ("contended_stall_ms", self.contended_stall_ms),
        ];
        match keys.iter().find(|(_, v)| *v == 0) {
            Some((key, _)) => Err(format!("line {}: [timeouts] {key} must be > 0", find_key_line(text, key))),
            None => Ok(()),
        }
    }
}

/// `[limits]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest request head accepted (431 past it).
    pub max_head_bytes: usize,
    /// Largest body refract buffers (Hyrise-R plans, fan-out); 413 past it. Other bodies stream.
    pub max_buffered_body: usize,
    /// Idle keep-alive connections kept per backend.
    pub max_idle_per_backend: usize,
    /// Most of a response read into memory for a client that stopped reading while others
    /// waited for its backend (`[timeouts] contended_stall_ms`); 0 = never spill.
    pub spill_bytes: usize,
    /// Most memory all such spills hold together.
    pub spill_total_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_head_bytes: 64 * 1024,
            max_buffered_body: 1 << 20,
            max_idle_per_backend: 64,
            spill_bytes: 1 << 20,
            spill_total_bytes: 64 << 20,
        }
    }
}

/// `[health]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Health {
    /// Time between two probes of a backend.
    pub interval_ms: u64,
    /// A probe that takes longer fails.
    pub timeout_ms: u64,
    /// The deprecated spelling of `[http] health_path` (the HTTP front end's section): the
    /// dispatcher reads it with a warning. The engine does not use it.
    pub path: Option<String>,
}

impl Default for Health {
    fn default() -> Self {
        Health { interval_ms: 1000, timeout_ms: 1000, path: None }
    }
}

/// A backend's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Takes writes (and reads if configured).
    Primary,
    /// Takes reads.
    Replica,
}

/// `[[backend]]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// Unique name (letters, digits, `-`, `_`).
    pub name: String,
    /// Address of the backend.
    pub addr: SocketAddr,
    /// Primary or replica.
    pub role: Role,
    /// This backend's hard cap on requests in flight (overrides `[overload] max_concurrency`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<usize>,
    /// A partial replica: the tables it holds (Hyrise-R plans naming others go elsewhere);
    /// absent = every table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tables: Option<Vec<String>>,
}

/// A configuration error, with the line when known.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ConfigError {
    path: String,
    message: String,
}

impl ConfigError {
    /// An error in the file at `path`.
    pub fn new(path: &Path, message: String) -> Self {
        ConfigError { path: path.display().to_string(), message }
    }
}

impl Config {
    /// Reads, parses and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError { path: path.display().to_string(), message: e.to_string() })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Config::parse_in(&text, base).map_err(|message| ConfigError { path: path.display().to_string(), message })
    }

    /// Parses and validates configuration text; the error names the line. Relative paths in
    /// it (`[admin] token_file`) are taken from the current directory.
    pub fn parse(text: &str) -> Result<Config, String> {
        Config::parse_in(text, Path::new("."))
    }

    /// Parses and validates configuration text whose relative paths start at `base`.
    pub fn parse_in(text: &str, base: &Path) -> Result<Config, String> {
        let cfg: Config = toml::from_str(text).map_err(|e| describe_toml_error(text, &e))?;
        cfg.checked(text, base, &[])
    }

    /// Checks the engine's sections of a configuration read from `text` (whose relative paths
    /// start at `base`) and resolves its paths; `others` are the front ends' listeners, which
    /// must not clash with the engine's.
    pub fn checked(mut self, text: &str, base: &Path, others: &[Listener]) -> Result<Config, String> {
        checks::all(&self, text, others)?;
        self.admin.resolve(self.listen.admin, base, find_key_line(text, "admin"))?;
        if let Some(p) = &mut self.listen.admin_socket {
            *p = base.join(&*p);
        }
        self.validate(text)
    }

    fn validate(self, text: &str) -> Result<Config, String> {
        let mut primaries = 0;
        for (i, b) in self.backends.iter().enumerate() {
            let at = line_of(text, b.span().start);
            validate_backend(b.get_ref()).map_err(|m| format!("line {at}: {m}"))?;
            if self.backends[..i].iter().any(|o| o.get_ref().name == b.get_ref().name) {
                return Err(format!("line {at}: backend name {:?} is used twice", b.get_ref().name));
            }
            primaries += usize::from(b.get_ref().role == Role::Primary);
            if primaries > 1 {
                return Err(format!("line {at}: a second primary; exactly one backend may be primary"));
            }
        }
        let t = &self.timeouts;
        for (key, v) in
            [("connect_ms", t.connect_ms), ("request_ms", t.request_ms), ("client_idle_ms", t.client_idle_ms)]
        {
            if v == 0 {
                return Err(format!("line {}: [timeouts] {key} must be > 0", find_key_line(text, key)));
            }
        }
        self.timeouts.validate_client(text)?;
        self.balance.validate(text)?;
        if self.health.interval_ms == 0 || self.health.timeout_ms == 0 {
            return Err(format!("line {}: [health] times must be > 0", find_key_line(text, "health")));
        }
        let o = &self.overload;
        if o.min_concurrency == 0 || o.min_concurrency > o.max_concurrency || o.initial_concurrency == 0 {
            return Err(format!(
                "line {}: [overload] needs 1 ≤ min_concurrency ≤ max_concurrency and initial_concurrency ≥ 1",
                find_key_line(text, "overload")
            ));
        }
        if !(0.0..=1.0).contains(&o.eject_max_fraction)
            || o.client_share.is_nan()
            || o.client_share <= 0.0
            || o.client_share > 1.0
            || o.retry_budget_ratio < 0.0
            || o.retry_budget_floor < 0.0
            || o.eject_slow_factor.is_nan()
            || o.eject_slow_factor < 0.0
        {
            return Err(format!(
                "line {}: [overload] fractions must be in 0..=1 (client_share above 0), budgets and eject_slow_factor ≥ 0",
                find_key_line(text, "overload")
            ));
        }
        if o.users.iter().any(|u| u.rate <= 0.0 || u.burst < 1.0) {
            return Err(format!(
                "line {}: [[overload.user]] needs rate > 0 and burst ≥ 1",
                find_key_line(text, "[[overload.user]]")
            ));
        }
        if self.listen.busy_poll_us > MAX_BUSY_POLL_US {
            return Err(format!(
                "line {}: [listen] busy_poll_us must be ≤ {MAX_BUSY_POLL_US} (polling longer than that saves nothing)",
                find_key_line(text, "busy_poll_us")
            ));
        }
        if self.listen.busy_poll_us > 0 && self.listen.runtime != RuntimeKind::PerCore {
            return Err(format!(
                "line {}: [listen] busy_poll_us needs runtime = \"per-core\"",
                find_key_line(text, "busy_poll_us")
            ));
        }
        if self.limits.max_head_bytes < 1024 {
            return Err(format!(
                "line {}: [limits] max_head_bytes must be ≥ 1024",
                find_key_line(text, "max_head_bytes")
            ));
        }
        Ok(self)
    }

    /// The backends as plain values.
    pub fn backend_list(&self) -> Vec<BackendConfig> {
        self.backends.iter().map(|b| b.get_ref().clone()).collect()
    }
}

/// Checks one backend definition (also used for runtime additions).
pub fn validate_backend(b: &BackendConfig) -> Result<(), String> {
    let ok = !b.name.is_empty()
        && b.name.len() <= 64
        && b.name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_');
    if !ok {
        return Err(format!("backend name {:?} must be 1-64 letters, digits, '-' or '_'", b.name));
    }
    if b.addr.port() == 0 {
        return Err(format!("backend {} needs a port", b.name));
    }
    match &b.tables {
        Some(_) if b.role == Role::Primary => {
            Err(format!("backend {}: the primary holds every table (no `tables`)", b.name))
        }
        Some(t) if t.iter().any(String::is_empty) => Err(format!("backend {}: a table name is empty", b.name)),
        _ => Ok(()),
    }
}

/// A TOML error with the line it is about.
pub fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
    match e.span() {
        Some(span) => format!("line {}: {}", line_of(text, span.start), e.message()),
        None => e.message().to_string(),
    }
}

/// The line of byte `offset` in `text`.
pub fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The first line that starts with `key` or holds `[key]` (0 when none).
pub fn find_key_line(text: &str, key: &str) -> usize {
    text.lines().position(|l| l.trim_start().starts_with(key) || l.contains(&format!("[{key}]"))).map_or(0, |i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replica, then `[listen]` (so that tests append `[listen]` keys); 7 lines.
    const MIN: &str =
        "[[backend]]\nname = \"r0\"\naddr = \"127.0.0.1:9\"\nrole = \"replica\"\n\n[listen]\nhttp = \"127.0.0.1:8080\"\n";

    #[test]
    fn busy_polling_is_bounded_and_needs_the_per_core_runtime() {
        assert_eq!(Config::parse(MIN).unwrap().listen.busy_poll_us, 0, "off by default");
        let on = Config::parse(&format!("{MIN}busy_poll_us = 200\n")).unwrap();
        assert_eq!(on.listen.busy_poll_us, 200);
        let long = Config::parse(&format!("{MIN}busy_poll_us = 20000\n")).unwrap_err();
        assert!(long.contains("line 8") && long.contains("busy_poll_us must be ≤ 10000"), "{long}");
        let ws = Config::parse(&format!("{MIN}runtime = \"work-stealing\"\nbusy_poll_us = 200\n")).unwrap_err();
        assert!(ws.contains("line 9") && ws.contains("per-core"), "{ws}");
    }

    #[test]
    fn defaults_apply() {
        let c = Config::parse(MIN).unwrap();
        assert_eq!(c.timeouts.connect_ms, 1000);
        assert_eq!(c.balance.policy, Policy::PeakEwma);
        assert_eq!(c.backends.len(), 1);
    }

    #[test]
    fn unknown_key_names_the_line() {
        let e = Config::parse(&format!("{MIN}colour = 3\n")).unwrap_err();
        assert!(e.starts_with("line 8:"), "{e}");
        assert!(e.contains("colour"), "{e}");
    }

    #[test]
    fn bad_address_names_the_line() {
        let e = Config::parse("[listen]\n\nhttp = \"nowhere\"\n").unwrap_err();
        assert!(e.starts_with("line 3:"), "{e}");
    }

    #[test]
    fn duplicate_backend_names_the_line() {
        let text = format!(
            "{MIN}[[backend]]\nname = \"a\"\naddr = \"127.0.0.1:1\"\nrole = \"primary\"\n\
             [[backend]]\nname = \"a\"\naddr = \"127.0.0.1:2\"\nrole = \"replica\"\n"
        );
        let e = Config::parse(&text).unwrap_err();
        assert!(e.contains("used twice"), "{e}");
        assert!(e.starts_with("line 12:") || e.starts_with("line 13:"), "{e}");
    }

    #[test]
    fn a_replica_may_hold_some_tables_the_primary_all() {
        let text =
            format!("{MIN}[[backend]]\nname = \"r1\"\naddr = \"127.0.0.1:1\"\nrole = \"replica\"\ntables = [\"a\"]\n");
        let c = Config::parse(&text).unwrap();
        assert_eq!(c.backend_list()[1].tables, Some(vec!["a".to_string()]));
        assert_eq!(c.backend_list()[0].tables, None, "absent: every table");
        let e = Config::parse(&text.replace("\"replica\"\ntables", "\"primary\"\ntables")).unwrap_err();
        assert!(e.starts_with("line 8:") && e.contains("the primary holds every table"), "{e}");
        let e = Config::parse(&text.replace("[\"a\"]", "[\"\"]")).unwrap_err();
        assert!(e.contains("a table name is empty"), "{e}");
    }

    #[test]
    fn two_primaries_refused() {
        let text = format!(
            "{MIN}[[backend]]\nname = \"a\"\naddr = \"127.0.0.1:1\"\nrole = \"primary\"\n\
             [[backend]]\nname = \"b\"\naddr = \"127.0.0.1:2\"\nrole = \"primary\"\n"
        );
        assert!(Config::parse(&text).unwrap_err().contains("second primary"));
    }

    #[test]
    fn client_timeouts_default_and_must_be_set() {
        let t = Config::parse(MIN).unwrap().timeouts;
        assert_eq!((t.head_ms, t.body_ms, t.write_stall_ms, t.client_idle_ms), (10_000, 30_000, 30_000, 60_000));
        let c = Config::parse(&format!("{MIN}[timeouts]\nhead_ms = 1500\nbody_ms = 2000\nwrite_stall_ms = 2500\n"));
        let t = c.unwrap().timeouts;
        assert_eq!((t.head_ms, t.body_ms, t.write_stall_ms), (1500, 2000, 2500));
        let e = Config::parse(&format!("{MIN}[timeouts]\nhead_ms = 10\nwrite_stall_ms = 0\n")).unwrap_err();
        assert_eq!(e, "line 10: [timeouts] write_stall_ms must be > 0");
        assert_eq!(Config::parse(MIN).unwrap().timeouts.contended_stall_ms, 250);
        let e = Config::parse(&format!("{MIN}[timeouts]\ncontended_stall_ms = 0\n")).unwrap_err();
        assert_eq!(e, "line 9: [timeouts] contended_stall_ms must be > 0");
    }

    #[test]
    fn spill_bounds_default_and_bounds() {
        let l = Config::parse(MIN).unwrap().limits;
        assert_eq!((l.spill_bytes, l.spill_total_bytes), (1 << 20, 64 << 20));
        let c = Config::parse(&format!("{MIN}[limits]\nspill_bytes = 0\n")).unwrap();
        assert_eq!(c.limits.spill_bytes, 0);
        let e = Config::parse(&format!("{MIN}[limits]\nspill_total_bytes = 99999999999\n")).unwrap_err();
        assert!(e.starts_with("line 9: [limits] spill_total_bytes"), "{e}");
    }

    #[test]
    fn client_share_defaults_and_bounds() {
        assert_eq!(Config::parse(MIN).unwrap().overload.client_share, 0.5);
        let c = Config::parse(&format!("{MIN}[overload]\nclient_share = 1.0\n")).unwrap();
        assert_eq!(c.overload.admission().client_share, 1.0);
        for bad in ["0.0", "1.5", "-0.5"] {
            let e = Config::parse(&format!("{MIN}[overload]\nclient_share = {bad}\n")).unwrap_err();
            assert!(e.starts_with("line 8: [overload] fractions") && e.contains("client_share"), "{e}");
        }
    }

    #[test]
    fn the_affinity_policy_and_its_load_factor() {
        let c = Config::parse(MIN).unwrap();
        assert_eq!(c.balance.affinity_load_factor, 1.25);
        let c = Config::parse(&format!("{MIN}[balance]\npolicy = \"affinity\"\n")).unwrap();
        assert_eq!((c.balance.policy, c.balance.affinity_load_factor), (Policy::Affinity, 1.25));
        let c = Config::parse(&format!("{MIN}[balance]\npolicy = \"affinity\"\naffinity_load_factor = 1.5\n"));
        assert_eq!(c.unwrap().balance.affinity_load_factor, 1.5);
        for bad in ["1.0", "0.5", "-2.0", "inf", "nan"] {
            let e = Config::parse(&format!("{MIN}[balance]\naffinity_load_factor = {bad}\n")).unwrap_err();
            assert!(e.starts_with("line 9: [balance] affinity_load_factor must be a number above 1"), "{e}");
        }
        let e = Config::parse(&format!("{MIN}[balance]\npolicy = \"hash\"\n")).unwrap_err();
        assert!(e.starts_with("line 9:") && e.contains("affinity"), "{e}");
    }

    #[test]
    fn zero_timeout_refused() {
        let e = Config::parse(&format!("{MIN}[timeouts]\nconnect_ms = 0\n")).unwrap_err();
        assert_eq!(e, "line 9: [timeouts] connect_ms must be > 0");
    }
}
