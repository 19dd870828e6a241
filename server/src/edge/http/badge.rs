//! `GET /badge/{site}.svg` (a counting SVG badge) and `GET /api/v1/pixel.gif` (a counting
//! no-JavaScript pixel).
//!
//! Neither request carries a visitor id, so the visitor is the keyed hash of the source (see
//! `privacy`), and repeated fetches from one source of the same page within the configured
//! interval count once ([`crate::core::suppress`], behind [`crate::state::RepeatGate`]). Both
//! go through the same counting pipeline as a hit ([`crate::collect::Collector`]). Badge views are stored with their own
//! source and shown by the larger-source rule ([`crate::core::counts`]); pixel views count as
//! web views, since the pixel only loads where the script could not run.
//!
//! Limits: every counted view is charged to the sender's address (see `state::limits`), like a hit.
//! A fetch over the allowance still gets its image (a README must not show a broken image)
//! but is not counted (`X-Tally-Status: rate_limited`). Known image proxies (GitHub's camo)
//! fetch for many readers from few addresses: they are charged to a separate, larger proxy
//! allowance, and their repeat gate is per (proxy address, page) and one second, so each
//! reader's view through the proxy counts, at most one per second per page and proxy address.
//! `HEAD` never counts, and neither a display-only badge nor a `HEAD` creates a site.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tally_wire::ErrorBody;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{ApiError, AppState, SiteSegment};
use crate::collect::{Counted, Sender};
use crate::core::badge::{Badge, BadgeColor, BadgeStyle, abbreviate, group};
use crate::core::counts::present;
use crate::core::ids::PagePath;
use crate::core::record::Source;
use crate::core::site::Site;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(badge))
}

pub fn pixel_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(pixel))
}

/// What a server-side counted view ended as (also sent as `X-Tally-Status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, utoipa::ToSchema)]
#[schema(as = ViewStatus, rename_all = "snake_case")]
pub enum ViewStatus {
    Accepted,
    Duplicate,
    Suppressed,
    Filtered,
    RateLimited,
    /// `display_only`: `count=0`, or a `HEAD`.
    #[schema(rename = "display_only")]
    NotCounted,
}

impl ViewStatus {
    fn as_str(self) -> &'static str {
        match self {
            ViewStatus::Accepted => "accepted",
            ViewStatus::Duplicate => "duplicate",
            ViewStatus::Suppressed => "suppressed",
            ViewStatus::Filtered => "filtered",
            ViewStatus::RateLimited => "rate_limited",
            ViewStatus::NotCounted => "display_only",
        }
    }
}

/// Count one view of `page` made by the server on behalf of a source without a visitor id.
async fn count_view(
    state: &AppState,
    site: Arc<Site>,
    page: &PagePath,
    source: Source,
    sender: &Sender,
) -> Result<ViewStatus, ApiError> {
    let counted = state
        .collect
        .count_server_view(site, page, source, sender)
        .await?;
    Ok(match counted {
        Counted::Accepted => ViewStatus::Accepted,
        Counted::Duplicate => ViewStatus::Duplicate,
        Counted::Filtered => ViewStatus::Filtered,
        Counted::Suppressed => ViewStatus::Suppressed,
        Counted::RateLimited => ViewStatus::RateLimited,
    })
}

fn parse_page(raw: Option<&str>) -> Result<Option<PagePath>, ApiError> {
    match raw {
        None | Some("") => Ok(None),
        Some(p) => PagePath::parse(p)
            .map(Some)
            .map_err(|_| ApiError::bad("invalid_page", "page must be a path starting with /")),
    }
}

/// A badge's parameters. An invalid value of any of them is replaced by its default (named in
/// `X-Tally-Warning`): a badge never breaks.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct BadgeQuery {
    /// The page's path; the whole site when absent (a path without its leading `/` gets one).
    #[param(example = "/README")]
    page: Option<String>,
    /// `views` (default), `visitors` or `today` (today's views).
    #[param(example = "views")]
    metric: Option<String>,
    /// The left-hand text (default: the metric's name).
    label: Option<String>,
    /// The value's colour: a shields name (`brightgreen`, `blue`, …) or hex (`4c1`, `#007ec6`).
    #[param(example = "brightgreen")]
    color: Option<String>,
    /// Shields' name; `label_color` is accepted too.
    #[serde(rename = "labelColor", alias = "label_color")]
    label_color: Option<String>,
    /// `flat` (default), `flat-square`, `plastic` or `for-the-badge`.
    #[param(example = "flat")]
    style: Option<String>,
    /// `1`/`true`/`yes`: show 12.3k instead of 12,345.
    abbreviate: Option<String>,
    /// `0`/`false`/`no`: display only, do not count.
    count: Option<String>,
}

/// A flag's value, or `None` when it is neither 1/0, true/false nor yes/no.
fn flag(raw: Option<&str>, default: bool) -> Option<bool> {
    match raw {
        None => Some(default),
        Some("1" | "true" | "yes") => Some(true),
        Some("0" | "false" | "no") => Some(false),
        Some(_) => None,
    }
}

/// What a badge shows, with every invalid parameter replaced by its documented default; the
/// names of the replaced ones go to `X-Tally-Warning`, so a README never shows a broken image.
struct BadgeParams {
    page: Option<PagePath>,
    metric: &'static str,
    label: Option<String>,
    color: BadgeColor,
    label_color: Option<BadgeColor>,
    style: BadgeStyle,
    short: bool,
    count: bool,
    ignored: Vec<&'static str>,
}

impl BadgeParams {
    fn from_query(query: Result<BadgeQuery, ()>) -> Self {
        let mut ignored = Vec::new();
        let q = query.unwrap_or_else(|()| {
            ignored.push("query");
            BadgeQuery::default()
        });
        let mut pick = |name: &'static str, ok: bool| {
            if !ok {
                ignored.push(name);
            }
        };
        // A page without its leading slash is read as if it had one.
        let page = match q.page.as_deref() {
            None | Some("") => None,
            Some(p) => {
                let page = PagePath::parse(p)
                    .or_else(|_| PagePath::parse(&format!("/{p}")))
                    .ok();
                pick("page", page.is_some());
                page
            }
        };
        let metric = match q.metric.as_deref() {
            None => "views",
            Some("views") => "views",
            Some("visitors") => "visitors",
            Some("today") => "today",
            Some(_) => {
                pick("metric", false);
                "views"
            }
        };
        let color = q.color.as_deref().map(BadgeColor::parse);
        pick("color", !matches!(color, Some(None)));
        let label_color = q.label_color.as_deref().map(BadgeColor::parse);
        pick("labelColor", !matches!(label_color, Some(None)));
        let style = q.style.as_deref().map(BadgeStyle::parse);
        pick("style", !matches!(style, Some(None)));
        let short = flag(q.abbreviate.as_deref(), false);
        pick("abbreviate", short.is_some());
        let count = flag(q.count.as_deref(), true);
        pick("count", count.is_some());
        Self {
            page,
            metric,
            label: q.label,
            color: color.flatten().unwrap_or_default(),
            label_color: label_color.flatten(),
            style: style.flatten().unwrap_or_default(),
            short: short.unwrap_or(false),
            count: count.unwrap_or(true),
            ignored,
        }
    }
}

/// The shields endpoint-badge JSON (`https://shields.io/badges/endpoint-badge`).
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct EndpointBadge {
    /// Always 1.
    schema_version: u8,
    label: String,
    message: String,
    color: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    label_color: Option<String>,
}

/// The badge's file: `{site}.svg` or `{site}.json`.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // Read as a `String` (the router cannot split a segment): only documented.
struct BadgeFile {
    /// `{site}.svg` (the SVG badge) or `{site}.json` (shields' endpoint badge).
    #[param(
        pattern = "^[a-z0-9][a-z0-9._-]{0,63}\\.(svg|json)$",
        example = "blog.svg"
    )]
    file: String,
}

/// A counter badge, as SVG or as shields' endpoint badge.
///
/// `{site}.svg` is the badge; `{site}.json` the same numbers in shields' endpoint-badge
/// schema. Each fetch counts a view (badge source; a repeat from one source within the repeat
/// interval counts once) unless `count=0`; `HEAD` never counts. Over its allowance a fetch
/// still gets its badge, uncounted (`X-Tally-Status: rate_limited`).
#[utoipa::path(
    get,
    path = "/badge/{file}",
    operation_id = "badge",
    tag = "badges",
    params(
        BadgeFile,
        BadgeQuery,
        ("If-None-Match" = Option<String>, Header, description = "An `ETag` of an earlier answer: 304 when the SVG is unchanged."),
    ),
    responses(
        (status = 200, description = "The badge; never cached.",
            content(
                (String = "image/svg+xml"),
                (EndpointBadge = "application/json"),
            ),
            headers(
                ("X-Tally-Status" = inline(ViewStatus), description = "What the fetch counted."),
                ("X-Tally-Warning" = String, description = "The invalid parameters replaced by their defaults."),
                ("ETag" = String, description = "Entity tag of the SVG."),
            )),
        (status = 304, description = "The SVG is unchanged (`If-None-Match` matched); the fetch was still judged.",
            headers(("X-Tally-Status" = inline(ViewStatus), description = "What the fetch counted."))),
        (status = 400, description = "`invalid_site`.", body = ErrorBody),
        (status = 403, description = "`unknown_site`, `site_limit_reached`.", body = ErrorBody),
        (status = 404, description = "`not_found`: the file ends neither in `.svg` nor `.json`.", body = ErrorBody),
        (status = 429, description = "`rate_limited`: this address may create no more sites now (auto-sites).",
            body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 503, description = "`overloaded`, `storage_unavailable`, `disk_full`.",
            body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
async fn badge(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: Method,
    SiteSegment(file): SiteSegment,
    headers: HeaderMap,
    query: Result<Query<BadgeQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let (raw_site, json) = match (file.strip_suffix(".svg"), file.strip_suffix(".json")) {
        (Some(site), _) => (site, false),
        (_, Some(site)) => (site, true),
        _ => {
            return Err(ApiError::NotFound(
                "badges end in .svg (or .json for shields' endpoint badge)".into(),
            ));
        }
    };
    let site_id = super::site_id(raw_site)?;
    let p = BadgeParams::from_query(query.map(|q| q.0).map_err(|_| ()));
    let page = p.page.clone();
    let (metric, color, label_color, style) = (p.metric, p.color, p.label_color, p.style);
    // HEAD never counts (link checkers and proxies probe with it).
    let counting = p.count && method != Method::HEAD;
    let short = p.short;
    let counted_page = page.clone().unwrap_or_else(PagePath::root);
    let (site, status) = if counting {
        let sender = state.sender(peer, &headers);
        let site = state
            .collect
            .site_for_counting(&site_id, None, sender.net, state.clock.now())
            .await?;
        let status = count_view(
            &state,
            Arc::clone(&site),
            &counted_page,
            Source::Badge,
            &sender,
        )
        .await?;
        (site, status)
    } else {
        (
            state.collect.sites.get(&site_id).await?,
            ViewStatus::NotCounted,
        )
    };
    let now = state.clock.now();
    let raw = state
        .store
        .counts(&site.id, &counted_page, site.zone.day_of(now))
        .await?;
    let counts = present(&raw, Default::default());
    let scope = if page.is_some() {
        counts.page
    } else {
        counts.site
    };
    let (n, default_label) = match metric {
        "visitors" => (scope.visitors, "visitors"),
        "today" => (scope.today.views, "today"),
        _ => (scope.views, "views"),
    };
    let value = if short { abbreviate(n) } else { group(n) };
    let label = p.label.as_deref().unwrap_or(default_label);
    if json {
        let body = EndpointBadge {
            schema_version: 1,
            label: crate::core::badge::clean(label),
            message: value,
            color: color.to_string(),
            label_color: label_color.map(|c| c.to_string()),
        };
        let mut response = axum::Json(body).into_response();
        finish(response.headers_mut(), status, &p.ignored);
        return Ok(response);
    }
    let svg = Badge {
        label,
        value: &value,
        color,
        label_color,
        style,
    }
    .render();
    let etag = format!("\"{}\"", &blake3::hash(svg.as_bytes()).to_hex()[..16]);
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [
                (header::CONTENT_TYPE, "image/svg+xml; charset=utf-8"),
                // Opened on its own, an SVG is a document: no script, no fetch, no form,
                // whatever the escaping of labels ever misses.
                (header::CONTENT_SECURITY_POLICY, SVG_CSP),
            ],
            svg,
        )
            .into_response()
    };
    let h = response.headers_mut();
    finish(h, status, &p.ignored);
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    Ok(response)
}

/// The policy of an SVG answer (badges, the favicon): inline styles only, sandboxed.
pub(crate) const SVG_CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; sandbox";

/// Headers of every badge answer: never cached, the count status, what was ignored.
fn finish(h: &mut HeaderMap, status: ViewStatus, ignored: &[&'static str]) {
    // Image proxies (GitHub's camo) must re-fetch on every view.
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-store, must-revalidate, max-age=0"),
    );
    h.insert(
        header::EXPIRES,
        HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"),
    );
    h.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    h.insert("x-tally-status", HeaderValue::from_static(status.as_str()));
    if !ignored.is_empty()
        && let Ok(v) = HeaderValue::from_str(&format!(
            "ignored invalid {} (defaults used)",
            ignored.join(", ")
        ))
    {
        h.insert("x-tally-warning", v);
    }
}

/// The smallest transparent 1×1 GIF (43 bytes).
const PIXEL: &[u8] = &[
    0x47, 0x49, 0x46, 0x38, 0x39, 0x61, 0x01, 0x00, 0x01, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00,
    0xff, 0xff, 0xff, 0x21, 0xf9, 0x04, 0x01, 0x00, 0x00, 0x00, 0x00, 0x2c, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x01, 0x00, 0x00, 0x02, 0x02, 0x44, 0x01, 0x00, 0x3b,
];

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct PixelQuery {
    /// The site id.
    #[param(pattern = "^[a-z0-9][a-z0-9._-]{0,63}$", example = "blog")]
    site: String,
    /// The page's path; without it, the path of the embedding page (`Referer`), else `/`.
    #[param(pattern = "^/([^/]|$)", example = "/posts/hello")]
    page: Option<String>,
}

/// A counting transparent 1×1 GIF for `<noscript>`.
///
/// Each fetch is a page view (web source) unless it is a repeat from one source within the
/// repeat interval, or over the address's allowance (the image is still sent). `HEAD` never
/// counts. The `Referer`'s origin must be one the site allows.
#[utoipa::path(
    get,
    path = "/api/v1/pixel.gif",
    operation_id = "pixel",
    tag = "badges",
    params(
        PixelQuery,
        ("Referer" = Option<String>, Header, description = "The embedding page: its path is the page when `page` is absent, and its origin must be one the site allows (403 `origin_not_allowed`).", example = "https://blog.example/posts/hello"),
    ),
    responses(
        (status = 200, description = "The 43-byte GIF.", content_type = "image/gif", body = String,
            headers(("X-Tally-Status" = inline(ViewStatus), description = "What the fetch counted."))),
        (status = 400, description = "`invalid_query` (no `site`), `invalid_site`, `invalid_page`.", body = ErrorBody),
        (status = 403, description = "`unknown_site`, `origin_not_allowed`, `site_limit_reached`.", body = ErrorBody),
        (status = 429, description = "`rate_limited`: this address may create no more sites now (auto-sites).",
            body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 503, description = "`overloaded`, `storage_unavailable`, `disk_full`.",
            body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
async fn pixel(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: Method,
    headers: HeaderMap,
    query: Result<Query<PixelQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let q = super::query(query)?;
    let site_id = super::site_id(&q.site)?;
    // The page is the `page` parameter, else the path of the page that embeds the pixel.
    let referer = headers
        .get(header::REFERER)
        .and_then(|v| v.to_str().ok())
        .and_then(|r| url::Url::parse(r).ok());
    let page = match parse_page(q.page.as_deref())? {
        Some(page) => page,
        None => referer
            .as_ref()
            .and_then(|u| PagePath::parse(u.path()).ok())
            .unwrap_or_else(PagePath::root),
    };
    // An <img> sends no Origin; the embedding page's origin is checked when the Referer says it.
    let origin = referer.as_ref().map(|u| u.origin().ascii_serialization());
    let status = if method == Method::HEAD {
        state
            .collect
            .sites
            .for_origin(&site_id, origin.as_deref())
            .await?;
        ViewStatus::NotCounted
    } else {
        let sender = state.sender(peer, &headers);
        let site = state
            .collect
            .site_for_counting(&site_id, origin.as_deref(), sender.net, state.clock.now())
            .await?;
        count_view(&state, site, &page, Source::Web, &sender).await?
    };
    let mut response = ([(header::CONTENT_TYPE, "image/gif")], PIXEL).into_response();
    response
        .headers_mut()
        .insert("x-tally-status", HeaderValue::from_static(status.as_str()));
    Ok(response)
}
