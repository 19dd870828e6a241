//! What a counting request IS, decided in one place for every counting route (a hit, a batch
//! record, a badge fetch, a pixel fetch): its [`Lane`], whether it is filtered, the local day
//! whose salt keys its visitor, its repeat-gate key, the [`Record`] it becomes, and whether
//! it enters the live window.
//!
//! Contract (the HTTP handlers only gather inputs and call these, in this order):
//! 1. [`filter_reason`]: an empty user agent or a listed bot (not a known image proxy) is not
//!    counted.
//! 2. A [`View`] is built from a parsed hit ([`View::from_hit`]) or made by the server for a
//!    badge or pixel fetch ([`View::server_side`]: a page view, now, no referrer).
//! 3. The visitor is the client's own id when it sent one, else the keyed hash of its source
//!    salted for [`View::day`] (the event's local day, so a visitor stays one visitor all day).
//! 4. Badge and pixel views pass the repeat gate under [`View::repeat_key`]: per visitor,
//!    source and page for direct clients; per proxy address, site, source and page for known
//!    image proxies (each of the proxy's readers counts, at most once per proxy interval).
//! 5. [`View::into_record`]: a custom event's dedupe key is scoped to its visitor unless the
//!    sender holds the site's ingest key (only the site's own server sets site-wide keys).
//! 6. After the store accepted it, [`live_entry`] says what the live window records: recent
//!    events only (a late delivery is counted but not "live"), page keys for page views only.

use jiff::Timestamp;
use jiff::civil::Date;

use super::day::SiteZone;
use super::dims::Campaign;
use super::filtered::Reason;
use super::hit::{HitKind, ValidHit};
use super::ids::{DedupeKey, EventId, PagePath, SiteId, VisitorKey};
use super::net::ClientNet;
use super::record::{Dims, Record, Source};

/// Which allowance (and which repeat gate) a request is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// A browser or any other direct client.
    Direct,
    /// A known image proxy fetching a badge or pixel for its readers.
    Proxy,
}

impl Lane {
    /// The lane of a sender by its user agent.
    pub fn of(user_agent: &str) -> Self {
        if is_image_proxy(user_agent) {
            Lane::Proxy
        } else {
            Lane::Direct
        }
    }
}

/// User agents of the image proxies that fetch badges on behalf of many readers: GitHub's
/// camo (`github-camo (…)`), Google's (Gmail) image proxy, and a few mail and chat proxies.
const IMAGE_PROXIES: [&str; 4] = [
    "github-camo",
    "GoogleImageProxy",
    "YahooMailProxy",
    "camo-asset-proxy",
];

/// Whether `user_agent` names a known image proxy.
pub fn is_image_proxy(user_agent: &str) -> bool {
    IMAGE_PROXIES.iter().any(|p| user_agent.contains(p))
}

/// Why a valid view is not counted, judged by its user agent; `is_bot` is the bot list. Known
/// image proxies (which the bot list names) are not bots here: they fetch for human readers,
/// within their own bounded allowance.
pub fn filter_reason(user_agent: &str, is_bot: impl FnOnce(&str) -> bool) -> Option<Reason> {
    let ua = user_agent.trim();
    if ua.is_empty() {
        Some(Reason::EmptyUserAgent)
    } else if is_bot(ua) && !is_image_proxy(ua) {
        Some(Reason::Bot)
    } else {
        None
    }
}

/// One view about to be counted: everything but its visitor key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    pub site: SiteId,
    pub source: Source,
    pub kind: HitKind,
    pub page: PagePath,
    pub event_id: EventId,
    pub referrer: Option<String>,
    /// The campaign tags of the page's URL.
    pub campaign: Campaign,
    /// The screen width the client reported.
    pub screen_width: Option<u32>,
    /// The event's local day in the site's time zone.
    day: Date,
    /// The client's own visitor id, when it keeps one.
    client_visitor: Option<VisitorKey>,
    /// The sender holds the site's ingest key.
    keyed: bool,
}

impl View {
    /// A parsed hit (script beacon or batch record) of a site in `zone`; `keyed` when the
    /// sender presented the site's ingest key.
    pub fn from_hit(valid: ValidHit, zone: &SiteZone, keyed: bool) -> Self {
        Self {
            day: zone.day_of(valid.event_id.time()),
            site: valid.site,
            source: Source::Web,
            kind: valid.kind,
            page: valid.page,
            event_id: valid.event_id,
            referrer: valid.referrer,
            campaign: valid.campaign,
            screen_width: valid.screen_width,
            client_visitor: valid.visitor,
            keyed,
        }
    }

    /// A page view the server counts for a badge (`Source::Badge`) or pixel (`Source::Web`)
    /// fetch: no visitor id, no referrer, its event id made now by the caller.
    pub fn server_side(
        site: &SiteId,
        zone: &SiteZone,
        page: PagePath,
        source: Source,
        event_id: EventId,
    ) -> Self {
        Self {
            day: zone.day_of(event_id.time()),
            site: site.clone(),
            source,
            kind: HitKind::Pageview,
            page,
            event_id,
            referrer: None,
            campaign: Campaign::default(),
            screen_width: None,
            client_visitor: None,
            keyed: false,
        }
    }

    /// A line of an imported log or export (`tally import`): its event id made from the line
    /// by the caller, its referrer (cleaned as a live one) and the campaign tags of its
    /// request, no visitor id (the caller hashes the line's source), no screen width (logs
    /// have none), and the operator's authority (dedupe keys are not scoped to a visitor).
    pub fn imported(
        site: &SiteId,
        zone: &SiteZone,
        kind: HitKind,
        page: PagePath,
        event_id: EventId,
        referrer: Option<String>,
        campaign: Campaign,
    ) -> Self {
        Self {
            day: zone.day_of(event_id.time()),
            site: site.clone(),
            source: Source::Web,
            kind,
            page,
            event_id,
            referrer,
            campaign,
            screen_width: None,
            client_visitor: None,
            keyed: true,
        }
    }

    /// The event's instant.
    pub fn at(&self) -> Timestamp {
        self.event_id.time()
    }

    /// The event's local day: the day it is counted under, and the day whose salt keys an
    /// anonymous visitor.
    pub fn day(&self) -> Date {
        self.day
    }

    /// The client's own visitor id; `None` means the visitor is the keyed hash of the source.
    pub fn client_visitor(&self) -> Option<VisitorKey> {
        self.client_visitor
    }

    /// The repeat-gate key of a badge or pixel view by `visitor` sent from `net` in `lane`.
    pub fn repeat_key(&self, lane: Lane, net: ClientNet, visitor: &VisitorKey) -> u64 {
        let mut h = blake3::Hasher::new();
        match lane {
            // A proxy is many readers: its repeats are told apart per page and interval only.
            Lane::Proxy => {
                h.update(b"proxy");
                h.update(&net.to_bytes());
                h.update(self.site.as_str().as_bytes());
            }
            Lane::Direct => {
                h.update(&visitor.0);
            }
        }
        h.update(&self.source.code().to_le_bytes());
        h.update(self.page.as_str().as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&h.finalize().as_bytes()[..8]);
        u64::from_le_bytes(first)
    }

    /// The record to store, counted for `visitor`, with its dimensions (`collect::dims`).
    pub fn into_record(self, visitor: VisitorKey, dims: Dims) -> Record {
        let kind = match self.kind {
            // Only the site's own server sets site-wide keys; anyone else's are their visitor's.
            HitKind::Event {
                name,
                dedupe: Some(key),
            } if !self.keyed => HitKind::Event {
                name,
                dedupe: Some(DedupeKey::scoped_to(&key, &visitor)),
            },
            kind => kind,
        };
        let at = self.event_id.time();
        Record {
            event_id: self.event_id,
            site: self.site,
            source: self.source,
            kind,
            page: self.page,
            visitor,
            at_ms: at.as_millisecond(),
            day: self.day,
            referrer: self.referrer,
            dims,
        }
    }
}

/// What the live window records for one accepted record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveEntry {
    pub site: SiteId,
    /// The page, for page views (custom events count for the whole site only).
    pub page: Option<PagePath>,
    /// The visitor, folded to 64 bits.
    pub visitor: u64,
}

/// The live rule: an accepted record enters a live window of `window_secs` at `now_ms` only if
/// its event is younger than the window (a retried beacon from an hour ago is counted, but is
/// not "live").
pub fn live_entry(record: &Record, now_ms: i64, window_secs: u32) -> Option<LiveEntry> {
    if now_ms - record.at_ms >= i64::from(window_secs) * 1000 {
        return None;
    }
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&record.visitor.0[..8]);
    hi.copy_from_slice(&record.visitor.0[8..]);
    Some(LiveEntry {
        site: record.site.clone(),
        page: (record.kind == HitKind::Pageview).then(|| record.page.clone()),
        visitor: u64::from_le_bytes(lo) ^ u64::from_le_bytes(hi),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ids::EventName;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn view(kind: HitKind, keyed: bool) -> View {
        let zone = SiteZone::parse("Pacific/Kiritimati").expect("zone");
        let valid = ValidHit {
            site: SiteId::parse("s").expect("site"),
            kind,
            event_id: EventId::new_at(at("2026-06-01T12:00:00Z"), [1; 10]),
            visitor: None,
            page: PagePath::parse("/a").expect("page"),
            referrer: None,
            campaign: Default::default(),
            screen_width: None,
        };
        View::from_hit(valid, &zone, keyed)
    }

    #[test]
    fn the_day_is_the_local_day_of_the_event() {
        // UTC+14: noon UTC is 02:00 the next day.
        assert_eq!(
            view(HitKind::Pageview, false).day(),
            jiff::civil::date(2026, 6, 2)
        );
    }

    #[test]
    fn dedupe_keys_are_scoped_to_the_visitor_unless_keyed() {
        let event = HitKind::Event {
            name: EventName::parse("buy").expect("name"),
            dedupe: Some(DedupeKey::parse("order_1").expect("key")),
        };
        let (v1, v2) = (VisitorKey([1; 16]), VisitorKey([2; 16]));
        let a = view(event.clone(), false).into_record(v1, Dims::default());
        let b = view(event.clone(), false).into_record(v2, Dims::default());
        assert_ne!(a.kind, b.kind, "two visitors cannot share a key");
        let keyed = view(event.clone(), true).into_record(v1, Dims::default());
        assert_eq!(keyed.kind, event, "the site's server sets site-wide keys");
    }

    #[test]
    fn repeat_keys_of_proxies_ignore_the_visitor_and_direct_ones_do_not() {
        let v = view(HitKind::Pageview, false);
        let net = ClientNet::of("192.0.2.1".parse().expect("ip"));
        let other = ClientNet::of("192.0.2.2".parse().expect("ip"));
        let (v1, v2) = (VisitorKey([1; 16]), VisitorKey([2; 16]));
        assert_ne!(
            v.repeat_key(Lane::Direct, net, &v1),
            v.repeat_key(Lane::Direct, net, &v2)
        );
        assert_eq!(
            v.repeat_key(Lane::Direct, net, &v1),
            v.repeat_key(Lane::Direct, other, &v1)
        );
        assert_eq!(
            v.repeat_key(Lane::Proxy, net, &v1),
            v.repeat_key(Lane::Proxy, net, &v2)
        );
        assert_ne!(
            v.repeat_key(Lane::Proxy, net, &v1),
            v.repeat_key(Lane::Proxy, other, &v1)
        );
    }

    #[test]
    fn only_recent_records_are_live_and_events_only_for_the_site() {
        let record =
            view(HitKind::Pageview, false).into_record(VisitorKey([3; 16]), Dims::default());
        let now = record.at_ms;
        let entry = live_entry(&record, now + 59_999, 60).expect("live");
        assert_eq!(entry.page, Some(record.page.clone()));
        assert_eq!(live_entry(&record, now + 60_000, 60), None);
        let event = View {
            kind: HitKind::Event {
                name: EventName::parse("buy").expect("name"),
                dedupe: None,
            },
            ..view(HitKind::Pageview, false)
        }
        .into_record(VisitorKey([3; 16]), Dims::default());
        assert_eq!(live_entry(&event, now, 60).expect("live").page, None);
    }

    #[test]
    fn filters_and_lanes() {
        assert_eq!(filter_reason("  ", |_| false), Some(Reason::EmptyUserAgent));
        assert_eq!(filter_reason("crawler", |_| true), Some(Reason::Bot));
        assert_eq!(filter_reason("github-camo (1)", |_| true), None);
        assert_eq!(Lane::of("github-camo (876de43e)"), Lane::Proxy);
        assert_eq!(Lane::of("Mozilla/5.0 Chrome/126.0"), Lane::Direct);
    }
}
