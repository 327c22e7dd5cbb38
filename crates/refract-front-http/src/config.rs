//! The HTTP front end's own sections of the configuration: `[http]` (its listener and health
//! probe), `[[route]]` (with the classifier built from them), `[[share]]` (partial replicas)
//! and `[handover]`. The dispatcher parses them with the rest of the file and puts an
//! [`HttpConfig`] among the engine's [`Sections`](refract_core::config::Sections).

use refract_core::config::Config;
use refract_core::partial::{ShareSection, Shares};
pub use refract_handover::config::{AgentAddr, HandoverConfig, HandoverMode, MAX_IDLE_MS};
use refract_http::{Classifier, RouteRule};
use serde::Deserialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

/// `[[share]]`: the Hyrise-R read plans that name exactly `tables` go to the backends named in
/// `backends` (among those available and holding the tables) in proportion to their weights.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpShare {
    /// The class: the set of tables a plan reads.
    pub tables: Vec<String>,
    /// Backend name → weight (> 0; e.g. an LP allocation's fractions).
    pub backends: HashMap<String, f64>,
}

impl HttpShare {
    /// How the errors name the section.
    pub const SECTION: ShareSection = ShareSection { name: "[[share]]", weights: "backends", member: "[[backend]]" };
}

/// `[http]`: the HTTP front end's listener and health probe. `[listen] http` and
/// `[health] path` are their deprecated spellings (read with a warning, see [`Listening`]).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    /// Client-facing HTTP address.
    pub listen: Option<SocketAddr>,
    /// HTTP path probed with GET (2xx = healthy); absent = a TCP connect is the probe.
    pub health_path: Option<String>,
}

/// The HTTP listener and health path in force, whichever spelling set them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Listening {
    /// The listener and the key that set it (`[http] listen` or `[listen] http`), for errors.
    pub listen: Option<(&'static str, SocketAddr)>,
    /// `[http] health_path` (or `[health] path`).
    pub health_path: Option<String>,
    /// Deprecated keys the file used: (old key, new key), warned about at start.
    pub renamed: Vec<(&'static str, &'static str)>,
}

impl Listening {
    /// Resolves `[http]` (`new`) against the deprecated keys (`old_listen`, `old_path`): either
    /// spelling alone is fine, both for one setting is an error.
    pub fn resolve(
        new: Option<&HttpSection>,
        old_listen: Option<SocketAddr>,
        old_path: Option<String>,
    ) -> Result<Listening, String> {
        let new = new.cloned().unwrap_or_default();
        let mut renamed = Vec::new();
        if new.listen.is_none() && old_listen.is_some() {
            renamed.push(("[listen] http", "[http] listen"));
        }
        if new.health_path.is_none() && old_path.is_some() {
            renamed.push(("[health] path", "[http] health_path"));
        }
        let (new_listen, old_listen) =
            (new.listen.map(|a| ("[http] listen", a)), old_listen.map(|a| ("[listen] http", a)));
        let listen = once(new_listen, old_listen, ("[http] listen", "[listen] http"))?;
        let health_path = once(new.health_path, old_path, ("[http] health_path", "[health] path"))?;
        Ok(Listening { listen, health_path, renamed })
    }
}

/// One setting written at most once: `new`, else `old`; an error naming both `keys` when both
/// are written.
fn once<T>(new: Option<T>, old: Option<T>, keys: (&str, &str)) -> Result<Option<T>, String> {
    match (new, old) {
        (Some(_), Some(_)) => {
            Err(format!("{} and {} are both set: keep {0} ({1} is its deprecated spelling)", keys.0, keys.1))
        }
        (new, old) => Ok(new.or(old)),
    }
}

/// The HTTP front end's sections, as one value of a configuration generation.
#[derive(Debug, Clone, Default)]
pub struct HttpConfig {
    /// Routing rules (method + path prefix → class), tried after the built-in rules.
    pub routes: Vec<RouteRule>,
    /// Request classification built from `routes`.
    pub classifier: Classifier,
    /// Connection hand-over to agents on the backends' hosts; absent = off.
    pub handover: Option<HandoverConfig>,
    /// `[[share]]` as written (a reload compares it).
    pub share_config: Vec<HttpShare>,
    /// The shares built from `share_config` (each class counts its reads).
    pub shares: Arc<Shares>,
    /// `[http]`: the listener and the health probe.
    pub listening: Listening,
}

impl HttpConfig {
    /// The sections, with the classifier built from `routes` and the shares from `share_config`.
    pub fn new(routes: Vec<RouteRule>, handover: Option<HandoverConfig>, share_config: Vec<HttpShare>) -> Self {
        let shares = Arc::new(Shares::new(share_config.iter().map(|s| (s.tables.as_slice(), &s.backends))));
        let classifier = Classifier::new(routes.clone());
        HttpConfig { classifier, routes, handover, share_config, shares, listening: Listening::default() }
    }

    /// The HTTP sections of `cfg` (none set: no routes, no hand-over).
    pub fn of(cfg: &Config) -> &HttpConfig {
        static NONE: std::sync::OnceLock<HttpConfig> = std::sync::OnceLock::new();
        cfg.sections.get::<HttpConfig>().unwrap_or_else(|| NONE.get_or_init(HttpConfig::default))
    }
}
