//! The browser snippet, embedded in the binary so `tally serve` needs no files beside it.
//!
//! Contract:
//! - `GET /tally.js` is the loader: `text/javascript`, cached briefly (`max-age=300`) so a new
//!   release reaches pages within minutes, with an `ETag` so revalidation costs a 304.
//! - The wasm-bindgen glue and the `.wasm` module are served under their content-hashed names
//!   (`/tally-<hash>.js`, `/tally-<hash>.wasm`, named by `static/manifest.rs`, which
//!   `scripts/build-snippet.sh` writes) with `Cache-Control: public, max-age=31536000,
//!   immutable`; the module as `application/wasm`, which streaming compilation requires.
//! - Every file is embedded as built and precompressed (brotli and gzip, made once by the
//!   build): the answer carries the encoding the request's `Accept-Encoding` prefers (its
//!   q-values honoured; on a tie brotli, then gzip, then the identity), `Content-Encoding`
//!   when compressed, and `Vary: Accept-Encoding` always, so caches keep the encodings apart.
//!   The loader's `ETag` names the representation (one per encoding).
//! - Every snippet answer carries `Access-Control-Allow-Origin: *` and
//!   `Cross-Origin-Resource-Policy: cross-origin`: pages on other origins import the glue as a
//!   module and fetch the module in CORS mode. They are public, credential-free files.
//! - The bytes are `include_bytes!` of the committed files in `static/`; `scripts/check-snippet.sh`
//!   proves those are current and that the compressed files decompress to them.

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

/// A content coding the snippet files are stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Brotli,
    Gzip,
    Identity,
}

impl Encoding {
    /// Preference on equal q-values: the smallest first.
    const BY_PREFERENCE: [Encoding; 3] = [Encoding::Brotli, Encoding::Gzip, Encoding::Identity];

    /// The `Content-Encoding` value; `None` for the identity.
    fn header(self) -> Option<&'static str> {
        match self {
            Encoding::Brotli => Some("br"),
            Encoding::Gzip => Some("gzip"),
            Encoding::Identity => None,
        }
    }

    /// Whether `token` (an `Accept-Encoding` coding, case-insensitive) names this coding.
    fn is_named(self, token: &str) -> bool {
        match self {
            Encoding::Brotli => token.eq_ignore_ascii_case("br"),
            Encoding::Gzip => {
                token.eq_ignore_ascii_case("gzip") || token.eq_ignore_ascii_case("x-gzip")
            }
            Encoding::Identity => token.eq_ignore_ascii_case("identity"),
        }
    }
}

/// The encoding to answer with (RFC 9110 §12.5.3): each coding's q-value is the one its own
/// entry gives, else the `*` entry's, else 0 for br and gzip and, for the identity, the least
/// that is still acceptable (so any accepted coding beats it); the highest q wins, ties go by
/// [`Encoding::BY_PREFERENCE`]. No header means the identity. When
/// every coding is refused the identity is sent anyway (better than a 406 for a script).
fn negotiate(request_headers: &HeaderMap) -> Encoding {
    let mut best = (Encoding::Identity, 0.0_f32);
    for encoding in Encoding::BY_PREFERENCE {
        let mut own = None;
        let mut star = None;
        for value in request_headers.get_all(header::ACCEPT_ENCODING) {
            let Ok(value) = value.to_str() else {
                continue;
            };
            for entry in value.split(',') {
                let mut parts = entry.split(';');
                let token = parts.next().unwrap_or("").trim();
                let q = parts
                    .filter_map(|p| {
                        let (k, v) = p.split_once('=')?;
                        k.trim().eq_ignore_ascii_case("q").then(|| v.trim())
                    })
                    .next()
                    .map_or(1.0, |v| v.parse::<f32>().unwrap_or(0.0));
                if encoding.is_named(token) {
                    own = Some(q);
                } else if token == "*" {
                    star = Some(q);
                }
            }
        }
        // The identity is acceptable unless refused, but any accepted coding beats it.
        let default = if encoding == Encoding::Identity {
            0.001
        } else {
            0.0
        };
        let q = own.or(star).unwrap_or(default);
        if q > best.1 {
            best = (encoding, q);
        }
    }
    best.0
}

/// One snippet file in its three encodings.
struct Asset {
    identity: &'static [u8],
    gzip: &'static [u8],
    brotli: &'static [u8],
    content_type: &'static str,
    cache_control: &'static str,
}

impl Asset {
    fn bytes(&self, encoding: Encoding) -> &'static [u8] {
        match encoding {
            Encoding::Brotli => self.brotli,
            Encoding::Gzip => self.gzip,
            Encoding::Identity => self.identity,
        }
    }
}

const LOADER: Asset = Asset {
    identity: manifest::LOADER,
    gzip: manifest::LOADER_GZ,
    brotli: manifest::LOADER_BR,
    content_type: JAVASCRIPT,
    cache_control: LOADER_CACHE,
};
const GLUE: Asset = Asset {
    identity: manifest::GLUE,
    gzip: manifest::GLUE_GZ,
    brotli: manifest::GLUE_BR,
    content_type: JAVASCRIPT,
    cache_control: IMMUTABLE_CACHE,
};
const MODULE: Asset = Asset {
    identity: manifest::WASM,
    gzip: manifest::WASM_GZ,
    brotli: manifest::WASM_BR,
    content_type: WASM,
    cache_control: IMMUTABLE_CACHE,
};

/// The loader's `ETag` in each encoding: a hash of those bytes, computed at compile time.
const LOADER_ETAGS: [&str; 3] = [
    etag(&LOADER_ETAG_BYTES[0]),
    etag(&LOADER_ETAG_BYTES[1]),
    etag(&LOADER_ETAG_BYTES[2]),
];
const LOADER_ETAG_BYTES: [[u8; 18]; 3] = [
    quoted_hex(fnv1a(manifest::LOADER_BR)),
    quoted_hex(fnv1a(manifest::LOADER_GZ)),
    quoted_hex(fnv1a(manifest::LOADER)),
];

const fn etag(hex: &'static [u8; 18]) -> &'static str {
    match std::str::from_utf8(hex) {
        Ok(s) => s,
        Err(_) => panic!("hex is ASCII"),
    }
}

fn loader_etag(encoding: Encoding) -> &'static str {
    match encoding {
        Encoding::Brotli => LOADER_ETAGS[0],
        Encoding::Gzip => LOADER_ETAGS[1],
        Encoding::Identity => LOADER_ETAGS[2],
    }
}

/// Routes for `/tally.js` and the two content-hashed snippet files.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/tally.js", get(loader))
        .route(
            &format!("/{}", manifest::GLUE_NAME),
            get(|headers: HeaderMap| async move { file(&GLUE, negotiate(&headers)) }),
        )
        .route(
            &format!("/{}", manifest::WASM_NAME),
            get(|headers: HeaderMap| async move { file(&MODULE, negotiate(&headers)) }),
        )
}

async fn loader(request_headers: HeaderMap) -> Response {
    let encoding = negotiate(&request_headers);
    let tag = loader_etag(encoding);
    let fresh = request_headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag || t.trim() == "*"));
    let mut response = if fresh {
        let mut r = StatusCode::NOT_MODIFIED.into_response();
        let headers = r.headers_mut();
        headers.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static(LOADER_CACHE),
        );
        headers.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
        shared_headers(headers);
        r
    } else {
        file(&LOADER, encoding)
    };
    response
        .headers_mut()
        .insert(header::ETAG, HeaderValue::from_static(tag));
    response
}

fn file(asset: &Asset, encoding: Encoding) -> Response {
    let mut response = asset.bytes(encoding).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(asset.cache_control),
    );
    if let Some(coding) = encoding.header() {
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static(coding));
    }
    headers.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
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

    /// What Chromium sends over HTTPS.
    const BROWSER: &str = "gzip, deflate, br, zstd";

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

    async fn body(r: Response) -> Vec<u8> {
        to_bytes(r.into_body(), usize::MAX)
            .await
            .expect("body")
            .to_vec()
    }

    fn accept(value: &str) -> Encoding {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_str(value).expect("header"),
        );
        negotiate(&headers)
    }

    #[test]
    fn negotiation_prefers_brotli_then_gzip_and_honours_q_values() {
        assert_eq!(negotiate(&HeaderMap::new()), Encoding::Identity);
        assert_eq!(accept(BROWSER), Encoding::Brotli);
        // Chromium over plain http:// offers no br.
        assert_eq!(accept("gzip, deflate"), Encoding::Gzip);
        assert_eq!(accept("x-gzip"), Encoding::Gzip);
        assert_eq!(accept("GZIP;Q=0.5, BR;q=0.4"), Encoding::Gzip);
        assert_eq!(accept("br;q=0, gzip;q=0"), Encoding::Identity);
        assert_eq!(accept("br;q=0, *"), Encoding::Gzip, "* covers gzip");
        assert_eq!(accept("*"), Encoding::Brotli);
        assert_eq!(accept("identity"), Encoding::Identity);
        assert_eq!(accept("deflate, zstd"), Encoding::Identity);
        assert_eq!(accept("br;q=nonsense, gzip"), Encoding::Gzip);
        assert_eq!(
            accept("identity;q=0, *;q=0"),
            Encoding::Identity,
            "nothing acceptable: the identity anyway"
        );
        // Values spread over several header lines count together.
        let mut headers = HeaderMap::new();
        headers.append(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        headers.append(header::ACCEPT_ENCODING, HeaderValue::from_static("br"));
        assert_eq!(negotiate(&headers), Encoding::Brotli);
    }

    #[tokio::test]
    async fn every_file_is_served_in_the_negotiated_encoding_with_vary_and_its_caching() {
        let files = [
            ("/tally.js".to_owned(), &LOADER),
            (format!("/{}", manifest::GLUE_NAME), &GLUE),
            (format!("/{}", manifest::WASM_NAME), &MODULE),
        ];
        for (path, asset) in files {
            for (accept, coding) in [(BROWSER, "br"), ("gzip, deflate", "gzip"), ("", "")] {
                let r = get_path(&path, &[("accept-encoding", accept)]).await;
                assert_eq!(r.status(), StatusCode::OK, "{path} {accept}");
                assert_eq!(header(&r, "content-encoding"), coding, "{path} {accept}");
                assert_eq!(header(&r, "vary"), "Accept-Encoding", "{path}");
                assert_eq!(header(&r, "content-type"), asset.content_type);
                assert_eq!(header(&r, "cache-control"), asset.cache_control);
                assert_eq!(header(&r, "access-control-allow-origin"), "*");
                let sent = body(r).await;
                // The embedded file of that encoding (scripts/check-snippet.sh proves each
                // decompresses to the file itself).
                let want = match coding {
                    "br" => asset.brotli,
                    "gzip" => {
                        assert_eq!(&sent[..2], b"\x1f\x8b", "{path}: a gzip stream");
                        asset.gzip
                    }
                    _ => asset.identity,
                };
                assert_eq!(sent, want, "{path} {accept}");
                assert!(sent.len() <= asset.identity.len(), "{path} {accept}");
            }
        }
    }

    #[tokio::test]
    async fn loader_is_javascript_with_a_short_cache_and_an_etag_per_encoding() {
        let r = get_path("/tally.js", &[]).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "content-type"), JAVASCRIPT);
        assert_eq!(header(&r, "cache-control"), LOADER_CACHE);
        let etag = header(&r, "etag").to_owned();
        let bytes = body(r).await;
        assert_eq!(&bytes[..], manifest::LOADER);
        // The loader names the other two files.
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains(manifest::GLUE_NAME) && text.contains(manifest::WASM_NAME));

        let again = get_path("/tally.js", &[("if-none-match", &etag)]).await;
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(header(&again, "vary"), "Accept-Encoding");
        assert_eq!(header(&again, "cache-control"), LOADER_CACHE);
        let other = get_path("/tally.js", &[("if-none-match", "\"nope\"")]).await;
        assert_eq!(other.status(), StatusCode::OK);

        // Each representation has its own validator.
        let br = get_path("/tally.js", &[("accept-encoding", BROWSER)]).await;
        let br_tag = header(&br, "etag").to_owned();
        assert_ne!(br_tag, etag);
        let revalidated = get_path(
            "/tally.js",
            &[("accept-encoding", BROWSER), ("if-none-match", &br_tag)],
        )
        .await;
        assert_eq!(revalidated.status(), StatusCode::NOT_MODIFIED);
        let switched = get_path(
            "/tally.js",
            &[("accept-encoding", "gzip"), ("if-none-match", &br_tag)],
        )
        .await;
        assert_eq!(
            switched.status(),
            StatusCode::OK,
            "a gzip client gets gzip bytes"
        );
        assert_eq!(header(&switched, "content-encoding"), "gzip");
    }

    #[tokio::test]
    async fn other_hashes_are_not_served() {
        let r = get_path("/tally-000000000000.wasm", &[]).await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn etags_are_quoted_hex() {
        for tag in LOADER_ETAGS {
            assert_eq!(tag.len(), 18);
            assert!(tag.starts_with('"') && tag.ends_with('"'));
        }
        assert_eq!(&quoted_hex(0xabc), b"\"0000000000000abc\"");
    }
}
