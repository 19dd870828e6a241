//! Operations endpoints: `/healthz` (the process answers), `/readyz` (the storage probe passes
//! — the database file is the one opened, the disk is above its floor, a read works — and the
//! queue has room; the body says why not), `/metrics` (the classic Prometheus text format
//! 0.0.4, or OpenMetrics 1.0 when the `Accept` header names `application/openmetrics-text`).
//!
//! `/metrics` is open unless `--metrics-token` is set; then it needs `Authorization: Bearer
//! <metrics token>` (401 otherwise; wrong tokens are throttled guesses, see `edge::http::auth`).

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tally_wire::ErrorBody;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{ApiError, AppState};
use crate::metrics::{CLASSIC_CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE};
use crate::store::StoreError;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
}

/// Liveness: the process answers.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "operations",
    responses((status = 200, description = "`ok`.", content_type = "text/plain", body = String, example = "ok\n"))
)]
async fn healthz() -> &'static str {
    "ok\n"
}

/// Readiness.
///
/// Ready when the storage probe passes (the database file is the one opened, the disk is
/// above its floor, a read works) and the ingest queue has room.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "operations",
    responses(
        (status = 200, description = "`ready`.", content_type = "text/plain", body = String, example = "ready\n"),
        (status = 503, description = "`not ready: …` and why.", content_type = "text/plain", body = String),
    )
)]
async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let room = state.collect.ingest.depth() < state.options.ingest_capacity;
    let probe = state.store.probe().await;
    state.metrics.storage_up.set(i64::from(probe.is_ok()));
    // Redis is never a reason to refuse hits: only a detail of "ready".
    let redis_down = match &state.redis {
        Some(link) => !link.ping().await,
        None => false,
    };
    match (probe, room) {
        (Ok(()), true) if redis_down => (
            StatusCode::OK,
            "ready (redis unavailable: live numbers, limits, repeat gate and site cache are this collector's own until it answers)\n"
                .to_owned(),
        ),
        (Ok(()), true) => (StatusCode::OK, "ready\n".to_owned()),
        (Ok(()), false) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the ingest queue is full\n".to_owned(),
        ),
        (Err(StoreError::DiskFull { free, floor }), _) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: free disk space {free} B is below the floor of {floor} B\n"),
        ),
        // The store's words name the file and say what to do.
        (Err(StoreError::FileLost(why)), _) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
        (Err(e), _) => {
            tracing::warn!(error = %e, "readiness probe failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: storage is unavailable\n".to_owned(),
            )
        }
    }
}

/// Prometheus metrics.
///
/// The classic text format 0.0.4, or OpenMetrics 1.0 when `Accept` names
/// `application/openmetrics-text`. Open unless `--metrics-token` is set.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "operations",
    security((), ("metrics_token" = [])),
    responses(
        (status = 200, description = "The metrics.",
            content(
                (String = "text/plain"),
                (String = "application/openmetrics-text"),
            )),
        (status = 401, description = "`unauthorized`: a metrics token is set and was not given.",
            body = ErrorBody, headers(("WWW-Authenticate" = String, description = "`Bearer realm=\"metrics\"`."))),
        (status = 429, description = "`rate_limited`: too many wrong tokens from this network.",
            body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
async fn metrics(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let net = state.client_net(peer, &headers);
    let allowed = state
        .auth
        .may_read_metrics(&headers, net, state.clock.now())
        .await
        .map_err(|t| ApiError::RateLimited {
            retry_after: t.retry_after,
        })?;
    if !allowed {
        let mut r = ApiError::Unauthorized.into_response();
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"metrics\""),
        );
        return Ok(r);
    }
    state
        .metrics
        .queue_depth
        .set(state.collect.ingest.depth() as i64);
    if let Some(link) = &state.redis {
        let health = &link.health;
        state
            .metrics
            .redis_fallback_active
            .set(i64::from(!health.is_up()));
        let (seen, counted) = (health.fallbacks(), state.metrics.redis_fallbacks.get());
        if seen > counted {
            state.metrics.redis_fallbacks.inc_by(seen - counted);
        }
    }
    let (segments, states, dictionaries) = state.analytics.kept_bytes();
    let store = state.store.kept_bytes();
    // In the order of READ_CACHES.
    let kept = [
        segments,
        states,
        dictionaries,
        store.day_sets,
        store.day_pages,
        store.visitor_numbers,
    ];
    for (cache, bytes) in crate::metrics::READ_CACHES.into_iter().zip(kept) {
        state
            .metrics
            .read_cache_bytes
            .get_or_create(&crate::metrics::CacheLabel { cache })
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
    if let Some(free) = state.store.free_bytes() {
        state
            .metrics
            .disk_free_bytes
            .set(i64::try_from(free).unwrap_or(i64::MAX));
    }
    Ok(if wants_openmetrics(&headers) {
        (
            [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
            state.metrics.render_openmetrics(),
        )
            .into_response()
    } else {
        (
            [(header::CONTENT_TYPE, CLASSIC_CONTENT_TYPE)],
            state.metrics.render_classic(),
        )
            .into_response()
    })
}

/// Whether `Accept` lists OpenMetrics with a non-zero weight (Prometheus 2.x sends
/// `application/openmetrics-text;version=1.0.0;q=0.5,…,text/plain;version=0.0.4;q=0.4,*/*;q=0.1`
/// and parses either; we answer its first choice).
fn wants_openmetrics(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let is_open = parts
                .next()
                .is_some_and(|t| t.eq_ignore_ascii_case("application/openmetrics-text"));
            let q_zero = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            is_open && !q_zero
        })
}
