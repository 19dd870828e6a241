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
//! - A share is given back when its guard drops (connection closed, answer sent or dropped).

use std::net::IpAddr;
use std::sync::Arc;

use crate::core::forwarded::TrustedProxies;
use crate::core::net::{ClientNet, Share, Shares};

/// The connection and request shares of every connected client network.
pub(crate) struct AddressShares {
    connections: Arc<Shares>,
    requests: Arc<Shares>,
    exempt: TrustedProxies,
}

impl AddressShares {
    pub fn new(max_connections: usize, max_requests: usize, exempt: TrustedProxies) -> Self {
        Self {
            connections: Shares::new(max_connections),
            requests: Shares::new(max_requests),
            exempt,
        }
    }

    /// A connection from `peer`, or `None` when its network holds its whole share. A trusted
    /// proxy always gets one that counts nothing.
    pub fn connect(&self, peer: IpAddr) -> Option<ConnectionShare> {
        if self.exempt.contains(peer) {
            return Some(ConnectionShare {
                requests: None,
                _held: None,
            });
        }
        let net = ClientNet::of(peer);
        let held = self.connections.take(net)?;
        Some(ConnectionShare {
            requests: Some((Arc::clone(&self.requests), net)),
            _held: Some(held),
        })
    }
}

/// One connection's place in its network's share; given back on drop.
pub(crate) struct ConnectionShare {
    /// The request shares and the network; `None` for a trusted proxy.
    requests: Option<(Arc<Shares>, ClientNet)>,
    _held: Option<Share>,
}

impl ConnectionShare {
    /// An open request of this connection (`Some(None)` for a proxy: nothing to count), or
    /// `None` when its network holds its whole share.
    pub fn request(&self) -> Option<Option<Share>> {
        match &self.requests {
            None => Some(None),
            Some((shares, net)) => shares.take(*net).map(Some),
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
    fn connections_and_requests_have_their_own_shares() {
        let shares = AddressShares::new(2, 3, TrustedProxies::none());
        let a = shares.connect(ip("192.0.2.1")).expect("first");
        let b = shares.connect(ip("192.0.2.1")).expect("second");
        assert!(shares.connect(ip("192.0.2.1")).is_none(), "past the share");
        let other = shares.connect(ip("192.0.2.2")).expect("another address");
        let r1 = a.request().expect("request 1");
        let r2 = b.request().expect("request 2, another connection");
        let r3 = a.request().expect("request 3");
        assert!(b.request().is_none(), "requests are shared by the network");
        assert!(other.request().is_some(), "not by other networks");
        drop(r2);
        assert!(
            a.request().is_some(),
            "a request's share comes back on drop"
        );
        drop((r1, r3));
        drop(a);
        assert!(
            shares.connect(ip("192.0.2.1")).is_some(),
            "given back on drop"
        );
    }

    #[test]
    fn trusted_proxies_have_no_share() {
        let proxies = TrustedProxies::parse(["10.0.0.0/8"]).expect("parse");
        let shares = AddressShares::new(1, 1, proxies);
        let held: Vec<_> = (0..10)
            .map(|_| shares.connect(ip("10.1.2.3")).expect("proxy"))
            .collect();
        let requests: Vec<_> = (0..10)
            .map(|_| held[0].request().expect("proxy request"))
            .collect();
        assert!(requests.iter().all(Option::is_none), "nothing is counted");
        assert!(shares.connect(ip("10.9.9.9")).is_some());
    }
}
