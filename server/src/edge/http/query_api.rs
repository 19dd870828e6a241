//! `POST /api/v2/query`: the analytics API, in the request and answer shape of Plausible's
//! Stats API v2, so scripts and tools written for it work against Tally unchanged.
//!
//! Contract:
//! - The request is `{site_id, metrics, date_range, dimensions?, filters?, order_by?,
//!   include?, pagination?}`; unknown keys are refused. The answer is `{results: [{dimensions,
//!   metrics}], meta, query}`, `query` echoing the request as understood (the date range as
//!   the site's local start and end instants, the default order, the include flags set).
//! - What is supported is what `core::query` computes; anything else (a metric, dimension,
//!   operator or include key Tally does not have) is a 400 `invalid_query` whose message
//!   names what is supported.
//! - Access is the site's stats access: public sites are open; private ones need the admin
//!   token (`Authorization: Bearer`), a signed-in session, or a shared link's token. Each
//!   request takes a stats slot, like every stats read.

use std::net::SocketAddr;

use axum::Json;
use axum::extract::{ConnectInfo, State};
use axum::http::HeaderMap;
use jiff::civil::Date;
use serde::{Deserialize, Serialize};
use serde_json::{Value as Json_, json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{ApiError, AppState};
use crate::core::query::{Dimension, Filter, Grain, Metric, Op, OrderKey, Query, Value, VisitDim};
use crate::core::range::DayRange;
use crate::core::site::Site;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(query))
}

/// Largest request body, bytes.
pub(super) const MAX_BODY: usize = 64 * 1024;
/// Most rows of one answer (Plausible's default and limit).
const MAX_LIMIT: usize = 10_000;
/// Most filters (after flattening `and`).
const MAX_FILTERS: usize = 64;
/// Most values of one filter.
const MAX_VALUES: usize = 256;

/// A question in Plausible's Stats API v2 shape.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct QueryRequest {
    /// The site id.
    #[schema(pattern = "^[a-z0-9][a-z0-9._-]{0,63}$", example = "blog")]
    site_id: String,
    /// Metrics, in the order their values are answered.
    #[schema(schema_with = doc::metrics)]
    metrics: Vec<String>,
    /// `day`, `Nd` (`7d`, `28d`, `30d`, `91d`: the N days before today), `month`, `Nmo`
    /// (`6mo`, `12mo`: whole months before this one), `year`, `all`, or `[from, to]` (dates,
    /// or datetimes whose local dates are used).
    #[schema(schema_with = doc::date_range)]
    date_range: Json_,
    /// What rows are grouped by (`time`: hours, days, weeks or months by the range's length).
    #[serde(default)]
    #[schema(schema_with = doc::dimensions)]
    dimensions: Vec<String>,
    /// `[operator, dimension, [values], {"case_sensitive": bool}?]`, ANDed; `["and", [...]]`
    /// is flattened.
    #[serde(default)]
    #[schema(schema_with = doc::filters)]
    filters: Vec<Json_>,
    /// `[[metric or dimension, "asc" | "desc"], …]`: each a metric or dimension of the query.
    #[serde(default)]
    #[schema(schema_with = doc::order_by)]
    order_by: Vec<(String, String)>,
    #[serde(default)]
    include: Include,
    #[serde(default)]
    pagination: Pagination,
}

#[derive(Debug, Default, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct Include {
    /// Every time bucket label of the range in `meta.time_labels` (needs a time dimension).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    time_labels: bool,
    /// The number of rows before pagination in `meta.total_rows`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    total_rows: bool,
    /// Include imported breakdowns (Plausible's CSV export) where they can answer the
    /// question: no filter, or filters only on the dimensions broken down by, all of one
    /// imported table; never in hourly buckets. `meta.imports_included` says whether they
    /// were, `meta.imports_warning` what to know (imported visitors are summed per day).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    imports: bool,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct Pagination {
    #[serde(default = "default_limit")]
    #[schema(minimum = 1, maximum = 10000)]
    limit: usize,
    #[serde(default)]
    offset: usize,
}

fn default_limit() -> usize {
    MAX_LIMIT
}

impl Default for Pagination {
    fn default() -> Self {
        Self {
            limit: MAX_LIMIT,
            offset: 0,
        }
    }
}

/// The request's fields in the OpenAPI document, from the tables the request is read with
/// (so the document lists exactly what is supported).
mod doc {
    use serde_json::{Value, json};
    use utoipa::openapi::schema::Schema;

    use crate::core::query::{Dimension, Metric, Op};

    fn schema(value: Value) -> Schema {
        // A fixed shape written here, checked by the OpenAPI test: not input.
        serde_json::from_value(value).expect("a valid schema")
    }

    fn metric_names() -> Vec<&'static str> {
        Metric::ALL.iter().map(|m| m.name()).collect()
    }

    fn dimension_names(time: bool) -> Vec<&'static str> {
        let named = Dimension::ALL
            .iter()
            .filter(|(_, d)| time || !matches!(d, Dimension::Time(_)))
            .map(|(n, _)| *n);
        if time {
            std::iter::once("time").chain(named).collect()
        } else {
            named.collect()
        }
    }

    pub(super) fn metrics() -> Schema {
        schema(json!({
            "type": "array", "minItems": 1, "uniqueItems": true,
            "items": {"type": "string", "enum": metric_names()}
        }))
    }

    pub(super) fn dimensions() -> Schema {
        schema(json!({
            "type": "array", "uniqueItems": true,
            "items": {"type": "string", "enum": dimension_names(true)}
        }))
    }

    pub(super) fn date_range() -> Schema {
        schema(json!({
            "oneOf": [
                {"type": "string", "enum": ["day", "7d", "28d", "30d", "91d", "month", "6mo", "12mo", "year", "all"]},
                {"type": "array", "minItems": 2, "maxItems": 2,
                 "prefixItems": [{"type": "string", "format": "date"}, {"type": "string", "format": "date"}],
                 "items": false,
                 "description": "[from, to]: from not after to, at most 10 years apart"}
            ]
        }))
    }

    pub(super) fn filters() -> Schema {
        let ops: Vec<&str> = Op::ALL.iter().map(|(n, _)| *n).collect();
        schema(json!({
            "type": "array", "maxItems": 64,
            "items": {
                "type": "array", "minItems": 3, "maxItems": 4,
                "prefixItems": [
                    {"type": "string", "enum": ops},
                    {"type": "string", "enum": dimension_names(false)},
                    {"type": "array", "minItems": 1, "maxItems": 256, "items": {"type": "string"}},
                    {"type": "object", "additionalProperties": false,
                     "properties": {"case_sensitive": {"type": "boolean"}}}
                ],
                "items": false
            }
        }))
    }

    pub(super) fn metric_values() -> Schema {
        schema(json!({"type": "array", "items": {"type": ["number", "null"]}}))
    }

    pub(super) fn order_by() -> Schema {
        let keys: Vec<&str> = metric_names()
            .into_iter()
            .chain(Dimension::ALL.iter().map(|(n, _)| *n))
            .collect();
        schema(json!({
            "type": "array",
            "items": {
                "type": "array", "minItems": 2, "maxItems": 2,
                "prefixItems": [{"type": "string", "enum": keys}, {"type": "string", "enum": ["asc", "desc"]}],
                "items": false
            }
        }))
    }
}

/// The answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct QueryResponse {
    results: Vec<ResultRow>,
    #[schema(value_type = Object)]
    meta: Json_,
    #[schema(value_type = Object)]
    query: Json_,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct ResultRow {
    dimensions: Vec<String>,
    /// The metrics' values in query order: a number, or null where a ratio has no base.
    #[schema(schema_with = doc::metric_values)]
    metrics: Vec<Json_>,
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::bad("invalid_query", message)
}

fn names<T>(all: impl Iterator<Item = T>, name: impl Fn(T) -> &'static str) -> String {
    all.map(name).collect::<Vec<_>>().join(", ")
}

/// The request as a typed question over a range of the site's days.
fn understand(
    req: &QueryRequest,
    site: &Site,
    now: jiff::Timestamp,
    first: Option<Date>,
) -> Result<(Query, DayRange), ApiError> {
    let metrics = req
        .metrics
        .iter()
        .enumerate()
        .map(|(i, m)| {
            Metric::parse(m).ok_or_else(|| {
                invalid(format!(
                    "#/metrics/{i}: Invalid metric {m:?}; supported: {}",
                    names(Metric::ALL.into_iter(), Metric::name)
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if metrics.is_empty() {
        return Err(invalid(
            "#/metrics: Expected a minimum of 1 items but got 0.",
        ));
    }
    let range = date_range(&req.date_range, site, now, first)?;
    let days = range
        .from
        .until(range.to)
        .map(|s| s.get_days())
        .unwrap_or(0);
    let dimensions = req
        .dimensions
        .iter()
        .enumerate()
        .map(|(i, d)| match d.as_str() {
            // `time` picks its bucket by the range's length, as Plausible does.
            "time" => Ok(Dimension::Time(match days {
                0..=1 => Grain::Hour,
                2..=40 => Grain::Day,
                41..=364 => Grain::Week,
                _ => Grain::Month,
            })),
            other => Dimension::parse(other).ok_or_else(|| {
                invalid(format!(
                    "#/dimensions/{i}: Invalid dimension {other:?}; supported: time, {}",
                    names(Dimension::ALL.iter(), |(n, _)| *n)
                ))
            }),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut filters = Vec::new();
    for (i, f) in req.filters.iter().enumerate() {
        flatten(f, &format!("#/filters/{i}"), &mut filters)?;
    }
    if filters.len() > MAX_FILTERS {
        return Err(invalid(format!("at most {MAX_FILTERS} filters")));
    }
    let mut order_by = Vec::new();
    for (i, (key, dir)) in req.order_by.iter().enumerate() {
        let desc = match dir.as_str() {
            "desc" => true,
            "asc" => false,
            _ => {
                return Err(invalid(format!(
                    "#/order_by/{i}: direction must be \"asc\" or \"desc\""
                )));
            }
        };
        let key = match (Metric::parse(key), Dimension::parse(key)) {
            (Some(m), _) if metrics.contains(&m) => OrderKey::Metric(m),
            (_, Some(d)) if dimensions.contains(&d) => OrderKey::Dimension(d),
            _ => {
                return Err(invalid(format!(
                    "Invalid order_by entry {key:?}. Entry is not a queried metric or dimension."
                )));
            }
        };
        order_by.push((key, desc));
    }
    if req.include.time_labels && !dimensions.iter().any(|d| matches!(d, Dimension::Time(_))) {
        return Err(invalid(
            "Invalid include.time_labels: requires a time dimension.",
        ));
    }
    if req.pagination.limit == 0 || req.pagination.limit > MAX_LIMIT {
        return Err(invalid(format!(
            "#/pagination/limit: must be 1 to {MAX_LIMIT}"
        )));
    }
    if metrics.contains(&Metric::Percentage) && dimensions.is_empty() {
        return Err(invalid(
            "Metric `percentage` requires non-empty dimensions.",
        ));
    }
    let query = Query {
        metrics,
        dimensions,
        filters,
        order_by,
        limit: req.pagination.limit,
        offset: req.pagination.offset,
    };
    query.check().map_err(|e| invalid(e.0))?;
    Ok((query, range))
}

/// One filter, or an `and` of filters, into `out`.
fn flatten(f: &Json_, at: &str, out: &mut Vec<Filter>) -> Result<(), ApiError> {
    let parts = f
        .as_array()
        .ok_or_else(|| invalid(format!("{at}: a filter is an array")))?;
    let op = parts.first().and_then(Json_::as_str).unwrap_or("");
    if op == "and" {
        let inner = parts
            .get(1)
            .and_then(Json_::as_array)
            .filter(|a| !a.is_empty() && parts.len() == 2)
            .ok_or_else(|| invalid(format!("{at}: [\"and\", [filters…]]")))?;
        for (i, f) in inner.iter().enumerate() {
            flatten(f, &format!("{at}/1/{i}"), out)?;
        }
        return Ok(());
    }
    let op = Op::parse(op).ok_or_else(|| {
        invalid(format!(
            "{at}: Invalid filter operator {op:?}; supported: and, {} (filters are ANDed)",
            names(Op::ALL.iter(), |(n, _)| *n)
        ))
    })?;
    let dim_name = parts.get(1).and_then(Json_::as_str).unwrap_or("");
    let dimension = Dimension::parse(dim_name)
        .filter(|d| !matches!(d, Dimension::Time(_)))
        .ok_or_else(|| {
            invalid(format!(
                "{at}: Invalid filter dimension {dim_name:?}; supported: {}",
                names(
                    Dimension::ALL
                        .iter()
                        .filter(|(_, d)| !matches!(d, Dimension::Time(_))),
                    |(n, _)| *n
                )
            ))
        })?;
    let values: Vec<String> = parts
        .get(2)
        .and_then(Json_::as_array)
        .ok_or_else(|| invalid(format!("{at}: the third item is a list of values")))?
        .iter()
        .map(|v| match v {
            Json_::String(s) => Some(s.clone()),
            Json_::Number(n) => Some(n.to_string()),
            _ => None,
        })
        .collect::<Option<_>>()
        .filter(|v: &Vec<String>| !v.is_empty() && v.len() <= MAX_VALUES)
        .ok_or_else(|| {
            invalid(format!(
                "{at}: values are 1 to {MAX_VALUES} strings or numbers"
            ))
        })?;
    let case_sensitive = match parts.get(3) {
        None => true,
        Some(m) => m
            .as_object()
            .filter(|o| o.keys().all(|k| k == "case_sensitive"))
            .and_then(|o| o.get("case_sensitive").map(Json_::as_bool))
            .flatten()
            .ok_or_else(|| invalid(format!("{at}/3: {{\"case_sensitive\": bool}}")))?,
    };
    if parts.len() > 4 {
        return Err(invalid(format!("{at}: too many items")));
    }
    if dimension == Dimension::Visit(VisitDim::Country)
        && matches!(op, Op::Is | Op::IsNot)
        && values.iter().any(|v| v.len() != 2)
    {
        return Err(invalid(
            "Invalid visit:country filter, visit:country needs to be a valid 2-letter country code.",
        ));
    }
    out.push(Filter {
        dimension,
        op,
        values,
        case_sensitive,
    });
    Ok(())
}

fn date_range(
    raw: &Json_,
    site: &Site,
    now: jiff::Timestamp,
    first: Option<Date>,
) -> Result<DayRange, ApiError> {
    let bad = |e: crate::core::range::RangeError| invalid(format!("#/date_range: {e}"));
    match raw {
        Json_::String(name) => DayRange::shortcut(name, &site.zone, now, first).map_err(bad),
        Json_::Array(pair) if pair.len() == 2 => {
            let day = |v: &Json_| -> Result<Date, ApiError> {
                let text = v
                    .as_str()
                    .ok_or_else(|| invalid("#/date_range: [from, to] are strings"))?;
                if let Ok(d) = text.parse::<Date>() {
                    return Ok(d);
                }
                // A datetime: its date in the site's zone.
                let ts: jiff::Timestamp = text
                    .parse()
                    .map_err(|_| invalid(format!("#/date_range: {text:?} is not a date")))?;
                Ok(site.zone.day_of(ts))
            };
            DayRange::explicit_api(day(&pair[0])?, day(&pair[1])?).map_err(bad)
        }
        _ => Err(invalid(
            "#/date_range: a shortcut (day, 7d, 30d, month, 6mo, 12mo, year, all…) or [from, to]",
        )),
    }
}

/// An instant as Plausible echoes it: local time with its offset.
fn local(site: &Site, ts: jiff::Timestamp) -> String {
    ts.to_zoned(site.zone.time_zone().clone())
        .strftime("%Y-%m-%dT%H:%M:%S%:z")
        .to_string()
}

fn value(v: Value) -> Json_ {
    match v {
        Value::Int(n) => json!(n),
        Value::Float(x) => json!(x),
        Value::Null => Json_::Null,
    }
}

/// Answer a question about a site's visits.
///
/// The request and answer shape of Plausible's Stats API v2; every metric and dimension Tally
/// has (a 400 lists them for anything else).
#[utoipa::path(
    post,
    path = "/api/v2/query",
    operation_id = "query",
    tag = "stats",
    request_body = QueryRequest,
    security((), ("admin_token" = []), ("admin_session" = [])),
    responses(
        (status = 200, description = "The rows, with meta and the query as understood.", body = QueryResponse),
        (status = 400, description = "`invalid_query` (says what is supported), `invalid_site`, `malformed_json`.", body = tally_wire::ErrorBody),
        (status = 401, description = "`unauthorized`: a private site without the admin token or a shared link's token.", body = tally_wire::ErrorBody),
        (status = 403, description = "`share_other_site`.", body = tally_wire::ErrorBody),
        (status = 404, description = "`not_found`: no such site.", body = tally_wire::ErrorBody),
        (status = 413, description = "`body_too_large`: over 64 KiB.", body = tally_wire::ErrorBody),
        (status = 429, description = "`rate_limited`: too many wrong tokens.", body = tally_wire::ErrorBody),
        (status = 503, description = "`busy`, `storage_unavailable`.", body = tally_wire::ErrorBody),
    )
)]
async fn query(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Json<QueryResponse>, ApiError> {
    let bytes = super::read_body(body, MAX_BODY).await?;
    let req: QueryRequest = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad("malformed_json", format!("body is not a query: {e}")))?;
    let (site, _) = super::dashboard::authorised(&state, &req.site_id, peer, &headers).await?;
    let _slot = state.stats_slot(state.client_net(peer, &headers)).await?;
    let now = state.clock.now();
    let first = if req.date_range.as_str() == Some("all") {
        first_day(&state, &site, now).await?
    } else {
        None
    };
    let (query, range) = understand(&req, &site, now, first)?;
    let answers = state
        .analytics
        .answer_with(
            &site.id,
            &site.zone,
            range.from,
            range.to,
            std::slice::from_ref(&query),
            req.include.imports,
        )
        .await?;
    let (answer, imports) = answers.into_iter().next().unwrap_or_else(|| {
        (
            crate::core::query::Answer {
                rows: Vec::new(),
                total_rows: 0,
                time_labels: Vec::new(),
            },
            Default::default(),
        )
    });
    let mut meta = serde_json::Map::new();
    if req.include.time_labels {
        meta.insert("time_labels".into(), json!(answer.time_labels));
    }
    if req.include.total_rows {
        meta.insert("total_rows".into(), json!(answer.total_rows));
    }
    if req.include.imports {
        meta.insert("imports_included".into(), json!(imports.included));
        if let Some(warning) = imports.warning {
            meta.insert("imports_warning".into(), json!(warning));
        }
    }
    let (start, end) = site.zone.span(range.from, range.to);
    let end = end
        .checked_sub(jiff::SignedDuration::from_secs(1))
        .unwrap_or(end);
    let order: Vec<Json_> = crate::core::query::order_of(&query)
        .iter()
        .map(|(k, desc)| {
            let name = match k {
                OrderKey::Metric(m) => m.name(),
                OrderKey::Dimension(d) => d.name(),
            };
            json!([name, if *desc { "desc" } else { "asc" }])
        })
        .collect();
    let echo = json!({
        "site_id": site.id.as_str(),
        "metrics": query.metrics.iter().map(|m| m.name()).collect::<Vec<_>>(),
        "date_range": [local(&site, start), local(&site, end)],
        "filters": req.filters,
        "dimensions": query.dimensions.iter().map(|d| d.name()).collect::<Vec<_>>(),
        "order_by": order,
        "include": req.include,
        "pagination": {"offset": query.offset, "limit": query.limit},
    });
    Ok(Json(QueryResponse {
        results: answer
            .rows
            .into_iter()
            .map(|r| ResultRow {
                dimensions: r.dimensions,
                metrics: r.metrics.into_iter().map(value).collect(),
            })
            .collect(),
        meta: Json_::Object(meta),
        query: echo,
    }))
}

/// The site's first day with counted views (for `all`), within ten years.
async fn first_day(
    state: &AppState,
    site: &Site,
    now: jiff::Timestamp,
) -> Result<Option<Date>, ApiError> {
    let today = site.zone.day_of(now);
    let from = today
        .checked_sub(jiff::Span::new().days(crate::core::range::MAX_API_DAYS - 1))
        .unwrap_or(today);
    let rows = state.store.series(&site.id, from, today).await?;
    Ok(rows.first().map(|r| r.day))
}
