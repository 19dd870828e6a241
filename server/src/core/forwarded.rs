//! Who the client is behind reverse proxies: `X-Forwarded-For` and RFC 7239 `Forwarded`.
//!
//! Contract:
//! - A [`TrustedProxies`] set is built from CIDRs, single addresses and opt-in presets
//!   (`loopback`, `private`, `link-local`). It is empty unless configured: then no header is read.
//! - [`client_address`] reads a header only when the peer (the socket's other end) is itself in
//!   the set. It then walks the hops from right to left over ALL lines of the chosen header, in
//!   order (a proxy that adds its own line, like HAProxy, and one that appends to the last line,
//!   like nginx, give the same list), and returns the rightmost address NOT in the set. Every hop
//!   left of that one was written by the client and is never looked at, so a client cannot choose
//!   its address by sending a forged header.
//! - Hops may be `a.b.c.d`, `a.b.c.d:port`, a bare IPv6 address, `[v6]` or `[v6]:port`, quoted
//!   or not; IPv4-mapped IPv6 addresses are their IPv4 address. A hop that is not an address
//!   (`unknown`, an RFC 7239 obfuscated `_name`, garbage) stops the walk: the client is then the
//!   last (leftmost) trusted address reached, at worst the peer. The same holds when every hop is
//!   trusted.
//! - Only one header is read ([`ProxyHeader`]): a client can send both, and only the one the
//!   proxy writes carries a hop the client cannot forge.
//! - Nothing here panics or allocates more than the header's own size; parsing is total.

use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

/// Which header the trusted proxies write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ProxyHeader {
    /// `X-Forwarded-For: client, proxy1, …` (nginx, HAProxy `option forwardfor`, Caddy,
    /// Traefik, most load balancers).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client;proto=https, for=proxy1` (HAProxy `option forwarded`,
    /// Envoy, some CDNs).
    Forwarded,
}

impl ProxyHeader {
    /// The header's name (lower case).
    pub fn name(self) -> &'static str {
        match self {
            ProxyHeader::XForwardedFor => "x-forwarded-for",
            ProxyHeader::Forwarded => "forwarded",
        }
    }
}

/// Why a trusted-proxy entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "trusted proxy {0:?} is neither a CIDR (10.0.0.0/8, fd00::/8), an address, nor a preset (loopback, private, link-local)"
)]
pub struct ProxyError(pub String);

/// The addresses whose forwarding headers are believed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

/// `loopback`: the machine itself.
const LOOPBACK: [&str; 2] = ["127.0.0.0/8", "::1/128"];
/// `private`: RFC 1918 ranges and IPv6 unique local addresses (RFC 4193).
const PRIVATE: [&str; 4] = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"];
/// `link-local`: RFC 3927 and IPv6 link-local.
const LINK_LOCAL: [&str; 2] = ["169.254.0.0/16", "fe80::/10"];

impl TrustedProxies {
    /// No proxy is trusted: the peer is always the client.
    pub fn none() -> Self {
        Self::default()
    }

    /// A set from entries: presets (`loopback`, `private`, `link-local`), CIDRs, or addresses.
    pub fn parse<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<Self, ProxyError> {
        let mut nets = Vec::new();
        for entry in entries {
            let entry = entry.trim();
            let preset: &[&str] = match entry.to_ascii_lowercase().as_str() {
                "" => continue,
                "loopback" => &LOOPBACK,
                "private" => &PRIVATE,
                "link-local" | "linklocal" => &LINK_LOCAL,
                _ => &[],
            };
            if !preset.is_empty() {
                nets.extend(preset.iter().filter_map(|n| IpNet::from_str(n).ok()));
                continue;
            }
            let net = IpNet::from_str(entry)
                .or_else(|_| IpAddr::from_str(entry).map(IpNet::from))
                .map_err(|_| ProxyError(entry.to_owned()))?;
            nets.push(canonical_net(net.trunc()));
        }
        nets.sort();
        nets.dedup();
        Ok(Self { nets })
    }

    /// Whether no proxy is trusted.
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    /// Whether `ip` is a trusted proxy (IPv4-mapped IPv6 addresses as their IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|n| n.contains(&ip))
    }

    /// The configured networks, for display.
    pub fn nets(&self) -> &[IpNet] {
        &self.nets
    }
}

/// `::ffff:10.0.0.0/104` is `10.0.0.0/8`.
fn canonical_net(net: IpNet) -> IpNet {
    if let IpNet::V6(v6) = net
        && let Some(v4) = v6.network().to_ipv4_mapped()
        && v6.prefix_len() >= 96
        && let Ok(n) = ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96)
    {
        return IpNet::V4(n);
    }
    net
}

/// One hop of a forwarding header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hop {
    /// An address (canonical: IPv4-mapped addresses are IPv4).
    Addr(IpAddr),
    /// `unknown`, an obfuscated identifier, or something that is not an address.
    Unknown,
}

/// Parse one node: `a.b.c.d`, `a.b.c.d:port`, `v6`, `[v6]`, `[v6]:port`, optionally quoted.
pub fn parse_node(raw: &str) -> Hop {
    let mut s = raw.trim_matches(|c: char| c == ' ' || c == '\t');
    if s.len() >= 2 && s.starts_with('"') && s.ends_with('"') {
        s = &s[1..s.len() - 1];
    }
    let addr = if let Some(rest) = s.strip_prefix('[') {
        // `[v6]` or `[v6]:port`
        rest.split_once(']').and_then(|(inner, after)| {
            let port_ok = after.is_empty() || after.strip_prefix(':').is_some_and(valid_port);
            port_ok.then(|| inner.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6))?
        })
    } else if let Ok(ip) = s.parse::<IpAddr>() {
        Some(ip)
    } else if let Some((host, port)) = s.split_once(':') {
        // Exactly one colon: `a.b.c.d:port` (a bare IPv6 address parsed above).
        if valid_port(port) {
            host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
        } else {
            None
        }
    } else {
        None
    };
    match addr {
        Some(ip) => Hop::Addr(ip.to_canonical()),
        None => Hop::Unknown,
    }
}

/// A port: digits (at most 5), or an RFC 7239 obfuscated port (`_abc`).
fn valid_port(p: &str) -> bool {
    (!p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
        || (p.len() > 1
            && p.starts_with('_')
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')))
}

/// The hops of one `X-Forwarded-For` line, left to right (empty elements skipped).
pub fn x_forwarded_for_hops(line: &str) -> impl DoubleEndedIterator<Item = Hop> + '_ {
    line.split(',')
        .filter(|e| !e.trim().is_empty())
        .map(parse_node)
}

/// The hops of one `Forwarded` line, left to right: each element's `for=` node; an element
/// without one, or one that cannot be read, is [`Hop::Unknown`].
pub fn forwarded_hops(line: &str) -> Vec<Hop> {
    split_outside_quotes(line, b',')
        .into_iter()
        .filter(|e| !e.trim().is_empty())
        .map(|element| {
            split_outside_quotes(element, b';')
                .into_iter()
                .filter_map(|pair| pair.split_once('='))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("for"))
                .map_or(Hop::Unknown, |(_, value)| parse_forwarded_value(value))
        })
        .collect()
}

/// A `for=` value: a token or a quoted string (escapes removed; an address holds none).
fn parse_forwarded_value(value: &str) -> Hop {
    let value = value.trim();
    if value.starts_with('"') {
        if value.len() < 2 || !value.ends_with('"') {
            return Hop::Unknown;
        }
        let inner = &value[1..value.len() - 1];
        if inner.contains('\\') {
            let unescaped: String = {
                let mut out = String::with_capacity(inner.len());
                let mut chars = inner.chars();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => out.extend(chars.next()),
                        c => out.push(c),
                    }
                }
                out
            };
            return parse_node(&unescaped);
        }
        return parse_node(inner);
    }
    parse_node(value)
}

/// Split `s` at `sep` where it is not inside a quoted string (backslash escapes honoured). An
/// unterminated quote runs to the end of the line.
fn split_outside_quotes(s: &str, sep: u8) -> Vec<&str> {
    let bytes = s.as_bytes();
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, &b) in bytes.iter().enumerate() {
        if escaped {
            escaped = false;
        } else if quoted && b == b'\\' {
            escaped = true;
        } else if b == b'"' {
            quoted = !quoted;
        } else if b == sep && !quoted {
            parts.push(&s[start..i]);
            start = i + 1;
        }
    }
    parts.push(&s[start..]);
    parts
}

/// The client's address: the peer, unless the peer is a trusted proxy; then the rightmost hop
/// of `lines` (every line of `header`, in order) that is not trusted (see the module doc).
pub fn client_address<'a>(
    peer: IpAddr,
    trusted: &TrustedProxies,
    header: ProxyHeader,
    lines: impl DoubleEndedIterator<Item = &'a str>,
) -> IpAddr {
    let mut client = peer.to_canonical();
    if !trusted.contains(client) {
        return client;
    }
    for line in lines.rev() {
        let hops: Vec<Hop> = match header {
            ProxyHeader::XForwardedFor => x_forwarded_for_hops(line).collect(),
            ProxyHeader::Forwarded => forwarded_hops(line),
        };
        for hop in hops.into_iter().rev() {
            match hop {
                Hop::Addr(ip) => {
                    client = ip;
                    if !trusted.contains(ip) {
                        return ip;
                    }
                }
                Hop::Unknown => return client,
            }
        }
    }
    client
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn local() -> TrustedProxies {
        TrustedProxies::parse(["loopback", "private"]).expect("presets")
    }

    fn xff(peer: &str, lines: &[&str]) -> IpAddr {
        client_address(
            ip(peer),
            &local(),
            ProxyHeader::XForwardedFor,
            lines.iter().copied(),
        )
    }

    fn fwd(peer: &str, lines: &[&str]) -> IpAddr {
        client_address(
            ip(peer),
            &local(),
            ProxyHeader::Forwarded,
            lines.iter().copied(),
        )
    }

    #[test]
    fn nodes_in_every_form() {
        for (raw, want) in [
            ("203.0.113.7", "203.0.113.7"),
            (" 203.0.113.7 ", "203.0.113.7"),
            ("203.0.113.7:51234", "203.0.113.7"),
            ("\"203.0.113.7:51234\"", "203.0.113.7"),
            ("2001:db8::1", "2001:db8::1"),
            ("[2001:db8::1]", "2001:db8::1"),
            ("[2001:db8::1]:443", "2001:db8::1"),
            ("\"[2001:db8::1]:_port\"", "2001:db8::1"),
            ("::ffff:203.0.113.7", "203.0.113.7"),
            ("[::ffff:203.0.113.7]:80", "203.0.113.7"),
        ] {
            assert_eq!(parse_node(raw), Hop::Addr(ip(want)), "{raw}");
        }
        for raw in [
            "unknown",
            "_hidden",
            "",
            "1.2.3",
            "1.2.3.4:",
            "1.2.3.4:99999999",
            "[2001:db8::1",
            "[1.2.3.4]",
            "2001:db8::1:80:x",
            "fe80::1%eth0",
        ] {
            assert_eq!(parse_node(raw), Hop::Unknown, "{raw}");
        }
    }

    #[test]
    fn the_peer_must_be_trusted_for_any_header_to_be_read() {
        assert_eq!(xff("198.51.100.1", &["203.0.113.7"]), ip("198.51.100.1"));
        let none = TrustedProxies::none();
        assert_eq!(
            client_address(
                ip("127.0.0.1"),
                &none,
                ProxyHeader::XForwardedFor,
                ["203.0.113.7"].into_iter()
            ),
            ip("127.0.0.1")
        );
    }

    #[test]
    fn the_rightmost_untrusted_hop_is_the_client() {
        // nginx: one line, the proxy appended the client's address.
        assert_eq!(
            xff("127.0.0.1", &["6.6.6.6, 203.0.113.7"]),
            ip("203.0.113.7")
        );
        // HAProxy: the client's forged line first, the proxy's own line last.
        assert_eq!(
            xff("127.0.0.1", &["6.6.6.6", "203.0.113.7"]),
            ip("203.0.113.7")
        );
        // Two proxies, the inner one private: skipped.
        assert_eq!(
            xff("10.0.0.2", &["6.6.6.6, 203.0.113.7, 10.0.0.1"]),
            ip("203.0.113.7")
        );
        // A forged private hop left of the real client is never reached.
        assert_eq!(
            xff("127.0.0.1", &["10.9.9.9, 203.0.113.7"]),
            ip("203.0.113.7")
        );
        // ip:port from a proxy that adds the port.
        assert_eq!(xff("127.0.0.1", &["203.0.113.7:4711"]), ip("203.0.113.7"));
        assert_eq!(xff("127.0.0.1", &["[2001:db8::7]:4711"]), ip("2001:db8::7"));
    }

    #[test]
    fn all_trusted_or_unreadable_hops_stop_at_the_last_trusted_address() {
        assert_eq!(xff("127.0.0.1", &["10.0.0.5"]), ip("10.0.0.5"));
        assert_eq!(xff("127.0.0.1", &[]), ip("127.0.0.1"));
        assert_eq!(xff("127.0.0.1", &["6.6.6.6, unknown"]), ip("127.0.0.1"));
        assert_eq!(
            xff("127.0.0.1", &["6.6.6.6, garbage, 10.0.0.9"]),
            ip("10.0.0.9")
        );
        // An IPv4-mapped peer is its IPv4 address.
        assert_eq!(xff("::ffff:127.0.0.1", &["203.0.113.7"]), ip("203.0.113.7"));
    }

    #[test]
    fn forwarded_elements_quotes_and_parameters() {
        assert_eq!(
            fwd(
                "127.0.0.1",
                &["for=6.6.6.6, for=203.0.113.7;proto=https;by=10.0.0.1"]
            ),
            ip("203.0.113.7")
        );
        assert_eq!(
            fwd("127.0.0.1", &["for=6.6.6.6", "For=\"[2001:db8::7]:4711\""]),
            ip("2001:db8::7")
        );
        // A quoted comma does not split elements.
        assert_eq!(
            fwd(
                "127.0.0.1",
                &["for=\"6.6.6.6, for=1.1.1.1\";proto=http, for=203.0.113.7"]
            ),
            ip("203.0.113.7")
        );
        // Obfuscated and unknown nodes stop the walk at the last trusted address.
        assert_eq!(fwd("127.0.0.1", &["for=_hidden"]), ip("127.0.0.1"));
        assert_eq!(
            fwd("127.0.0.1", &["for=6.6.6.6, for=unknown, for=10.1.1.1"]),
            ip("10.1.1.1")
        );
        // An element without `for=` says nothing about the client.
        assert_eq!(fwd("127.0.0.1", &["proto=https"]), ip("127.0.0.1"));
        // A forged unterminated quote only spoils its own line.
        assert_eq!(
            fwd("127.0.0.1", &["for=\"6.6.6.6", "for=203.0.113.7"]),
            ip("203.0.113.7")
        );
        // Escapes inside quotes.
        assert_eq!(
            fwd("127.0.0.1", &["for=\"203.0.113\\.7\""]),
            ip("203.0.113.7")
        );
    }

    #[test]
    fn presets_cidrs_and_addresses() {
        let t = TrustedProxies::parse(["private", "203.0.113.9", "2001:db8::/32"]).expect("ok");
        assert!(t.contains(ip("10.255.0.1")));
        assert!(t.contains(ip("172.31.1.1")));
        assert!(!t.contains(ip("172.32.1.1")));
        assert!(t.contains(ip("fd12::1")));
        assert!(t.contains(ip("203.0.113.9")));
        assert!(t.contains(ip("::ffff:203.0.113.9")));
        assert!(!t.contains(ip("203.0.113.10")));
        assert!(t.contains(ip("2001:db8:ffff::1")));
        assert!(!t.contains(ip("127.0.0.1")), "loopback is opt-in");
        assert!(
            TrustedProxies::parse(["::ffff:10.0.0.0/104"])
                .expect("mapped")
                .contains(ip("10.1.2.3"))
        );
        assert_eq!(
            TrustedProxies::parse(["10.0.0.0/33"]),
            Err(ProxyError("10.0.0.0/33".into()))
        );
        assert!(TrustedProxies::parse(["everything"]).is_err());
        assert!(
            TrustedProxies::parse(Vec::<&str>::new())
                .expect("empty")
                .is_empty()
        );
    }

    fn any_ip() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            any::<[u8; 4]>().prop_map(IpAddr::from),
            any::<[u8; 16]>().prop_map(IpAddr::from),
        ]
    }

    proptest! {
        #[test]
        fn parsing_never_panics(line in ".{0,200}", peer in any_ip()) {
            let _ = xff(&peer.to_string(), &[&line]);
            let _ = fwd(&peer.to_string(), &[&line, &line]);
        }

        #[test]
        fn a_client_cannot_choose_its_address(
            forged in proptest::collection::vec("[ -~]{0,40}", 0..4),
            real in any_ip(),
            separate_line in any::<bool>(),
        ) {
            // Whatever the client sends, a trusted proxy appends the real peer address.
            prop_assume!(!local().contains(real));
            let forged = forged.join(",");
            let real_text = match real.to_canonical() {
                IpAddr::V4(v4) => format!("{v4}:4711"),
                IpAddr::V6(v6) => format!("[{v6}]:4711"),
            };
            let got = if separate_line {
                xff("127.0.0.1", &[&forged, &real_text])
            } else {
                xff("127.0.0.1", &[&format!("{forged}, {real_text}")])
            };
            prop_assert_eq!(got, real.to_canonical());
            let quoted = format!("for=\"{real_text}\"");
            let got = fwd("127.0.0.1", &[&forged, &quoted]);
            prop_assert_eq!(got, real.to_canonical());
        }

        #[test]
        fn the_result_is_the_peer_or_a_hop(line in "[0-9a-f:., \\[\\]]{0,60}", peer in any_ip()) {
            let got = xff(&peer.to_string(), &[&line]);
            let hops: Vec<Hop> = x_forwarded_for_hops(&line).collect();
            prop_assert!(got == peer.to_canonical() || hops.contains(&Hop::Addr(got)));
        }
    }
}
