//! Static snippet files (placeholder until the client lands).

use axum::Router;

pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
}
