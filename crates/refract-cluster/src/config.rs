//! `[cluster]`: the etcd endpoints, this dispatcher's node id and how it logs in.

use serde::Deserialize;
use std::path::PathBuf;

/// `[cluster]` as written. Without the section a dispatcher runs alone, with no etcd.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// etcd client endpoints (`http://host:2379`, or `https://` with `ca_file`).
    pub etcd: Vec<String>,
    /// This dispatcher's name among its peers: unique, and stable across restarts (the
    /// two-phase-commit decisions it makes carry it).
    pub node_id: String,
    /// The key prefix every refract key lives under (several refract clusters may share
    /// one etcd).
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// The lease's time to live: a dispatcher that stops renewing it (crashed, cut off) is
    /// gone from its peers' view this long after its last renewal.
    #[serde(default = "default_lease_ttl_s")]
    pub lease_ttl_s: u64,
    /// etcd user (with `password_file`), when etcd has authentication enabled.
    #[serde(default)]
    pub user: Option<String>,
    /// A file holding the etcd user's password (first line).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// PEM CA bundle that signs etcd's server certificate (TLS to etcd).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for etcd's `--client-cert-auth`.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// The key of `cert_file`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Where this dispatcher takes CancelRequests forwarded by its peers (a client's cancel
    /// that reached a dispatcher other than the one holding its session); published to them.
    #[serde(default)]
    pub cancel_listen: Option<std::net::SocketAddr>,
    /// A file holding the key the dispatchers authenticate forwarded cancels with (at least
    /// 16 bytes, the same on every dispatcher); required with `cancel_listen`.
    #[serde(default)]
    pub peer_key_file: Option<PathBuf>,
}

fn default_prefix() -> String {
    "/refract".into()
}

fn default_lease_ttl_s() -> u64 {
    5
}

/// The most a lease may live: a crashed dispatcher's peers wait this long at worst.
pub const MAX_LEASE_TTL_S: u64 = 300;

impl ClusterConfig {
    /// Checks what serde cannot: a usable node id, endpoints, a lease time, paired settings.
    pub fn validate(self) -> Result<Self, String> {
        if self.etcd.is_empty() {
            return Err("[cluster] etcd lists no endpoint".into());
        }
        if let Some(bad) = self.etcd.iter().find(|e| !(e.starts_with("http://") || e.starts_with("https://"))) {
            return Err(format!("[cluster] etcd endpoint {bad:?} is not http://host:port or https://host:port"));
        }
        let id_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if self.node_id.is_empty() || self.node_id.len() > 63 || !self.node_id.chars().all(id_ok) {
            return Err(format!(
                "[cluster] node_id {:?} must be 1 to 63 letters, digits, '-', '_' or '.'",
                self.node_id
            ));
        }
        if !self.prefix.starts_with('/') || self.prefix.ends_with('/') {
            return Err(format!("[cluster] prefix {:?} must start with '/' and not end with one", self.prefix));
        }
        if !(1..=MAX_LEASE_TTL_S).contains(&self.lease_ttl_s) {
            return Err(format!("[cluster] lease_ttl_s must be 1 to {MAX_LEASE_TTL_S}"));
        }
        if self.user.is_some() != self.password_file.is_some() {
            return Err("[cluster] user and password_file go together".into());
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err("[cluster] cert_file and key_file go together".into());
        }
        if self.cancel_listen.is_some() != self.peer_key_file.is_some() {
            return Err("[cluster] cancel_listen and peer_key_file go together".into());
        }
        let tls = self.etcd.iter().any(|e| e.starts_with("https://"));
        if (self.ca_file.is_some() || self.cert_file.is_some()) && !tls {
            return Err("[cluster] ca_file / cert_file need https:// endpoints".into());
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &str) -> Result<ClusterConfig, String> {
        let text = format!("etcd = [\"http://127.0.0.1:2379\"]\nnode_id = \"d1\"\n{extra}");
        toml::from_str::<ClusterConfig>(&text).map_err(|e| e.to_string())?.validate()
    }

    #[test]
    fn defaults_and_refusals() {
        let c = parse("").expect("minimal");
        assert_eq!((c.prefix.as_str(), c.lease_ttl_s), ("/refract", 5));
        for (extra, needle) in [
            ("lease_ttl_s = 0", "lease_ttl_s"),
            ("prefix = \"refract\"", "prefix"),
            ("user = \"u\"", "password_file"),
            ("cert_file = \"c.pem\"", "key_file"),
            ("ca_file = \"ca.pem\"", "https"),
            ("cancel_listen = \"127.0.0.1:6500\"", "peer_key_file"),
            ("colour = 1", "unknown field"),
        ] {
            let e = parse(extra).expect_err(extra);
            assert!(e.contains(needle), "{extra}: {e}");
        }
        let e = toml::from_str::<ClusterConfig>("etcd = []\nnode_id = \"a b\"").map_err(|e| e.to_string());
        assert!(e.expect("parses").validate().is_err());
    }
}
