//! Response compression: gzip or brotli, chosen by the request's `Accept-Encoding` (brotli
//! preferred at equal weight), with `Vary: Accept-Encoding` on every answer that could be
//! compressed.
//!
//! Contract:
//! - Only text answers are compressed — HTML, JSON, SVG, the metrics text formats, and
//!   JS/wasm/CSS that arrive without an encoding — and only bodies of a known size from
//!   [`MIN_BYTES`] to [`MAX_BYTES`] (smaller ones would not shrink; every answer of this
//!   server is built in memory, far below the upper bound). A response that already carries
//!   `Content-Encoding` (the precompressed snippet files) or a `Content-Range` passes through
//!   untouched, so nothing is compressed twice.
//! - Memory is bounded whatever clients do: a body is compressed whole, at once, by one of at
//!   most [`ENCODERS`] encoders, and the encoder is freed before the first byte is sent. An
//!   answer a client does not read (a stalled socket, an HTTP/2 stream whose window stays
//!   shut) holds only its compressed bytes, never an encoder's state: a streaming encoder per
//!   answer in flight cost megabytes each.
//! - Brotli runs at quality 4 with a 1 MiB window (nginx's and tower-http's level for
//!   on-the-fly brotli), gzip at level 5: a dashboard page costs well under a millisecond.

use std::io::Write;

use axum::body::{Body, HttpBody};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

/// Bodies shorter than this are sent as they are.
pub const MIN_BYTES: u64 = 256;
/// Bodies longer than this are sent as they are (none of this server's answers comes near).
pub const MAX_BYTES: u64 = 8 * 1024 * 1024;
/// Encoders at work at once, in the whole process; a request beyond waits for one.
pub const ENCODERS: usize = 4;

/// The process's encoders.
static ENCODER_PERMITS: Semaphore = Semaphore::const_new(ENCODERS);

/// Brotli quality and window (log2 bytes).
const BROTLI_QUALITY: u32 = 4;
const BROTLI_WINDOW: u32 = 20;
/// gzip level.
const GZIP_LEVEL: u32 = 5;

/// Media types worth compressing (matched as prefixes of `Content-Type`).
const COMPRESSIBLE: [&str; 9] = [
    "text/html",
    "text/plain",
    "text/css",
    "application/json",
    "application/javascript",
    "text/javascript",
    "application/wasm",
    "image/svg+xml",
    "application/openmetrics-text",
];

/// A content coding this server produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Coding {
    Brotli,
    Gzip,
}

impl Coding {
    fn name(self) -> &'static str {
        match self {
            Coding::Brotli => "br",
            Coding::Gzip => "gzip",
        }
    }

    /// `body`, compressed whole.
    fn encode(self, body: &[u8]) -> std::io::Result<Vec<u8>> {
        let out = Vec::with_capacity(body.len() / 3);
        match self {
            Coding::Brotli => {
                let mut w = brotli::CompressorWriter::new(out, 4096, BROTLI_QUALITY, BROTLI_WINDOW);
                w.write_all(body)?;
                w.flush()?;
                Ok(w.into_inner())
            }
            Coding::Gzip => {
                let mut w =
                    flate2::write::GzEncoder::new(out, flate2::Compression::new(GZIP_LEVEL));
                w.write_all(body)?;
                w.finish()
            }
        }
    }
}

/// The coding a request accepts best: by `q` weight, brotli before gzip at equal weight, none
/// when neither is accepted (`q=0` refuses; `*` stands for any coding not named).
fn preferred(headers: &HeaderMap) -> Option<Coding> {
    let (mut br, mut gzip, mut any) = (None::<f32>, None::<f32>, None::<f32>);
    for value in headers.get_all(header::ACCEPT_ENCODING) {
        let Ok(value) = value.to_str() else { continue };
        for item in value.split(',') {
            let mut parts = item.split(';');
            let name = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.trim().strip_prefix("q=").or(p.trim().strip_prefix("Q=")))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0)
                .clamp(0.0, 1.0);
            match name.as_str() {
                "br" => br = Some(q),
                "gzip" | "x-gzip" => gzip = Some(q),
                "*" => any = Some(q),
                _ => {}
            }
        }
    }
    let br = br.or(any).unwrap_or(0.0);
    let gzip = gzip.or(any).unwrap_or(0.0);
    if br > 0.0 && br >= gzip {
        Some(Coding::Brotli)
    } else if gzip > 0.0 {
        Some(Coding::Gzip)
    } else {
        None
    }
}

/// Whether a response's media type is one we compress.
fn compressible(headers: &HeaderMap) -> bool {
    let Some(ct) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let ct = ct.trim_start().to_ascii_lowercase();
    COMPRESSIBLE.iter().any(|t| ct.starts_with(t))
}

/// Add `Accept-Encoding` to the answer's `Vary` unless it is there.
fn vary_on_encoding(headers: &mut HeaderMap) {
    let varies = headers.get_all(header::VARY).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|t| t.trim() == "*" || t.trim().eq_ignore_ascii_case("accept-encoding"))
        })
    });
    if !varies {
        headers.append(header::VARY, HeaderValue::from_static("accept-encoding"));
    }
}

/// The middleware [`super::app`] wraps every route in.
pub async fn compress(request: Request, next: Next) -> Response {
    let coding = preferred(request.headers());
    let head = request.method() == Method::HEAD;
    let mut response = next.run(request).await;
    let headers = response.headers();
    if !compressible(headers)
        || headers.contains_key(header::CONTENT_ENCODING)
        || headers.contains_key(header::CONTENT_RANGE)
    {
        return response;
    }
    vary_on_encoding(response.headers_mut());
    let status = response.status();
    let size = response.body().size_hint().exact();
    let Some(coding) = coding else {
        return response;
    };
    if head
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
        || status.is_informational()
        || !size.is_some_and(|s| (MIN_BYTES..=MAX_BYTES).contains(&s))
    {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(plain) = axum::body::to_bytes(body, MAX_BYTES as usize).await else {
        // An in-memory body cannot fail; if one ever does, the answer is lost either way.
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let compressed = {
        let Ok(_permit) = ENCODER_PERMITS.acquire().await else {
            return Response::from_parts(parts, Body::from(plain));
        };
        coding.encode(&plain)
    };
    match compressed {
        Ok(compressed) if compressed.len() < plain.len() => {
            parts.headers.insert(
                header::CONTENT_ENCODING,
                HeaderValue::from_static(coding.name()),
            );
            parts.headers.remove(header::CONTENT_LENGTH);
            parts.headers.remove(header::ACCEPT_RANGES);
            Response::from_parts(parts, Body::from(compressed))
        }
        _ => Response::from_parts(parts, Body::from(plain)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &str) -> Option<Coding> {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_str(value).expect("value"),
        );
        preferred(&headers)
    }

    #[test]
    fn the_coding_follows_the_weights() {
        assert_eq!(accept("gzip, deflate, br, zstd"), Some(Coding::Brotli));
        assert_eq!(accept("gzip"), Some(Coding::Gzip));
        assert_eq!(accept("br;q=0.5, gzip;q=0.8"), Some(Coding::Gzip));
        assert_eq!(accept("br;q=0, gzip;q=0"), None);
        assert_eq!(accept("identity"), None);
        assert_eq!(accept("*"), Some(Coding::Brotli));
        assert_eq!(accept("*;q=0.1, br;q=0"), Some(Coding::Gzip));
        assert_eq!(accept("deflate"), None);
        assert_eq!(preferred(&HeaderMap::new()), None);
    }

    #[test]
    fn both_codings_decode_to_the_input() {
        let page = "<p>tally</p>".repeat(500);
        let br = Coding::Brotli.encode(page.as_bytes()).expect("br");
        let mut plain = Vec::new();
        brotli::BrotliDecompress(&mut &br[..], &mut plain).expect("decode");
        assert_eq!(plain, page.as_bytes());
        let gz = Coding::Gzip.encode(page.as_bytes()).expect("gzip");
        let mut plain = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut plain)
            .expect("decode");
        assert_eq!(plain, page.as_bytes());
        assert!(br.len() < page.len() / 10 && gz.len() < page.len() / 10);
    }
}
