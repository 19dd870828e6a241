//! The hostile client's request floods. Each [`Kind`] is a loop over one keep-alive connection
//! from an attacker address, sending its request as fast as answers come back until the
//! deadline (every request bounded by [`REQUEST_TIMEOUT`]), and tallying the answers.
//!
//! What each kind tries: `ua-rotation` valid hits with a new user agent each (a limit keyed by
//! user agent never bites); `random-sites` a new site id each (auto-sites creates sites);
//! `long-paths` a 1 KiB path and a 1 KiB referrer each; `batches` full batches of 500 valid
//! records; `huge-4mib` a 4 MiB body of `{"events":[{"a":[]},…]}`; `huge-parse` the same
//! shape just under the collector's batch byte limit (so it is read and parsed, not refused by
//! size); `badge` and `pixel` counting GETs for random sites and pages with rotating agents.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;

use crate::client::{self, ConnectError, Failure};
use crate::rng::Rng;

/// Longest wait for one hostile answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const RECONNECT_PAUSE: Duration = Duration::from_millis(20);
/// Bytes of the exactly-4-MiB body.
const FOUR_MIB: usize = 4 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    UaRotation,
    RandomSites,
    LongPaths,
    Batches,
    #[value(name = "huge-4mib")]
    Huge4Mib,
    HugeParse,
    Badge,
    Pixel,
}

impl Kind {
    pub const ALL: [Kind; 8] = [
        Kind::UaRotation,
        Kind::RandomSites,
        Kind::LongPaths,
        Kind::Batches,
        Kind::Huge4Mib,
        Kind::HugeParse,
        Kind::Badge,
        Kind::Pixel,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::UaRotation => "ua-rotation",
            Kind::RandomSites => "random-sites",
            Kind::LongPaths => "long-paths",
            Kind::Batches => "batches",
            Kind::Huge4Mib => "huge-4mib",
            Kind::HugeParse => "huge-parse",
            Kind::Badge => "badge",
            Kind::Pixel => "pixel",
        }
    }

    /// Workers of this kind, given the per-kind count (the huge bodies get half).
    pub fn workers(self, per_kind: usize) -> usize {
        match self {
            Kind::Huge4Mib | Kind::HugeParse => per_kind.div_ceil(2),
            _ => per_kind,
        }
    }
}

/// Answers of one kind.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    pub sent: u64,
    pub ok: u64,
    pub too_many: u64,
    pub too_large: u64,
    pub other_4xx: u64,
    pub unavailable: u64,
    pub other_5xx: u64,
    pub other: u64,
    pub refused: u64,
    pub connect_failed: u64,
    pub closed: u64,
    pub timeouts: u64,
    /// Records the answers say were stored.
    pub stored: u64,
    /// Error codes of the 4xx/5xx answers (`{"error": code}`), by count.
    pub codes: BTreeMap<String, u64>,
}

impl Tally {
    pub fn add(&mut self, o: &Tally) {
        self.sent += o.sent;
        self.ok += o.ok;
        self.too_many += o.too_many;
        self.too_large += o.too_large;
        self.other_4xx += o.other_4xx;
        self.unavailable += o.unavailable;
        self.other_5xx += o.other_5xx;
        self.other += o.other;
        self.refused += o.refused;
        self.connect_failed += o.connect_failed;
        self.closed += o.closed;
        self.timeouts += o.timeouts;
        self.stored += o.stored;
        for (code, n) in &o.codes {
            *self.codes.entry(code.clone()).or_default() += n;
        }
    }

    fn answer(&mut self, status: u16) {
        match status {
            200..=299 => self.ok += 1,
            429 => self.too_many += 1,
            413 => self.too_large += 1,
            400..=499 => self.other_4xx += 1,
            503 => self.unavailable += 1,
            500..=599 => self.other_5xx += 1,
            _ => self.other += 1,
        }
    }
}

/// Bodies built once and shared by the workers.
pub struct Payloads {
    four_mib: Bytes,
    under_limit: Bytes,
}

impl Default for Payloads {
    fn default() -> Self {
        Self {
            four_mib: empty_records(FOUR_MIB),
            // Just under the collector's limit, so it is read and parsed.
            under_limit: empty_records(tally_wire::MAX_BATCH_BYTES.min(FOUR_MIB) - 16),
        }
    }
}

/// `{"events":[{"a":[]},{"a":[]},…]}` of exactly `len` bytes (padded with spaces).
fn empty_records(len: usize) -> Bytes {
    const HEAD: &str = r#"{"events":["#;
    const RECORD: &str = r#"{"a":[]}"#;
    let mut s = String::with_capacity(len);
    s.push_str(HEAD);
    s.push_str(RECORD);
    while s.len() + 1 + RECORD.len() + 2 <= len {
        s.push(',');
        s.push_str(RECORD);
    }
    s.push_str("]}");
    while s.len() < len {
        s.push(' ');
    }
    Bytes::from(s)
}

/// One worker: floods with `kind` from `source` until `deadline`.
pub async fn worker(
    kind: Kind,
    addr: SocketAddr,
    source: IpAddr,
    deadline: Instant,
    seed: u64,
    payloads: std::sync::Arc<Payloads>,
) -> Tally {
    let mut tally = Tally::default();
    let mut rng = Rng::new(seed);
    let host = addr.to_string();
    let mut conn: Option<client::Conn> = None;
    while Instant::now() < deadline {
        if conn.is_none() {
            match client::connect(addr, Some(source)).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    match e {
                        ConnectError::Refused => tally.refused += 1,
                        _ => tally.connect_failed += 1,
                    }
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                    continue;
                }
            }
        }
        let Some(open) = conn.as_mut() else { continue };
        let req = request(kind, &mut rng, &host, &payloads);
        tally.sent += 1;
        match open.send(req, REQUEST_TIMEOUT).await {
            Ok(answer) => {
                tally.answer(answer.status);
                if (200..300).contains(&answer.status) {
                    tally.stored += stored(kind, &answer);
                } else {
                    let code = serde_json::from_slice::<tally_wire::ErrorBody>(&answer.body)
                        .map_or_else(|_| format!("http_{}", answer.status), |e| e.error);
                    *tally.codes.entry(code).or_default() += 1;
                }
            }
            Err(Failure::Timeout) => {
                tally.timeouts += 1;
                conn = None;
            }
            Err(Failure::Closed) => {
                tally.closed += 1;
                conn = None;
            }
        }
    }
    tally
}

fn stored(kind: Kind, answer: &client::Answer) -> u64 {
    match kind {
        Kind::Badge | Kind::Pixel => u64::from(answer.tally_status.as_deref() == Some("accepted")),
        Kind::Batches | Kind::Huge4Mib | Kind::HugeParse => {
            serde_json::from_slice::<tally_wire::BatchResponse>(&answer.body)
                .map(|b| {
                    b.results
                        .iter()
                        .filter(|r| r.status == tally_wire::Status::Accepted)
                        .count() as u64
                })
                .unwrap_or(0)
        }
        _ => u64::from(crate::drive::accepted(&answer.body)),
    }
}

/// A desktop-looking user agent, different on (almost) every call.
fn rotating_ua(rng: &mut Rng) -> String {
    format!(
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) \
         Chrome/{}.0.{}.{} Safari/537.36",
        90 + rng.below(50),
        rng.below(10_000),
        rng.below(1_000)
    )
}

fn hit(rng: &mut Rng, site: &str, url: &str, referrer: Option<&str>) -> String {
    let referrer = referrer.map_or("null".to_owned(), |r| format!("\"{r}\""));
    format!(
        r#"{{"site":"{site}","type":"pageview","event_id":"{}","visitor_id":"{}","url":"{url}","referrer":{referrer}}}"#,
        uuid::Uuid::now_v7(),
        rng.uuid_v4()
    )
}

fn request(kind: Kind, rng: &mut Rng, host: &str, payloads: &Payloads) -> Request<Full<Bytes>> {
    let ua = rotating_ua(rng);
    let post = |path: &str, body: Bytes| {
        client::post(
            path,
            &[
                ("host", host),
                ("content-type", "text/plain;charset=UTF-8"),
                ("user-agent", &ua),
                ("origin", "https://bench.example"),
            ],
            body,
        )
    };
    match kind {
        Kind::UaRotation => {
            let url = format!("https://bench.example/posts/{}", rng.below(250));
            post("/api/v1/hit", Bytes::from(hit(rng, "bench", &url, None)))
        }
        Kind::RandomSites => {
            let site = format!("s{}", rng.slug(16));
            let url = format!("https://{site}.example/{}", rng.slug(8));
            post("/api/v1/hit", Bytes::from(hit(rng, &site, &url, None)))
        }
        Kind::LongPaths => {
            // Both at the collector's 1 KiB limits (path; referrer URL), so they are stored.
            let url = format!("https://bench.example/{}", rng.slug(1023));
            let referrer = format!("https://ref.example/{}", rng.slug(1004));
            post(
                "/api/v1/hit",
                Bytes::from(hit(rng, "bench", &url, Some(&referrer))),
            )
        }
        Kind::Batches => {
            let records: Vec<String> = (0..tally_wire::MAX_BATCH_RECORDS)
                .map(|_| {
                    let url = format!("https://bench.example/{}", rng.slug(12));
                    hit(rng, "bench", &url, None)
                })
                .collect();
            let body = format!(r#"{{"events":[{}]}}"#, records.join(","));
            post("/api/v1/events", Bytes::from(body))
        }
        Kind::Huge4Mib => post("/api/v1/events", payloads.four_mib.clone()),
        Kind::HugeParse => post("/api/v1/events", payloads.under_limit.clone()),
        Kind::Badge => client::get(
            &format!("/badge/b{}.svg?page=/{}", rng.slug(12), rng.slug(24)),
            &[("host", host), ("user-agent", &ua)],
        ),
        Kind::Pixel => client::get(
            &format!(
                "/api/v1/pixel.gif?site=p{}&page=/{}",
                rng.slug(12),
                rng.slug(24)
            ),
            &[("host", host), ("user-agent", &ua)],
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_record_bodies_have_the_asked_length_and_parse() {
        for len in [100, 4096, 10_001] {
            let body = empty_records(len);
            assert_eq!(body.len(), len);
            let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
            assert!(v["events"].as_array().expect("array").len() > 5);
        }
    }

    #[test]
    fn every_hostile_hit_is_valid_json_under_the_hit_limit() {
        let mut rng = Rng::new(1);
        let referrer = format!("https://ref.example/{}", rng.slug(1004));
        let url = format!("https://bench.example/{}", rng.slug(1023));
        let body = hit(&mut rng, "bench", &url, Some(&referrer));
        assert!(body.len() < tally_wire::MAX_HIT_BYTES);
        let h: tally_wire::Hit = serde_json::from_str(&body).expect("hit");
        assert_eq!(h.url.len(), url.len());
        assert_eq!(h.referrer.map(|r| r.len()), Some(1024));
        assert_eq!(url.len() - "https://bench.example".len(), 1024);
    }
}
