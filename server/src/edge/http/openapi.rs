//! The OpenAPI 3.1 document of the public API, generated from the types (`utoipa`), and
//! `GET /api/v1/openapi.json`, which serves it.
//!
//! Contract:
//! - Every documented route is registered through `utoipa_axum::routes!` from a handler that
//!   carries `#[utoipa::path]`: the route and its operation come from one place and cannot
//!   drift. The bodies are the very types the handlers read and write (`tally-wire` with its
//!   `openapi` feature, the stats answers of `dashboard`).
//! - Invariant: every route the app serves is either in the document or one of the pages
//!   (HTML, forms, static files: `super::pages`), and no page lives under `/api/`, `/badge/` or
//!   the operations paths. `tests::every_route_is_documented_or_a_page` enforces it.
//! - The document is built once when the app is built; its answer is the same bytes with an
//!   `ETag` and `Cache-Control: public, max-age=300` (a `304` for a matching `If-None-Match`).

use axum::Extension;
use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;

/// Security scheme: the admin token as `Authorization: Bearer`.
pub const ADMIN_TOKEN: &str = "admin_token";
/// Security scheme: the dashboard's session cookie.
pub const ADMIN_SESSION: &str = "admin_session";
/// Security scheme: a site's ingest key as `Authorization: Bearer`.
pub const INGEST_KEY: &str = "ingest_key";
/// Security scheme: the metrics token as `Authorization: Bearer`.
pub const METRICS_TOKEN: &str = "metrics_token";

/// The document's fixed parts; the paths come from the routers.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tally",
        description = "Tally's HTTP API, v1: count page views and events, read the counts, \
badges and the no-JavaScript pixel, the stats behind the dashboard, and the operations \
endpoints. Every 4xx/5xx answer of the JSON API is an `ErrorBody` (`{\"error\": code, \
\"message\": sentence}`); 429 and 503 answers carry `Retry-After`. Any route answers 405 \
`method_not_allowed` to a method it does not serve, and a request whose body does not arrive \
within the body timeout gets 408 `request_timeout`. CORS preflights (`OPTIONS`) of the \
counting and counts endpoints answer 204. At its connection cap the server answers a new \
connection 503 with `Retry-After` before reading any route.",
    ),
    modifiers(&SecuritySchemes),
    tags(
        (name = "counting", description = "Send page views and events."),
        (name = "counts", description = "The numbers a page shows its readers (open to any allowed origin)."),
        (name = "badges", description = "Counting images: the badge and the pixel."),
        (name = "stats", description = "The dashboard's numbers: public sites are open, private ones need the admin token or session."),
        (name = "operations", description = "Health, readiness, metrics and this document."),
    )
)]
pub struct ApiDoc;

/// Adds the security schemes (the derive cannot describe a cookie scheme's purpose).
struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let bearer = |description: &str| {
            let mut http = Http::new(HttpAuthScheme::Bearer);
            http.description = Some(description.to_owned());
            SecurityScheme::Http(http)
        };
        components.add_security_scheme(
            ADMIN_TOKEN,
            bearer(
                "The admin token (`--admin-token`): opens the stats of private sites. Wrong \
                 tokens are throttled per client network (429).",
            ),
        );
        components.add_security_scheme(
            ADMIN_SESSION,
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
                super::auth::COOKIE,
                "The dashboard's session: a signed, expiring value set by signing in with the \
                 admin token at `POST /dashboard/{site}/login`.",
            ))),
        );
        components.add_security_scheme(
            INGEST_KEY,
            bearer(
                "A site's ingest key (`tally site key`): its records skip the per-address \
                 limits and its dedupe keys are site-wide. A wrong key is 401 \
                 `invalid_ingest_key` and a throttled guess.",
            ),
        );
        components.add_security_scheme(
            METRICS_TOKEN,
            bearer("The metrics token (`--metrics-token`); without one `/metrics` is open."),
        );
    }
}

/// What the derives cannot say, added once the routers have collected every schema: a hit of
/// type `event` needs a `name` (JSON Schema's `if`/`then`, which utoipa has no attribute for;
/// the rule itself is `core::hit`'s `HitError::MissingName`).
pub fn complete(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::Schema;
    let hit = doc
        .components
        .as_mut()
        .and_then(|c| c.schemas.get_mut("Hit"));
    if let Some(RefOr::T(Schema::Object(hit))) = hit {
        let rule = [
            (
                "if",
                serde_json::json!({
                    "properties": {"type": {"const": "event"}},
                    "required": ["type"],
                }),
            ),
            ("then", serde_json::json!({"required": ["name"]})),
        ];
        hit.extensions
            .get_or_insert_with(Default::default)
            .extend(rule.map(|(k, v)| (k.to_owned(), v)));
    }
}

/// The routes of this module.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(openapi_json))
}

/// The serialized document and its entity tag.
#[derive(Clone)]
pub struct Document {
    json: Bytes,
    etag: HeaderValue,
}

impl Document {
    /// Serialize `doc` once.
    pub fn new(doc: &utoipa::openapi::OpenApi) -> Self {
        // Serializing a document of strings and maps cannot fail; an empty one would be seen.
        let json = Bytes::from(doc.to_json().unwrap_or_default());
        let etag = format!("\"{}\"", &blake3::hash(&json).to_hex()[..16]);
        Self {
            etag: HeaderValue::from_str(&etag).unwrap_or(HeaderValue::from_static("\"\"")),
            json,
        }
    }
}

/// This document.
#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    operation_id = "openapi",
    tag = "operations",
    params(("If-None-Match" = Option<String>, Header, description = "The `ETag` of an earlier answer: 304 when the document is unchanged.")),
    responses(
        (status = 200, description = "The OpenAPI 3.1 document of this API.",
            content_type = "application/json", body = Object,
            headers(("ETag" = String, description = "Entity tag of the document."))),
        (status = 304, description = "Not modified (`If-None-Match` matched the `ETag`)."),
    )
)]
async fn openapi_json(Extension(doc): Extension<Document>, headers: HeaderMap) -> Response {
    let fresh = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim() == doc.etag || t.trim() == "*");
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(header::CONTENT_TYPE, "application/json")],
            doc.json.clone(),
        )
            .into_response()
    };
    let h = response.headers_mut();
    h.insert(header::ETAG, doc.etag.clone());
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    response
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use axum::Router;

    use super::super::{AppState, documented, pages, routes};

    /// `(METHOD, path)` of every route of `router` (`HEAD` left out: axum answers it for every
    /// `GET`). axum has no route listing; its `Debug` output names each route's path and its
    /// `Allow` methods, and a change of that format fails [`every_route_is_documented_or_a_page`]
    /// (nothing parsed), never passes it silently.
    fn served(router: &Router<AppState>) -> BTreeSet<(String, String)> {
        let dump = format!("{router:?}");
        // The fallback router's entries (ids overlap) come after this field.
        let dump = dump.split("fallback_router:").next().unwrap_or_default();
        let methods = regex::Regex::new(
            r#"RouteId\((\d+)\): MethodRouter\(MethodRouter \{[^{}]*?allow_header: Bytes\(b"([A-Z,]+)"\)"#,
        )
        .expect("regex");
        let paths = regex::Regex::new(r#"RouteId\((\d+)\): "([^"]+)""#).expect("regex");
        let ids = |re: &regex::Regex| -> Vec<(String, String)> {
            re.captures_iter(dump)
                .map(|c| (c[1].to_owned(), c[2].to_owned()))
                .collect()
        };
        let methods = ids(&methods);
        let paths = ids(&paths);
        assert_eq!(
            methods.len(),
            paths.len(),
            "every route must be a method router (no `route_service`): {dump}"
        );
        let mut out = BTreeSet::new();
        for (id, path) in paths {
            let (_, allow) = methods
                .iter()
                .find(|(m, _)| *m == id)
                .unwrap_or_else(|| panic!("no methods read for {path}"));
            for method in allow.split(',').filter(|m| *m != "HEAD") {
                out.insert((method.to_owned(), path.clone()));
            }
        }
        out
    }

    fn operations(doc: &utoipa::openapi::OpenApi) -> BTreeSet<(String, String)> {
        let json = serde_json::to_value(doc).expect("document");
        let mut out = BTreeSet::new();
        for (path, item) in json["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                out.insert((method.to_ascii_uppercase(), path.clone()));
            }
        }
        out
    }

    /// Paths no page may take: they belong to the API.
    fn is_api_path(path: &str) -> bool {
        path.starts_with("/api/")
            || path.starts_with("/badge/")
            || matches!(path, "/healthz" | "/readyz" | "/metrics")
    }

    #[test]
    fn every_route_is_documented_or_a_page() {
        let (app, doc) = routes();
        let all = served(&app);
        let ops = operations(&doc);
        let pages = served(&pages());
        assert!(ops.len() >= 15 && pages.len() >= 5, "{ops:?} {pages:?}");
        let undocumented: Vec<_> = all
            .difference(&ops)
            .filter(|r| !pages.contains(r))
            .collect();
        assert!(
            undocumented.is_empty(),
            "routes served without an operation in the OpenAPI document (register them with \
             `utoipa_axum::routes!` from a handler with `#[utoipa::path]`): {undocumented:?}"
        );
        let unserved: Vec<_> = ops.difference(&all).collect();
        assert!(unserved.is_empty(), "documented, not served: {unserved:?}");
        let misplaced: Vec<_> = pages.iter().filter(|(_, p)| is_api_path(p)).collect();
        assert!(
            misplaced.is_empty(),
            "API paths served as undocumented pages: {misplaced:?}"
        );
        // The rule the derives cannot say is in.
        let hit = &serde_json::to_value(&doc).expect("json")["components"]["schemas"]["Hit"];
        assert_eq!(hit["then"]["required"][0], "name", "{hit}");
        // The documented router holds nothing the document lacks.
        let (api, doc) = documented().split_for_parts();
        assert_eq!(served(&api), operations(&doc));
    }
}
