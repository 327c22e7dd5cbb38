//! Reload (`SIGHUP`, `POST /reload`, `refract reload`): read the config file again, validate
//! it, apply membership, then put the new configuration in force for new requests; nothing is
//! closed. What the running dispatcher cannot change (listeners, threads, the PostgreSQL and
//! hand-over front ends, balancing and admission state) keeps its old value and is logged as
//! "needs restart". An invalid file changes nothing.

use refract_cluster::ClusterConfig;
use refract_core::{Config, Ctx};
use refract_front_http::config::HttpConfig;
use refract_front_pg::PgConfig;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

/// Reloads from the dispatcher's config file, logging the outcome: an error line naming the
/// problem when the file is refused (the old configuration stays), else what changed.
pub fn reload_logged(ctx: &Ctx) -> Result<String, String> {
    let result = reload(ctx);
    match &result {
        Ok(summary) => tracing::info!(changes = %summary, "config reloaded"),
        Err(e) => tracing::error!(error = %e, "reload refused: keeping the old configuration"),
    }
    result
}

/// Reloads from the dispatcher's config file; returns a summary of what changed.
fn reload(ctx: &Ctx) -> Result<String, String> {
    let path = ctx.config_path.get().ok_or("the dispatcher was not started from a config file")?;
    let mut next = crate::config::load(path).map_err(|e| e.to_string())?;
    let kept = keep_restart_only(&ctx.cfg, &mut next);
    // The running admin listener stays: the new [admin] must still guard it.
    next.admin.fits(next.listen.admin).map_err(|e| format!("the running admin listener: {e}"))?;
    for section in kept {
        tracing::warn!(section, "changed in the config file but needs restart: left as it was");
    }
    let mut changes = ctx.members.apply(&next.backend_list());
    for b in ctx.members.snapshot().iter() {
        ctx.metrics.set_drained(&b.name, b.is_drained());
    }
    let (old_http, next_http) = (HttpConfig::of(&ctx.cfg), HttpConfig::of(&next));
    if format!("{:?}", old_http.routes) != format!("{:?}", next_http.routes) {
        changes.push("routes".into());
    }
    if old_http.share_config != next_http.share_config {
        changes.push("shares".into());
    }
    ctx.replace_config(next);
    Ok(if changes.is_empty() { "no membership, route or share change".into() } else { changes.join(", ") })
}

/// Copies into `next` the parts of `old` that cannot change while serving; returns those that
/// differed.
fn keep_restart_only(old: &Config, next: &mut Config) -> Vec<&'static str> {
    let mut differ = Vec::new();
    let mut keep = |name: &'static str, same: bool| {
        if !same {
            differ.push(name);
        }
    };
    let same = |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") == format!("{b:?}");
    keep("[listen]", same(&old.listen, &next.listen));
    keep("[balance]", same(&old.balance, &next.balance));
    keep("[health]", same(&old.health, &next.health));
    keep("[overload]", same(&old.overload, &next.overload));
    let (old_http, next_http) = (HttpConfig::of(old), HttpConfig::of(next).clone());
    let old_pg = old.sections.get::<PgConfig>().cloned();
    keep("[postgres]", same(&old_pg, &next.sections.get::<PgConfig>()));
    let old_cluster = old.sections.get::<ClusterConfig>().cloned();
    keep("[cluster]", old_cluster.as_ref() == next.sections.get::<ClusterConfig>());
    keep("[handover]", same(&old_http.handover, &next_http.handover));
    keep("[http]", old_http.listening == next_http.listening);
    keep("[limits] max_idle_per_backend", old.limits.max_idle_per_backend == next.limits.max_idle_per_backend);
    next.listen = old.listen.clone();
    next.balance = old.balance.clone();
    next.health = old.health.clone();
    next.overload = old.overload.clone();
    // The new routes and shares, the old hand-over.
    let http = HttpConfig {
        listening: old_http.listening.clone(),
        ..HttpConfig::new(next_http.routes, old_http.handover.clone(), next_http.share_config)
    };
    next.sections.insert(http);
    match old_pg {
        Some(pg) => next.sections.insert(pg),
        None => next.sections.remove::<PgConfig>(),
    }
    match old_cluster {
        Some(cluster) => next.sections.insert(cluster),
        None => next.sections.remove::<ClusterConfig>(),
    }
    next.limits.max_idle_per_backend = old.limits.max_idle_per_backend;
    differ
}

/// `refract reload --config FILE`: asks the dispatcher running with `FILE` to reload, through
/// `POST /reload` on its admin listener with the token from `FILE`. Returns its answer; an
/// error when the dispatcher refused the file (with its reason) or could not be reached.
pub fn request(config: &Path) -> Result<String, String> {
    let cfg = crate::config::load(config).map_err(|e| e.to_string())?;
    let post = |host: &str, auth: &str| {
        format!(
            "POST /reload HTTP/1.1\r\nhost: {host}\r\n{auth}content-type: application/json\r\n\
             content-length: 2\r\nconnection: close\r\n\r\n{{}}"
        )
    };
    // The Unix admin socket when there is one: it needs no token.
    let answer = if let Some(path) = &cfg.listen.admin_socket {
        let req = post("localhost", "");
        let exchanged = std::os::unix::net::UnixStream::connect(path).and_then(|s| {
            s.set_read_timeout(Some(ANSWER))?;
            exchange(s, req.as_bytes())
        });
        exchanged.map_err(|e| format!("admin socket {}: {e}", path.display()))?
    } else {
        let mut addr: SocketAddr = cfg
            .listen
            .admin
            .ok_or("the config has no [listen] admin or admin_socket; send SIGHUP to the dispatcher instead")?;
        if addr.ip().is_unspecified() {
            addr.set_ip(if addr.is_ipv4() { [127, 0, 0, 1].into() } else { std::net::Ipv6Addr::LOCALHOST.into() });
        }
        let auth = cfg.admin.token.map(|t| format!("authorization: Bearer {t}\r\n")).unwrap_or_default();
        let req = post(&addr.to_string(), &auth);
        let exchanged = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).and_then(|s| {
            s.set_read_timeout(Some(ANSWER))?;
            exchange(s, req.as_bytes())
        });
        exchanged.map_err(|e| format!("admin listener {addr}: {e}"))?
    };
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    match head.split(' ').nth(1) {
        Some("200") => Ok(body.trim().to_string()),
        _ => Err(format!("{}: {}", head.lines().next().unwrap_or(""), body.trim())),
    }
}

/// How long `refract reload` waits for the dispatcher's answer.
const ANSWER: Duration = Duration::from_secs(30);

/// Sends `req` and reads the whole answer (the request asks to close).
fn exchange(mut s: impl Read + Write, req: &[u8]) -> std::io::Result<String> {
    s.write_all(req)?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}
