//! A client's fair share of a backend's slots: slots held per client address, and which waiter
//! a free slot goes to. A client holding its share of the limit (`client_share` of it) waits
//! behind the other clients' requests of the same priority: the slots it holds are its own, but
//! the next free one goes to a client holding less. Work-conserving: a client alone gets every
//! slot, and waiters without an address (or of clients under their share) are served in the
//! queue's own order. A share of 1 prefers no one (a client that holds fewer than all slots is
//! under it, and a free slot means nobody holds all).

use std::collections::HashMap;
use std::net::IpAddr;

/// Slots held per client address (only clients that hold one are listed).
#[derive(Debug, Default)]
pub(super) struct Holders {
    held: HashMap<IpAddr, usize>,
}

impl Holders {
    /// `client` took a slot.
    pub(super) fn add(&mut self, client: Option<IpAddr>) {
        if let Some(c) = client {
            *self.held.entry(c).or_default() += 1;
        }
    }

    /// `client` gave a slot back.
    pub(super) fn remove(&mut self, client: Option<IpAddr>) {
        let Some(c) = client else { return };
        if let Some(n) = self.held.get_mut(&c) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(&c);
            }
        }
    }

    /// Slots `client` holds.
    pub(super) fn of(&self, client: IpAddr) -> usize {
        self.held.get(&client).copied().unwrap_or(0)
    }

    /// Which of `waiters` (client addresses in the queue's order of service) gets the next slot:
    /// the first whose client holds fewer than `share` slots (a fraction of the limit), else the
    /// first.
    pub(super) fn pick(&self, waiters: impl Iterator<Item = Option<IpAddr>>, share: f64) -> usize {
        // One client usually fills a queue: its verdict is looked up once, not per waiter.
        let mut over: Option<IpAddr> = None;
        for (i, client) in waiters.enumerate() {
            match client {
                None => return i,
                Some(c) if over == Some(c) => {}
                Some(c) if (self.of(c) as f64) < share => return i,
                Some(c) => over = Some(c),
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([127, 0, 0, last]))
    }

    #[test]
    fn a_client_over_its_share_waits_behind_others() {
        let mut h = Holders::default();
        for _ in 0..2 {
            h.add(ip(2));
        }
        h.add(ip(3));
        // (waiters in order, share in slots) → index served.
        let table: [(&[Option<IpAddr>], f64, usize); 7] = [
            (&[ip(2), ip(2), ip(1)], 2.0, 2), // 2 holds its share: 1 goes first
            (&[ip(2), ip(2), ip(1)], 2.5, 0), // under a larger share: in order
            (&[ip(2), ip(3), ip(1)], 1.0, 2), // 2 and 3 both hold their one slot
            (&[ip(2), ip(3), ip(1)], 0.5, 2), // a share under one slot: holding one is over it
            (&[ip(2), None, ip(1)], 2.0, 1),  // no address: in order
            (&[ip(2), ip(2)], 2.0, 0),        // only clients over their share: in order
            (&[ip(3), ip(2)], 2.0, 0),        // 3 holds one of its two
        ];
        for (waiters, share, want) in table {
            assert_eq!(h.pick(waiters.iter().copied(), share), want, "{waiters:?} share {share}");
        }
        h.remove(ip(2));
        h.remove(ip(2));
        h.remove(None);
        assert_eq!((h.of(IpAddr::from([127, 0, 0, 2])), h.held.len()), (0, 1), "emptied entries go");
    }
}
