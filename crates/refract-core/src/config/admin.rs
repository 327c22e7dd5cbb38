//! `[admin]`: who may drive the admin listener. A bearer token (inline or from a file, read at
//! start and on every reload); without one the listener must be on loopback and say so with
//! `insecure_loopback = true`, so an open admin API is never an accident.

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Shortest token accepted: a guessable token is no better than none.
pub const MIN_TOKEN_LEN: usize = 16;

/// `[admin]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// The bearer token (`Authorization: Bearer TOKEN`).
    #[serde(default)]
    pub token: Option<String>,
    /// A file holding the token (trailing newline ignored); relative to the config file.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Run without a token, on a loopback address only.
    #[serde(default)]
    pub insecure_loopback: bool,
    /// File mode of `[listen] admin_socket` (default `0o600`: the dispatcher's user only).
    #[serde(default = "default_socket_mode")]
    pub socket_mode: u32,
}

fn default_socket_mode() -> u32 {
    0o600
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig { token: None, token_file: None, insecure_loopback: false, socket_mode: default_socket_mode() }
    }
}

impl AdminConfig {
    /// Checks the section against the admin address and reads `token_file` into `token`
    /// (relative paths from `base`, the config file's directory). `at` is the section's line.
    pub(crate) fn resolve(&mut self, admin: Option<SocketAddr>, base: &Path, at: usize) -> Result<(), String> {
        if self.token.is_some() && self.token_file.is_some() {
            return Err(format!("line {at}: [admin] token and token_file exclude each other; keep one"));
        }
        if let Some(file) = &self.token_file {
            let path = base.join(file);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("line {at}: [admin] token_file {}: {e}", path.display()))?;
            self.token = Some(text.trim_end_matches(['\r', '\n']).to_string());
        }
        if self.socket_mode & !0o777 != 0 || self.socket_mode & 0o007 != 0 {
            return Err(format!(
                "line {at}: [admin] socket_mode {:#o}: permission bits only, none for others (e.g. 0o600, 0o660)",
                self.socket_mode
            ));
        }
        self.fits(admin).map_err(|e| format!("line {at}: {e}"))
    }

    /// Whether this section may guard an admin listener on `admin` (a token, or the loopback
    /// opt-in on a loopback address; nothing to guard without a TCP listener).
    pub fn fits(&self, admin: Option<SocketAddr>) -> Result<(), String> {
        match (&self.token, admin) {
            (Some(t), _) if t.len() < MIN_TOKEN_LEN || t.bytes().any(|c| !c.is_ascii_graphic()) => {
                Err(format!("[admin] token must be at least {MIN_TOKEN_LEN} printable characters without spaces"))
            }
            (Some(_), _) if self.insecure_loopback => {
                Err("[admin] insecure_loopback = true makes no sense with a token; drop it".into())
            }
            (None, Some(addr)) if !addr.ip().is_loopback() => {
                Err(format!("[listen] admin {addr} is not a loopback address and has no [admin] token or token_file"))
            }
            (None, Some(addr)) if !self.insecure_loopback => Err(format!(
                "[listen] admin {addr} needs [admin] token or token_file \
                 (or, on loopback only, [admin] insecure_loopback = true)"
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::Config;

    const HEAD: &str =
        "[[backend]]\nname = \"a\"\naddr = \"127.0.0.1:1\"\nrole = \"primary\"\n[listen]\nhttp = \"127.0.0.1:8080\"\n";

    fn parse(admin: &str, section: &str) -> Result<Config, String> {
        Config::parse(&format!("{HEAD}admin = \"{admin}\"\n[admin]\n{section}"))
    }

    #[test]
    fn an_admin_listener_needs_a_token_or_the_loopback_opt_in() {
        let e = parse("0.0.0.0:8081", "").unwrap_err();
        assert!(e.contains("[listen] admin 0.0.0.0:8081 is not a loopback address and has no [admin] token"), "{e}");
        let e = parse("0.0.0.0:8081", "insecure_loopback = true\n").unwrap_err();
        assert!(e.contains("not a loopback address"), "{e}");
        let e = parse("127.0.0.1:8081", "").unwrap_err();
        assert!(e.starts_with("line 7:") && e.contains("insecure_loopback = true"), "{e}");
        assert!(parse("127.0.0.1:8081", "insecure_loopback = true\n").is_ok());
        assert!(parse("0.0.0.0:8081", "token = \"0123456789abcdef\"\n").is_ok());
        let e = parse("0.0.0.0:8081", "token = \"short\"\n").unwrap_err();
        assert!(e.contains("at least 16"), "{e}");
        assert!(Config::parse(HEAD).is_ok(), "no admin listener, nothing to protect");
    }

    #[test]
    fn token_file_is_read_relative_to_the_config() {
        let dir = std::env::temp_dir().join(format!("refract-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("admin.token"), "0123456789abcdefXYZ\n").unwrap();
        let text = format!("{HEAD}admin = \"0.0.0.0:8081\"\n[admin]\ntoken_file = \"admin.token\"\n");
        let c = Config::parse_in(&text, &dir).unwrap();
        assert_eq!(c.admin.token.as_deref(), Some("0123456789abcdefXYZ"));
        let e = Config::parse_in(&text.replace("admin.token", "missing.token"), &dir).unwrap_err();
        assert!(e.contains("[admin] token_file") && e.contains("missing.token"), "{e}");
        let both = format!("{text}token = \"0123456789abcdef\"\n");
        assert!(Config::parse_in(&both, &dir).unwrap_err().contains("exclude each other"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
