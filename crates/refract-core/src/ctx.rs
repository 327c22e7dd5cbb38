//! The state every session and service shares ([`Ctx`]): the configuration in force, the
//! backends, metrics, the retry budget, user limits and spilled memory, the stop token. It sits below every service: the dispatcher builds it and
//! hands it to them, none of them is reached through it.

use crate::config::Config;
use crate::live::{Live, LiveConfig};
use crate::membership::Membership;
use crate::metrics::Metrics;
use crate::overload::{RetryBudget, SpillBudget, UserLimits};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// What every session shares.
pub struct Ctx {
    /// The configuration in force (a reload swaps it whole; see `live`).
    pub cfg: LiveConfig,
    /// The backends.
    pub members: Membership,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Cancelled when the dispatcher starts draining.
    pub stop: CancellationToken,
    /// Retries allowed (shared by all sessions).
    pub budget: RetryBudget,
    /// Per-user token buckets.
    pub users: UserLimits,
    /// Memory held for clients that stopped reading (bounded by `[limits] spill_total_bytes`).
    pub spill: Arc<SpillBudget>,
    /// The file the configuration came from, which a reload reads again.
    pub config_path: std::sync::OnceLock<std::path::PathBuf>,
    /// Set when a drain ended with sessions still open.
    pub drain_timed_out: std::sync::atomic::AtomicBool,
}

impl Ctx {
    /// The shared state for a configuration.
    pub fn new(cfg: Config) -> Arc<Ctx> {
        let metrics = Arc::new(Metrics::new());
        let members = Membership::new(
            &cfg.backend_list(),
            cfg.balance.clone(),
            cfg.limits.max_idle_per_backend,
            metrics.clone(),
            &cfg.overload,
        );
        let o = &cfg.overload;
        let budget = RetryBudget::new(o.retry_budget_ratio, o.retry_budget_floor, 100.0);
        let users = UserLimits::new(o.users.iter().map(|u| (u.name.as_str(), u.rate, u.burst)));
        let stop = CancellationToken::new();
        let cfg = LiveConfig(Live::new(cfg));
        let (config_path, drain_timed_out, spill) = (Default::default(), Default::default(), Default::default());
        Arc::new(Ctx { cfg, members, metrics, stop, budget, users, spill, config_path, drain_timed_out })
    }

    /// Puts a validated configuration in force (a reload has already applied its membership
    /// and kept the parts that need a restart).
    pub fn replace_config(&self, cfg: Config) {
        self.cfg.0.replace(cfg);
    }

    /// Notes a drain that ended with `left` sessions still open.
    pub fn drain_ended(&self, left: usize, worker: Option<usize>) {
        if left > 0 {
            self.drain_timed_out.store(true, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(?worker, left, "drain timeout: closing remaining connections");
        }
    }
}
