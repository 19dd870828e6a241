//! Operations endpoints: `/healthz` (the process answers), `/readyz` (the store answers and
//! the queue has room), `/metrics` (Prometheus text format).

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use super::AppState;

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

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    state.metrics.queue_depth.set(state.ingest.depth() as i64);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
}
