//! Turning a wire [`tally_wire::Hit`] into a [`ValidHit`]: every field parsed into its type,
//! the event time checked against the accepted window. A hit that fails here stores nothing.

use jiff::{SignedDuration, Timestamp};
use tally_wire::{Hit, MAX_ENGAGED_MS, TYPE_ENGAGEMENT, TYPE_EVENT, TYPE_PAGEVIEW};

use super::dims::Campaign;
use super::ids::{DedupeKey, EventId, EventName, IdError, PagePath, SiteId, VisitorKey};

/// How far from `now` an event id's time may lie. Event ids older than `back` are refused,
/// so raw events older than that can be pruned without ever letting a replay count twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeWindow {
    /// How far back an event may lie (default 72 h).
    pub back: SignedDuration,
    /// How far ahead (client clock skew) an event may lie (default 5 min).
    pub ahead: SignedDuration,
}

impl Default for TimeWindow {
    fn default() -> Self {
        Self {
            back: SignedDuration::from_hours(72),
            ahead: SignedDuration::from_mins(5),
        }
    }
}

impl TimeWindow {
    /// Whether `at` lies inside the window around `now` (both ends inclusive).
    pub fn contains(&self, now: Timestamp, at: Timestamp) -> bool {
        let age = now.duration_since(at);
        age <= self.back && -age <= self.ahead
    }
}

/// Why a hit was refused; `code()` is the wire error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HitError {
    #[error(transparent)]
    Id(#[from] IdError),
    #[error("type must be \"pageview\", \"event\" or \"engagement\"")]
    Type,
    #[error("an engagement needs engaged_ms (0 to {MAX_ENGAGED_MS}) or scroll (0 to 100), or both")]
    Engagement,
    #[error("screen_width must be 0 to {MAX_SCREEN_WIDTH}")]
    ScreenWidth,
    #[error("an event needs a name")]
    MissingName,
    #[error("event_id time {at} lies outside the accepted window ({back} back, {ahead} ahead)")]
    OutOfWindow {
        at: Timestamp,
        back: String,
        ahead: String,
    },
}

impl HitError {
    /// The stable snake_case code sent to clients.
    pub fn code(&self) -> &'static str {
        match self {
            HitError::Id(e) => e.code(),
            HitError::Type => "invalid_type",
            HitError::Engagement => "invalid_engagement",
            HitError::ScreenWidth => "invalid_screen_width",
            HitError::MissingName => "invalid_name",
            HitError::OutOfWindow { .. } => "event_id_out_of_window",
        }
    }
}

/// What a hit counts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HitKind {
    /// A page view.
    Pageview,
    /// A custom event, counted once per (site, name, dedupe) when a dedupe key is given.
    Event {
        name: EventName,
        dedupe: Option<DedupeKey>,
    },
    /// An engagement report on the page view with the same event id: its visible and focused
    /// time and largest scroll depth so far. Counts nothing itself; the store keeps the
    /// largest values it was sent for the page view.
    Engagement { engaged_ms: u32, scroll: Option<u8> },
}

/// Largest `screen_width` accepted, CSS pixels.
pub const MAX_SCREEN_WIDTH: u32 = 100_000;

/// A hit whose every field has been parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidHit {
    pub site: SiteId,
    pub kind: HitKind,
    pub event_id: EventId,
    /// The client's visitor id, when it keeps one.
    pub visitor: Option<VisitorKey>,
    pub page: PagePath,
    /// The referrer without query and fragment (privacy: no tracking parameters kept); `None`
    /// for navigation inside the site (same host as the page).
    pub referrer: Option<String>,
    /// The campaign tags of the page's URL (the rest of its query string is dropped).
    pub campaign: Campaign,
    /// The screen width the client reported.
    pub screen_width: Option<u32>,
}

impl ValidHit {
    /// Parse a wire hit received at `now`.
    pub fn parse(hit: &Hit, now: Timestamp, window: TimeWindow) -> Result<Self, HitError> {
        let site = SiteId::parse(&hit.site)?;
        let kind = match hit.kind.as_str() {
            TYPE_PAGEVIEW => HitKind::Pageview,
            TYPE_EVENT => {
                let name = hit.name.as_deref().ok_or(HitError::MissingName)?;
                HitKind::Event {
                    name: EventName::parse(name)?,
                    dedupe: hit.dedupe.as_deref().map(DedupeKey::parse).transpose()?,
                }
            }
            TYPE_ENGAGEMENT => {
                let engaged = hit.engaged_ms.filter(|&ms| ms <= MAX_ENGAGED_MS);
                let scroll = hit.scroll.filter(|&s| s <= 100);
                if (hit.engaged_ms.is_some() && engaged.is_none())
                    || (hit.scroll.is_some() && scroll.is_none())
                    || (engaged.is_none() && scroll.is_none())
                {
                    return Err(HitError::Engagement);
                }
                HitKind::Engagement {
                    engaged_ms: u32::try_from(engaged.unwrap_or(0)).unwrap_or(u32::MAX),
                    scroll,
                }
            }
            _ => return Err(HitError::Type),
        };
        if hit.screen_width.is_some_and(|w| w > MAX_SCREEN_WIDTH) {
            return Err(HitError::ScreenWidth);
        }
        let event_id = EventId::parse(&hit.event_id)?;
        let at = event_id.time();
        if !window.contains(now, at) {
            return Err(HitError::OutOfWindow {
                at,
                back: format!("{:#}", window.back),
                ahead: format!("{:#}", window.ahead),
            });
        }
        let visitor = hit
            .visitor_id
            .as_deref()
            .map(VisitorKey::parse_uuid)
            .transpose()?;
        let (page, url) = PagePath::from_url(&hit.url)?;
        let referrer = match hit.referrer.as_deref() {
            None | Some("") => None,
            Some(raw) => clean_referrer(raw, url.host_str())?,
        };
        Ok(Self {
            site,
            kind,
            event_id,
            visitor,
            page,
            referrer,
            campaign: Campaign::of(&url),
            screen_width: hit.screen_width,
        })
    }
}

/// Longest referrer kept, in bytes: its origin and path (query, fragment and credentials are
/// dropped), cut like a page path. Referrers are shown by host; the path is kept for context.
pub const MAX_REFERRER_BYTES: usize = 256;

/// The host a stored referrer is counted under: what follows its first `://`, up to the next
/// `/` (a referrer without `://`, which the collector never stores, loses its first two
/// characters instead). The stores' SQL recounts (`tally verify`, the schema migration that
/// filled the referrer counters) use the same rule, so both agree to the byte.
pub fn referrer_host(referrer: &str) -> &str {
    let rest = match referrer.find("://") {
        Some(i) => &referrer[i + 3..],
        None => referrer
            .char_indices()
            .nth(2)
            .map_or("", |(i, _)| &referrer[i..]),
    };
    rest.split('/').next().unwrap_or(rest)
}

/// A referrer as it is stored: origin and path only (query, fragment and credentials dropped),
/// cut to [`MAX_REFERRER_BYTES`]; `None` when it points at `page_host` (internal navigation).
/// An address that is not an absolute URL with a host part is an error.
pub fn clean_referrer(raw: &str, page_host: Option<&str>) -> Result<Option<String>, IdError> {
    let mut url = url::Url::parse(raw).map_err(|_| IdError::Referrer)?;
    if url.cannot_be_a_base() {
        return Err(IdError::Referrer);
    }
    if url.host_str().is_some() && url.host_str() == page_host {
        return Ok(None);
    }
    url.set_query(None);
    url.set_fragment(None);
    let _ = url.set_username("");
    let _ = url.set_password(None);
    let text: String = url.into();
    Ok(Some(
        super::ids::cap_path(&text, MAX_REFERRER_BYTES).to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn hit(event_id: &str) -> Hit {
        Hit {
            site: "blog".into(),
            kind: "pageview".into(),
            event_id: event_id.into(),
            visitor_id: Some("67e55044-10b1-426f-9247-bb680e5fe0c8".into()),
            url: "https://blog.example/a?x=1".into(),
            referrer: Some("https://news.example/item?id=5#c".into()),
            name: None,
            dedupe: None,
            screen_width: None,
            engaged_ms: None,
            scroll: None,
        }
    }

    #[test]
    fn window_edges_are_inclusive() {
        let now = at("2026-06-01T12:00:00Z");
        let w = TimeWindow::default();
        assert!(w.contains(now, at("2026-05-29T12:00:00Z")));
        assert!(!w.contains(now, at("2026-05-29T11:59:59.999Z")));
        assert!(w.contains(now, at("2026-06-01T12:05:00Z")));
        assert!(!w.contains(now, at("2026-06-01T12:05:00.001Z")));
    }

    #[test]
    fn old_event_ids_are_refused() {
        let now = at("2026-06-01T12:00:00Z");
        let old = EventId::new_at(at("2026-05-20T00:00:00Z"), [1; 10])
            .uuid()
            .to_string();
        let err = ValidHit::parse(&hit(&old), now, TimeWindow::default()).expect_err("old");
        assert_eq!(err.code(), "event_id_out_of_window");
    }

    #[test]
    fn a_referrer_is_counted_under_its_host() {
        assert_eq!(referrer_host("https://news.example/item"), "news.example");
        assert_eq!(referrer_host("https://news.example"), "news.example");
        assert_eq!(referrer_host("http://a.example:8080/x/y"), "a.example:8080");
        assert_eq!(referrer_host("file:///tmp/x"), "");
        assert_eq!(referrer_host("ab"), "");
        assert_eq!(referrer_host("abc/d"), "c");
    }

    #[test]
    fn a_good_hit_parses_and_referrer_loses_its_query() {
        let now = at("2026-06-01T12:00:00Z");
        let id = EventId::new_at(now, [1; 10]).uuid().to_string();
        let valid = ValidHit::parse(&hit(&id), now, TimeWindow::default()).expect("valid");
        assert_eq!(valid.page.as_str(), "/a");
        assert_eq!(valid.referrer.as_deref(), Some("https://news.example/item"));
        let mut internal = hit(&id);
        internal.referrer = Some("https://blog.example/other".into());
        let valid = ValidHit::parse(&internal, now, TimeWindow::default()).expect("valid");
        assert_eq!(
            valid.referrer, None,
            "navigation inside the site is no referral"
        );
    }

    #[test]
    fn events_need_a_name() {
        let now = at("2026-06-01T12:00:00Z");
        let mut h = hit(&EventId::new_at(now, [1; 10]).uuid().to_string());
        h.kind = "event".into();
        assert_eq!(
            ValidHit::parse(&h, now, TimeWindow::default()),
            Err(HitError::MissingName)
        );
        h.name = Some("purchase".into());
        h.dedupe = Some("order_1".into());
        assert!(ValidHit::parse(&h, now, TimeWindow::default()).is_ok());
        h.kind = "click".into();
        assert_eq!(
            ValidHit::parse(&h, now, TimeWindow::default()),
            Err(HitError::Type)
        );
    }

    #[test]
    fn engagement_reports_need_a_value_in_range() {
        let now = at("2026-06-01T12:00:00Z");
        let mut h = hit(&EventId::new_at(now, [1; 10]).uuid().to_string());
        h.kind = "engagement".into();
        let parse = |h: &Hit| ValidHit::parse(h, now, TimeWindow::default());
        assert_eq!(parse(&h), Err(HitError::Engagement), "neither value");
        h.scroll = Some(101);
        assert_eq!(parse(&h), Err(HitError::Engagement));
        h.scroll = Some(60);
        h.engaged_ms = Some(MAX_ENGAGED_MS + 1);
        assert_eq!(parse(&h), Err(HitError::Engagement));
        h.engaged_ms = Some(12_345);
        assert_eq!(
            parse(&h).map(|v| v.kind),
            Ok(HitKind::Engagement {
                engaged_ms: 12_345,
                scroll: Some(60)
            })
        );
        h.screen_width = Some(MAX_SCREEN_WIDTH + 1);
        assert_eq!(parse(&h), Err(HitError::ScreenWidth));
    }

    #[test]
    fn campaign_tags_are_read_before_the_query_is_dropped() {
        let now = at("2026-06-01T12:00:00Z");
        let mut h = hit(&EventId::new_at(now, [1; 10]).uuid().to_string());
        h.url = "https://blog.example/a?utm_source=news&utm_campaign=spring%20sale&gclid=x&other=1"
            .into();
        let valid = ValidHit::parse(&h, now, TimeWindow::default()).expect("valid");
        assert_eq!(valid.page.as_str(), "/a");
        assert_eq!(valid.campaign.utm_source, "news");
        assert_eq!(valid.campaign.utm_campaign, "spring sale");
        assert_eq!(valid.campaign.click_id, Some("gclid"));
    }
}
