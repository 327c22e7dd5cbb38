//! The HTTP front end's own sections of the configuration: `[[route]]` (with the classifier
//! built from them), `[[share]]` (partial replicas) and `[handover]`. The dispatcher parses them with the rest of the file and
//! puts an [`HttpConfig`] among the engine's [`Sections`](refract_core::config::Sections).

use refract_core::config::Config;
use refract_core::partial::{ShareSection, Shares};
pub use refract_handover::config::{AgentAddr, HandoverConfig, HandoverMode, MAX_IDLE_MS};
use refract_http::{Classifier, RouteRule};
use serde::Deserialize;
use std::collections::HashMap;
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
}

impl HttpConfig {
    /// The sections, with the classifier built from `routes` and the shares from `share_config`.
    pub fn new(routes: Vec<RouteRule>, handover: Option<HandoverConfig>, share_config: Vec<HttpShare>) -> Self {
        let shares = Arc::new(Shares::new(share_config.iter().map(|s| (s.tables.as_slice(), &s.backends))));
        HttpConfig { classifier: Classifier::new(routes.clone()), routes, handover, share_config, shares }
    }

    /// The HTTP sections of `cfg` (none set: no routes, no hand-over).
    pub fn of(cfg: &Config) -> &HttpConfig {
        static NONE: std::sync::OnceLock<HttpConfig> = std::sync::OnceLock::new();
        cfg.sections.get::<HttpConfig>().unwrap_or_else(|| NONE.get_or_init(HttpConfig::default))
    }
}
