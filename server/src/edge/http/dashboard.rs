//! `GET /dashboard/{site}` (HTML, readable without JavaScript) and its JSON twins
//! `GET /api/v1/sites/{site}/series`, `/top` and `/events` (custom events: the 50 names with
//! most events in the range, each with its days).
//!
//! Access: public sites are open; private sites need the admin token, as `Authorization:
//! Bearer <token>` or the session cookie set by the login form (`POST /dashboard/{site}/login`;
//! `HttpOnly; Secure; SameSite=Strict`; a signed, timestamped value that expires, see
//! `http::auth`); `POST /dashboard/{site}/logout` ends it. Wrong tokens are throttled per client
//! network (429). A shared link's token (`Authorization: Bearer tsh_…`, see `http::share`)
//! reads its one site read-only. Every page path and referrer is attacker-controlled and is escaped by the
//! template engine; pages carry the CSP and framing headers of `http::ui`.
//!
//! Cost: every list is ranked and limited inside the database (at most 100 rows), and at most
//! `--stats-concurrency` stats requests run at once; others wait up to 2 s, then get 503
//! `busy` with `Retry-After`. Identical requests waiting together share one read
//! (`http::coalesce`).

use askama::Template;
use axum::Json;
use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{ConnectInfo, Form, Query, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use tally_wire::{ErrorBody, Numbers};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use std::net::SocketAddr;

use super::auth::COOKIE;
use super::ui::html;
use super::{ApiError, AppState, SiteSegment};
use crate::core::badge::group;
use crate::core::chart::{DayPoint, daily_chart};
use crate::core::counts::combine;
use crate::core::filtered::{FilteredCounts, Reason};
use crate::core::range::DayRange;
use crate::core::site::Site;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/dashboard/{site}", get(page))
        .route("/favicon.ico", get(favicon))
        .route("/dashboard/{site}/login", post(login))
        .route("/dashboard/{site}/logout", post(logout))
}

pub fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(series))
        .routes(routes!(top))
        .routes(routes!(events))
        .routes(routes!(filtered))
}

/// Most custom event names listed (ranked in the database).
const EVENTS_LIMIT: u32 = 50;

/// Range selection shared by the page and the JSON.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct RangeQuery {
    /// A named range ending today in the site's time zone (default `30d`).
    #[param(schema_with = range_names)]
    range: Option<String>,
    /// First day (`YYYY-MM-DD`) of an explicit range, which replaces `range`: give both `from`
    /// and `to`, or neither. A range spans at most 366 days.
    #[param(value_type = Option<String>, format = Date, example = "2026-05-01")]
    from: Option<String>,
    /// Last day (`YYYY-MM-DD`, inclusive) of an explicit range.
    #[param(value_type = Option<String>, format = Date, example = "2026-05-31")]
    to: Option<String>,
}

/// The length of the top lists (the page and `top`).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct LimitQuery {
    /// Rows of each list, 1 to 100 (default 10).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<u32>,
}

impl LimitQuery {
    fn limit(&self) -> Result<u32, ApiError> {
        match self.limit {
            None => Ok(10),
            Some(n @ 1..=100) => Ok(n),
            Some(_) => Err(ApiError::bad("invalid_limit", "limit must be 1 to 100")),
        }
    }
}

/// The document of `range`: the names of [`RANGES`].
fn range_names() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(RANGES.iter().map(|(key, _)| *key)))
        .description(Some(
            "A named range ending today in the site's time zone (default `30d`).",
        ))
        .build()
}

const RANGES: [(&str, &str); 5] = [
    ("today", "Today"),
    ("7d", "7 days"),
    ("30d", "30 days"),
    ("90d", "90 days"),
    ("365d", "365 days"),
];
const DEFAULT_RANGE: &str = "30d";

impl RangeQuery {
    fn resolve(&self, state: &AppState, site: &Site) -> Result<(DayRange, String), ApiError> {
        let bad = |e: crate::core::range::RangeError| ApiError::bad("invalid_range", e.to_string());
        match (&self.from, &self.to) {
            (Some(from), Some(to)) => Ok((
                DayRange::explicit(from, to).map_err(bad)?,
                format!("{from} – {to}"),
            )),
            (None, None) => {
                let name = self.range.as_deref().unwrap_or(DEFAULT_RANGE);
                let range = DayRange::named(name, &site.zone, state.clock.now()).map_err(bad)?;
                Ok((range, name.to_owned()))
            }
            _ => Err(ApiError::bad(
                "invalid_range",
                "give both from and to, or neither",
            )),
        }
    }
}

/// The site, if the caller may see its stats, and whether the caller is the admin.
pub(super) async fn authorised(
    state: &AppState,
    raw: &str,
    peer: SocketAddr,
    headers: &HeaderMap,
) -> Result<(Site, bool), ApiError> {
    let id = super::site_id(raw)?;
    let site = site_of(state, &id).await?;
    if let Some(token) =
        super::auth::bearer(headers).filter(|t| t.starts_with(crate::collect::shares::TOKEN_PREFIX))
    {
        super::share_access::api_access(state, token, &site.id, peer, headers).await?;
        return Ok(((*site).clone(), false));
    }
    let admin = state.is_admin(peer, headers).await;
    if site.public {
        // A throttled guesser still sees what is public.
        return Ok(((*site).clone(), admin.unwrap_or(false)));
    }
    match admin? {
        true => Ok(((*site).clone(), true)),
        false => Err(ApiError::Unauthorized),
    }
}

/// A configured site, or 404.
pub(super) async fn site_of(
    state: &AppState,
    id: &crate::core::ids::SiteId,
) -> Result<std::sync::Arc<Site>, ApiError> {
    state.collect.sites.get(id).await.map_err(|e| match e {
        crate::collect::sites::SiteError::Unknown(_) => ApiError::NotFound(format!("no site {id}")),
        other => other.into(),
    })
}

/// The JSON endpoints' common start: the query, the site (if the caller may see it), the range.
async fn scope(
    state: &AppState,
    raw: &str,
    peer: SocketAddr,
    headers: &HeaderMap,
    query: Result<Query<RangeQuery>, QueryRejection>,
) -> Result<(Site, DayRange, super::StatsSlot), ApiError> {
    let q = super::query(query)?;
    let (site, _) = authorised(state, raw, peer, headers).await?;
    let (range, _) = q.resolve(state, &site)?;
    let slot = state.stats_slot(state.client_net(peer, headers)).await?;
    Ok((site, range, slot))
}

async fn daily_points(
    state: &AppState,
    site: &Site,
    range: DayRange,
) -> Result<Vec<DayPoint>, ApiError> {
    let rows = state.store.series(&site.id, range.from, range.to).await?;
    let mut rows = rows.into_iter().peekable();
    Ok(range
        .days()
        .into_iter()
        .map(|day| {
            let n = match rows.peek() {
                Some(r) if r.day == day => {
                    rows.next().map(|r| combine(r.numbers)).unwrap_or_default()
                }
                _ => Numbers::default(),
            };
            DayPoint {
                day,
                views: n.views,
                visitors: n.visitors,
            }
        })
        .collect())
}

#[derive(Serialize, utoipa::ToSchema)]
struct SeriesDay {
    day: String,
    views: u64,
    visitors: u64,
}

#[derive(Serialize, utoipa::ToSchema)]
struct SeriesResponse {
    site: String,
    timezone: String,
    from: String,
    to: String,
    days: Vec<SeriesDay>,
    /// Views summed; visitors distinct over the whole range (exact).
    total: Numbers,
}

/// The `{site}` of the stats paths (read as [`SiteSegment`]; only its document is derived).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct SitePath {
    /// The site id.
    #[param(pattern = "^[a-z0-9][a-z0-9._-]{0,63}$", example = "blog")]
    site: String,
}

/// The error answers of the stats endpoints.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // Only the document is derived: the answers are `ApiError`s.
enum StatsErrors {
    /// `invalid_query` (a parameter of the wrong type), `invalid_site`, `invalid_range`,
    /// `invalid_limit` (`top`).
    #[response(status = 400)]
    BadRequest(ErrorBody),
    /// `unauthorized`: a private site, and neither the admin token, a session nor a shared
    /// link's token (`Bearer tsh_…`); `share_revoked`, `share_expired`,
    /// `share_password_required`: a shared link that does not open.
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    /// `share_other_site`: a shared link's token for another site.
    #[response(status = 403)]
    Forbidden(ErrorBody),
    /// `not_found`: no such site.
    #[response(status = 404)]
    NotFound(ErrorBody),
    /// `rate_limited`: too many wrong tokens from this network.
    #[response(status = 429, headers(("Retry-After" = u64, description = "Seconds to wait.")))]
    RateLimited(ErrorBody),
    /// `busy` (every stats slot taken for 2 s), `storage_unavailable`.
    #[response(status = 503, headers(("Retry-After" = u64, description = "Seconds to wait.")))]
    Unavailable(ErrorBody),
}

/// Views and visitors per day of a range.
///
/// With the range's total: views summed, visitors distinct over the whole range (exact).
#[utoipa::path(
    get,
    path = "/api/v1/sites/{site}/series",
    operation_id = "series",
    tag = "stats",
    params(SitePath, RangeQuery),
    security((), ("admin_token" = []), ("admin_session" = [])),
    responses(
        (status = 200, description = "Every day of the range, in order.", body = SeriesResponse),
        StatsErrors,
    )
)]
async fn series(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    SiteSegment(raw): SiteSegment,
    headers: HeaderMap,
    query: Result<Query<RangeQuery>, QueryRejection>,
) -> Result<Json<SeriesResponse>, ApiError> {
    let (site, range, _slot) = scope(&state, &raw, peer, &headers, query).await?;
    let points = daily_points(&state, &site, range).await?;
    let total = combine(
        state
            .store
            .range_totals(&site.id, range.from, range.to)
            .await?,
    );
    Ok(Json(SeriesResponse {
        site: site.id.to_string(),
        timezone: site.zone.name().to_owned(),
        from: range.from.to_string(),
        to: range.to.to_string(),
        days: points
            .into_iter()
            .map(|p| SeriesDay {
                day: p.day.to_string(),
                views: p.views,
                visitors: p.visitors,
            })
            .collect(),
        total,
    }))
}

#[derive(Serialize, utoipa::ToSchema)]
struct TopPageJson {
    page: String,
    views: u64,
    visitors: u64,
}

#[derive(Serialize, utoipa::ToSchema)]
struct TopReferrerJson {
    host: String,
    views: u64,
}

#[derive(Serialize, utoipa::ToSchema)]
struct TopResponse {
    site: String,
    from: String,
    to: String,
    pages: Vec<TopPageJson>,
    referrers: Vec<TopReferrerJson>,
}

async fn top_lists(
    state: &AppState,
    site: &Site,
    range: DayRange,
    limit: u32,
) -> Result<(Vec<TopPageJson>, Vec<TopReferrerJson>), ApiError> {
    let pages = state
        .store
        .top_pages(&site.id, range.from, range.to, limit)
        .await?;
    let referrers = state
        .store
        .top_referrers(&site.id, range.from, range.to, limit)
        .await?;
    Ok((
        pages
            .into_iter()
            .map(|p| {
                let n = combine(p.numbers);
                TopPageJson {
                    page: p.page,
                    views: n.views,
                    visitors: n.visitors,
                }
            })
            .collect(),
        referrers
            .into_iter()
            .map(|r| TopReferrerJson {
                host: r.host,
                views: r.views,
            })
            .collect(),
    ))
}

/// The most viewed pages and the top referrer hosts of a range.
#[utoipa::path(
    get,
    path = "/api/v1/sites/{site}/top",
    operation_id = "top",
    tag = "stats",
    params(SitePath, RangeQuery, LimitQuery),
    security((), ("admin_token" = []), ("admin_session" = [])),
    responses(
        (status = 200, description = "The lists, longest first.", body = TopResponse),
        StatsErrors,
    )
)]
async fn top(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    SiteSegment(raw): SiteSegment,
    headers: HeaderMap,
    query: Result<Query<RangeQuery>, QueryRejection>,
    limit: Result<Query<LimitQuery>, QueryRejection>,
) -> Result<Json<TopResponse>, ApiError> {
    let limit = super::query(limit)?;
    let (site, range, _slot) = scope(&state, &raw, peer, &headers, query).await?;
    let (pages, referrers) = top_lists(&state, &site, range, limit.limit()?).await?;
    Ok(Json(TopResponse {
        site: site.id.to_string(),
        from: range.from.to_string(),
        to: range.to.to_string(),
        pages,
        referrers,
    }))
}

#[derive(Serialize, utoipa::ToSchema)]
struct EventDayJson {
    day: String,
    count: u64,
}

#[derive(Serialize, utoipa::ToSchema)]
struct EventJson {
    name: String,
    count: u64,
    days: Vec<EventDayJson>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct EventsResponse {
    site: String,
    from: String,
    to: String,
    events: Vec<EventJson>,
}

async fn event_list(
    state: &AppState,
    site: &Site,
    range: DayRange,
) -> Result<Vec<EventJson>, ApiError> {
    Ok(state
        .store
        .top_events(&site.id, range.from, range.to, EVENTS_LIMIT)
        .await?
        .into_iter()
        .map(|e| EventJson {
            name: e.name,
            count: e.count,
            days: e
                .days
                .into_iter()
                .map(|(day, count)| EventDayJson {
                    day: day.to_string(),
                    count,
                })
                .collect(),
        })
        .collect())
}

/// Custom events of a range.
///
/// The 50 names with most events in the range, each with its days.
#[utoipa::path(
    get,
    path = "/api/v1/sites/{site}/events",
    operation_id = "site_events",
    tag = "stats",
    params(SitePath, RangeQuery),
    security((), ("admin_token" = []), ("admin_session" = [])),
    responses(
        (status = 200, description = "The names, most events first.", body = EventsResponse),
        StatsErrors,
    )
)]
async fn events(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    SiteSegment(raw): SiteSegment,
    headers: HeaderMap,
    query: Result<Query<RangeQuery>, QueryRejection>,
) -> Result<Json<EventsResponse>, ApiError> {
    let (site, range, _slot) = scope(&state, &raw, peer, &headers, query).await?;
    let events = event_list(&state, &site, range).await?;
    Ok(Json(EventsResponse {
        site: site.id.to_string(),
        from: range.from.to_string(),
        to: range.to.to_string(),
        events,
    }))
}

/// Views of a site not counted over a range.
#[derive(Serialize, utoipa::ToSchema)]
struct FilteredResponse {
    site: String,
    /// First local day of the range (`YYYY-MM-DD`).
    from: String,
    /// Last local day of the range.
    to: String,
    /// Views not counted, by reason.
    filtered: FilteredCounts,
    /// Every reason summed.
    total: u64,
}

/// Views not counted over a range.
///
/// By reason: bots, no user agent, repeats of a badge or pixel, over the address allowance.
#[utoipa::path(
    get,
    path = "/api/v1/sites/{site}/filtered",
    operation_id = "site_filtered",
    tag = "stats",
    params(SitePath, RangeQuery),
    security((), ("admin_token" = []), ("admin_session" = [])),
    responses(
        (status = 200, description = "The views not counted, by reason.", body = FilteredResponse),
        StatsErrors,
    )
)]
async fn filtered(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    SiteSegment(raw): SiteSegment,
    headers: HeaderMap,
    query: Result<Query<RangeQuery>, QueryRejection>,
) -> Result<Json<FilteredResponse>, ApiError> {
    let (site, range, _slot) = scope(&state, &raw, peer, &headers, query).await?;
    let filtered = state
        .filtered_counts(&site.id, range.from, range.to)
        .await?;
    Ok(Json(FilteredResponse {
        site: site.id.to_string(),
        from: range.from.to_string(),
        to: range.to.to_string(),
        total: filtered.total(),
        filtered,
    }))
}

/// One reason in the dashboard's "Not counted" panel.
struct FilteredRowView {
    reason: &'static str,
    label: &'static str,
    help: &'static str,
    count: String,
    share: u64,
}

fn filtered_rows(counts: &FilteredCounts) -> Vec<FilteredRowView> {
    let top = Reason::ALL
        .into_iter()
        .map(|r| counts.get(r))
        .max()
        .unwrap_or(0);
    Reason::ALL
        .into_iter()
        .map(|r| {
            let (label, help) = match r {
                Reason::Bot => ("Bots", "The user agent is on the bot list"),
                Reason::EmptyUserAgent => ("No user agent", "Requests without a User-Agent"),
                Reason::Suppressed => (
                    "Badge/pixel repeats",
                    "The same reader fetched a badge or pixel again within the repeat interval",
                ),
                Reason::RateLimited => (
                    "Over the rate limit",
                    "Over the sender's address allowance (hits answered 429 may be retried and counted later)",
                ),
                Reason::OriginNotAllowed => (
                    "Refused origin",
                    "Sent from a page whose origin is not one of the site's allowed origins (the log names it; add it with tally site add --origin)",
                ),
            };
            FilteredRowView {
                reason: r.name(),
                label,
                help,
                count: group(counts.get(r)),
                share: share(counts.get(r), top),
            }
        })
        .collect()
}

struct Card {
    label: &'static str,
    views: String,
    visitors: String,
}

struct RangeLink {
    key: &'static str,
    label: &'static str,
    selected: bool,
}

#[derive(Template)]
#[template(path = "dashboard.html")]
struct DashboardPage {
    site: String,
    timezone: String,
    range_label: String,
    ranges: Vec<RangeLink>,
    /// The range's first and last day, for the custom range form.
    from: String,
    to: String,
    /// The visits part: cards, chart, panels, filters.
    v: super::dashboard_view::Visits,
    chart: String,
    /// Live visitors and events (never filtered).
    live: Card,
    /// Views not counted, by reason.
    filtered: Vec<FilteredRowView>,
    filtered_total: u64,
    public: bool,
    live_window: u32,
    /// The viewer is the admin (a sign-out button is shown).
    signed_in: bool,
    /// Opened through a shared link: read-only, no admin controls.
    shared: bool,
    /// Other sites, for the site switcher of a signed-in admin.
    sites: Vec<String>,
    /// The "Share" section, for a signed-in admin.
    admin: Option<super::share_access::AdminShares>,
    /// The site's own page with `#tally-ignore` (the snippet then stops counting this
    /// browser), when the site names an origin.
    ignore_url: Option<String>,
    /// The location database's attribution, when it asks for one (DB-IP's lite files).
    geo_credit: bool,
}

/// The favicon (an SVG; browsers take it from `/favicon.ico` by its content type).
const FAVICON_SVG: &str = include_str!("../../../templates/favicon.svg");

async fn favicon() -> Response {
    (
        [
            (header::CONTENT_TYPE, "image/svg+xml"),
            (header::CACHE_CONTROL, "public, max-age=86400"),
            (header::CONTENT_SECURITY_POLICY, super::badge::SVG_CSP),
        ],
        FAVICON_SVG,
    )
        .into_response()
}

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    site: String,
    failed: bool,
    /// Seconds a throttled network must wait.
    retry_after: Option<u64>,
}

/// The login page: 401, or 429 with `Retry-After` for a throttled network.
fn login_page(site: String, failed: bool, retry_after: Option<u64>) -> Response {
    let status = match retry_after {
        Some(_) => StatusCode::TOO_MANY_REQUESTS,
        None => StatusCode::UNAUTHORIZED,
    };
    let mut r = html(
        status,
        LoginPage {
            site,
            failed,
            retry_after,
        }
        .render(),
    );
    if let Some(wait) = retry_after {
        with_retry_after(&mut r, wait);
    }
    r
}

/// Add `Retry-After: secs` to an answer.
pub(super) fn with_retry_after(r: &mut Response, secs: u64) {
    if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
}

fn share(n: u64, top: u64) -> u64 {
    if top == 0 { 0 } else { (n * 100).div_ceil(top) }
}

async fn page(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    SiteSegment(raw): SiteSegment,
    headers: HeaderMap,
    query: Result<Query<RangeQuery>, QueryRejection>,
    RawQuery(raw_query): RawQuery,
) -> Result<Response, ApiError> {
    let q = super::query(query)?;
    let (site, signed_in) = match authorised(&state, &raw, peer, &headers).await {
        Ok(found) => found,
        Err(ApiError::Unauthorized) => return Ok(login_page(raw, false, None)),
        Err(ApiError::RateLimited { retry_after }) => {
            return Ok(login_page(raw, false, Some(retry_after)));
        }
        Err(e) => return Err(e),
    };
    let view = match signed_in {
        true => View::Admin(super::share_access::admin_shares(&state, &site, &headers).await?),
        false => View::Reader,
    };
    render(
        &state,
        &site,
        &q,
        raw_query.as_deref(),
        peer,
        &headers,
        view,
    )
    .await
}

/// Who looks at a dashboard.
pub(super) enum View {
    /// Anyone allowed to read the site (public site, or the admin by bearer token).
    Reader,
    /// The signed-in admin: sign-out, and the share section when the session has forms.
    Admin(Option<super::share_access::AdminShares>),
    /// Someone holding a shared link: read-only.
    Shared,
}

/// The dashboard of `site` for the range and filters asked (`format=csv`: the same view as
/// CSV).
#[allow(clippy::too_many_arguments)]
pub(super) async fn render(
    state: &AppState,
    site: &Site,
    q: &RangeQuery,
    raw_query: Option<&str>,
    peer: SocketAddr,
    headers: &HeaderMap,
    view: View,
) -> Result<Response, ApiError> {
    let (range, range_name) = q.resolve(state, site)?;
    let filters = super::dashboard_view::parse_filters(raw_query)?;
    let _slot = state.stats_slot(state.client_net(peer, headers)).await?;
    let now = state.clock.now();
    let range_pairs: Vec<(&'static str, String)> = match (&q.from, &q.to) {
        (Some(from), Some(to)) => vec![("from", from.clone()), ("to", to.clone())],
        _ => vec![("range", range_name.clone())],
    };
    let mut visits =
        super::dashboard_view::visits(state, site, range, &range_pairs, &filters).await?;
    // Top pages: visitors on each page in the live window too.
    if let Some(top) = visits
        .sections
        .iter_mut()
        .flat_map(|s| s.panels.iter_mut())
        .find(|p| p.id == "top-pages")
    {
        top.heads.push("Now");
        for row in &mut top.rows {
            let live = match crate::core::ids::PagePath::parse(&row.value) {
                Ok(page) => {
                    super::counts::live_of_page(state, &site.id, Some(&page), now.as_millisecond())
                        .await
                        .visitors
                }
                Err(_) => 0,
            };
            row.cells.push(live.to_string());
        }
    }
    let csv = url::form_urlencoded::parse(raw_query.unwrap_or("").as_bytes())
        .any(|(k, v)| k == "format" && v == "csv");
    if csv {
        let body = super::dashboard_view::csv(site, range, &visits);
        return Ok((
            [
                (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"tally-dashboard.csv\"",
                ),
            ],
            body,
        )
            .into_response());
    }
    let live = super::counts::live_of(state, &site.id, now.as_millisecond()).await;
    let not_counted = state
        .filtered_counts(&site.id, range.from, range.to)
        .await?;
    let sites = match view {
        View::Admin(_) => state
            .store
            .list_sites()
            .await?
            .into_iter()
            .map(|s| s.id.to_string())
            .filter(|id| id != site.id.as_str())
            .collect(),
        _ => Vec::new(),
    };
    let body = DashboardPage {
        site: site.id.to_string(),
        timezone: site.zone.name().to_owned(),
        range_label: RANGES
            .iter()
            .find(|(k, _)| *k == range_name)
            .map(|(_, l)| (*l).to_owned())
            .unwrap_or(range_name.clone()),
        ranges: RANGES
            .iter()
            .map(|&(key, label)| RangeLink {
                key,
                label,
                selected: key == range_name,
            })
            .collect(),
        from: range.from.to_string(),
        to: range.to.to_string(),
        chart: daily_chart(&visits.points),
        v: visits,
        live: Card {
            label: "Live now",
            views: group(live.events),
            visitors: group(live.visitors),
        },
        filtered: filtered_rows(&not_counted),
        filtered_total: not_counted.total(),
        public: site.public,
        live_window: state.options.live_window_secs,
        signed_in: matches!(view, View::Admin(_)),
        shared: matches!(view, View::Shared),
        sites,
        admin: match view {
            View::Admin(admin) => admin,
            _ => None,
        },
        ignore_url: site
            .origins
            .iter()
            .find(|o| o.starts_with("https://") || o.starts_with("http://"))
            .map(|o| format!("{}/#tally-ignore", o.trim_end_matches('/'))),
        geo_credit: state.collect.geo_credit(),
    }
    .render();
    Ok(html(StatusCode::OK, body))
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

/// The session cookie with `value` for `max_age` seconds (0 clears it).
fn session_cookie(value: &str, max_age: i64) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age={max_age}"
    ))
    .ok()
}

pub(super) fn see_other(to: &str) -> Response {
    let mut r = Redirect::to(to).into_response();
    *r.status_mut() = StatusCode::SEE_OTHER;
    r
}

async fn login(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    SiteSegment(raw): SiteSegment,
    headers: HeaderMap,
    form: Result<Form<LoginForm>, axum::extract::rejection::FormRejection>,
) -> Result<Response, ApiError> {
    let Form(form) = form.map_err(|e| ApiError::bad("invalid_form", e.body_text()))?;
    let id = super::site_id(&raw)?;
    let net = state.client_net(peer, &headers);
    match state.auth.login(&form.token, net, state.clock.now()).await {
        Err(throttled) => Ok(login_page(raw, false, Some(throttled.retry_after))),
        Ok(None) => Ok(login_page(raw, true, None)),
        Ok(Some(value)) => {
            let mut r = see_other(&format!("/dashboard/{id}"));
            if let Some(v) = session_cookie(&value, state.auth.lifetime_secs()) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            Ok(r)
        }
    }
}

/// End the session (and every older one, on every collector of the database), clear the
/// cookie, and go back to the site's dashboard. When the store cannot keep the logout, this
/// collector has ended the sessions but the others have not: a 503 says so.
async fn logout(
    State(state): State<AppState>,
    SiteSegment(raw): SiteSegment,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = super::site_id(&raw)?;
    let now_ms = state.clock.now().as_millisecond();
    if state.auth.logout(&headers, now_ms) {
        let stored = state.store.end_sessions(now_ms).await?;
        state.auth.learn_logout(stored);
    }
    let mut r = see_other(&format!("/dashboard/{id}"));
    if let Some(v) = session_cookie("", 0) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(r)
}
