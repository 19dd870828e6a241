//! The browser snippet, embedded in the binary so `tally serve` needs no files beside it.
//!
//! Contract:
//! - `GET /tally.js` is the loader: `text/javascript`, cached briefly (`max-age=300`) so a new
//!   release reaches pages within minutes, with an `ETag` so revalidation costs a 304.
//! - The wasm-bindgen glue and the `.wasm` module are served under their content-hashed names
//!   (`/tally-<hash>.js`, `/tally-<hash>.wasm`, named by `static/manifest.rs`, which
//!   `scripts/build-snippet.sh` writes) with `Cache-Control: public, max-age=31536000,
//!   immutable`; the module as `application/wasm`, which streaming compilation requires.
//! - Every snippet answer carries `Access-Control-Allow-Origin: *` and
//!   `Cross-Origin-Resource-Policy: cross-origin`: pages on other origins import the glue as a
//!   module and fetch the module in CORS mode. They are public, credential-free files.
//! - The bytes are `include_bytes!` of the committed files in `static/`; `scripts/check-snippet.sh`
//!   proves those are current.

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

mod manifest {
    include!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../static/manifest.rs"
    ));
}

/// How long browsers may reuse `/tally.js` without asking.
const LOADER_CACHE: &str = "public, max-age=300";
/// The content-hashed files never change under their name.
const IMMUTABLE_CACHE: &str = "public, max-age=31536000, immutable";
const JAVASCRIPT: &str = "text/javascript; charset=utf-8";
const WASM: &str = "application/wasm";

/// The loader's `ETag`: a hash of its bytes, computed at compile time.
const LOADER_ETAG: &str = {
    const HASH: u64 = fnv1a(manifest::LOADER);
    const HEX: [u8; 18] = quoted_hex(HASH);
    match std::str::from_utf8(&HEX) {
        Ok(s) => s,
        Err(_) => panic!("hex is ASCII"),
    }
};

/// Routes for `/tally.js` and the two content-hashed snippet files.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/tally.js", get(loader))
        .route(
            &format!("/{}", manifest::GLUE_NAME),
            get(|| async { file(manifest::GLUE, JAVASCRIPT) }),
        )
        .route(
            &format!("/{}", manifest::WASM_NAME),
            get(|| async { file(manifest::WASM, WASM) }),
        )
}

async fn loader(request_headers: HeaderMap) -> Response {
    let fresh = request_headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|tag| tag.trim() == LOADER_ETAG || tag.trim() == "*")
        });
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        manifest::LOADER.into_response()
    };
    let headers = response.headers_mut();
    if !fresh {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(JAVASCRIPT));
    }
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(LOADER_CACHE),
    );
    headers.insert(header::ETAG, HeaderValue::from_static(LOADER_ETAG));
    shared_headers(headers);
    response
}

fn file(body: &'static [u8], content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(IMMUTABLE_CACHE),
    );
    shared_headers(headers);
    response
}

fn shared_headers(headers: &mut HeaderMap) {
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    headers.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("cross-origin"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
}

/// 64-bit FNV-1a, usable in constants.
const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}

/// `"<16 hex digits>"`, quotes included, as an `ETag` wants.
const fn quoted_hex(mut n: u64) -> [u8; 18] {
    let digits = b"0123456789abcdef";
    let mut out = [b'"'; 18];
    let mut i = 16;
    while i > 0 {
        out[i] = digits[(n & 15) as usize];
        n >>= 4;
        i -= 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::{Body, to_bytes};
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get_path(path: &str, headers: &[(&str, &str)]) -> Response {
        let mut request = Request::get(path);
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        router::<()>()
            .oneshot(request.body(Body::empty()).expect("request"))
            .await
            .expect("infallible")
    }

    fn header<'a>(r: &'a Response, name: &str) -> &'a str {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    #[tokio::test]
    async fn loader_is_javascript_with_a_short_cache_and_an_etag() {
        let r = get_path("/tally.js", &[]).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "content-type"), JAVASCRIPT);
        assert_eq!(header(&r, "cache-control"), LOADER_CACHE);
        assert_eq!(header(&r, "access-control-allow-origin"), "*");
        let etag = header(&r, "etag").to_owned();
        let body = to_bytes(r.into_body(), usize::MAX).await.expect("body");
        assert_eq!(&body[..], manifest::LOADER);
        // The loader names the other two files.
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains(manifest::GLUE_NAME) && text.contains(manifest::WASM_NAME));

        let again = get_path("/tally.js", &[("if-none-match", &etag)]).await;
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        let other = get_path("/tally.js", &[("if-none-match", "\"nope\"")]).await;
        assert_eq!(other.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn wasm_is_application_wasm_and_immutable() {
        let r = get_path(&format!("/{}", manifest::WASM_NAME), &[]).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "content-type"), WASM);
        assert_eq!(header(&r, "cache-control"), IMMUTABLE_CACHE);
        assert_eq!(header(&r, "access-control-allow-origin"), "*");
        let body = to_bytes(r.into_body(), usize::MAX).await.expect("body");
        assert_eq!(&body[..4], b"\0asm");
    }

    #[tokio::test]
    async fn glue_is_immutable_javascript() {
        let r = get_path(&format!("/{}", manifest::GLUE_NAME), &[]).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "content-type"), JAVASCRIPT);
        assert_eq!(header(&r, "cache-control"), IMMUTABLE_CACHE);
        assert_eq!(header(&r, "cross-origin-resource-policy"), "cross-origin");
    }

    #[tokio::test]
    async fn other_hashes_are_not_served() {
        let r = get_path("/tally-000000000000.wasm", &[]).await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn etag_is_quoted_hex() {
        assert_eq!(LOADER_ETAG.len(), 18);
        assert!(LOADER_ETAG.starts_with('"') && LOADER_ETAG.ends_with('"'));
        assert_eq!(&quoted_hex(0xabc), b"\"0000000000000abc\"");
    }
}
