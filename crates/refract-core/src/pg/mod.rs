//! The PostgreSQL front end: a listener speaking the v3 protocol to clients and routing each
//! statement to the primary or a replica. (Being built: `[postgres]` is refused for now.)

use crate::dispatcher::Ctx;
use serde::Deserialize;
use std::net::SocketAddr;
use std::sync::Arc;

/// `[postgres]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgConfig {
    /// Client-facing PostgreSQL address.
    pub listen: SocketAddr,
}

/// Starts the PostgreSQL listener.
pub async fn start(_ctx: Arc<Ctx>, _cfg: PgConfig) -> std::io::Result<()> {
    Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "the [postgres] front end is not built yet"))
}
