//! GoatCounter's CSV export (version 2): one row per page view or event, and what its columns
//! say of the visit, mapped to Tally's dimensions.
//!
//! Columns are found by their header names (the first cell carries the version, `2Path`).
//! Required: Path, Event, Session, Bot, Referrer, Date. Read when present: UserAgent (always
//! blank in current exports), Browser, System, Referrer scheme, Screen size, Location, and a
//! Campaign column (not in GoatCounter's documented format; read if a tool adds one).
//!
//! Mapping (unknown stays empty, never guessed):
//! - Browser `Chrome 131` → browser `Chrome`, version `131`; System `iOS 17.1` → `iOS`, `17`;
//!   a value without a trailing version is all name. Names go through the name table of
//!   `collect::agents` (`Mobile Safari` → `Safari`, `Mac OS X` → `macOS`).
//! - Screen size `x,y,scaling`: `x` is the CSS width, classed like a live screen width
//!   (`core::dims::device_of_width`: under 576 Mobile, under 992 Tablet, under 1440 Laptop,
//!   else Desktop); blank or unreadable: the user agent's hint if there is one, else unknown.
//! - Location `US` or `US-CA` (ISO 3166-1 / 3166-2) → country `US`, region `US-CA`.
//! - Referrer by scheme: `h` (a link, stored without its scheme) and `o` (other, e.g. an
//!   Android app's `android-app://…`) are referrers, classified like a live referrer; `g`
//!   (a name GoatCounter generated, "Hacker News") and `c` (the text of a campaign parameter:
//!   `utm_source`, `ref`, `src` or `source`, which the export does not say) name the source
//!   like a `ref=` tag: the source and channel are set, the referrer and `utm_source` stay
//!   empty. A Campaign column's value is `utm_campaign`.

use anyhow::Context;
use jiff::Timestamp;

use super::Parsed;
use crate::collect::agents::major;
use crate::collect::dims::Dimensions;
use crate::core::dims::{AgentDims, Campaign, clean, device_of_width};
use crate::core::hit::MAX_SCREEN_WIDTH;

/// What a row states of the visit's agent and place.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Stated {
    /// `Chrome 131`.
    pub browser: String,
    /// `Windows 10`.
    pub system: String,
    /// The screen's CSS width, when the row has a readable one.
    pub width: Option<u32>,
    /// `US` or `US-CA`.
    pub location: String,
}

/// Column indexes of a GoatCounter export.
pub(super) struct Columns {
    path: usize,
    event: usize,
    user_agent: Option<usize>,
    browser: Option<usize>,
    system: Option<usize>,
    session: usize,
    bot: usize,
    referrer: usize,
    scheme: Option<usize>,
    size: Option<usize>,
    location: Option<usize>,
    campaign: Option<usize>,
    date: usize,
}

/// The columns of a header row, or why it is not a version 2 export.
pub(super) fn columns(headers: &csv::StringRecord) -> anyhow::Result<Columns> {
    let first = headers.get(0).unwrap_or("");
    anyhow::ensure!(
        first.starts_with('2'),
        "not a GoatCounter export version 2 (first header is {first:?}, expected \"2Path\")"
    );
    let names: Vec<String> = headers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let h = if i == 0 { h.trim_start_matches('2') } else { h };
            h.trim().to_ascii_lowercase()
        })
        .collect();
    let find = |want: &[&str]| names.iter().position(|n| want.contains(&n.as_str()));
    let need = |name: &str| {
        find(&[&name.to_ascii_lowercase()]).with_context(|| format!("no column {name:?}"))
    };
    Ok(Columns {
        path: need("Path")?,
        event: need("Event")?,
        user_agent: find(&["useragent", "user-agent"]),
        browser: find(&["browser"]),
        system: find(&["system"]),
        session: need("Session")?,
        bot: need("Bot")?,
        referrer: need("Referrer")?,
        scheme: find(&["referrer scheme"]),
        size: find(&["screen size"]),
        location: find(&["location"]),
        campaign: find(&["campaign"]),
        date: need("Date")?,
    })
}

impl Columns {
    /// One row as a page view or event, or why it is not counted.
    pub(super) fn parse(&self, row: &csv::StringRecord) -> Result<Parsed, String> {
        let get = |i: usize| row.get(i).unwrap_or("").trim();
        let opt = |i: Option<usize>| i.map_or("", get);
        let bot = get(self.bot);
        if !bot.is_empty() && bot != "0" {
            return Err(format!("bot (GoatCounter bot flag {bot})"));
        }
        let at = get(self.date)
            .parse::<Timestamp>()
            .map_err(|e| format!("malformed Date: {e}"))?;
        let event = matches!(get(self.event), "true" | "1");
        let (referrer, mut campaign) = source(get(self.referrer), opt(self.scheme));
        campaign.utm_campaign = clean(opt(self.campaign));
        Ok(Parsed {
            at,
            path: get(self.path).to_owned(),
            referrer,
            user_agent: opt(self.user_agent).to_owned(),
            client: get(self.session).to_owned(),
            host: None,
            event,
            campaign: Some(campaign),
            stated: Some(Stated {
                browser: opt(self.browser).to_owned(),
                system: opt(self.system).to_owned(),
                width: width(opt(self.size)),
                location: opt(self.location).to_owned(),
            }),
        })
    }
}

/// The referrer (as a URL) or the source tag a Referrer cell gives, by its scheme.
fn source(value: &str, scheme: &str) -> (Option<String>, Campaign) {
    if value.is_empty() {
        return (None, Campaign::default());
    }
    match scheme {
        "g" | "c" => (
            None,
            Campaign {
                source_tag: clean(value),
                ..Campaign::default()
            },
        ),
        // `h`, `o`, or none (older exports): a referring address, stored without a scheme.
        _ => {
            let url = if value.contains("://") {
                value.to_owned()
            } else {
                format!("https://{value}")
            };
            (Some(url), Campaign::default())
        }
    }
}

/// The CSS width of a `x,y,scaling` cell.
fn width(size: &str) -> Option<u32> {
    let x: f64 = size.split(',').next()?.trim().parse().ok()?;
    (x >= 1.0 && x <= f64::from(MAX_SCREEN_WIDTH)).then(|| x.round() as u32)
}

/// `Chrome 131.0` → (`Chrome`, `131`); a value whose last word is no version is all name.
fn name_and_major(value: &str) -> (&str, String) {
    let value = value.trim();
    match value.rsplit_once(' ') {
        Some((name, version)) if version.starts_with(|c: char| c.is_ascii_digit()) => {
            (name.trim(), major(version.split('.').next().unwrap_or("")))
        }
        _ => (value, String::new()),
    }
}

/// `US` / `US-CA` → (`US`, `US-CA`); anything else is unknown.
fn place(location: &str) -> (String, String) {
    let location = location.trim().to_ascii_uppercase();
    let (country, sub) = location
        .split_once('-')
        .map_or((location.as_str(), None), |(c, s)| (c, Some(s)));
    if country.len() != 2 || !country.bytes().all(|b| b.is_ascii_uppercase()) {
        return (String::new(), String::new());
    }
    let region = sub
        .filter(|s| (1..=3).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric()))
        .map(|s| format!("{country}-{s}"))
        .unwrap_or_default();
    (country.to_owned(), region)
}

/// The agent tuple of a row: its columns first, its user agent (old exports kept one) for
/// what they leave out.
pub(super) fn agent_of(stated: &Stated, user_agent: &str, dims: &Dimensions) -> AgentDims {
    let parsed = (!user_agent.trim().is_empty()).then(|| dims.agents().parse(user_agent));
    let (browser, browser_version) = match name_and_major(&stated.browser) {
        ("", _) => parsed
            .as_ref()
            .map(|a| (a.browser.clone(), a.browser_version.clone()))
            .unwrap_or_default(),
        (name, version) => (dims.agents().browser_name(name), version),
    };
    let (os, os_version) = match name_and_major(&stated.system) {
        ("", _) => parsed
            .as_ref()
            .map(|a| (a.os.clone(), a.os_version.clone()))
            .unwrap_or_default(),
        (name, version) => (dims.agents().os_name(name), version),
    };
    let device = match stated.width {
        Some(w) => device_of_width(w).to_owned(),
        None => parsed
            .as_ref()
            .map(|a| a.device_hint.to_owned())
            .unwrap_or_default(),
    };
    let (country, region) = place(&stated.location);
    AgentDims {
        browser_version: if browser.is_empty() {
            String::new()
        } else {
            browser_version
        },
        os_version: if os.is_empty() {
            String::new()
        } else {
            os_version
        },
        browser,
        os,
        device,
        country,
        region,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_map_to_dimensions_and_unknown_stays_empty() {
        let dims = Dimensions::bundled();
        let stated = |browser: &str, system: &str, size: &str, location: &str| Stated {
            browser: browser.into(),
            system: system.into(),
            width: width(size),
            location: location.into(),
        };
        let a = agent_of(
            &stated("Chrome 131", "Windows 10", "1920,1080,1", "US-CA"),
            "",
            &dims,
        );
        assert_eq!(
            [&a.browser, &a.browser_version, &a.os, &a.os_version],
            ["Chrome", "131", "Windows", "10"]
        );
        assert_eq!(
            [&a.device, &a.country, &a.region],
            ["Desktop", "US", "US-CA"]
        );
        let a = agent_of(
            &stated("Safari 18.3", "iOS 17.1", "390,844,3", "NL"),
            "",
            &dims,
        );
        assert_eq!(
            [
                &a.browser_version,
                &a.os_version,
                &a.device,
                &a.country,
                &a.region
            ],
            ["18", "17", "Mobile", "NL", ""]
        );
        let a = agent_of(
            &stated("Firefox", "Mac OS X 10.15", "", "nowhere"),
            "",
            &dims,
        );
        assert_eq!(
            [&a.browser, &a.browser_version, &a.os, &a.os_version],
            ["Firefox", "", "macOS", "10"]
        );
        assert_eq!([&a.device, &a.country, &a.region], ["", "", ""]);
        assert_eq!(
            agent_of(&Stated::default(), "", &dims),
            AgentDims::default()
        );
        assert_eq!(width("1e9,1,1"), None);
    }

    #[test]
    fn referrers_by_scheme() {
        assert_eq!(
            source("news.example.net/item", "h"),
            (
                Some("https://news.example.net/item".into()),
                Campaign::default()
            )
        );
        let (url, campaign) = source("Hacker News", "g");
        assert_eq!((url, campaign.source_tag.as_str()), (None, "Hacker News"));
        let (url, campaign) = source("newsletter", "c");
        assert_eq!((url, campaign.source_tag.as_str()), (None, "newsletter"));
        assert_eq!(
            source("android-app://com.slack", "o").0.as_deref(),
            Some("android-app://com.slack")
        );
        assert_eq!(source("", "o"), (None, Campaign::default()));
    }
}
