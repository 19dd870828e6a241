//! The HTTP error type: every failure a client can see, its status and its stable code.
//! 4xx bodies say why; 5xx bodies say nothing internal (the cause is logged once, here).

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tally_wire::ErrorBody;

use crate::collect::Refused;
use crate::collect::ingest::IngestError;
use crate::collect::sites::SiteError;
use crate::core::hit::HitError;
use crate::store::StoreError;

/// Seconds a client should wait after a 503.
pub const RETRY_AFTER_OVERLOAD: u64 = 1;
/// Seconds a client should wait after the store failed.
pub const RETRY_AFTER_STORE: u64 = 5;
/// Seconds a client should wait while the disk is below its free-space floor.
pub const RETRY_AFTER_DISK: u64 = 60;

/// An error answer.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the request is malformed; `code` names what.
    #[error("{message}")]
    BadRequest { code: &'static str, message: String },
    /// 400: more records in one anonymous request than the sender's allowance can ever hold.
    #[error(
        "this batch holds more records than one address may send at once ({allowance}); send smaller batches, or use the site's ingest key"
    )]
    OverAllowance { allowance: u32 },
    /// 401: a private resource without a valid admin token.
    #[error("this resource needs the admin token")]
    Unauthorized,
    /// 401: a shared link that does not open this (`share_revoked`, `share_expired`,
    /// `share_password_required`).
    #[error("{message}")]
    ShareRefused { code: &'static str, message: String },
    /// 401: an `Authorization: Bearer` ingest key that is not the site's.
    #[error("the ingest key is not valid for site {site:?}")]
    InvalidIngestKey { site: String },
    /// 403: unknown site, or an origin the site does not allow.
    #[error("{message}")]
    Forbidden { code: &'static str, message: String },
    /// 404: no such route or resource.
    #[error("{0}")]
    NotFound(String),
    /// 405: the route exists with other methods.
    #[error("method not allowed here")]
    MethodNotAllowed,
    /// 413: body over the limit.
    #[error("body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    /// 415: not JSON or text/plain.
    #[error("content-type must be application/json or text/plain")]
    UnsupportedMediaType,
    /// 429: this source sent more than its per-minute allowance; retry after the wait.
    #[error("too many hits from this source; retry after {retry_after} s")]
    RateLimited { retry_after: u64 },
    /// 503: the ingest queue is full; retry after a second.
    #[error("the collector is overloaded; retry later")]
    Overloaded,
    /// 503: the store failed; nothing was counted; retry later.
    #[error("storage is unavailable; nothing was counted; retry later")]
    StorageUnavailable,
    /// 503: free disk space is below the configured floor; nothing was counted.
    #[error("the collector's disk is nearly full; nothing was counted; retry later")]
    DiskFull,
    /// 503: every stats reader slot is taken.
    #[error("too many stats requests at once; retry shortly")]
    Busy,
}

impl ApiError {
    /// A 400 with a code and a message.
    pub fn bad(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            code,
            message: message.into(),
        }
    }

    /// The status code.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } | ApiError::OverAllowance { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized
            | ApiError::InvalidIngestKey { .. }
            | ApiError::ShareRefused { .. } => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Overloaded
            | ApiError::StorageUnavailable
            | ApiError::DiskFull
            | ApiError::Busy => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest { code, .. }
            | ApiError::Forbidden { code, .. }
            | ApiError::ShareRefused { code, .. } => code,
            ApiError::OverAllowance { .. } => "batch_over_allowance",
            ApiError::Unauthorized => "unauthorized",
            ApiError::InvalidIngestKey { .. } => "invalid_ingest_key",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::TooLarge { .. } => "body_too_large",
            ApiError::UnsupportedMediaType => "unsupported_media_type",
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::Overloaded => "overloaded",
            ApiError::StorageUnavailable => "storage_unavailable",
            ApiError::DiskFull => "disk_full",
            ApiError::Busy => "busy",
        }
    }

    fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::RateLimited { retry_after } => Some(*retry_after),
            ApiError::Overloaded | ApiError::Busy => Some(RETRY_AFTER_OVERLOAD),
            ApiError::StorageUnavailable => Some(RETRY_AFTER_STORE),
            ApiError::DiskFull => Some(RETRY_AFTER_DISK),
            _ => None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.code().to_owned(),
            message: self.to_string(),
        };
        let mut response = (self.status(), Json(body)).into_response();
        if let Some(secs) = self.retry_after() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

impl From<HitError> for ApiError {
    fn from(e: HitError) -> Self {
        ApiError::bad(e.code(), e.to_string())
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            // Expected while the disk is below its floor: a warning, not an error per request.
            StoreError::DiskFull { free, floor } => {
                tracing::warn!(
                    free,
                    floor,
                    "disk below its free-space floor; writes refused"
                );
                ApiError::DiskFull
            }
            e => {
                tracing::error!(error = %e, "store error");
                ApiError::StorageUnavailable
            }
        }
    }
}

impl From<crate::store::analytics::AnalyticsError> for ApiError {
    fn from(e: crate::store::analytics::AnalyticsError) -> Self {
        match e {
            crate::store::analytics::AnalyticsError::Invalid(why) => {
                ApiError::bad("invalid_query", why.0)
            }
            crate::store::analytics::AnalyticsError::Store(e) => e.into(),
        }
    }
}

impl From<IngestError> for ApiError {
    fn from(e: IngestError) -> Self {
        match e {
            IngestError::QueueFull | IngestError::Closed => ApiError::Overloaded,
            // The writer already logged the cause.
            IngestError::Store(e) => match *e {
                StoreError::DiskFull { .. } => ApiError::DiskFull,
                _ => ApiError::StorageUnavailable,
            },
        }
    }
}

impl From<SiteError> for ApiError {
    fn from(e: SiteError) -> Self {
        match e {
            SiteError::Unknown(_) => ApiError::Forbidden {
                code: "unknown_site",
                message: e.to_string(),
            },
            SiteError::Origin { .. } => ApiError::Forbidden {
                code: "origin_not_allowed",
                message: e.to_string(),
            },
            SiteError::CreationLimited(wait) => ApiError::RateLimited {
                retry_after: wait.as_secs().max(1),
            },
            SiteError::SiteLimit(_) => ApiError::Forbidden {
                code: "site_limit_reached",
                message: e.to_string(),
            },
            SiteError::Store(e) => e.into(),
        }
    }
}

impl From<Refused> for ApiError {
    fn from(e: Refused) -> Self {
        match e {
            Refused::Invalid(e) => e.into(),
            Refused::Site(e) => e.into(),
            Refused::InvalidIngestKey { site } => ApiError::InvalidIngestKey { site },
            Refused::RateLimited { retry_after } => ApiError::RateLimited { retry_after },
            Refused::OverAllowance { allowance } => ApiError::OverAllowance { allowance },
            Refused::Ingest(e) => e.into(),
            Refused::Store(e) => e.into(),
        }
    }
}

/// Map a serde_json error on a request body to a 400.
pub fn json_error(e: &serde_json::Error) -> ApiError {
    use serde_json::error::Category;
    match e.classify() {
        Category::Data => ApiError::bad(
            "invalid_field",
            format!("a field has the wrong type or value: {e}"),
        ),
        Category::Syntax | Category::Eof | Category::Io => {
            ApiError::bad("malformed_json", format!("body is not valid JSON: {e}"))
        }
    }
}
