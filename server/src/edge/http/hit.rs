//! `POST /api/v1/hit` and `POST /api/v1/events`: parse, validate, filter, queue, answer after
//! commit.
//!
//! The one flow for every record: cost bounded first (content type, `Content-Length`, the
//! sender's address allowance, a batch slot) → body (at most 8 KiB / 4 MiB) → wire `Hit` (a
//! batch is split into at most 500 raw records without building them: a longer array is
//! refused as soon as its 501st element is seen) → [`ValidHit`] (400 with a code) → site and
//! origin (403; auto-sites creates here) → lane: the site's ingest key (no address limits) or
//! the sender's address limits (429 with `Retry-After`, or 400 `batch_over_allowance` when no
//! wait could help) → bot filter (`filtered`, not counted) → visitor key (client id, or a keyed
//! hash of the source) → [`Record`] with its local day → ingest queue → commit → outcome.
//! What a hit counts as (filter, visitor day, dedupe scoping, the live rule) is decided by
//! [`crate::core::classify`], shared with the badge and pixel; this module gathers inputs.
//!
//! Dedupe keys of custom events: a sender with the site's ingest key sets site-wide keys (the
//! shop's server says `order_1001` once for the whole site); any other sender's key is scoped
//! to its visitor ([`DedupeKey::scoped_to`]), so an anonymous client cannot pre-claim a key. A
//! wrong ingest key is a throttled guess (see `edge::http::auth`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, header};
use axum::response::Response;
use serde::Deserialize;
use serde_json::value::RawValue;
use tally_wire::{
    Batch, BatchResponse, BatchResult, ErrorBody, Hit, HitResponse, MAX_BATCH_BYTES,
    MAX_BATCH_RECORDS, MAX_HIT_BYTES, Status,
};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::json_error;
use super::{ApiError, AppState, MAX_USER_AGENT_BYTES, check_content_type, origin, read_body};
use crate::core::classify::{View, live_entry};
use crate::core::filtered::Reason;
use crate::core::hit::ValidHit;
use crate::core::ids::{PagePath, SiteId};
use crate::core::net::ClientNet;
use crate::core::record::{Outcome, Record};
use crate::state::limits::{Lane, Refusal};
use crate::store::Site;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(hit, hit_preflight))
        .routes(routes!(events, events_preflight))
}

/// The query of `POST /api/v1/hit`.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // Read by hand (`wants_counts`): only its document is derived.
struct HitQuery {
    /// `1`, `true` or empty: answer with the counts of the site and page after this hit
    /// (one request for a page's counter); any other value is ignored.
    counts: Option<String>,
}

/// CORS preflight of `POST /api/v1/hit`.
#[utoipa::path(
    options,
    path = "/api/v1/hit",
    operation_id = "hit_preflight",
    tag = "counting",
    responses((status = 204, description = "Preflight answered: `POST` with `Content-Type` allowed; the `Origin` is echoed."))
)]
async fn hit_preflight() -> Response {
    super::preflight().await
}

/// CORS preflight of `POST /api/v1/events`.
#[utoipa::path(
    options,
    path = "/api/v1/events",
    operation_id = "events_preflight",
    tag = "counting",
    responses((status = 204, description = "Preflight answered: `POST` with `Content-Type` allowed; the `Origin` is echoed."))
)]
async fn events_preflight() -> Response {
    super::preflight().await
}

/// What the request says about its sender.
pub struct Sender {
    pub ip: std::net::IpAddr,
    /// The network the sender's requests are limited by.
    pub net: ClientNet,
    /// The user agent, cut to [`MAX_USER_AGENT_BYTES`].
    pub user_agent: String,
    pub origin: Option<String>,
    /// An `Authorization: Bearer` value: a site's ingest key, if the sender is the site's server.
    pub bearer: Option<String>,
}

impl Sender {
    /// Read the sender from a request.
    pub fn from_request(state: &AppState, peer: SocketAddr, headers: &HeaderMap) -> Self {
        let ip = state.client_ip(peer, headers);
        Self {
            ip,
            net: ClientNet::of(ip),
            user_agent: super::truncate(
                headers
                    .get(header::USER_AGENT)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default(),
                MAX_USER_AGENT_BYTES,
            )
            .to_owned(),
            origin: origin(headers).map(str::to_owned),
            bearer: headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(|v| v.trim().to_owned()),
        }
    }

    /// Whether this sender holds `site`'s ingest key (compared in constant time).
    pub fn has_key_of(&self, site: &Site) -> bool {
        match (&self.bearer, &site.ingest_key) {
            (Some(given), Some(key)) => super::constant_time_eq(given, key),
            _ => false,
        }
    }
}

/// Why a record is not counted although it is valid ([`crate::core::classify::filter_reason`]
/// with this app's bot list).
pub fn filter_reason(state: &AppState, sender: &Sender) -> Option<Reason> {
    crate::core::classify::filter_reason(&sender.user_agent, |ua| state.is_bot(ua))
}

/// A record ready for the queue, or filtered; both with the site and page they belong to.
enum Prepared {
    Record(Box<Record>, Arc<Site>),
    Filtered(Arc<Site>, PagePath),
}

/// A valid hit and its site, with the lane it is charged to.
struct Checked {
    valid: ValidHit,
    site: Arc<Site>,
    /// The sender holds the site's ingest key: no address limits.
    keyed: bool,
}

/// Validate a hit and find (or, with auto-sites, create) its site; decide its lane.
async fn check(
    state: &AppState,
    hit: &Hit,
    sender: &Sender,
    now: jiff::Timestamp,
) -> Result<Checked, ApiError> {
    let valid = ValidHit::parse(hit, now, state.config.window)?;
    let site = state
        .sites
        .for_counting(&valid.site, sender.origin.as_deref(), sender.net, now)
        .await?;
    let keyed = sender.has_key_of(&site);
    if sender.bearer.is_some() && !keyed {
        state.auth.failed_guess(sender.net, now).await;
        return Err(ApiError::InvalidIngestKey {
            site: site.id.to_string(),
        });
    }
    Ok(Checked { valid, site, keyed })
}

/// Filter and key a checked hit into a record.
async fn prepare(
    state: &AppState,
    checked: Checked,
    sender: &Sender,
) -> Result<Prepared, ApiError> {
    let Checked { valid, site, keyed } = checked;
    if let Some(reason) = filter_reason(state, sender) {
        state.not_counted(&site.id, &site.zone, reason, 1);
        return Ok(Prepared::Filtered(site, valid.page));
    }
    let view = View::from_hit(valid, &site.zone, keyed);
    let visitor = match view.client_visitor() {
        Some(v) => v,
        None => {
            state
                .hasher
                .source_key(view.day(), &view.site, sender.ip, &sender.user_agent)
                .await?
        }
    };
    Ok(Prepared::Record(Box::new(view.into_record(visitor)), site))
}

/// After commit: metrics and the live window ([`live_entry`] decides what is live).
pub async fn observe(state: &AppState, record: &Record, outcome: Outcome) {
    match outcome {
        Outcome::Duplicate => state.metrics.hit("duplicate"),
        Outcome::Accepted => {
            state.metrics.hit("accepted");
            let now = state.clock.now().as_millisecond();
            if let Some(entry) = live_entry(record, now, state.config.live_window_secs) {
                state.live.record(&entry, now).await;
            }
        }
    }
}

/// The sender's address allowance for the unkeyed records of a request: one record per site
/// mentioned (a batch may mix sites), all charged or none.
async fn admit(
    state: &AppState,
    sender: &Sender,
    sites: &[&SiteId],
    now: jiff::Timestamp,
) -> Result<(), ApiError> {
    let mut per_site: Vec<(&SiteId, u32)> = Vec::new();
    for site in sites {
        match per_site.iter_mut().find(|(s, _)| s == site) {
            Some((_, n)) => *n += 1,
            None => per_site.push((site, 1)),
        }
    }
    if per_site.is_empty() {
        return Ok(());
    }
    state
        .limits
        .admit_many(Lane::Direct, sender.net, &per_site, now)
        .await
        .map_err(refused)
}

/// A limit refusal as an answer.
pub fn refused(refusal: Refusal) -> ApiError {
    match refusal {
        Refusal::Wait(wait) => ApiError::RateLimited {
            retry_after: wait.as_secs().max(1),
        },
        Refusal::Never { allowance } => ApiError::OverAllowance { allowance },
    }
}

/// Before reading a body: refuse at once a sender with no allowance left (unless it presents
/// an ingest key, which is checked after parsing), and a declared length over `limit`.
async fn precheck(
    state: &AppState,
    sender: &Sender,
    headers: &HeaderMap,
    limit: usize,
    now: jiff::Timestamp,
) -> Result<(), ApiError> {
    check_content_type(headers)?;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::TooLarge { limit });
    }
    if sender.bearer.is_none() {
        state
            .limits
            .has_room(Lane::Direct, sender.net, now)
            .await
            .map_err(refused)?;
    } else {
        // A key guesser that used up its wrong guesses is refused before its key is compared.
        state
            .auth
            .before_guess(sender.net, now)
            .await
            .map_err(|t| ApiError::RateLimited {
                retry_after: t.retry_after,
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

fn parse_body<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad("empty_body", "the request body is empty"));
    }
    serde_json::from_slice(bytes).map_err(|e| json_error(&e))
}

/// Record a 4xx in the metrics on its way out.
fn rejected(state: &AppState, e: ApiError) -> ApiError {
    match &e {
        ApiError::Overloaded
        | ApiError::StorageUnavailable
        | ApiError::DiskFull
        | ApiError::Busy
        | ApiError::RateLimited { .. } => {
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

/// Count one page view or custom event.
///
/// The answer comes after the record is committed; a retry with the same `event_id` answers
/// `duplicate` and changes nothing.
#[utoipa::path(
    post,
    path = "/api/v1/hit",
    operation_id = "hit",
    tag = "counting",
    params(HitQuery, ("Origin" = Option<String>, Header, description = "The sending page's origin, when a browser sends one: it must be one of the site's allowed origins (403 `origin_not_allowed`).", example = "https://blog.example")),
    request_body(
        description = "One record, as JSON; sent as `application/json` or as `text/plain` \
(beacons). At most 8 KiB.",
        content(
            (Hit = "application/json"),
            (Hit = "text/plain"),
        ),
    ),
    security((), ("ingest_key" = [])),
    responses(
        (status = 200, description = "Judged: `accepted`, `duplicate` or `filtered` (a bot or \
an empty user agent: not counted).", body = HitResponse),
        (status = 400, description = "Malformed or invalid: `empty_body`, `malformed_json`, \
`invalid_field`, `invalid_site`, `invalid_type`, `invalid_event_id`, \
`event_id_out_of_window`, `invalid_visitor_id`, `invalid_url`, `invalid_referrer`, \
`invalid_name`, `invalid_dedupe`, `unreadable_body`, `batch_over_allowance`.", body = ErrorBody),
        (status = 401, description = "`invalid_ingest_key`: a bearer key that is not the site's.", body = ErrorBody),
        (status = 403, description = "`unknown_site`, `origin_not_allowed` (the `Origin` is not \
one of the site's), `site_limit_reached` (auto-sites: no more sites may be created).", body = ErrorBody),
        (status = 408, description = "`request_timeout`: the body did not arrive in time.", body = ErrorBody),
        (status = 413, description = "`body_too_large`: over 8 KiB.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: neither JSON nor text/plain.", body = ErrorBody),
        (status = 429, description = "`rate_limited`: this address's allowance (or its new sites, \
or its wrong keys) is used up.", body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 503, description = "Nothing was counted: `overloaded`, `storage_unavailable`, \
`disk_full`.", body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
async fn hit(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Result<Json<HitResponse>, ApiError> {
    // The request taken whole: its headers are read in place (the `HeaderMap` extractor
    // would clone them on every hit).
    let (parts, body) = request.into_parts();
    let (headers, query) = (parts.headers, parts.uri.query());
    let run = async {
        let sender = Sender::from_request(&state, peer, &headers);
        let now = state.clock.now();
        precheck(&state, &sender, &headers, MAX_HIT_BYTES, now).await?;
        let bytes = read_body(body, MAX_HIT_BYTES).await?;
        let hit: Hit = parse_body(&bytes)?;
        let checked = check(&state, &hit, &sender, now).await?;
        if !checked.keyed {
            admit(&state, &sender, &[&checked.valid.site], now)
                .await
                .inspect_err(|_| {
                    let site = &checked.site;
                    state.not_counted(&site.id, &site.zone, Reason::RateLimited, 1);
                })?;
        }
        let (status, site, page) = match prepare(&state, checked, &sender).await? {
            Prepared::Filtered(site, page) => {
                state.metrics.hit("filtered");
                (Status::Filtered, site, page)
            }
            Prepared::Record(record, site) => {
                let outcome = state.ingest.submit(vec![(*record).clone()]).await?;
                let outcome = outcome.first().copied().unwrap_or(Outcome::Duplicate);
                observe(&state, &record, outcome).await;
                (status_of(outcome), site, record.page)
            }
        };
        let counts = match wants_counts(query) {
            true => Some(super::counts::counts_for(&state, &site, &page).await?),
            false => None,
        };
        Ok(Json(HitResponse { status, counts }))
    };
    run.await.map_err(|e| rejected(&state, e))
}

/// Marks the error raised when a batch holds more than [`MAX_BATCH_RECORDS`] records.
const TOO_MANY_RECORDS: &str = "tally: batch holds too many records";

/// The records of a batch, as raw JSON slices of the body: nothing is built per record until
/// the count is known, and the count is checked element by element.
struct RawRecords<'a>(Vec<&'a RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for RawRecords<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Records<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Records<'a> {
            type Value = RawRecords<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array of records")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(raw) = seq.next_element::<&'de RawValue>()? {
                    if out.len() == MAX_BATCH_RECORDS {
                        return Err(serde::de::Error::custom(TOO_MANY_RECORDS));
                    }
                    out.push(raw);
                }
                Ok(RawRecords(out))
            }
        }
        d.deserialize_seq(Records(std::marker::PhantomData))
    }
}

/// A batch body; unknown top-level fields are skipped without being built.
#[derive(Deserialize)]
struct RawBatch<'a> {
    #[serde(borrow)]
    events: RawRecords<'a>,
}

/// The event id of a record that did not parse, if it has a string one.
fn event_id_of(raw: &RawValue) -> Option<String> {
    #[derive(Deserialize)]
    struct IdOnly {
        event_id: Option<String>,
    }
    serde_json::from_str::<IdOnly>(raw.get())
        .ok()
        .and_then(|r| r.event_id)
}

/// Count a batch of records.
///
/// For the snippet's queue, an import, a shop's server. Each record is judged on its own and
/// answered in order; an invalid one is `rejected` with its error code while the others
/// count. A failure that no record can escape (503, 429) fails the whole batch, so the client
/// retries it.
#[utoipa::path(
    post,
    path = "/api/v1/events",
    operation_id = "events",
    tag = "counting",
    params(("Origin" = Option<String>, Header, description = "The sending page's origin, when a browser sends one: it must be one of the site's allowed origins (403 `origin_not_allowed`).", example = "https://blog.example")),
    request_body(
        description = "At most 500 records and 4 MiB, as JSON; sent as `application/json` or \
`text/plain`.",
        content(
            (Batch = "application/json"),
            (Batch = "text/plain"),
        ),
    ),
    security((), ("ingest_key" = [])),
    responses(
        (status = 200, description = "One result per record, in order.", body = BatchResponse),
        (status = 400, description = "The batch as a whole: `empty_body`, `malformed_json`, \
`invalid_field` (no `events` array), `batch_too_large` (over 500 records), \
`batch_over_allowance`, `unreadable_body`.", body = ErrorBody),
        (status = 408, description = "`request_timeout`: the body did not arrive in time.", body = ErrorBody),
        (status = 413, description = "`body_too_large`: over 4 MiB.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: neither JSON nor text/plain.", body = ErrorBody),
        (status = 429, description = "`rate_limited`: this address's allowance (or its new sites, \
or its wrong keys) is used up.", body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 503, description = "Nothing was counted: `overloaded` (also: too many batches \
at once), `storage_unavailable`, `disk_full`.", body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
async fn events(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<BatchResponse>, ApiError> {
    let run = async {
        let sender = Sender::from_request(&state, peer, &headers);
        let now = state.clock.now();
        precheck(&state, &sender, &headers, MAX_BATCH_BYTES, now).await?;
        // At most `--batch-concurrency` bodies of up to 4 MiB are held and parsed at once.
        let _slot = Arc::clone(&state.batch_slots)
            .try_acquire_owned()
            .map_err(|_| ApiError::Overloaded)?;
        let bytes = read_body(body, MAX_BATCH_BYTES).await?;
        let batch: RawBatch<'_> = parse_body(&bytes).map_err(|e| match e {
            ApiError::BadRequest { message, .. } if message.contains(TOO_MANY_RECORDS) => {
                ApiError::bad(
                    "batch_too_large",
                    format!("a batch holds at most {MAX_BATCH_RECORDS} records"),
                )
            }
            other => other,
        })?;
        let mut results = Vec::with_capacity(batch.events.0.len());
        let mut checked = Vec::new();
        for raw in batch.events.0 {
            let event_id = event_id_of(raw);
            let outcome = match serde_json::from_str::<Hit>(raw.get()) {
                Ok(hit) => check(&state, &hit, &sender, now).await,
                Err(e) => Err(json_error(&e)),
            };
            match outcome {
                Ok(c) => {
                    checked.push((results.len(), c));
                    results.push(BatchResult {
                        event_id,
                        status: Status::Accepted,
                        error: None,
                    });
                }
                // The whole batch cannot be stored now: fail it so the client retries it.
                Err(
                    e @ (ApiError::Overloaded
                    | ApiError::StorageUnavailable
                    | ApiError::DiskFull
                    | ApiError::RateLimited { .. }),
                ) => return Err(e),
                Err(e) => {
                    let e = rejected(&state, e);
                    results.push(BatchResult {
                        event_id,
                        status: Status::Rejected,
                        error: Some(e.code().to_owned()),
                    });
                }
            }
        }
        let unkeyed: Vec<&SiteId> = checked
            .iter()
            .filter(|(_, c)| !c.keyed)
            .map(|(_, c)| &c.valid.site)
            .collect();
        admit(&state, &sender, &unkeyed, now)
            .await
            .inspect_err(|_| {
                for (_, c) in checked.iter().filter(|(_, c)| !c.keyed) {
                    state.not_counted(&c.site.id, &c.site.zone, Reason::RateLimited, 1);
                }
            })?;
        let mut records = Vec::new();
        let mut slots = Vec::new();
        for (slot, c) in checked {
            match prepare(&state, c, &sender).await? {
                Prepared::Record(record, _) => {
                    slots.push(slot);
                    records.push(*record);
                }
                Prepared::Filtered(..) => {
                    state.metrics.hit("filtered");
                    results[slot].status = Status::Filtered;
                }
            }
        }
        if !records.is_empty() {
            let outcomes = state.ingest.submit(records.clone()).await?;
            // Observed together: with `--redis` the batch's live records share a pipeline.
            let mut observed = Vec::with_capacity(records.len());
            for ((slot, record), outcome) in slots.into_iter().zip(&records).zip(outcomes) {
                observed.push(observe(&state, record, outcome));
                results[slot].status = status_of(outcome);
            }
            futures_util::future::join_all(observed).await;
        }
        Ok(Json(BatchResponse { results }))
    };
    run.await.map_err(|e| rejected(&state, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::hit::TimeWindow;
    use proptest::prelude::*;

    /// Any JSON value, a few levels deep.
    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>().prop_map(serde_json::Value::from),
            ".{0,40}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("site".to_owned()),
                        Just("type".to_owned()),
                        Just("event_id".to_owned()),
                        Just("url".to_owned()),
                        Just("visitor_id".to_owned()),
                        Just("referrer".to_owned()),
                        Just("name".to_owned()),
                        Just("dedupe".to_owned()),
                        "[a-z_]{1,8}",
                    ],
                    inner,
                    0..8
                )
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Parse as the hit endpoint does; every refusal must be a 4xx with a code.
    fn judge(bytes: &[u8]) -> Result<(), TestCaseError> {
        let now: jiff::Timestamp = "2026-05-10T12:00:00Z".parse().expect("ts");
        match parse_body::<Hit>(bytes) {
            Err(e) => {
                prop_assert!(e.status().is_client_error(), "{e:?}");
                prop_assert!(!e.code().is_empty());
            }
            Ok(hit) => {
                if let Err(e) = ValidHit::parse(&hit, now, TimeWindow::default()) {
                    let api: ApiError = e.into();
                    prop_assert!(api.status().is_client_error(), "{api:?}");
                }
            }
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_and_are_refused_with_a_4xx(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            judge(&bytes)?;
        }

        #[test]
        fn arbitrary_json_never_panics_and_is_refused_with_a_4xx(value in json_value()) {
            judge(value.to_string().as_bytes())?;
        }

        #[test]
        fn near_valid_hits_never_panic(
            site in "[a-z0-9._-]{0,70}",
            kind in prop_oneof![Just("pageview".to_owned()), Just("event".to_owned()), ".{0,8}"],
            url in prop_oneof![".{0,60}", "https?://[a-z.]{1,20}(:[0-9]{1,6})?/[ -~]{0,60}"],
            name in proptest::option::of(".{0,80}"),
            dedupe in proptest::option::of(".{0,140}"),
            visitor in proptest::option::of("[0-9a-f-]{0,40}"),
            referrer in proptest::option::of(".{0,80}"),
            id in "[0-9a-f-]{0,40}",
        ) {
            let hit = serde_json::json!({
                "site": site, "type": kind, "url": url, "name": name, "dedupe": dedupe,
                "visitor_id": visitor, "referrer": referrer,
                "event_id": if id.len() == 36 { id } else { "019a0000-0000-7000-8000-000000000000".into() },
            });
            judge(hit.to_string().as_bytes())?;
        }
    }
}
