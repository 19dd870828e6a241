//! `POST /api/v1/hit` and `POST /api/v1/events`: parse, validate, filter, queue, answer after
//! commit.
//!
//! The edge's part: content type and `Content-Length` before the body, the body (at most 8 KiB
//! / 4 MiB), the wire `Hit` (a batch is split into at most 500 raw records without building
//! them: a longer array is refused as soon as its 501st element is seen), a batch slot, then
//! the counting pipeline ([`crate::collect::Collector`]: check, filter, visitor, limit, commit, observe) and
//! its outcome or refusal as the answer.
//!
//! Dedupe keys of custom events: a sender with the site's ingest key sets site-wide keys (the
//! shop's server says `order_1001` once for the whole site); any other sender's key is scoped
//! to its visitor (`DedupeKey::scoped_to`), so an anonymous client cannot pre-claim a key. A
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
use super::{ApiError, AppState, check_content_type, read_body};
use crate::collect::{Counted, Sender};

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

/// Before reading a body: refuse a content type other than JSON or text, a declared length
/// over `limit`, and a sender the pipeline refuses at once ([`Collector::precheck`]).
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
    Ok(state.collect.precheck(sender, now).await?)
}

/// The wire status of what a record ended as.
fn status_of(counted: Counted) -> Status {
    match counted {
        Counted::Accepted => Status::Accepted,
        Counted::Duplicate => Status::Duplicate,
        // A hit refused by the limits is refused as a whole: neither is a hit's answer.
        Counted::Filtered | Counted::Suppressed | Counted::RateLimited => Status::Filtered,
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
        let sender = state.sender(peer, &headers);
        let now = state.clock.now();
        precheck(&state, &sender, &headers, MAX_HIT_BYTES, now).await?;
        let bytes = read_body(body, MAX_HIT_BYTES).await?;
        let hit: Hit = parse_body(&bytes)?;
        let checked = state.collect.check(&hit, &sender, now).await?;
        let (site, page) = (Arc::clone(&checked.site), checked.valid.page.clone());
        let counted = state
            .collect
            .count_hits(vec![checked], &sender, now)
            .await?;
        let status = status_of(counted.first().copied().unwrap_or(Counted::Duplicate));
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
        let sender = state.sender(peer, &headers);
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
                Ok(hit) => state
                    .collect
                    .check(&hit, &sender, now)
                    .await
                    .map_err(ApiError::from),
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
        let (slots, checked): (Vec<usize>, Vec<_>) = checked.into_iter().unzip();
        if !checked.is_empty() {
            let counted = state.collect.count_hits(checked, &sender, now).await?;
            for (slot, counted) in slots.into_iter().zip(counted) {
                results[slot].status = status_of(counted);
            }
        }
        Ok(Json(BatchResponse { results }))
    };
    run.await.map_err(|e| rejected(&state, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::hit::{TimeWindow, ValidHit};
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
