//! `GET /api/v1/counts?site=&page=`: the numbers for in-page counters (open to any origin the
//! site allows; these are the numbers a page shows its readers).

use axum::Json;
use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::routing::get;
use serde::Deserialize;
use tally_wire::{Counts, Live};

use super::{ApiError, AppState, origin};
use crate::core::counts::present;
use crate::core::ids::{PagePath, SiteId};
use crate::store::Site;

pub fn router() -> Router<AppState> {
    Router::new().route("/api/v1/counts", get(counts).options(super::preflight))
}

#[derive(Debug, Deserialize)]
struct CountsQuery {
    site: String,
    page: Option<String>,
}

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
    let site = state.sites.for_origin(&site_id, origin(&headers)).await?;
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
    let n = state.live.read(site, page, now_ms).await;
    Live {
        events: n.events,
        visitors: n.visitors,
    }
}
