//! The network a client's requests are limited by.
//!
//! Contract: a client is its address with the part it can vary for free removed: an IPv4
//! address as a whole (/32), an IPv6 address by its /64 prefix (one subscriber or host usually
//! owns a whole /64 and can rotate the lower 64 bits at will). An IPv4-mapped IPv6 address
//! (`::ffff:a.b.c.d`) is the IPv4 address. Nothing else a client sends (user agent, site id,
//! page) is part of it.

use std::net::IpAddr;

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
}
