//! `POST /api/v1/hit` and `POST /api/v1/events`: parse, validate, filter, queue, answer after
//! commit.
//!
//! The one flow for every record: body → wire `Hit` → [`ValidHit`] (400 with a code) → site and
//! origin (403) → bot filter (`filtered`, not counted) → visitor key (client id, or a keyed
//! hash of the source) → [`Record`] with its local day → ingest queue → commit → outcome.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, RawQuery, State};
use axum::http::{HeaderMap, header};
use axum::routing::post;
use serde_json::Value;
use tally_wire::{
    BatchResponse, BatchResult, Hit, HitResponse, MAX_BATCH_BYTES, MAX_BATCH_RECORDS,
    MAX_HIT_BYTES, Status,
};

use super::error::json_error;
use super::{ApiError, AppState, check_content_type, origin, read_body};
use crate::core::hit::{HitKind, ValidHit};
use crate::core::ids::PagePath;
use crate::core::record::{Outcome, Record, Source};
use crate::store::Site;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/hit", post(hit).options(super::preflight))
        .route("/api/v1/events", post(events).options(super::preflight))
}

/// What the request says about its sender.
pub struct Sender {
    pub ip: std::net::IpAddr,
    pub user_agent: String,
    pub origin: Option<String>,
}

impl Sender {
    /// Read the sender from a request.
    pub fn from_request(state: &AppState, peer: SocketAddr, headers: &HeaderMap) -> Self {
        Self {
            ip: state.client_ip(peer, headers),
            user_agent: headers
                .get(header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
            origin: origin(headers).map(str::to_owned),
        }
    }
}

/// Why a record is not counted although it is valid.
pub fn filter_reason(state: &AppState, sender: &Sender) -> Option<&'static str> {
    let ua = sender.user_agent.trim();
    if ua.is_empty() {
        Some("empty_user_agent")
    } else if state.is_bot(ua) {
        Some("bot")
    } else {
        None
    }
}

/// A record ready for the queue, or filtered; both with the site and page they belong to.
enum Prepared {
    Record(Box<Record>, Arc<Site>),
    Filtered(Arc<Site>, PagePath),
}

async fn prepare(
    state: &AppState,
    hit: &Hit,
    sender: &Sender,
    now: jiff::Timestamp,
) -> Result<Prepared, ApiError> {
    let valid = ValidHit::parse(hit, now, state.config.window)?;
    let site = state
        .sites
        .for_origin(&valid.site, sender.origin.as_deref())
        .await?;
    if let Some(reason) = filter_reason(state, sender) {
        state
            .metrics
            .filtered
            .get_or_create(&crate::metrics::ReasonLabel { reason })
            .inc();
        return Ok(Prepared::Filtered(site, valid.page));
    }
    let visitor = match valid.visitor {
        Some(v) => v,
        None => {
            // Salted per local day of the event, so a visitor stays one visitor all day long.
            let local_day = site.zone.day_of(valid.event_id.time());
            state
                .hasher
                .source_key(local_day, &valid.site, sender.ip, &sender.user_agent)
                .await?
        }
    };
    let at = valid.event_id.time();
    let record = Record {
        event_id: valid.event_id,
        day: site.zone.day_of(at),
        site: valid.site,
        source: Source::Web,
        kind: valid.kind,
        page: valid.page,
        visitor,
        at_ms: at.as_millisecond(),
        referrer: valid.referrer,
    };
    Ok(Prepared::Record(Box::new(record), site))
}

/// After commit: metrics and the live window.
pub fn observe(state: &AppState, record: &Record, outcome: Outcome) {
    match outcome {
        Outcome::Duplicate => state.metrics.hit("duplicate"),
        Outcome::Accepted => {
            state.metrics.hit("accepted");
            let now = state.clock.now().as_millisecond();
            // A late delivery (a retried beacon from an hour ago) is counted, but is not "live".
            if now - record.at_ms >= i64::from(state.config.live_window_secs) * 1000 {
                return;
            }
            let (lo, hi) = record.visitor.0.split_at(8);
            let visitor = u64::from_le_bytes(lo.try_into().unwrap_or([0; 8]))
                ^ u64::from_le_bytes(hi.try_into().unwrap_or([0; 8]));
            if let Ok(mut live) = state.live.lock() {
                live.record(&(record.site.clone(), None), visitor, now);
                if record.kind == HitKind::Pageview {
                    live.record(
                        &(record.site.clone(), Some(record.page.clone())),
                        visitor,
                        now,
                    );
                }
            }
        }
    }
}

/// The per-source rate limit: one record per site mentioned (a batch may mix sites).
fn admit<'a>(
    state: &AppState,
    sender: &Sender,
    sites: impl Iterator<Item = &'a crate::core::ids::SiteId>,
) -> Result<(), ApiError> {
    let mut per_site: Vec<(&crate::core::ids::SiteId, usize)> = Vec::new();
    for site in sites {
        match per_site.iter_mut().find(|(s, _)| *s == site) {
            Some((_, n)) => *n += 1,
            None => per_site.push((site, 1)),
        }
    }
    for (site, n) in per_site {
        state
            .limiter
            .check(site, sender.ip, &sender.user_agent, n)
            .map_err(|wait| ApiError::RateLimited {
                retry_after: wait.as_secs().max(1),
            })?;
    }
    Ok(())
}

fn status_of(outcome: Outcome) -> Status {
    match outcome {
        Outcome::Accepted => Status::Accepted,
        Outcome::Duplicate => Status::Duplicate,
    }
}

fn wants_counts(query: Option<&str>) -> bool {
    query.is_some_and(|q| {
        q.split('&')
            .any(|kv| matches!(kv, "counts=1" | "counts=true" | "counts"))
    })
}

fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad("empty_body", "the request body is empty"));
    }
    serde_json::from_slice(bytes).map_err(|e| json_error(&e))
}

/// Record a 4xx in the metrics on its way out.
fn rejected(state: &AppState, e: ApiError) -> ApiError {
    match &e {
        ApiError::Overloaded | ApiError::StorageUnavailable | ApiError::RateLimited { .. } => {
            state
                .metrics
                .refused
                .get_or_create(&crate::metrics::ReasonLabel { reason: e.code() })
                .inc();
        }
        _ => {
            state
                .metrics
                .rejected
                .get_or_create(&crate::metrics::CodeLabel { code: e.code() })
                .inc();
        }
    }
    e
}

async fn hit(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<HitResponse>, ApiError> {
    let run = async {
        check_content_type(&headers)?;
        let bytes = read_body(body, MAX_HIT_BYTES).await?;
        let hit: Hit = parse_body(&bytes)?;
        let sender = Sender::from_request(&state, peer, &headers);
        let now = state.clock.now();
        let (status, site, page) = match prepare(&state, &hit, &sender, now).await? {
            Prepared::Filtered(site, page) => {
                state.metrics.hit("filtered");
                (Status::Filtered, site, page)
            }
            Prepared::Record(record, site) => {
                admit(&state, &sender, std::iter::once(&record.site))?;
                let outcome = state.ingest.submit(vec![(*record).clone()]).await?;
                let outcome = outcome.first().copied().unwrap_or(Outcome::Duplicate);
                observe(&state, &record, outcome);
                (status_of(outcome), site, record.page)
            }
        };
        let counts = match wants_counts(query.as_deref()) {
            true => Some(super::counts::counts_for(&state, &site, &page).await?),
            false => None,
        };
        Ok(Json(HitResponse { status, counts }))
    };
    run.await.map_err(|e| rejected(&state, e))
}

async fn events(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<BatchResponse>, ApiError> {
    let run = async {
        check_content_type(&headers)?;
        let bytes = read_body(body, MAX_BATCH_BYTES).await?;
        // Records are parsed one by one so a bad record does not spoil the others.
        #[derive(serde::Deserialize)]
        struct RawBatch {
            events: Vec<Value>,
        }
        let batch: RawBatch = parse_body(&bytes)?;
        if batch.events.len() > MAX_BATCH_RECORDS {
            return Err(ApiError::bad(
                "batch_too_large",
                format!("a batch holds at most {MAX_BATCH_RECORDS} records"),
            ));
        }
        let sender = Sender::from_request(&state, peer, &headers);
        let now = state.clock.now();
        let mut results = Vec::with_capacity(batch.events.len());
        let mut records = Vec::new();
        let mut slots = Vec::new();
        for raw in batch.events {
            let event_id = raw
                .get("event_id")
                .and_then(Value::as_str)
                .map(str::to_owned);
            let prepared = match serde_json::from_value::<Hit>(raw) {
                Ok(hit) => prepare(&state, &hit, &sender, now).await,
                Err(e) => Err(json_error(&e)),
            };
            let result = |status, error: Option<&str>| BatchResult {
                event_id: event_id.clone(),
                status,
                error: error.map(str::to_owned),
            };
            match prepared {
                Ok(Prepared::Record(record, _)) => {
                    slots.push(results.len());
                    records.push(*record);
                    results.push(result(Status::Accepted, None));
                }
                Ok(Prepared::Filtered(..)) => {
                    state.metrics.hit("filtered");
                    results.push(result(Status::Filtered, None));
                }
                // The whole batch cannot be stored: fail it so the client retries it.
                Err(e @ (ApiError::Overloaded | ApiError::StorageUnavailable)) => return Err(e),
                Err(e) => {
                    let e = rejected(&state, e);
                    results.push(result(Status::Rejected, Some(e.code())));
                }
            }
        }
        if !records.is_empty() {
            admit(&state, &sender, records.iter().map(|r| &r.site))?;
            let outcomes = state.ingest.submit(records.clone()).await?;
            for ((slot, record), outcome) in slots.into_iter().zip(&records).zip(outcomes) {
                observe(&state, record, outcome);
                results[slot].status = status_of(outcome);
            }
        }
        Ok(Json(BatchResponse { results }))
    };
    run.await.map_err(|e| rejected(&state, e))
}
