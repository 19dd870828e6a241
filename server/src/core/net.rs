//! The network a client's requests are limited by.
//!
//! Contract: a client is its address with the part it can vary for free removed: an IPv4
//! address as a whole (/32), an IPv6 address by its /64 prefix (one subscriber or host usually
//! owns a whole /64 and can rotate the lower 64 bits at will). An IPv4-mapped IPv6 address
//! (`::ffff:a.b.c.d`) is the IPv4 address. Nothing else a client sends (user agent, site id,
//! page) is part of it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// A client network: IPv4 /32 or IPv6 /64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClientNet {
    V4([u8; 4]),
    V6([u8; 8]),
}

impl ClientNet {
    /// The network of `ip`.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => ClientNet::V4(v4.octets()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => ClientNet::V4(v4.octets()),
                None => {
                    let mut prefix = [0u8; 8];
                    prefix.copy_from_slice(&v6.octets()[..8]);
                    ClientNet::V6(prefix)
                }
            },
        }
    }

    /// A fixed-length encoding (a tag byte and the network's bytes), for hashing.
    pub fn to_bytes(self) -> [u8; 9] {
        let mut out = [0u8; 9];
        match self {
            ClientNet::V4(b) => {
                out[0] = 4;
                out[1..5].copy_from_slice(&b);
            }
            ClientNet::V6(b) => {
                out[0] = 6;
                out[1..].copy_from_slice(&b);
            }
        }
        out
    }
}

/// How many of something (connections, open requests, stats reads) each client network holds
/// now, at most `max` each. A network holding nothing has no entry: the table is as large as
/// the set of networks holding something now, never more.
pub struct Shares {
    table: Mutex<HashMap<ClientNet, usize>>,
    max: usize,
}

impl Shares {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            table: Mutex::new(HashMap::new()),
            max: max.max(1),
        })
    }

    fn table(&self) -> MutexGuard<'_, HashMap<ClientNet, usize>> {
        // Plain counters, valid whatever a panicking holder did.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One more for `net`, or `None` when it holds its whole share; given back on drop.
    pub fn take(self: &Arc<Self>, net: ClientNet) -> Option<Share> {
        let mut table = self.table();
        let held = table.entry(net).or_default();
        if *held >= self.max {
            return None;
        }
        *held += 1;
        Some(Share {
            shares: Arc::clone(self),
            net,
        })
    }

    /// Networks holding something now.
    pub fn networks(&self) -> usize {
        self.table().len()
    }
}

/// One place in a network's share; given back on drop.
pub struct Share {
    shares: Arc<Shares>,
    net: ClientNet,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut table = self.shares.table();
        if let Some(held) = table.get_mut(&self.net) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                table.remove(&self.net);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> ClientNet {
        ClientNet::of(s.parse().expect("ip"))
    }

    #[test]
    fn ipv6_is_limited_by_its_64_prefix() {
        assert_eq!(
            net("2001:db8:1:2::1"),
            net("2001:db8:1:2:ffff:ffff:ffff:ffff")
        );
        assert_ne!(net("2001:db8:1:2::1"), net("2001:db8:1:3::1"));
    }

    #[test]
    fn ipv4_is_the_whole_address_also_when_mapped() {
        assert_ne!(net("192.0.2.1"), net("192.0.2.2"));
        assert_eq!(net("::ffff:192.0.2.1"), net("192.0.2.1"));
    }

    #[test]
    fn a_network_gets_its_share_and_no_more_and_gives_it_back() {
        let shares = Shares::new(2);
        let a = shares.take(net("192.0.2.1")).expect("first");
        let b = shares.take(net("192.0.2.1")).expect("second");
        assert!(shares.take(net("192.0.2.1")).is_none(), "past the share");
        let other = shares.take(net("192.0.2.2")).expect("another network");
        let v6 = shares.take(net("2001:db8::1")).expect("v6");
        let v6b = shares.take(net("2001:db8::2")).expect("same /64");
        assert!(shares.take(net("2001:db8::3")).is_none(), "same /64, full");
        drop(a);
        let c = shares.take(net("192.0.2.1")).expect("given back on drop");
        drop((b, c, other, v6, v6b));
        assert_eq!(shares.networks(), 0, "nothing held, no entry");
    }
}
