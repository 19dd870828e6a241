//! What every HTML page shares: its security headers and its two static files.
//!
//! Contract:
//! - Every HTML answer (dashboard, login) carries a Content-Security-Policy that allows only
//!   this origin's stylesheet and script (`/assets/dashboard.css`, `/assets/dashboard.js`), no
//!   inline script or style (the templates hold none: bar widths are classes, the live refresh
//!   reads its site from a `data-` attribute), `fetch` to this origin, forms posting to this
//!   origin, no plugins, no `<base>`, and no framing (`frame-ancestors 'none'`, and
//!   `X-Frame-Options: DENY` for older browsers); `Referrer-Policy: no-referrer` (dashboard
//!   URLs name private sites); `Cache-Control: no-store`. `nosniff` is added to every answer by
//!   `http::app`.
//! - The two files are compiled into the binary and served with a short cache and `nosniff`.

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;

/// The policy of every HTML page.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const CSS: &str = include_str!("../../../templates/dashboard.css");
const JS: &str = include_str!("../../../templates/dashboard.js");

/// Routes of the pages' static files.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/assets/dashboard.css",
            get(|| async { file(CSS, "text/css; charset=utf-8") }),
        )
        .route(
            "/assets/dashboard.js",
            get(|| async { file(JS, "text/javascript; charset=utf-8") }),
        )
}

fn file(body: &'static str, content_type: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        body,
    )
        .into_response()
}

/// An HTML page with the pages' security headers; a template error is a logged 500.
pub fn html(status: StatusCode, body: Result<String, askama::Error>) -> Response {
    let mut response = match body {
        Ok(body) => (status, Html(body)).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "template failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response()
        }
    };
    let h = response.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

#[cfg(test)]
mod tests {
    #[test]
    fn templates_hold_no_inline_script_or_style() {
        for (name, text) in [
            (
                "layout.html",
                include_str!("../../../templates/layout.html"),
            ),
            (
                "dashboard.html",
                include_str!("../../../templates/dashboard.html"),
            ),
            ("login.html", include_str!("../../../templates/login.html")),
        ] {
            assert!(!text.contains("<style"), "{name} has a <style> element");
            assert!(!text.contains("style="), "{name} has a style attribute");
            // No event handler attributes (`onclick=` and the like).
            let lower = text.to_ascii_lowercase();
            for (i, _) in lower.match_indices(" on") {
                let rest = &lower[i + 3..];
                let word = rest.len()
                    - rest
                        .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                        .len();
                assert!(
                    !(word > 0 && rest[word..].starts_with('=')),
                    "{name} has an event handler attribute"
                );
            }
            for (i, _) in text.match_indices("<script") {
                let tag = &text[i..text[i..].find('>').map_or(text.len(), |e| i + e)];
                assert!(tag.contains("src="), "{name} has an inline script");
            }
        }
    }
}
