//! Per-address shares of the server: how many connections and open requests one client
//! network may hold at once, so no single address can fill the server's cap.
//!
//! Contract:
//! - A client network is the TCP peer's address as [`ClientNet`] has it (IPv4 /32, IPv6 /64):
//!   forwarding headers play no part, the socket is what is held.
//! - At most `max_connections` connections and `max_requests` open requests (HTTP/1 requests
//!   and HTTP/2 streams, from head to the end of the answer) per network. A connection past
//!   its share is refused like one past the global cap; a request past it is answered `503`
//!   without reaching the application.
//! - Trusted proxies have no share: every client behind them arrives from their address, so
//!   the proxy's own per-client limits apply (the operators' guide says so).
//! - A share is given back when its guard drops (connection closed, answer sent or dropped);
//!   a network holding nothing has no entry, so the table is as large as the set of
//!   networks connected now, never more.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::core::forwarded::TrustedProxies;
use crate::core::net::ClientNet;

/// What one network holds now.
#[derive(Debug, Default, Clone, Copy)]
struct Held {
    connections: usize,
    requests: usize,
}

/// The shares of every connected client network.
pub(crate) struct Shares {
    table: Mutex<HashMap<ClientNet, Held>>,
    max_connections: usize,
    max_requests: usize,
    exempt: TrustedProxies,
}

impl Shares {
    pub fn new(max_connections: usize, max_requests: usize, exempt: TrustedProxies) -> Self {
        Self {
            table: Mutex::new(HashMap::new()),
            max_connections: max_connections.max(1),
            max_requests: max_requests.max(1),
            exempt,
        }
    }

    fn table(&self) -> MutexGuard<'_, HashMap<ClientNet, Held>> {
        // Plain counters, valid whatever a panicking holder did.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection from `peer`, or `None` when its network holds its whole share. A trusted
    /// proxy always gets one that counts nothing.
    pub fn connect(self: &Arc<Self>, peer: IpAddr) -> Option<ConnectionShare> {
        if self.exempt.contains(peer) {
            return Some(ConnectionShare {
                shares: Arc::clone(self),
                net: None,
            });
        }
        let net = ClientNet::of(peer);
        let mut table = self.table();
        let held = table.entry(net).or_default();
        if held.connections >= self.max_connections {
            return None;
        }
        held.connections += 1;
        Some(ConnectionShare {
            shares: Arc::clone(self),
            net: Some(net),
        })
    }

    fn release(&self, net: ClientNet, take: impl FnOnce(&mut Held)) {
        let mut table = self.table();
        if let Some(held) = table.get_mut(&net) {
            take(held);
            if held.connections == 0 && held.requests == 0 {
                table.remove(&net);
            }
        }
    }

    /// Networks holding a connection or a request now.
    #[cfg(test)]
    fn networks(&self) -> usize {
        self.table().len()
    }
}

/// One connection's place in its network's share; given back on drop.
pub(crate) struct ConnectionShare {
    shares: Arc<Shares>,
    /// `None` for a trusted proxy.
    net: Option<ClientNet>,
}

impl ConnectionShare {
    /// An open request of this connection, or `None` when its network holds its whole share.
    pub fn request(&self) -> Option<RequestShare> {
        let Some(net) = self.net else {
            return Some(RequestShare(None));
        };
        let mut table = self.shares.table();
        // The connection's own entry exists while it lives.
        let held = table.entry(net).or_default();
        if held.requests >= self.shares.max_requests {
            return None;
        }
        held.requests += 1;
        Some(RequestShare(Some((Arc::clone(&self.shares), net))))
    }
}

impl Drop for ConnectionShare {
    fn drop(&mut self) {
        if let Some(net) = self.net {
            self.shares.release(net, |held| {
                held.connections = held.connections.saturating_sub(1);
            });
        }
    }
}

/// One open request's place in its network's share; given back on drop.
pub(crate) struct RequestShare(Option<(Arc<Shares>, ClientNet)>);

impl Drop for RequestShare {
    fn drop(&mut self) {
        if let Some((shares, net)) = self.0.take() {
            shares.release(net, |held| held.requests = held.requests.saturating_sub(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn a_network_gets_its_share_and_no_more_and_gives_it_back() {
        let shares = Arc::new(Shares::new(2, 3, TrustedProxies::none()));
        let a = shares.connect(ip("192.0.2.1")).expect("first");
        let b = shares.connect(ip("192.0.2.1")).expect("second");
        assert!(shares.connect(ip("192.0.2.1")).is_none(), "past the share");
        let other = shares.connect(ip("192.0.2.2")).expect("another address");
        // One /64 is one network: another host part of it shares the share.
        let v6 = shares.connect(ip("2001:db8::1")).expect("v6");
        let v6b = shares.connect(ip("2001:db8::2")).expect("same /64");
        assert!(
            shares.connect(ip("2001:db8::3")).is_none(),
            "same /64, full"
        );
        assert!(shares.connect(ip("2001:db8:0:1::1")).is_some(), "next /64");
        drop(a);
        let c = shares.connect(ip("192.0.2.1")).expect("given back on drop");
        let r1 = b.request().expect("request 1");
        let r2 = c.request().expect("request 2, another connection");
        let r3 = b.request().expect("request 3");
        assert!(c.request().is_none(), "requests are shared by the network");
        assert!(other.request().is_some(), "not by other networks");
        drop(r2);
        assert!(
            b.request().is_some(),
            "a request's share comes back on drop"
        );
        drop((r1, r3, b, c, other, v6, v6b));
        assert_eq!(shares.networks(), 0, "nothing held, no entry");
    }

    #[test]
    fn trusted_proxies_have_no_share() {
        let proxies = TrustedProxies::parse(["10.0.0.0/8"]).expect("parse");
        let shares = Arc::new(Shares::new(1, 1, proxies));
        let held: Vec<_> = (0..10)
            .map(|_| shares.connect(ip("10.1.2.3")).expect("proxy"))
            .collect();
        let requests: Vec<_> = (0..10)
            .map(|_| held[0].request().expect("proxy request"))
            .collect();
        assert_eq!(shares.networks(), 0, "nothing is counted for a proxy");
        assert_eq!(requests.len(), 10);
    }
}
