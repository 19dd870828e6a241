//! Identifier types parsed at the edge. Each `parse` is the only way to build the value, so an
//! invalid site id, event id or page path cannot reach the counting logic or a store.

use std::fmt;

use jiff::Timestamp;
use uuid::Uuid;

/// Why an identifier was refused; `code()` is the wire error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("site must match [a-z0-9][a-z0-9._-]{{0,63}}")]
    Site,
    #[error("event_id must be a UUID")]
    EventIdNotUuid,
    #[error("event_id must be a UUIDv7 (time-ordered); got version {0}")]
    EventIdNotV7(usize),
    #[error("visitor_id must be a UUID or null")]
    VisitorId,
    #[error("url must be an absolute http(s) URL")]
    Url,
    #[error("referrer must be an absolute URL or null")]
    Referrer,
    #[error("name must be 1 to 64 printable characters")]
    Name,
    #[error("dedupe must be 1 to 128 printable characters")]
    Dedupe,
}

impl IdError {
    /// The stable snake_case code sent to clients.
    pub fn code(&self) -> &'static str {
        match self {
            IdError::Site => "invalid_site",
            IdError::EventIdNotUuid | IdError::EventIdNotV7(_) => "invalid_event_id",
            IdError::VisitorId => "invalid_visitor_id",
            IdError::Url => "invalid_url",
            IdError::Referrer => "invalid_referrer",
            IdError::Name => "invalid_name",
            IdError::Dedupe => "invalid_dedupe",
        }
    }
}

/// A site id: `[a-z0-9][a-z0-9._-]{0,63}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SiteId(String);

impl SiteId {
    /// Parse a site id.
    pub fn parse(raw: &str) -> Result<Self, IdError> {
        let bytes = raw.as_bytes();
        let first_ok = bytes
            .first()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        let rest_ok = bytes.iter().skip(1).all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        });
        if first_ok && rest_ok && bytes.len() <= 64 {
            Ok(Self(raw.to_owned()))
        } else {
            Err(IdError::Site)
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SiteId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A UUIDv7 event id; its embedded time is the event's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventId(Uuid);

impl EventId {
    /// Parse a UUIDv7.
    pub fn parse(raw: &str) -> Result<Self, IdError> {
        let uuid = Uuid::try_parse(raw).map_err(|_| IdError::EventIdNotUuid)?;
        match uuid.get_version_num() {
            7 => Ok(Self(uuid)),
            v => Err(IdError::EventIdNotV7(v)),
        }
    }

    /// A new id for an event the server creates itself (badge, pixel) at time `at`.
    pub fn new_at(at: Timestamp, random: [u8; 10]) -> Self {
        let ms = u64::try_from(at.as_millisecond()).unwrap_or(0);
        Self(uuid::Builder::from_unix_timestamp_millis(ms, &random).into_uuid())
    }

    /// The time embedded in the id.
    pub fn time(&self) -> Timestamp {
        let (secs, nanos) = self
            .0
            .get_timestamp()
            .map(|ts| ts.to_unix())
            .unwrap_or((0, 0));
        let millis =
            i64::try_from(secs).unwrap_or(i64::MAX / 1000) * 1000 + i64::from(nanos / 1_000_000);
        Timestamp::from_millisecond(millis).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    /// The 16 bytes, as stored.
    pub fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }

    /// The UUID.
    pub fn uuid(&self) -> Uuid {
        self.0
    }
}

/// The 16-byte key a visitor is counted under: the client's visitor UUID, or, when the client
/// keeps no id, a keyed hash of the request source that changes every day (see `collect::privacy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VisitorKey(pub [u8; 16]);

impl VisitorKey {
    /// Parse a client visitor id (any UUID version).
    pub fn parse_uuid(raw: &str) -> Result<Self, IdError> {
        Uuid::try_parse(raw)
            .map(|u| Self(*u.as_bytes()))
            .map_err(|_| IdError::VisitorId)
    }
}

/// Longest page key kept, in bytes (of the percent-encoded path). Longer paths are cut to
/// this length (never inside a `%XX` escape), so two pages that share their first 512 bytes
/// count as one: every stored key stays small, and a client cannot make rows of any size.
/// 512 bytes hold 56 percent-encoded CJK characters, more than real slugs use.
pub const MAX_PAGE_BYTES: usize = 512;

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

/// `path` cut to at most `max` bytes, never inside a `%XX` escape (a URL path is ASCII).
pub fn cap_path(path: &str, max: usize) -> &str {
    if path.len() <= max {
        return path;
    }
    let mut cut = max;
    while !path.is_char_boundary(cut) {
        cut -= 1;
    }
    // Step back over a partial escape: a '%' in the last two kept bytes.
    let bytes = path.as_bytes();
    for back in 1..=2 {
        if cut >= back && bytes[cut - back] == b'%' {
            cut -= back;
            break;
        }
    }
    &path[..cut]
}

/// A page key: the path of the page URL (query and fragment dropped).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PagePath(String);

impl PagePath {
    /// The page key of an absolute http(s) URL. A leading run of slashes is one slash
    /// (`https://site//a` is `/a`), so every page key is also a valid `page` parameter.
    pub fn from_url(raw: &str) -> Result<(Self, url::Url), IdError> {
        let url = url::Url::parse(raw).map_err(|_| IdError::Url)?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(IdError::Url);
        }
        let path = url.path();
        let path = &path[(path.len() - path.trim_start_matches('/').len()).saturating_sub(1)..];
        Ok((Self(cap_path(path, MAX_PAGE_BYTES).to_owned()), url))
    }

    /// A path as given by a query parameter (`/posts/a`); must start with `/`. It is
    /// normalised exactly as a URL's path is (percent-encoding, `..` segments, query and
    /// fragment dropped), so `?page=/a b` and a beacon from `https://site/a%20b` share a key.
    pub fn parse(raw: &str) -> Result<Self, IdError> {
        if !raw.starts_with('/') || raw.starts_with("//") || raw.chars().any(char::is_control) {
            return Err(IdError::Url);
        }
        let url =
            url::Url::parse(&format!("http://page.invalid{raw}")).map_err(|_| IdError::Url)?;
        Ok(Self(cap_path(url.path(), MAX_PAGE_BYTES).to_owned()))
    }

    /// The site root, `/`.
    pub fn root() -> Self {
        Self("/".to_owned())
    }

    /// The path as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn printable(raw: &str, max_chars: usize) -> bool {
    let n = raw.chars().count();
    (1..=max_chars).contains(&n) && !raw.chars().any(char::is_control)
}

/// A custom event name: 1–64 printable characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventName(String);

impl EventName {
    /// Parse an event name.
    pub fn parse(raw: &str) -> Result<Self, IdError> {
        if printable(raw, 64) {
            Ok(Self(raw.to_owned()))
        } else {
            Err(IdError::Name)
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A dedupe key of a custom event: 1–128 printable characters as sent, or a key scoped to one
/// visitor ([`DedupeKey::scoped_to`]).
///
/// Invariant: a scoped key starts with a control character, which [`DedupeKey::parse`] never
/// accepts, so no key anyone can send equals a scoped key: an anonymous sender's `order_1001`
/// can neither claim the site's real `order_1001` nor another visitor's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DedupeKey(String);

/// The first character of a scoped dedupe key (ASCII unit separator).
pub const SCOPED_DEDUPE_PREFIX: char = '\u{1f}';

impl DedupeKey {
    /// Parse a dedupe key.
    pub fn parse(raw: &str) -> Result<Self, IdError> {
        if printable(raw, 128) {
            Ok(Self(raw.to_owned()))
        } else {
            Err(IdError::Dedupe)
        }
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// This key as sent by `visitor` only: a control character and 32 hex digits of a hash of
    /// the visitor key and the key, so the same key from another visitor is another key.
    pub fn scoped_to(&self, visitor: &VisitorKey) -> Self {
        let mut h = blake3::Hasher::new_derive_key("tally 2026-12 visitor-scoped dedupe key v1");
        h.update(&visitor.0);
        h.update(self.0.as_bytes());
        let hex = h.finalize().to_hex();
        Self(format!("{SCOPED_DEDUPE_PREFIX}{}", &hex[..32]))
    }

    /// Whether this key is scoped to a visitor.
    pub fn is_scoped(&self) -> bool {
        self.0.starts_with(SCOPED_DEDUPE_PREFIX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn site_ids() {
        for ok in ["blog", "a", "0", "my-site.v2_x", &"a".repeat(64)] {
            assert!(SiteId::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Blog", "-a", ".a", "a b", "a/b", &"a".repeat(65), "é"] {
            assert_eq!(SiteId::parse(bad), Err(IdError::Site), "{bad}");
        }
    }

    #[test]
    fn event_id_must_be_v7_and_carries_its_time() {
        assert_eq!(EventId::parse("nope"), Err(IdError::EventIdNotUuid));
        let v4 = "67e55044-10b1-426f-9247-bb680e5fe0c8";
        assert_eq!(EventId::parse(v4), Err(IdError::EventIdNotV7(4)));
        let at: Timestamp = "2026-05-01T12:34:56.789Z".parse().expect("ts");
        let id = EventId::new_at(at, [7; 10]);
        let parsed = EventId::parse(&id.uuid().to_string()).expect("v7");
        assert_eq!(parsed.time(), at);
    }

    #[test]
    fn page_key_drops_query_and_fragment() {
        let (page, _) = PagePath::from_url("https://b.example/posts/a?utm=x#top").expect("url");
        assert_eq!(page.as_str(), "/posts/a");
        assert_eq!(PagePath::from_url("ftp://b.example/"), Err(IdError::Url));
        assert_eq!(PagePath::from_url("/relative"), Err(IdError::Url));
        let given = PagePath::parse("/a b/../c<d>?q=1").expect("path");
        let (from_url, _) = PagePath::from_url("https://b.example/a%20b/../c%3Cd%3E").expect("url");
        assert_eq!(given, from_url);
        assert_eq!(given.as_str(), "/c%3Cd%3E");
        assert!(PagePath::parse("//evil.example/x").is_err());
    }

    #[test]
    fn long_paths_are_cut_outside_escapes() {
        let long = format!("/{}", "a".repeat(2000));
        let (page, _) = PagePath::from_url(&format!("https://b.example{long}")).expect("url");
        assert_eq!(page.as_str().len(), MAX_PAGE_BYTES);
        // "/" + 510 × "a" + "%E4…": the escape that straddles the cut is dropped whole.
        let tricky = format!("/{}{}", "a".repeat(510), "%E4%B8%AD".repeat(10));
        let page = PagePath::parse(&tricky).expect("path");
        assert_eq!(page.as_str(), format!("/{}", "a".repeat(510)));
        assert_eq!(cap_path("/a%E4%B8", 5), "/a%E4");
        assert_eq!(cap_path("/a%E4%B8", 4), "/a");
    }

    proptest! {
        #[test]
        fn capped_paths_are_bounded_and_whole(raw in "/([a-z/]|%[0-9A-F]{2}){0,300}") {
            let capped = cap_path(&raw, 100);
            prop_assert!(capped.len() <= 100);
            prop_assert!(raw.starts_with(capped));
            // Every escape kept is whole.
            let b = capped.as_bytes();
            for (i, c) in b.iter().enumerate() {
                if *c == b'%' {
                    prop_assert!(i + 2 < b.len(), "a cut escape in {}", capped);
                }
            }
        }

        #[test]
        fn site_parse_never_panics_and_roundtrips(raw in ".{0,80}") {
            if let Ok(site) = SiteId::parse(&raw) {
                prop_assert_eq!(site.as_str(), raw.as_str());
                prop_assert!(site.as_str().len() <= 64);
            }
        }

        #[test]
        fn url_parse_never_panics(raw in ".{0,200}") {
            let _ = PagePath::from_url(&raw);
        }

        #[test]
        fn page_normalisation_is_a_bounded_fixpoint(
            path in "(/([ -~]|%[0-9A-Fa-f]{2}|é){0,40}){1,5}",
            query in "[ -~]{0,20}",
        ) {
            let url = format!("https://b.example{path}?{query}");
            if let Ok((page, _)) = PagePath::from_url(&url) {
                prop_assert!(page.as_str().starts_with('/'));
                prop_assert!(page.as_str().len() <= MAX_PAGE_BYTES);
                prop_assert!(!page.as_str().contains('?') && !page.as_str().contains('#'));
                // Normalising a normalised page changes nothing.
                prop_assert_eq!(PagePath::parse(page.as_str()).expect("reparses"), page);
            }
        }

        #[test]
        fn no_sent_dedupe_key_equals_a_scoped_one(raw in "\\PC{1,128}", v in any::<[u8; 16]>()) {
            if let Ok(key) = DedupeKey::parse(&raw) {
                let scoped = key.scoped_to(&VisitorKey(v));
                prop_assert!(scoped.is_scoped() && !key.is_scoped());
                prop_assert!(DedupeKey::parse(scoped.as_str()).is_err());
                prop_assert_ne!(scoped.clone(), key.scoped_to(&VisitorKey([!v[0]; 16])));
                prop_assert_eq!(scoped, key.scoped_to(&VisitorKey(v)));
            }
        }

        #[test]
        fn names_are_bounded(raw in ".{0,100}") {
            if let Ok(name) = EventName::parse(&raw) {
                prop_assert!((1..=64).contains(&name.as_str().chars().count()));
            }
        }
    }
}
