//! The HTTP front end's own sections of the configuration: `[[route]]` (with the classifier
//! built from them) and `[handover]`. The dispatcher parses them with the rest of the file and
//! puts an [`HttpConfig`] among the engine's [`Sections`](refract_core::config::Sections).

use refract_core::config::Config;
pub use refract_handover::config::{AgentAddr, HandoverConfig, HandoverMode, MAX_IDLE_MS};
use refract_http::{Classifier, RouteRule};

/// The HTTP front end's sections, as one value of a configuration generation.
#[derive(Debug, Clone, Default)]
pub struct HttpConfig {
    /// Routing rules (method + path prefix → class), tried after the built-in rules.
    pub routes: Vec<RouteRule>,
    /// Request classification built from `routes`.
    pub classifier: Classifier,
    /// Connection hand-over to agents on the backends' hosts; absent = off.
    pub handover: Option<HandoverConfig>,
}

impl HttpConfig {
    /// The sections, with the classifier built from `routes`.
    pub fn new(routes: Vec<RouteRule>, handover: Option<HandoverConfig>) -> Self {
        HttpConfig { classifier: Classifier::new(routes.clone()), routes, handover }
    }

    /// The HTTP sections of `cfg` (none set: no routes, no hand-over).
    pub fn of(cfg: &Config) -> &HttpConfig {
        static NONE: std::sync::OnceLock<HttpConfig> = std::sync::OnceLock::new();
        cfg.sections.get::<HttpConfig>().unwrap_or_else(|| NONE.get_or_init(HttpConfig::default))
    }
}
