//! `GET /api/v1/counts?site=&page=`: the numbers for in-page counters (open to any origin the
//! site allows; these are the numbers a page shows its readers).

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use tally_wire::{Counts, ErrorBody, Live};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{ApiError, AppState, origin};
use crate::core::counts::present;
use crate::core::ids::{PagePath, SiteId};
use crate::core::site::Site;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(counts, counts_preflight))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct CountsQuery {
    /// The site id.
    #[param(pattern = "^[a-z0-9][a-z0-9._-]{0,63}$", example = "blog")]
    site: String,
    /// The page's path (starting with `/`); the site root `/` when absent or empty.
    #[param(pattern = "^/([^/]|$)", example = "/posts/hello")]
    page: Option<String>,
}

/// CORS preflight of `GET /api/v1/counts`.
#[utoipa::path(
    options,
    path = "/api/v1/counts",
    operation_id = "counts_preflight",
    tag = "counts",
    responses((status = 204, description = "Preflight answered; the `Origin` is echoed."))
)]
async fn counts_preflight() -> Response {
    super::preflight().await
}

/// The numbers of a site and one of its pages.
///
/// All-time and today's views and visitors, and the live window's events and visitors. Open
/// to anyone (also for private sites: these are the numbers a page shows its readers), from
/// any origin the site allows.
#[utoipa::path(
    get,
    path = "/api/v1/counts",
    operation_id = "counts",
    tag = "counts",
    params(CountsQuery, ("Origin" = Option<String>, Header, description = "The sending page's origin, when a browser sends one: it must be one of the site's allowed origins (403 `origin_not_allowed`).", example = "https://blog.example")),
    responses(
        (status = 200, description = "The counts now.", body = Counts),
        (status = 400, description = "`invalid_query` (no `site`), `invalid_site`, `invalid_page`.", body = ErrorBody),
        (status = 403, description = "`unknown_site`, or `origin_not_allowed` (an `Origin` the site does not allow).", body = ErrorBody),
        (status = 503, description = "`storage_unavailable`.", body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
async fn counts(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<CountsQuery>, QueryRejection>,
) -> Result<Json<Counts>, ApiError> {
    let q = super::query(query)?;
    let site_id = super::site_id(&q.site)?;
    let page = match q.page.as_deref() {
        None | Some("") => PagePath::root(),
        Some(p) => PagePath::parse(p)
            .map_err(|_| ApiError::bad("invalid_page", "page must be a path starting with /"))?,
    };
    let site = state
        .collect
        .sites
        .for_origin(&site_id, origin(&headers))
        .await?;
    Ok(Json(counts_for(&state, &site, &page).await?))
}

/// The counts of `site` and `page` now.
pub async fn counts_for(
    state: &AppState,
    site: &Site,
    page: &PagePath,
) -> Result<Counts, ApiError> {
    let now = state.clock.now();
    let raw = state
        .store
        .counts(&site.id, page, site.zone.day_of(now))
        .await?;
    Ok(present(
        &raw,
        live_of(state, &site.id, now.as_millisecond()).await,
    ))
}

/// The live numbers of a whole site at `now_ms`.
pub async fn live_of(state: &AppState, site: &SiteId, now_ms: i64) -> Live {
    live_of_page(state, site, None, now_ms).await
}

/// The live numbers of a site (`page` = `None`) or one of its pages at `now_ms`.
pub async fn live_of_page(
    state: &AppState,
    site: &SiteId,
    page: Option<&PagePath>,
    now_ms: i64,
) -> Live {
    let n = state.collect.live.read(site, page, now_ms).await;
    Live {
        events: n.events,
        visitors: n.visitors,
    }
}
