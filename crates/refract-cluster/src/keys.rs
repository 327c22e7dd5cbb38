//! Where refract's keys live in etcd, under `[cluster] prefix`:
//! `PREFIX/nodes/NODE_ID` (each dispatcher, under its lease), `PREFIX/shared/NAME` (the
//! state every dispatcher follows) and `PREFIX/2pc/GID` (two-phase decisions, not watched). Pure: names in, names out.

/// The key layout under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

/// What a key under the prefix is.
#[derive(Debug, PartialEq, Eq)]
pub enum Key<'a> {
    /// A dispatcher's registration.
    Node(&'a str),
    /// A shared entry.
    Shared(&'a str),
}

const NODES: &str = "/nodes/";
const SHARED: &str = "/shared/";

impl Keys {
    /// The layout under `prefix` (`/refract`: validated to start and not end with `/`).
    pub fn new(prefix: &str) -> Keys {
        Keys { prefix: prefix.to_owned() }
    }

    /// Every key of ours: the range to read and watch.
    pub fn all(&self) -> String {
        format!("{}/", self.prefix)
    }

    /// A dispatcher's registration key.
    pub fn node(&self, node_id: &str) -> String {
        format!("{}{NODES}{node_id}", self.prefix)
    }

    /// A shared entry's key.
    pub fn shared(&self, name: &str) -> String {
        format!("{}{SHARED}{name}", self.prefix)
    }

    /// A two-phase transaction's decision (kept apart from the shared entries: not watched).
    pub fn decision(&self, gid: &str) -> String {
        format!("{}/2pc/{gid}", self.prefix)
    }

    /// What `key` is, or `None` for a key of ours this version does not know.
    pub fn parse<'a>(&self, key: &'a str) -> Option<Key<'a>> {
        let rest = key.strip_prefix(self.prefix.as_str())?;
        if let Some(id) = rest.strip_prefix(NODES) {
            return Some(Key::Node(id));
        }
        rest.strip_prefix(SHARED).map(Key::Shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let k = Keys::new("/refract");
        assert_eq!(k.parse(&k.node("d1")), Some(Key::Node("d1")));
        assert_eq!(k.parse(&k.shared("members/b1")), Some(Key::Shared("members/b1")));
        assert_eq!(k.parse("/refract/other/x"), None);
        assert_eq!(k.parse(&k.decision("refract:d1:1:2")), None, "decisions are not in the view");
        assert_eq!(k.parse("/refracted/nodes/x"), None);
        assert_eq!(k.all(), "/refract/");
    }
}
