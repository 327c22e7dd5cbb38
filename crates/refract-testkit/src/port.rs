//! Free loopback ports for tests, never the same one twice in one process.
//!
//! Binding port 0 and closing the listener names a port free at that moment; the kernel may
//! name the same one again at the next bind, and with every test of a crate in one binary two
//! set-ups (a server's port and an admin port, say) would then clash. This process remembers
//! what it handed out.

use std::collections::HashSet;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, OnceLock, PoisonError};

/// A port on 127.0.0.1 free right now and not handed out before by this process.
pub fn free_port() -> u16 {
    try_free_port().expect("bind 127.0.0.1:0")
}

/// [`free_port`], the bind's failure returned.
pub fn try_free_port() -> io::Result<u16> {
    static GIVEN: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let given = GIVEN.get_or_init(Default::default);
    loop {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port();
        if given.lock().unwrap_or_else(PoisonError::into_inner).insert(port) {
            return Ok(port);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_port_is_handed_out_twice() {
        let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
        let distinct: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
    }
}
