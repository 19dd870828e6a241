//! What a visit is broken down by: where it came from ([`SourceDims`]: referrer, source name,
//! channel, campaign tags) and what it was made with ([`AgentDims`]: browser, operating
//! system, device class, country). Both are decided once, at ingest, from the hit and its
//! request (`collect::classify`), stored interned, and never recomputed, so a refreshed data
//! file never changes a number already counted.
//!
//! Contract:
//! - Every value is plain text, trimmed, without control characters, at most
//!   [`MAX_VALUE_BYTES`]; an absent value is the empty string (shown as "Direct / None" for
//!   sources and "(not set)" elsewhere, as Plausible's API shows them).
//! - The raw user agent, the client address and the page's query string are never part of a
//!   dimension: only the names derived from them (and the five `utm_*` tags, `source`/`ref`
//!   and whether a click id was present).
//! - Channels follow Plausible's published rules ([`channel`]), in their order.

/// Longest stored dimension value, in bytes (cut at a character boundary).
pub const MAX_VALUE_BYTES: usize = 128;

/// The separator of the stored form of a dimension tuple (ASCII unit separator: it cannot
/// occur in a value, which holds no control characters).
const SEP: char = '\u{1f}';

/// A value as stored: control characters dropped, trimmed, capped.
pub fn clean(raw: &str) -> String {
    let text: String = raw.chars().filter(|c| !c.is_control()).collect();
    let text = text.trim();
    let mut end = text.len().min(MAX_VALUE_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// The category of a known source, which decides its channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Category {
    Search,
    Social,
    Shopping,
    Video,
    Email,
    AiAssistant,
}

impl Category {
    /// The name in the data file.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "search" => Category::Search,
            "social" => Category::Social,
            "shopping" => Category::Shopping,
            "video" => Category::Video,
            "email" => Category::Email,
            "ai" => Category::AiAssistant,
            _ => return None,
        })
    }
}

/// The campaign tags of a landing page's URL, read before its query string is dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Campaign {
    pub utm_source: String,
    pub utm_medium: String,
    pub utm_campaign: String,
    pub utm_term: String,
    pub utm_content: String,
    /// `source=` or `ref=` (Plausible reads them when `utm_source` is absent).
    pub source_tag: String,
    /// The first click id present (`gclid`, `msclkid`, ...), by name.
    pub click_id: Option<&'static str>,
}

/// Click ids of ad networks, in the order they are looked for: any of them marks a paid visit.
pub const CLICK_IDS: [&str; 9] = [
    "gclid",
    "gbraid",
    "wbraid",
    "msclkid",
    "fbclid",
    "twclid",
    "ttclid",
    "li_fat_id",
    "dclid",
];

impl Campaign {
    /// The tags of `url`'s query string (the URL itself is not kept).
    pub fn of(url: &url::Url) -> Self {
        let mut c = Campaign::default();
        for (key, value) in url.query_pairs() {
            let slot = match key.as_ref() {
                "utm_source" => &mut c.utm_source,
                "utm_medium" => &mut c.utm_medium,
                "utm_campaign" => &mut c.utm_campaign,
                "utm_term" => &mut c.utm_term,
                "utm_content" => &mut c.utm_content,
                "source" | "ref" => &mut c.source_tag,
                other => {
                    if c.click_id.is_none()
                        && !value.is_empty()
                        && let Some(id) = CLICK_IDS.iter().find(|id| **id == other)
                    {
                        c.click_id = Some(id);
                    }
                    continue;
                }
            };
            if slot.is_empty() {
                *slot = clean(&value);
            }
        }
        c
    }
}

/// Where a visit came from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct SourceDims {
    /// The referrer as shown: host without `www.` and path without a trailing `/`.
    pub referrer: String,
    /// The source's name ("Google", "Hacker News", a host, a `utm_source` tag), empty for
    /// direct visits.
    pub source: String,
    pub channel: String,
    pub utm_source: String,
    pub utm_medium: String,
    pub utm_campaign: String,
    pub utm_term: String,
    pub utm_content: String,
}

impl SourceDims {
    /// The stored form: the fields joined by a separator no value holds.
    pub fn encode(&self) -> String {
        [
            &self.referrer,
            &self.source,
            &self.channel,
            &self.utm_source,
            &self.utm_medium,
            &self.utm_campaign,
            &self.utm_term,
            &self.utm_content,
        ]
        .map(String::as_str)
        .join(&SEP.to_string())
    }

    /// Read a stored form; missing fields (a shorter tuple) read as empty.
    pub fn decode(stored: &str) -> Self {
        let mut f = stored.split(SEP).map(str::to_owned);
        let mut next = || f.next().unwrap_or_default();
        SourceDims {
            referrer: next(),
            source: next(),
            channel: next(),
            utm_source: next(),
            utm_medium: next(),
            utm_campaign: next(),
            utm_term: next(),
            utm_content: next(),
        }
    }
}

/// What a visit was made with, and where from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct AgentDims {
    pub browser: String,
    /// The browser's major version.
    pub browser_version: String,
    pub os: String,
    /// The operating system's major version.
    pub os_version: String,
    /// `Mobile`, `Tablet`, `Laptop` or `Desktop` (empty: unknown).
    pub device: String,
    /// ISO 3166-1 alpha-2 country code (empty: unknown).
    pub country: String,
    /// ISO 3166-2 subdivision code (`US-MD`), where the location database has one.
    pub region: String,
}

impl AgentDims {
    /// The stored form: the fields joined by a separator no value holds.
    pub fn encode(&self) -> String {
        [
            &self.browser,
            &self.browser_version,
            &self.os,
            &self.os_version,
            &self.device,
            &self.country,
            &self.region,
        ]
        .map(String::as_str)
        .join(&SEP.to_string())
    }

    /// Read a stored form; missing fields read as empty.
    pub fn decode(stored: &str) -> Self {
        let mut f = stored.split(SEP).map(str::to_owned);
        let mut next = || f.next().unwrap_or_default();
        AgentDims {
            browser: next(),
            browser_version: next(),
            os: next(),
            os_version: next(),
            device: next(),
            country: next(),
            region: next(),
        }
    }
}

/// Device classes by screen width in CSS pixels: under 576 mobile, under 992 tablet, under
/// 1440 laptop, else desktop (the thresholds Plausible used for widths).
pub fn device_of_width(width: u32) -> &'static str {
    match width {
        0..576 => "Mobile",
        576..992 => "Tablet",
        992..1440 => "Laptop",
        _ => "Desktop",
    }
}

/// The referrer as shown: host without `www.`, path without a trailing `/`, no scheme. The
/// stored referrer is already origin + path only (`core::hit`).
pub fn referrer_label(referrer: &str) -> String {
    let rest = referrer
        .split_once("://")
        .map_or(referrer, |(_, rest)| rest);
    let rest = rest.strip_prefix("www.").unwrap_or(rest);
    clean(rest.trim_end_matches('/'))
}

/// Known sources, as the data file names them: what the channel rules need to know.
pub trait SourceNames {
    /// The name and category of a referring host (`news.ycombinator.com` → Hacker News).
    fn by_host(&self, host: &str) -> Option<(&str, Option<Category>)>;
    /// The canonical spelling and category of a source name or tag (`google` → Google).
    fn by_name(&self, name: &str) -> Option<(&str, Option<Category>)>;
}

/// The source dimensions of a landing hit: its referrer (already cleaned by `core::hit`, or
/// `None` for direct or internal navigation) and its campaign tags.
pub fn classify_source(
    referrer: Option<&str>,
    campaign: &Campaign,
    names: &dyn SourceNames,
) -> SourceDims {
    let referrer_host = referrer.map(|r| {
        let rest = r.split_once("://").map_or(r, |(_, rest)| rest);
        rest.split('/').next().unwrap_or(rest).to_ascii_lowercase()
    });
    let tag = if campaign.utm_source.is_empty() {
        &campaign.source_tag
    } else {
        &campaign.utm_source
    };
    let (source, category) = if !tag.is_empty() {
        match names.by_name(tag) {
            Some((name, category)) => (name.to_owned(), category),
            None => (tag.clone(), None),
        }
    } else if let Some(host) = referrer_host.as_deref().filter(|h| !h.is_empty()) {
        match names.by_host(host) {
            Some((name, category)) => (name.to_owned(), category),
            None => (clean(host.strip_prefix("www.").unwrap_or(host)), None),
        }
    } else {
        (String::new(), None)
    };
    let category = category.or_else(|| names.by_name(&source).and_then(|(_, c)| c));
    let mut utm_medium = campaign.utm_medium.clone();
    // A click id says how a visit came when no medium does (Plausible shows "(gclid)").
    if utm_medium.is_empty() {
        match (source.as_str(), campaign.click_id) {
            ("Google", Some("gclid")) => utm_medium = "(gclid)".to_owned(),
            ("Bing", Some("msclkid")) => utm_medium = "(msclkid)".to_owned(),
            _ => {}
        }
    }
    let channel = channel(&Channel {
        source: &source,
        category,
        utm_medium: &campaign.utm_medium,
        utm_source: tag,
        utm_campaign: &campaign.utm_campaign,
        click_id: campaign.click_id,
    });
    SourceDims {
        referrer: referrer.map(referrer_label).unwrap_or_default(),
        source,
        channel: channel.to_owned(),
        utm_source: campaign.utm_source.clone(),
        utm_medium,
        utm_campaign: campaign.utm_campaign.clone(),
        utm_term: campaign.utm_term.clone(),
        utm_content: campaign.utm_content.clone(),
    }
}

/// What the channel rules look at.
pub struct Channel<'a> {
    /// The source's name (empty: direct).
    pub source: &'a str,
    pub category: Option<Category>,
    pub utm_medium: &'a str,
    /// `utm_source`, else `source=`/`ref=`.
    pub utm_source: &'a str,
    pub utm_campaign: &'a str,
    pub click_id: Option<&'a str>,
}

/// The channel of a visit: the first rule that matches, in Plausible's order.
pub fn channel(c: &Channel) -> &'static str {
    let source = c.source.to_lowercase();
    let medium = c.utm_medium.to_lowercase();
    let tag = c.utm_source.to_lowercase();
    let campaign = c.utm_campaign.to_lowercase();
    let is = |cat: Category| c.category == Some(cat);
    let paid_medium = medium.contains("cp")
        || medium == "ppc"
        || medium == "retargeting"
        || medium.starts_with("paid");
    let paid_tag = tag.ends_with("ads") || tag.ends_with("ad") || tag == "adwords";
    let shopping_campaign = shopping_campaign(&campaign);
    let email_word = |s: &str| {
        ["email", "e-mail", "e_mail", "e mail", "newsletter"]
            .iter()
            .any(|w| s.contains(w))
    };
    if campaign.contains("cross-network") {
        "Cross-network"
    } else if (is(Category::Shopping) || shopping_campaign) && paid_medium {
        "Paid Shopping"
    } else if (is(Category::Search) && (paid_medium || paid_tag))
        || (source == "google" && c.click_id == Some("gclid"))
        || (source == "bing" && c.click_id == Some("msclkid"))
    {
        "Paid Search"
    } else if is(Category::Social) && (paid_medium || paid_tag) {
        "Paid Social"
    } else if is(Category::Video) && (paid_medium || paid_tag) {
        "Paid Video"
    } else if ["display", "banner", "expandable", "interstitial", "cpm"].contains(&medium.as_str())
    {
        "Display"
    } else if paid_medium {
        "Paid Other"
    } else if is(Category::Shopping) || shopping_campaign {
        "Organic Shopping"
    } else if is(Category::Social)
        || [
            "social",
            "social-network",
            "social-media",
            "sm",
            "social network",
            "social media",
        ]
        .contains(&medium.as_str())
    {
        "Organic Social"
    } else if is(Category::Video) || medium.contains("video") {
        "Organic Video"
    } else if is(Category::AiAssistant) {
        "AI Assistants"
    } else if is(Category::Search) {
        "Organic Search"
    } else if is(Category::Email) || email_word(&tag) || email_word(&medium) {
        "Email"
    } else if medium == "affiliate" {
        "Affiliates"
    } else if medium == "audio" {
        "Audio"
    } else if tag == "sms" || medium == "sms" {
        "SMS"
    } else if medium.ends_with("push")
        || medium.contains("mobile")
        || medium.contains("notification")
        || source == "firebase"
    {
        "Mobile Push Notifications"
    } else if ["referral", "app", "link"].contains(&medium.as_str()) || !source.is_empty() {
        "Referral"
    } else {
        "Direct"
    }
}

/// A campaign name that says shopping: `shopping` anywhere, or `shop` at the start or after a
/// character that is not a letter other than `e` (`shop`, `eshop`, `summer-shop`, not `workshop`).
fn shopping_campaign(campaign: &str) -> bool {
    if campaign.contains("shopping") {
        return true;
    }
    let bytes = campaign.as_bytes();
    campaign.match_indices("shop").any(|(i, _)| {
        i == 0 || {
            let b = bytes[i - 1];
            !(b.is_ascii_lowercase() && b != b'e')
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Names;
    impl SourceNames for Names {
        fn by_host(&self, host: &str) -> Option<(&str, Option<Category>)> {
            match host {
                "www.google.com" | "google.com" => Some(("Google", Some(Category::Search))),
                "news.ycombinator.com" => Some(("Hacker News", Some(Category::Social))),
                "mail.google.com" => Some(("Gmail", Some(Category::Email))),
                _ => None,
            }
        }
        fn by_name(&self, name: &str) -> Option<(&str, Option<Category>)> {
            match name.to_lowercase().as_str() {
                "google" => Some(("Google", Some(Category::Search))),
                "bing" => Some(("Bing", Some(Category::Search))),
                "facebook" | "fb" => Some(("Facebook", Some(Category::Social))),
                "duckduckgo" => Some(("DuckDuckGo", Some(Category::Search))),
                "wikipedia" => Some(("Wikipedia", None)),
                _ => None,
            }
        }
    }

    fn landing(url: &str, referrer: Option<&str>) -> SourceDims {
        let url = url::Url::parse(url).expect("url");
        classify_source(referrer, &Campaign::of(&url), &Names)
    }

    #[test]
    fn sources_come_from_tags_first_then_the_referrer() {
        let d = landing(
            "https://s.example/?utm_source=FB",
            Some("https://www.google.com/"),
        );
        assert_eq!(
            (d.source.as_str(), d.channel.as_str()),
            ("Facebook", "Organic Social")
        );
        let d = landing(
            "https://s.example/",
            Some("https://news.ycombinator.com/item"),
        );
        assert_eq!(d.source, "Hacker News");
        assert_eq!(d.referrer, "news.ycombinator.com/item");
        let d = landing("https://s.example/", Some("https://www.blog.example/post/"));
        assert_eq!(
            (d.source.as_str(), d.channel.as_str()),
            ("blog.example", "Referral")
        );
        assert_eq!(d.referrer, "blog.example/post");
        let d = landing("https://s.example/?ref=producthunt", None);
        assert_eq!(
            (d.source.as_str(), d.channel.as_str()),
            ("producthunt", "Referral")
        );
        let d = landing("https://s.example/", None);
        assert_eq!((d.source.as_str(), d.channel.as_str()), ("", "Direct"));
    }

    #[test]
    fn click_ids_make_search_paid_and_name_the_medium() {
        let d = landing(
            "https://s.example/?gclid=abc",
            Some("https://www.google.com/"),
        );
        assert_eq!(
            (d.channel.as_str(), d.utm_medium.as_str()),
            ("Paid Search", "(gclid)")
        );
        let d = landing(
            "https://s.example/?gclid=abc",
            Some("https://duckduckgo.com/"),
        );
        assert_eq!(d.source, "duckduckgo.com");
        let d = landing("https://s.example/?utm_source=duckduckgo&gclid=x", None);
        assert_eq!(d.channel, "Organic Search");
    }

    #[test]
    fn channel_rules_in_order() {
        let ch = |source: &str, category, medium: &str, tag: &str, campaign: &str| {
            channel(&Channel {
                source,
                category,
                utm_medium: medium,
                utm_source: tag,
                utm_campaign: campaign,
                click_id: None,
            })
        };
        assert_eq!(ch("", None, "cpc", "", "x-cross-network"), "Cross-network");
        assert_eq!(ch("", None, "cpc", "", "summer-shop"), "Paid Shopping");
        assert_eq!(
            ch("Google", Some(Category::Search), "cpc", "", ""),
            "Paid Search"
        );
        assert_eq!(
            ch("Facebook", Some(Category::Social), "", "fb-ads", ""),
            "Paid Social"
        );
        assert_eq!(ch("", None, "banner", "", ""), "Display");
        assert_eq!(ch("", None, "cpc", "", ""), "Paid Other");
        assert_eq!(ch("", None, "", "", "workshop"), "Direct");
        assert_eq!(ch("", None, "", "", "eshop"), "Organic Shopping");
        assert_eq!(ch("", None, "social", "", ""), "Organic Social");
        assert_eq!(ch("", None, "video", "", ""), "Organic Video");
        assert_eq!(
            ch("ChatGPT", Some(Category::AiAssistant), "", "", ""),
            "AI Assistants"
        );
        assert_eq!(
            ch("Bing", Some(Category::Search), "", "", ""),
            "Organic Search"
        );
        assert_eq!(ch("x", None, "", "newsletter", ""), "Email");
        assert_eq!(ch("Gmail", Some(Category::Email), "", "", ""), "Email");
        assert_eq!(ch("", None, "affiliate", "", ""), "Affiliates");
        assert_eq!(ch("", None, "audio", "", ""), "Audio");
        assert_eq!(ch("sms", None, "", "sms", ""), "SMS");
        assert_eq!(
            ch("", None, "app-push", "", ""),
            "Mobile Push Notifications"
        );
        assert_eq!(ch("Wikipedia", None, "", "", ""), "Referral");
        assert_eq!(ch("", None, "", "", ""), "Direct");
    }

    #[test]
    fn values_are_cleaned_and_capped() {
        assert_eq!(clean("  a\u{0}b\n "), "ab");
        let long = "é".repeat(100);
        assert!(clean(&long).len() <= MAX_VALUE_BYTES);
        let d = SourceDims {
            source: "x".into(),
            utm_content: "y".into(),
            ..SourceDims::default()
        };
        assert_eq!(SourceDims::decode(&d.encode()), d);
        let a = AgentDims {
            browser: "Firefox".into(),
            region: "US-MD".into(),
            ..AgentDims::default()
        };
        assert_eq!(AgentDims::decode(&a.encode()), a);
    }

    #[test]
    fn devices_by_width() {
        assert_eq!(device_of_width(390), "Mobile");
        assert_eq!(device_of_width(576), "Tablet");
        assert_eq!(device_of_width(1366), "Laptop");
        assert_eq!(device_of_width(1440), "Desktop");
    }
}
