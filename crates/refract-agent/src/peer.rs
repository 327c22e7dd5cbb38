//! Who may use the same-host link: its socket file is 0600 (0660 with a group), and each peer's
//! uid (SO_PEERCRED) is checked on accept, before any message is read — a process that can open
//! the socket could otherwise make the agent run requests on its backend (issue 21, item 9).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use tokio::net::{UnixListener, UnixStream};

/// The uids allowed on the same-host link.
#[derive(Debug, Clone, Default)]
pub struct PeerPolicy {
    /// Listed uids (`allowed_uids`); the agent's own uid is always allowed.
    pub uids: Vec<u32>,
}

impl PeerPolicy {
    /// Whether a peer running as `peer` may talk to an agent running as `own`. Root is not
    /// special: a root peer is allowed only if listed or if the agent itself runs as root.
    pub fn allows(&self, peer: u32, own: u32) -> bool {
        peer == own || self.uids.contains(&peer)
    }

    /// Checks an accepted link's peer; `Err` says why it is refused (logged by the caller).
    pub fn check(&self, stream: &UnixStream) -> Result<(), String> {
        let cred = stream.peer_cred().map_err(|e| format!("no peer credentials: {e}"))?;
        let own = nix::unistd::geteuid().as_raw();
        if self.allows(cred.uid(), own) {
            return Ok(());
        }
        Err(format!("peer uid {} (pid {:?}) is not allowed (allowed_uids)", cred.uid(), cred.pid()))
    }
}

/// Binds the same-host socket at `path` (a stale file from an earlier run is replaced) and
/// restricts the file: 0600, or 0660 owned by `gid` when given. Between bind and chmod the file
/// has the umask's mode for an instant; the uid check covers that window.
pub fn bind_local(path: &Path, gid: Option<u32>) -> std::io::Result<UnixListener> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    let mode = match gid {
        Some(g) => {
            std::os::unix::fs::chown(path, None, Some(g))?;
            0o660
        }
        None => 0o600,
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn who_is_allowed() {
        let listed = PeerPolicy { uids: vec![1001] };
        let none = PeerPolicy::default();
        // (policy, peer, own, allowed)
        let table = [
            (&none, 1000, 1000, true),
            (&none, 1001, 1000, false),
            (&none, 0, 1000, false), // root peer, agent not root, not listed
            (&none, 0, 0, true),     // the agent runs as root
            (&none, 65534, 0, false),
            (&listed, 1001, 1000, true),
            (&listed, 1002, 1000, false),
            (&PeerPolicy { uids: vec![0] }, 0, 1000, true),
        ];
        for (p, peer, own, want) in table {
            assert_eq!(p.allows(peer, own), want, "{p:?} peer {peer} own {own}");
        }
    }
}
