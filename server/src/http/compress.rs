//! Response compression: gzip or brotli, chosen by the request's `Accept-Encoding` (brotli
//! preferred at equal weight), with `Vary: Accept-Encoding` on every answer that could be
//! compressed.
//!
//! Contract: only text answers are compressed — HTML, JSON, SVG, the metrics text formats, and
//! JS/wasm/CSS that arrive without an encoding — and only bodies of at least
//! [`MIN_BYTES`] (smaller ones would not shrink). A response that already carries
//! `Content-Encoding` (the precompressed snippet files) or a `Content-Range` passes through
//! untouched, so nothing is compressed twice. Brotli runs at quality 4 (tower-http's default
//! for on-the-fly brotli, nginx's too): a dashboard page costs well under a millisecond.

use axum::http::{Extensions, HeaderMap, StatusCode, Version, header};
use tower_http::compression::CompressionLayer;
use tower_http::compression::predicate::{Predicate, SizeAbove};

/// Bodies shorter than this are sent as they are.
pub const MIN_BYTES: u64 = 256;

/// Media types worth compressing (matched as prefixes of `Content-Type`).
const COMPRESSIBLE: [&str; 8] = [
    "text/html",
    "text/plain",
    "text/css",
    "application/json",
    "application/javascript",
    "text/javascript",
    "application/wasm",
    "image/svg+xml",
];

/// Also compressible: the OpenMetrics exposition format.
const OPENMETRICS: &str = "application/openmetrics-text";

/// Whether a response's media type is one we compress.
fn compressible(_: StatusCode, _: Version, headers: &HeaderMap, _: &Extensions) -> bool {
    let Some(ct) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let ct = ct.trim_start().to_ascii_lowercase();
    COMPRESSIBLE.iter().any(|t| ct.starts_with(t)) || ct.starts_with(OPENMETRICS)
}

/// The layer [`super::app`] wraps every route in.
pub fn layer() -> CompressionLayer<impl Predicate> {
    CompressionLayer::new()
        .gzip(true)
        .br(true)
        .compress_when(SizeAbove::new(MIN_BYTES).and(compressible))
}
