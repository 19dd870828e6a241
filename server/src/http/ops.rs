//! Operations endpoints: `/healthz` (the process answers), `/readyz` (the store answers and
//! the queue has room), `/metrics` (Prometheus text format).
//!
//! `/metrics` is open unless `--metrics-token` is set; then it needs `Authorization: Bearer
//! <metrics token>` (401 otherwise; wrong tokens are throttled guesses, see `http::auth`).

use std::net::SocketAddr;

use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::{ApiError, AppState};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let store_ok = state.store.list_sites().await.is_ok();
    let room = state.ingest.depth() < state.config.ingest.capacity;
    if store_ok && room {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn metrics(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let net = state.client_net(peer, &headers);
    let allowed = state
        .auth
        .may_read_metrics(&headers, net, state.clock.now().as_microsecond())
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
    state.metrics.queue_depth.set(state.ingest.depth() as i64);
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response())
}
