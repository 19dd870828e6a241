//! Tally's wire format, version 1 — the one definition of what travels between the browser
//! client and the collector.
//!
//! Contract:
//! - These types are the public JSON shapes of `POST /api/v1/hit`, `POST /api/v1/events`,
//!   `GET /api/v1/counts` and every error body. Field names and meanings are stable within v1;
//!   new optional fields may be added, and receivers ignore fields they do not know.
//! - Identifiers travel as strings. The collector parses them into its own typed values and
//!   answers with a precise error code when one is malformed, so this crate stays free of any
//!   validation logic and small enough for the WebAssembly client.
//! - Nothing here allocates beyond what serde needs; nothing here panics.
//! - With the `openapi` feature (the collector's, never the WebAssembly client's) every type
//!   also derives `utoipa::ToSchema`: the collector's OpenAPI document describes these very
//!   types, with the constraints the collector enforces written next to the fields.

use serde::{Deserialize, Serialize};

/// Largest accepted body of `POST /api/v1/hit`, in bytes.
pub const MAX_HIT_BYTES: usize = 8 * 1024;
/// Largest number of records in one `POST /api/v1/events` batch.
pub const MAX_BATCH_RECORDS: usize = 500;
/// Largest accepted body of `POST /api/v1/events`, in bytes.
pub const MAX_BATCH_BYTES: usize = MAX_BATCH_RECORDS * MAX_HIT_BYTES;

/// `type` of a page view.
pub const TYPE_PAGEVIEW: &str = "pageview";
/// `type` of a custom event.
pub const TYPE_EVENT: &str = "event";
/// `type` of an engagement report: the visible and focused time and the largest scroll depth
/// of the page view whose `event_id` it carries, as they stand now (totals, not increments).
pub const TYPE_ENGAGEMENT: &str = "engagement";
/// Largest `engaged_ms` accepted: 30 days.
pub const MAX_ENGAGED_MS: u64 = 30 * 24 * 3_600_000;

/// One page view or custom event: the body of `POST /api/v1/hit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "openapi",
    schema(example = json!({
        "site": "blog", "type": "pageview",
        "event_id": "019a2b3c-4d5e-7f60-8a1b-2c3d4e5f6071",
        "visitor_id": "3f0c9a52-8f5e-4b4a-9d61-0c2a7d1e5b8f",
        "url": "https://blog.example/posts/hello", "referrer": "https://news.example/item?id=1"
    }))
)]
pub struct Hit {
    /// Site id, `[a-z0-9][a-z0-9._-]{0,63}`.
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[a-z0-9][a-z0-9._-]{0,63}$", example = "blog")
    )]
    pub site: String,
    /// `pageview`, `event` or `engagement`.
    #[serde(rename = "type")]
    #[cfg_attr(feature = "openapi", schema(value_type = HitType))]
    pub kind: String,
    /// A UUIDv7 made by the client for this one event; retries reuse it. Its time must lie in
    /// the collector's window (by default 72 h back, 5 min ahead). An `engagement` carries the
    /// event id of the page view it reports on.
    #[cfg_attr(
        feature = "openapi",
        schema(
            format = "uuid",
            pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-7[0-9a-fA-F]{3}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
        )
    )]
    pub event_id: String,
    /// The anonymous visitor id (a UUID), or `null` when the client keeps none.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(format = "uuid"))]
    pub visitor_id: Option<String>,
    /// Absolute http(s) URL of the page.
    #[cfg_attr(
        feature = "openapi",
        schema(format = "uri", pattern = "^[hH][tT][tT][pP][sS]?://")
    )]
    pub url: String,
    /// Absolute URL of the referring page, or `null`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(format = "uri"))]
    pub referrer: Option<String>,
    /// Event name (required for `type = "event"`): 1–64 characters, no control characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 64))]
    pub name: Option<String>,
    /// Dedupe key of a custom event: counted once per (site, name, dedupe); 1–128 characters,
    /// no control characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 128))]
    pub dedupe: Option<String>,
    /// The width of the visitor's screen in CSS pixels (page views; decides the device
    /// class: under 576 mobile, under 992 tablet, under 1440 laptop, else desktop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 100000))]
    pub screen_width: Option<u32>,
    /// `engagement` only: the page view's visible and focused time so far, ms (the collector
    /// keeps the largest value it was sent, so a resend never adds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 2592000000_u64))]
    pub engaged_ms: Option<u64>,
    /// `engagement` only: the largest share of the page scrolled into view so far, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 100))]
    pub scroll: Option<u8>,
}

/// The `type` of a hit: `pageview`, or `event` (with a `name`). (In Rust the field is a
/// string, so an unknown type is answered `invalid_type`, not a parse error.)
#[cfg(feature = "openapi")]
#[derive(utoipa::ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum HitType {
    /// A page view.
    Pageview,
    /// A custom event (`name` required).
    Event,
    /// An engagement report on a page view (`event_id` = the page view's).
    Engagement,
}

/// How the collector treated one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Stored and counted.
    Accepted,
    /// This event id (or dedupe key) was counted before; nothing changed.
    Duplicate,
    /// A repeat from one source beyond the allowed rate: not counted.
    Suppressed,
    /// Bot or otherwise filtered traffic: not counted.
    Filtered,
    /// Only in batch results: the record was invalid (see `error`).
    Rejected,
}

/// Answer of `POST /api/v1/hit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HitResponse {
    pub status: Status,
    /// Present when the request asked for `?counts=1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counts: Option<Counts>,
}

/// Body of `POST /api/v1/events`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Batch {
    /// At most 500 records; each is judged on its own (an invalid one is
    /// `rejected` in its result, the others still count).
    #[cfg_attr(feature = "openapi", schema(max_items = 500))]
    pub events: Vec<Hit>,
}

/// One result of a batch, in the order of the records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchResult {
    /// The record's event id as sent (may be absent when the record was not an object).
    pub event_id: Option<String>,
    pub status: Status,
    /// Error code when `status` is `rejected`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Answer of `POST /api/v1/events`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchResponse {
    pub results: Vec<BatchResult>,
}

/// Views and visitors of one scope.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Numbers {
    pub views: u64,
    pub visitors: u64,
}

/// All-time numbers plus today's (in the site's time zone).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScopeCounts {
    pub views: u64,
    pub visitors: u64,
    pub today: Numbers,
}

/// Events and distinct visitors of the live window (the last 60 s).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Live {
    pub events: u64,
    pub visitors: u64,
}

/// Answer of `GET /api/v1/counts` (and `counts` of a hit answer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Counts {
    pub site: ScopeCounts,
    pub page: ScopeCounts,
    pub live: Live,
}

/// Every 4xx/5xx body: a stable snake_case code and a sentence for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "openapi",
    schema(example = json!({"error": "malformed_json", "message": "body is not valid JSON: EOF while parsing an object at line 1 column 14"}))
)]
pub struct ErrorBody {
    /// The stable snake_case code (`malformed_json`, `unknown_site`, `rate_limited`, …).
    pub error: String,
    /// A sentence for people; its wording may change.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hit_ignores_unknown_fields_and_defaults_optionals() {
        let hit: Hit = serde_json::from_str(
            r#"{"site":"blog","type":"pageview","event_id":"x","url":"https://a/","extra":[1]}"#,
        )
        .expect("valid hit");
        assert_eq!(hit.visitor_id, None);
        assert_eq!(hit.referrer, None);
        assert_eq!(hit.kind, TYPE_PAGEVIEW);
    }

    #[test]
    fn status_is_snake_case_on_the_wire() {
        let body = serde_json::to_string(&HitResponse {
            status: Status::Duplicate,
            counts: None,
        })
        .expect("serialises");
        assert_eq!(body, r#"{"status":"duplicate"}"#);
    }
}
