//! Operations endpoints: `/healthz` (the process answers), `/readyz` (the storage probe passes
//! — the database file is the one opened, the disk is above its floor, a read works — and the
//! queue has room; the body says why not), `/metrics` (Prometheus text format).
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
use crate::store::StoreError;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let room = state.ingest.depth() < state.config.ingest.capacity;
    let probe = state.store.probe().await;
    state.metrics.storage_up.set(i64::from(probe.is_ok()));
    match (probe, room) {
        (Ok(()), true) => (StatusCode::OK, "ready\n".to_owned()),
        (Ok(()), false) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the ingest queue is full\n".to_owned(),
        ),
        (Err(StoreError::DiskFull { free, floor }), _) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: free disk space {free} B is below the floor of {floor} B\n"),
        ),
        (Err(StoreError::FileLost(_)), _) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the database file was moved, replaced or deleted; restore it and restart\n"
                .to_owned(),
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
    if let Some(free) = state.store.free_bytes() {
        state
            .metrics
            .disk_free_bytes
            .set(i64::try_from(free).unwrap_or(i64::MAX));
    }
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response())
}
