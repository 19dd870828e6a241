//! The HTTP edge: parses requests into core types, calls the core and the ingest queue, maps
//! errors to answers. No counting logic lives here.
//!
//! Contract: every route module owns `fn router()`; [`app`] merges them and adds the shared
//! layers — CORS for `/api/*` (origin echoed, `Vary: Origin`, credentials allowed, preflight
//! answered), `Cache-Control: no-store` on every API answer, JSON 404/405 answers, and
//! `X-Content-Type-Options: nosniff` on every answer (HTML pages add their own policy, see
//! [`ui`]).
//!
//! The client's address is the peer's, or behind a trusted proxy the rightmost untrusted hop of
//! the configured forwarding header ([`crate::core::forwarded`]).
//!
//! gzip/brotli compression of text answers (`compress`).
//!
//! The public API is documented by an OpenAPI 3.1 document generated from the handlers and
//! their types (`openapi`, served at `/api/v1/openapi.json`). Invariant: every route is
//! either documented (`documented()`) or a page (`pages()`: HTML, forms, static files), and
//! no page is under `/api/`, `/badge/` or an operations path; a unit test enforces it.
//!
//! [`AppState`] holds the counting pipeline ([`crate::collect::Collector`]), the store for the
//! read routes, the credentials and the edge's own bounds (stats and batch slots); handlers
//! extract, call and answer.

mod assets;
pub mod auth;
mod badge;
mod coalesce;
mod compress;
mod counts;
mod dashboard;
mod dashboard_view;
mod error;
mod headers;
mod hit;
mod openapi;
mod query_api;
mod share;
mod share_access;
pub use share::share_url;
mod ops;
mod ui;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use headers::{HeaderLayer, HeaderRule};
use tower_http::set_header::SetResponseHeaderLayer;

pub use error::ApiError;

use crate::collect::Collector;
use crate::core::clock::Clock;
use crate::core::filtered::FilteredCounts;
use crate::core::forwarded::{ProxyHeader, TrustedProxies};
use crate::core::ids::SiteId;
use crate::core::net::ClientNet;
use crate::metrics::Metrics;
use crate::state::redis::RedisLink;
use crate::store::Store;

/// How long a stats request waits for a free reader slot before 503.
const STATS_WAIT: Duration = Duration::from_secs(2);

/// What the edge needs to know of the settings of `tally serve`.
#[derive(Debug, Clone)]
pub struct EdgeOptions {
    /// Proxies whose forwarding header is believed (empty: the peer is the client).
    pub trusted_proxies: TrustedProxies,
    /// The header those proxies write.
    pub proxy_header: ProxyHeader,
    /// Stats requests (dashboard, series, top) served at once.
    pub stats_concurrency: usize,
    /// Batch bodies read and parsed at once.
    pub batch_concurrency: usize,
    /// The ingest queue's capacity (`/readyz` says "not ready" when it is full).
    pub ingest_capacity: usize,
    /// Seconds an event stays in the live window (shown on the dashboard).
    pub live_window_secs: u32,
    /// The public base URL new shared links are shown under (`--public-url`), if set.
    pub public_url: Option<String>,
    /// Bytes of sealed day segments and question states the analytics keep in memory,
    /// together (`--analytics-cache-mb`).
    pub analytics_cache_bytes: usize,
}

/// Everything a handler needs, behind one `Arc`: axum clones the state for every request, and
/// one reference count is cheaper than one per field (in a `perf` profile under the realistic
/// load, cloning and dropping the twenty handles took ~5 % of the samples; after, none).
#[derive(Clone)]
pub struct AppState(Arc<AppStateInner>);

impl std::ops::Deref for AppState {
    type Target = AppStateInner;

    fn deref(&self) -> &AppStateInner {
        &self.0
    }
}

/// The handles of [`AppState`].
pub struct AppStateInner {
    /// The counting pipeline: every counting route calls it.
    pub collect: Arc<Collector>,
    /// The store, for the read routes.
    pub store: Arc<dyn Store>,
    /// Visits, dimensions and filters over the store's day segments.
    pub analytics: Arc<crate::store::analytics::Analytics>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
    pub options: EdgeOptions,
    /// Admin and metrics credentials, sessions, and the throttle on guessing them.
    pub auth: Arc<auth::Auth>,
    /// Stats requests (dashboard, series, top) in flight at once.
    pub stats_slots: Arc<tokio::sync::Semaphore>,
    /// Each client network's share of the stats slots (half of them, at least one).
    stats_shares: Arc<crate::core::net::Shares>,
    /// Identical stats requests waiting together, answered by one read (`coalesce`).
    coalescer: Arc<coalesce::Coalescer>,
    /// Batch bodies being read and parsed at once.
    pub batch_slots: Arc<tokio::sync::Semaphore>,
    /// The Redis of the shared state (`--redis`), for its health in `/metrics` and `/readyz`.
    pub redis: Option<Arc<RedisLink>>,
}

impl AppState {
    /// The state of the routes around a collector.
    pub fn new(
        collect: Arc<Collector>,
        store: Arc<dyn Store>,
        auth: Arc<auth::Auth>,
        options: EdgeOptions,
        redis: Option<Arc<RedisLink>>,
    ) -> Self {
        Self(Arc::new(AppStateInner {
            clock: Arc::clone(&collect.clock),
            metrics: Arc::clone(&collect.metrics),
            stats_slots: Arc::new(tokio::sync::Semaphore::new(options.stats_concurrency)),
            stats_shares: crate::core::net::Shares::new(options.stats_concurrency.div_ceil(2)),
            coalescer: Arc::new(coalesce::Coalescer::new(
                collect.metrics.stats_coalesced.clone(),
            )),
            batch_slots: Arc::new(tokio::sync::Semaphore::new(options.batch_concurrency)),
            analytics: Arc::new(crate::store::analytics::Analytics::new(
                store.clone(),
                options.analytics_cache_bytes,
            )),
            collect,
            store,
            auth,
            options,
            redis,
        }))
    }

    /// The client's address: the peer, or behind a trusted proxy the rightmost untrusted hop
    /// of every line of the configured forwarding header.
    pub fn client_ip(&self, peer: SocketAddr, headers: &HeaderMap) -> IpAddr {
        let header = self.options.proxy_header;
        let lines: Vec<&str> = if self.options.trusted_proxies.contains(peer.ip()) {
            headers
                .get_all(header.name())
                .iter()
                // A line that is not text cannot be read: it stops the walk like garbage would.
                .map(|v| v.to_str().unwrap_or("unknown"))
                .collect()
        } else {
            Vec::new()
        };
        crate::core::forwarded::client_address(
            peer.ip(),
            &self.options.trusted_proxies,
            header,
            lines.into_iter(),
        )
    }

    /// The network the client's requests are limited by.
    pub fn client_net(&self, peer: SocketAddr, headers: &HeaderMap) -> ClientNet {
        ClientNet::of(self.client_ip(peer, headers))
    }

    /// The sender of a counting request.
    pub fn sender(&self, peer: SocketAddr, headers: &HeaderMap) -> crate::collect::Sender {
        let text = |name| {
            headers
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
        };
        crate::collect::Sender::new(
            self.client_ip(peer, headers),
            text(header::USER_AGENT).unwrap_or_default(),
            origin(headers),
            text(header::AUTHORIZATION).and_then(|v| v.strip_prefix("Bearer ")),
        )
    }

    /// Views of `site` not counted over `from..=to`: the stored tallies and those not yet
    /// flushed.
    pub async fn filtered_counts(
        &self,
        site: &SiteId,
        from: jiff::civil::Date,
        to: jiff::civil::Date,
    ) -> Result<FilteredCounts, ApiError> {
        let mut counts = self.store.filtered(site, from, to).await?;
        counts.merge(&self.collect.not_counted.pending(site, from, to));
        Ok(counts)
    }

    /// A slot for one stats request (dashboard, series, top) of the client `net`: 503 `busy`
    /// with `Retry-After` at once when that network already has half of the
    /// `--stats-concurrency` slots (one address cannot keep everyone else's reads out), else
    /// waits up to 2 s for a slot, then 503 `busy`.
    pub async fn stats_slot(&self, net: ClientNet) -> Result<StatsSlot, ApiError> {
        let share = self.stats_shares.take(net).ok_or(ApiError::Busy)?;
        match tokio::time::timeout(STATS_WAIT, Arc::clone(&self.stats_slots).acquire_owned()).await
        {
            Ok(Ok(permit)) => {
                // The read begins: identical requests arriving from now on read anew.
                coalesce::started();
                Ok(StatsSlot {
                    _permit: permit,
                    _share: share,
                })
            }
            _ => Err(ApiError::Busy),
        }
    }

    /// Whether the request is the admin's (session cookie or bearer token); a wrong bearer
    /// token is a guess, throttled per client network (429).
    pub async fn is_admin(&self, peer: SocketAddr, headers: &HeaderMap) -> Result<bool, ApiError> {
        let net = self.client_net(peer, headers);
        self.auth
            .is_admin(headers, net, self.clock.now())
            .await
            .map_err(|t| ApiError::RateLimited {
                retry_after: t.retry_after,
            })
    }
}

/// A stats request's slot and its network's place in the share; both given back on drop.
pub struct StatsSlot {
    _permit: tokio::sync::OwnedSemaphorePermit,
    _share: crate::core::net::Share,
}

/// The whole application.
pub fn app(state: AppState) -> Router {
    let (routes, doc) = routes();
    routes
        // Innermost of the shared layers: compression and headers stay per request.
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state.coalescer),
            coalesce::layer,
        ))
        .layer(Extension(openapi::Document::new(&doc)))
        // `X-Content-Type-Options: nosniff` on every answer: browsers use the declared type only.
        .layer(SetResponseHeaderLayer::overriding(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
        .layer(axum::middleware::from_fn(compress::compress))
        .with_state(state)
}

/// The OpenAPI document of the public API.
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    routes().1
}

/// Every route of the app, and the document of the documented ones. [`app`] adds only layers
/// and the state.
fn routes() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let (documented, mut doc) = documented().split_for_parts();
    openapi::complete(&mut doc);
    let routes = Router::new()
        .merge(documented)
        .merge(pages())
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed });
    (routes, doc)
}

/// The public API: every route here is in the document (`utoipa_axum::routes!` registers a
/// handler's route and its operation together).
fn documented() -> utoipa_axum::router::OpenApiRouter<AppState> {
    use utoipa::OpenApi;
    let api = utoipa_axum::router::OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(hit::router())
        .merge(counts::router())
        .merge(badge::pixel_router())
        .merge(dashboard::api_router())
        .merge(query_api::router())
        .merge(openapi::router())
        .layer(HeaderLayer(ApiHeaders));
    api.merge(ops::router()).merge(badge::router())
}

/// The pages: HTML, its forms and static files, and the snippet. Not part of the API document.
fn pages() -> Router<AppState> {
    Router::new()
        .merge(dashboard::router())
        .merge(share::router())
        .merge(assets::router())
        .merge(ui::router())
}

/// CORS and caching headers for every `/api/*` answer.
#[derive(Debug, Clone, Copy)]
struct ApiHeaders;

/// What [`ApiHeaders`] reads off a request.
struct ApiFacts {
    /// The `Origin` to echo, when the route allows CORS.
    cors_origin: Option<HeaderValue>,
    /// A counting endpoint: credentials allowed.
    counting: bool,
}

impl HeaderRule for ApiHeaders {
    type Facts = ApiFacts;

    fn read<B>(&self, request: &Request<B>) -> ApiFacts {
        let path = request.uri().path();
        // Stats JSON is for the dashboard (same origin) and bearer-token scripts: no CORS, so
        // a page elsewhere can never read a private site's numbers with the admin cookie.
        let cors = !path.starts_with("/api/v1/sites/");
        ApiFacts {
            cors_origin: cors
                .then(|| request.headers().get(header::ORIGIN).cloned())
                .flatten(),
            // Beacons are sent with credentials; only the counting endpoints (which read no
            // cookie) allow them.
            counting: matches!(path, "/api/v1/hit" | "/api/v1/events"),
        }
    }

    fn write(&self, facts: ApiFacts, h: &mut HeaderMap) {
        // Whether this origin may send for the requested site is decided by the handler
        // (403); echoing it here lets the page read that answer.
        if let Some(origin) = facts.cors_origin {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            if facts.counting {
                h.insert(
                    header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                    HeaderValue::from_static("true"),
                );
            }
            h.insert(
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                HeaderValue::from_static("Retry-After"),
            );
        }
        h.append(header::VARY, HeaderValue::from_static("Origin"));
        // Only the document says it may be cached; every other API answer is live.
        if !h.contains_key(header::CACHE_CONTROL) {
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        }
    }
}

/// The answer to a CORS preflight (`OPTIONS`); [`ApiHeaders`] adds the echoed origin.
pub async fn preflight() -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    let h = r.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("content-type"),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("86400"),
    );
    r
}

/// A query string parsed into `T`, or a 400 `invalid_query` saying why.
pub fn query<T>(
    parsed: Result<axum::extract::Query<T>, axum::extract::rejection::QueryRejection>,
) -> Result<T, ApiError> {
    parsed
        .map(|q| q.0)
        .map_err(|e| ApiError::bad("invalid_query", e.body_text()))
}

/// The one path parameter of a route (`{site}`, or a badge's `{file}`), or a 400
/// `invalid_site` in JSON. (axum's own rejection, for a segment that is not UTF-8 once
/// percent-decoded, is plain text.)
pub struct SiteSegment(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for SiteSegment {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(raw)| Self(raw))
            .map_err(|e| ApiError::bad("invalid_site", e.body_text()))
    }
}

/// A site id from a path or query, or a 400 `invalid_site`.
pub fn site_id(raw: &str) -> Result<crate::core::ids::SiteId, ApiError> {
    crate::core::ids::SiteId::parse(raw).map_err(|e| ApiError::bad(e.code(), e.to_string()))
}

/// The request's `Origin`, if it is readable text.
pub fn origin(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::ORIGIN).and_then(|v| v.to_str().ok())
}

/// Read a whole body of at most `limit` bytes.
pub async fn read_body(
    body: axum::body::Body,
    limit: usize,
) -> Result<axum::body::Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(err) = source {
            if err.is::<http_body_util::LengthLimitError>() {
                return ApiError::TooLarge { limit };
            }
            source = err.source();
        }
        ApiError::bad(
            "unreadable_body",
            format!("the body could not be read: {e}"),
        )
    })
}

/// Reject content types other than JSON and text/plain (beacons); a missing one is accepted.
pub fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let ct = ct.to_str().unwrap_or_default().to_ascii_lowercase();
    let essence = ct.split(';').next().unwrap_or_default().trim();
    match essence {
        "application/json" | "text/plain" => Ok(()),
        _ => Err(ApiError::UnsupportedMediaType),
    }
}
