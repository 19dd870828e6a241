//! Parsed lines → records: event ids, visitor keys, days, and the dimensions of each visit,
//! decided as the collector decides a live hit's (`collect::dims::Dimensions`).
//!
//! Contract:
//! - The referrer is cleaned as a live one (origin and path; query, fragment and credentials
//!   dropped), and a referrer on the site's own host (the line's host, `--host`, or the host
//!   of one of the site's origins) is internal navigation: none.
//! - The campaign tags (`utm_*`, `ref`, `source`, click ids) are read from the request's
//!   query string before it is dropped; the query string itself is never stored.
//! - Log lines get browser, OS and device from their user agent and the country from their
//!   client address (with `--geoip`); GoatCounter rows from the columns GoatCounter wrote
//!   (`goat::agent_of`). Unknown stays empty.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};

use jiff::Timestamp;

use super::Parsed;
use crate::collect::bots::BotFilter;
use crate::collect::dims::Dimensions;
use crate::core::classify::View;
use crate::core::dims::Campaign;
use crate::core::filtered::Reason;
use crate::core::hit::{HitKind, clean_referrer, referrer_host};
use crate::core::ids::{EventId, EventName, PagePath, VisitorKey};
use crate::core::record::{Dims, Record};
use crate::core::site::Site;

/// Makes records of parsed lines.
pub(super) struct RecordMaker {
    site: Site,
    key: [u8; 32],
    /// Identical lines seen in the current second (their hash → how many).
    second: i64,
    /// The latest time a line may have (a day from the start of the run), read once.
    latest: Timestamp,
    seen: HashMap<[u8; 32], u32>,
    /// The collector's bot filter (its verdicts cached: logs repeat few agents).
    bots: BotFilter,
    /// The collector's classifiers (and location database, with `--geoip`).
    dims: Dimensions,
    /// The site's own hosts (lower case): a referrer on one of them is internal.
    own: HashSet<String>,
}

/// The host of an origin or `host[:port]`, lower case, without the port.
fn host_of(raw: &str) -> String {
    let rest = raw.split_once("://").map_or(raw, |(_, rest)| rest);
    let host = rest.split('/').next().unwrap_or(rest);
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    host.to_ascii_lowercase()
}

impl RecordMaker {
    pub(super) fn new(site: Site, host: Option<&str>, dims: Dimensions) -> Self {
        let own = site
            .origins
            .iter()
            .filter(|o| o.as_str() != "*")
            .map(|o| host_of(o))
            .chain(host.map(host_of))
            .filter(|h| !h.is_empty())
            .collect();
        Self {
            site,
            key: crate::collect::secrets::random_bytes::<32>(),
            second: i64::MIN,
            latest: Timestamp::now() + jiff::SignedDuration::from_hours(24),
            seen: HashMap::new(),
            bots: BotFilter::bundled(),
            dims,
            own,
        }
    }

    /// Why a line's view is not counted, judged as the collector judges a hit
    /// ([`BotFilter::reason`]: empty agents, and listed bots other than image proxies).
    pub(super) fn filter_reason(&self, user_agent: &str) -> Option<&'static str> {
        self.bots.reason(user_agent).map(|reason| match reason {
            Reason::EmptyUserAgent => "no user agent",
            _ => "bot",
        })
    }

    /// The line's referrer as stored: cleaned, and `None` when it is internal.
    fn referrer(&self, p: &Parsed) -> Option<String> {
        let raw = p
            .referrer
            .as_deref()
            .filter(|r| !r.is_empty() && *r != "-")?;
        let cleaned = clean_referrer(raw, None).ok().flatten()?;
        let host = host_of(referrer_host(&cleaned));
        let line_host = p.host.as_deref().map(host_of);
        if self.own.contains(&host) || line_host.as_deref() == Some(host.as_str()) {
            return None;
        }
        Some(cleaned)
    }

    /// The campaign tags of the request (GoatCounter's rows state theirs).
    fn campaign(&self, p: &Parsed) -> Campaign {
        if let Some(c) = &p.campaign {
            return c.clone();
        }
        if p.event || !p.path.contains('?') {
            return Campaign::default();
        }
        url::Url::parse("http://import.invalid/")
            .and_then(|base| base.join(&p.path))
            .map(|url| Campaign::of(&url))
            .unwrap_or_default()
    }

    pub(super) fn make(&mut self, p: &Parsed, line: &str) -> Result<Record, String> {
        let kind = if p.event {
            HitKind::Event {
                name: EventName::parse(p.path.trim_start_matches('/'))
                    .map_err(|e| format!("event name: {e}"))?,
                dedupe: None,
            }
        } else {
            HitKind::Pageview
        };
        let page = if p.event {
            PagePath::root()
        } else {
            PagePath::parse(&p.path).map_err(|_| format!("path {:?} is not a page path", p.path))?
        };
        if p.at < Timestamp::UNIX_EPOCH {
            return Err(format!("time {} is before 1970", p.at));
        }
        if p.at > self.latest {
            return Err(format!("time {} is in the future", p.at));
        }
        let sec = p.at.as_second();
        if sec != self.second {
            self.second = sec;
            self.seen.clear();
        }
        let mut h = blake3::Hasher::new();
        h.update(self.site.id.as_str().as_bytes());
        h.update(&[0]);
        h.update(line.trim_end_matches(['\r', '\n']).as_bytes());
        let line_hash = *h.finalize().as_bytes();
        let nth = self.seen.entry(line_hash).or_default();
        *nth += 1;
        let mut h = blake3::Hasher::new();
        h.update(&line_hash);
        h.update(&nth.to_le_bytes());
        let mut random = [0u8; 10];
        random.copy_from_slice(&h.finalize().as_bytes()[..10]);
        let mut v = blake3::Hasher::new_keyed(&self.key);
        for part in [
            self.site.id.as_str(),
            &sec.div_euclid(86_400).to_string(),
            &p.client,
            &p.user_agent,
        ] {
            v.update(part.as_bytes());
            v.update(&[0]);
        }
        let mut visitor = [0u8; 16];
        visitor.copy_from_slice(&v.finalize().as_bytes()[..16]);
        let view = View::imported(
            &self.site.id,
            &self.site.zone,
            kind,
            page,
            EventId::new_at(p.at, random),
            self.referrer(p),
            self.campaign(p),
        );
        let dims = match &p.stated {
            Some(stated) => Dims {
                src: self.dims.source(view.referrer.as_deref(), &view.campaign),
                agent: super::goat::agent_of(stated, &p.user_agent, &self.dims)
                    .encode()
                    .into(),
            },
            None => {
                let ip = p
                    .client
                    .parse::<IpAddr>()
                    .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
                self.dims.of(&view, &p.user_agent, ip)
            }
        };
        Ok(view.into_record(VisitorKey(visitor), dims))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::dims::{AgentDims, SourceDims};

    fn parsed(path: &str, referrer: Option<&str>, host: Option<&str>) -> Parsed {
        Parsed {
            at: "2025-03-02T10:00:00Z".parse().expect("time"),
            path: path.to_owned(),
            referrer: referrer.map(str::to_owned),
            user_agent: "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) \
                 AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Mobile/15E148 \
                 Safari/604.1"
                .to_owned(),
            client: "192.0.2.7".to_owned(),
            host: host.map(str::to_owned),
            event: false,
            campaign: None,
            stated: None,
        }
    }

    fn maker() -> RecordMaker {
        let site = Site {
            id: crate::core::ids::SiteId::parse("blog").expect("site"),
            origins: vec!["https://blog.example".to_owned()],
            zone: crate::core::day::SiteZone::utc(),
            public: false,
            ingest_key: None,
        };
        RecordMaker::new(site, Some("www.blog.example"), Dimensions::bundled())
    }

    #[test]
    fn a_log_line_gets_the_live_dimensions_and_keeps_no_query() {
        let mut m = maker();
        let p = parsed(
            "/a?utm_source=newsletter&utm_medium=email&utm_campaign=spring&x=1",
            Some("https://news.example.net/item?id=5#c"),
            None,
        );
        let r = m.make(&p, "line").expect("record");
        assert_eq!(r.page.as_str(), "/a");
        assert_eq!(r.referrer.as_deref(), Some("https://news.example.net/item"));
        let src = SourceDims::decode(&r.dims.src);
        assert_eq!(
            (src.utm_source.as_str(), src.utm_campaign.as_str()),
            ("newsletter", "spring")
        );
        assert_eq!(src.channel, "Email");
        let agent = AgentDims::decode(&r.dims.agent);
        assert_eq!(
            (
                agent.browser.as_str(),
                agent.os.as_str(),
                agent.device.as_str()
            ),
            ("Safari", "iOS", "Mobile")
        );
        assert_eq!(agent.country, "", "no location database: unknown");
    }

    #[test]
    fn a_referrer_on_the_sites_own_hosts_is_internal() {
        let mut m = maker();
        for (referrer, host) in [
            ("https://blog.example/other", None),
            ("https://www.blog.example/x", None),
            ("http://shop.example:8080/", Some("shop.example:443")),
        ] {
            let r = m
                .make(&parsed("/a", Some(referrer), host), referrer)
                .expect("record");
            assert_eq!(r.referrer, None, "{referrer}");
            assert_eq!(SourceDims::decode(&r.dims.src).channel, "Direct");
        }
    }
}
