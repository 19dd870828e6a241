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
//! [`AppState`] holds the seams, not their implementations: the store (`Arc<dyn Store>`), and
//! the live window, rate limiter, repeat gate and site cache behind the traits of
//! [`crate::state`] (in-process implementations today).

mod assets;
pub mod auth;
mod badge;
mod compress;
mod counts;
mod dashboard;
mod error;
mod headers;
mod hit;
mod openapi;
mod ops;
mod ui;

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use headers::{HeaderLayer, HeaderRule};
use tower_http::set_header::SetResponseHeaderLayer;

pub use error::ApiError;

use crate::collect::bots::BotList;
use crate::collect::ingest::Ingest;
use crate::collect::privacy::SourceHasher;
use crate::collect::secrets::ServerSecret;
use crate::collect::sites::SiteRegistry;
use crate::core::clock::Clock;
use crate::core::filtered::{FilterTally, FilteredCounts, Reason};
use crate::core::ids::SiteId;
use crate::core::net::ClientNet;
use crate::metrics::Metrics;
use crate::ops::config::ServeConfig;
use crate::state::redis::RedisLink;
use crate::state::{LiveState, RateLimiter, RepeatGate, SharedState};
use crate::store::Store;

/// User agents whose bot verdict is remembered (by a 64-bit hash: 16 bytes an entry, however
/// long the agent).
pub const BOT_VERDICTS: usize = 4096;

/// Longest user agent looked at, in bytes: longer ones are judged (and hashed) by this prefix.
/// Real browsers send 100–300 bytes; the header itself is bounded by the server's header limit.
pub const MAX_USER_AGENT_BYTES: usize = 512;

/// How long a stats request waits for a free reader slot before 503.
const STATS_WAIT: Duration = Duration::from_secs(2);

/// Most (site, day, reason) keys of views not counted held between two flushes (4 reasons ×
/// 2 days × 50,000 sites; the flush runs every few seconds).
const FILTER_TALLY_KEYS: usize = 400_000;

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
    pub store: Arc<dyn Store>,
    pub ingest: Ingest,
    pub sites: Arc<SiteRegistry>,
    pub clock: Arc<dyn Clock>,
    pub config: Arc<ServeConfig>,
    pub metrics: Arc<Metrics>,
    /// The live window (events of the last N seconds).
    pub live: Arc<dyn LiveState>,
    pub hasher: Arc<SourceHasher>,
    /// The bot user-agent list, compiled once.
    pub bots: Arc<BotList>,
    /// Admin and metrics credentials, sessions, and the throttle on guessing them.
    pub auth: Arc<auth::Auth>,
    /// Per-address limits of every counting route and of new sites.
    pub limits: Arc<dyn RateLimiter>,
    /// Badge and pixel repeat suppression (sources without a visitor id); known image proxies
    /// have their own gate, per (proxy address, page) and one second.
    pub repeats: Arc<dyn RepeatGate>,
    /// Verdicts of recently seen user agents by hash (the list is a large regex; agents repeat).
    bot_verdicts: Arc<Mutex<HashMap<u64, bool>>>,
    /// Hashes user agents for the verdict cache.
    ua_hasher: std::collections::hash_map::RandomState,
    /// Stats requests (dashboard, series, top) in flight at once.
    pub stats_slots: Arc<tokio::sync::Semaphore>,
    /// Each client network's share of the stats slots (half of them, at least one).
    stats_shares: Arc<crate::core::net::Shares>,
    /// Batch bodies being read and parsed at once.
    pub batch_slots: Arc<tokio::sync::Semaphore>,
    /// Views not counted, by site, day and reason, until the next flush to the store.
    pub filtered: Arc<Mutex<FilterTally>>,
    /// The Redis of the shared state (`--redis`), for its health in `/metrics` and `/readyz`.
    pub redis: Option<Arc<RedisLink>>,
}

impl AppState {
    /// Build the state around a started ingest queue and the collector's shared state.
    pub fn new(
        store: Arc<dyn Store>,
        ingest: Ingest,
        clock: Arc<dyn Clock>,
        config: ServeConfig,
        metrics: Arc<Metrics>,
        secret: ServerSecret,
        shared: SharedState,
    ) -> Self {
        let SharedState {
            live,
            limits,
            repeats,
            sites,
            redis,
        } = shared;
        Self(Arc::new(AppStateInner {
            sites: Arc::new(SiteRegistry::new(
                store.clone(),
                sites,
                config.auto_sites,
                config.max_sites,
                Arc::clone(&limits),
            )),
            hasher: Arc::new(SourceHasher::new(store.clone(), secret.clone())),
            auth: Arc::new(auth::Auth::new(&config, &secret, Arc::clone(&limits))),
            live,
            redis,
            stats_slots: Arc::new(tokio::sync::Semaphore::new(config.stats_concurrency)),
            stats_shares: crate::core::net::Shares::new(config.stats_concurrency.div_ceil(2)),
            batch_slots: Arc::new(tokio::sync::Semaphore::new(config.batch_concurrency)),
            config: Arc::new(config),
            bots: Arc::new(BotList::bundled()),
            filtered: Arc::new(Mutex::new(FilterTally::new(FILTER_TALLY_KEYS))),
            bot_verdicts: Arc::new(Mutex::new(HashMap::new())),
            ua_hasher: std::collections::hash_map::RandomState::new(),
            limits,
            repeats,
            store,
            ingest,
            clock,
            metrics,
        }))
    }

    /// The client's address: the peer, or behind a trusted proxy the rightmost untrusted hop
    /// of every line of the configured forwarding header.
    pub fn client_ip(&self, peer: SocketAddr, headers: &HeaderMap) -> IpAddr {
        let header = self.config.proxy_header;
        let lines: Vec<&str> = if self.config.trusted_proxies.contains(peer.ip()) {
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
            &self.config.trusted_proxies,
            header,
            lines.into_iter(),
        )
    }

    /// The network the client's requests are limited by.
    pub fn client_net(&self, peer: SocketAddr, headers: &HeaderMap) -> ClientNet {
        ClientNet::of(self.client_ip(peer, headers))
    }

    /// Whether `user_agent` is on the bot list (cached by hash for the most recent agents;
    /// only the first [`MAX_USER_AGENT_BYTES`] are looked at).
    pub fn is_bot(&self, user_agent: &str) -> bool {
        let user_agent = truncate(user_agent, MAX_USER_AGENT_BYTES);
        let key = self.ua_hasher.hash_one(user_agent);
        if let Some(verdict) = self
            .bot_verdicts
            .lock()
            .ok()
            .and_then(|c| c.get(&key).copied())
        {
            return verdict;
        }
        let verdict = self.bots.is_bot(user_agent);
        if let Ok(mut cache) = self.bot_verdicts.lock() {
            if cache.len() >= BOT_VERDICTS {
                cache.clear();
            }
            cache.insert(key, verdict);
        }
        verdict
    }

    /// A view of `site` not counted for `reason` (`n` of them): in `/metrics` and in the
    /// site's tally of what was dropped (dashboard, `/api/v1/sites/{site}/filtered`).
    pub fn not_counted(
        &self,
        site: &SiteId,
        zone: &crate::core::day::SiteZone,
        reason: Reason,
        n: u64,
    ) {
        let metric = match reason {
            Reason::Suppressed => None,
            other => Some(other.name()),
        };
        if let Some(reason) = metric {
            self.metrics
                .filtered
                .get_or_create(&crate::metrics::ReasonLabel { reason })
                .inc_by(n);
        }
        let day = zone.day_of(self.clock.now());
        let kept = self
            .filtered
            .lock()
            .map(|mut t| t.record(site, day, reason, n))
            .unwrap_or(false);
        if !kept {
            self.metrics.filtered_untallied.inc_by(n);
        }
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
        if let Ok(t) = self.filtered.lock() {
            counts.merge(&t.pending(site, from, to));
        }
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
            Ok(Ok(permit)) => Ok(StatsSlot {
                _permit: permit,
                _share: share,
            }),
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

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

/// Whether two secrets are equal, in time that depends on neither their content nor their
/// lengths: both are hashed to 32 bytes first, and the digests compared without branching.
pub(crate) fn constant_time_eq(a: &str, b: &str) -> bool {
    let (a, b) = (blake3::hash(a.as_bytes()), blake3::hash(b.as_bytes()));
    // blake3's `Hash` equality is constant-time.
    a == b
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
        .merge(openapi::router())
        .layer(HeaderLayer(ApiHeaders));
    api.merge(ops::router()).merge(badge::router())
}

/// The pages: HTML, its forms and static files, and the snippet. Not part of the API document.
fn pages() -> Router<AppState> {
    Router::new()
        .merge(dashboard::router())
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
