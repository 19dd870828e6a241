//! What legitimate traffic looks like: the hits a driver sends, one [`Step`] at a time.
//!
//! The **realistic** mix (the default) models a day of a small site: `visitors` distinct
//! visitor ids (UUIDs, as the script keeps them) and `pages` pages whose popularity follows a
//! Zipf law (weight 1/rank^s, s ≈ 1). Visitors come in visits of 1–8 page views; a view
//! prefers a page its visitor has not seen yet (up to eight redraws), so most views are a new
//! (visitor, page) pair of the day — the expensive case for the store. A share of the hits are
//! resends of an earlier hit of the same visit, byte for byte (a retried beacon: same event
//! id), so that `duplicates` % of all requests are duplicates. Visits arrive from an external
//! referrer (`referred` %) or directly; later views of a visit carry the previous page as
//! referrer; some URLs carry a campaign query. Requests carry a desktop browser's headers.
//!
//! The **cache** mix is the earlier, cache-friendly one: one visitor per connection, 50 pages
//! in turn, no referrers, duplicates from a ring of recent ids.
//!
//! Connections share nothing while generating: each owns the visitors `i ≡ conn (mod conns)`.

use std::sync::Arc;

use bytes::Bytes;
use clap::{Args, ValueEnum};

use crate::rng::Rng;

/// The site id of all legitimate traffic.
pub const SITE: &str = "bench";
/// The origin of all legitimate traffic.
pub const ORIGIN: &str = "https://bench.example";
/// A current desktop browser.
pub const DESKTOP_UA: &str = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36";
/// The user agent of the cache mix (unchanged from earlier runs).
pub const CACHE_UA: &str = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0 Safari/537.36";

const EXTERNAL_REFERRERS: &[&str] = &[
    "https://www.google.com/",
    "https://duckduckgo.com/",
    "https://www.bing.com/",
    "https://news.ycombinator.com/",
    "https://lobste.rs/",
    "https://www.reddit.com/r/rust/",
    "https://t.co/",
    "https://github.com/",
    "https://mastodon.social/",
    "https://www.linkedin.com/",
];
/// Views per visit, drawn uniformly: half the visits bounce (mean 2.2).
const VISIT_LENGTHS: &[u32] = &[1, 1, 1, 1, 1, 2, 2, 3, 4, 6];
/// Draws of a page before a view settles for one its visitor has already seen.
const REDRAWS: u32 = 8;
/// Share of views whose URL carries a campaign query (the page key drops it).
const QUERY_SHARE: f64 = 0.1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MixKind {
    /// Many visitors, Zipf pages, mostly new (visitor, page) pairs, referrers.
    Realistic,
    /// One visitor per connection, 50 pages in turn (the earlier benchmark).
    Cache,
}

/// The traffic mix options shared by every mode.
#[derive(Debug, Clone, Args)]
pub struct MixArgs {
    /// Traffic mix.
    #[arg(long, value_enum, default_value_t = MixKind::Realistic)]
    pub mix: MixKind,
    /// Distinct visitors (realistic mix).
    #[arg(long, default_value_t = 10_000)]
    pub visitors: usize,
    /// Distinct pages (realistic mix).
    #[arg(long, default_value_t = 250)]
    pub pages: usize,
    /// Zipf exponent of page popularity (realistic mix).
    #[arg(long, default_value_t = 1.0)]
    pub zipf: f64,
    /// Percentage of requests that resend an earlier hit (same event id).
    #[arg(long, default_value_t = 25)]
    pub duplicates: u64,
    /// Percentage of visits that arrive from an external referrer (realistic mix).
    #[arg(long, default_value_t = 40)]
    pub referred: u64,
    /// Seed of the mix (visitor ids, pages, choices); event ids are always fresh UUIDv7s.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// The fixed parts of a mix, shared by all connections of one drive.
pub struct Plan {
    pub args: MixArgs,
    visitors: Vec<String>,
    /// Page URLs without query, most popular first.
    pages: Vec<String>,
    /// Cumulative Zipf weights, normalised to end at 1.
    cdf: Vec<f64>,
}

impl Plan {
    /// `salt` varies the visitor ids (a warm-up must not pre-create the measured pairs).
    pub fn new(args: &MixArgs, salt: u64) -> Arc<Self> {
        let mut rng = Rng::new(args.seed ^ salt.wrapping_mul(0x2545_F491_4F6C_DD1D));
        let visitors = (0..args.visitors.max(1)).map(|_| rng.uuid_v4()).collect();
        let n = args.pages.max(1);
        let pages = (0..n)
            .map(|k| {
                let words = 1 + rng.index(3);
                let title: Vec<String> = (0..words)
                    .map(|_| {
                        let len = 3 + rng.index(6);
                        rng.slug(len)
                    })
                    .collect();
                format!("{ORIGIN}/posts/{k}-{}", title.join("-"))
            })
            .collect();
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|rank| {
                acc += 1.0 / (rank as f64).powf(args.zipf);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Arc::new(Self {
            args: args.clone(),
            visitors,
            pages,
            cdf,
        })
    }

    fn zipf_page(&self, rng: &mut Rng) -> usize {
        let u = rng.unit();
        self.cdf
            .partition_point(|c| *c < u)
            .min(self.pages.len() - 1)
    }
}

/// One request of legitimate traffic.
#[derive(Clone)]
pub struct Step {
    /// Index of the visitor (the driver may give each visitor its own source address).
    pub visitor: usize,
    pub body: Bytes,
    /// The page the hit is sent from (the `Referer` header of the request).
    pub page_url: String,
    /// A resend of an earlier hit.
    pub resend: bool,
    /// A fresh view of a (visitor, page) pair this run had not sent before.
    pub new_pair: bool,
    /// The hit names a referrer: another site's, or the previous page of the visit.
    pub referrer: Referrer,
}

/// Where a view came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Referrer {
    None,
    External,
    Internal,
}

/// The hit body as the browser client sends it (with the screen width it reports).
pub fn hit_body(event_id: &str, visitor: &str, url: &str, referrer: Option<&str>) -> Bytes {
    let referrer = match referrer {
        Some(r) => format!("\"{r}\""),
        None => "null".to_owned(),
    };
    Bytes::from(format!(
        r#"{{"site":"{SITE}","type":"pageview","event_id":"{event_id}","visitor_id":"{visitor}","url":"{url}","referrer":{referrer},"screen_width":1920}}"#
    ))
}

/// Generates one connection's requests.
pub enum Generator {
    Realistic(Box<Realistic>),
    Cache(Cache),
}

impl Generator {
    pub fn new(plan: Arc<Plan>, conn: usize, conns: usize) -> Self {
        match plan.args.mix {
            MixKind::Realistic => Generator::Realistic(Box::new(Realistic::new(plan, conn, conns))),
            MixKind::Cache => Generator::Cache(Cache::new(&plan, conn)),
        }
    }

    pub fn next_step(&mut self) -> Step {
        match self {
            Generator::Realistic(g) => g.next_step(),
            Generator::Cache(g) => g.next_step(),
        }
    }
}

pub struct Realistic {
    plan: Arc<Plan>,
    rng: Rng,
    /// The visitors this connection owns.
    owned: Vec<usize>,
    cursor: usize,
    /// Pages seen, one bit per (owned visitor, page).
    seen: Vec<u64>,
    words: usize,
    /// Chance that a fresh view is resent later in its visit.
    resend_chance: f64,
    visit: Visit,
}

#[derive(Default)]
struct Visit {
    /// Position of the visitor in `owned`.
    slot: usize,
    views_left: u32,
    /// The referrer of the next view: the visit's external referrer, then the previous page.
    previous: Option<String>,
    external: bool,
    pending: Vec<Step>,
}

impl Realistic {
    fn new(plan: Arc<Plan>, conn: usize, conns: usize) -> Self {
        let n = plan.visitors.len();
        let mut owned: Vec<usize> = (conn..n).step_by(conns.max(1)).collect();
        if owned.is_empty() {
            owned.push(conn % n);
        }
        let words = plan.pages.len().div_ceil(64);
        let dup = plan.args.duplicates.min(90) as f64 / 100.0;
        let rng = Rng::new(plan.args.seed.wrapping_add(0x9E37 * (conn as u64 + 1)));
        Self {
            seen: vec![0; owned.len() * words],
            owned,
            cursor: 0,
            words,
            // resends / all = q / (1 + q) = dup
            resend_chance: dup / (1.0 - dup),
            visit: Visit::default(),
            plan,
            rng,
        }
    }

    fn next_step(&mut self) -> Step {
        loop {
            let v = &mut self.visit;
            let flush = v.views_left == 0 || self.rng.chance(0.5);
            if flush && !v.pending.is_empty() {
                let i = self.rng.index(v.pending.len());
                return v.pending.swap_remove(i);
            }
            if v.views_left > 0 {
                return self.fresh_view();
            }
            self.start_visit();
        }
    }

    fn start_visit(&mut self) {
        let slot = self.cursor;
        self.cursor = (self.cursor + 1) % self.owned.len();
        let referrer = self
            .rng
            .chance(self.plan.args.referred as f64 / 100.0)
            .then(|| EXTERNAL_REFERRERS[self.rng.index(EXTERNAL_REFERRERS.len())].to_owned());
        self.visit = Visit {
            slot,
            views_left: VISIT_LENGTHS[self.rng.index(VISIT_LENGTHS.len())],
            external: referrer.is_some(),
            previous: referrer,
            pending: Vec::new(),
        };
    }

    fn fresh_view(&mut self) -> Step {
        let slot = self.visit.slot;
        let base = slot * self.words;
        let mut page = self.plan.zipf_page(&mut self.rng);
        let mut tries = 1;
        while self.seen[base + page / 64] & (1 << (page % 64)) != 0 && tries < REDRAWS {
            page = self.plan.zipf_page(&mut self.rng);
            tries += 1;
        }
        let bit = 1u64 << (page % 64);
        let new_pair = self.seen[base + page / 64] & bit == 0;
        self.seen[base + page / 64] |= bit;
        let mut url = self.plan.pages[page].clone();
        if self.rng.chance(QUERY_SHARE) {
            url.push_str("?utm_source=newsletter&utm_medium=email");
        }
        let visitor = self.owned[slot];
        let referrer = self.visit.previous.replace(url.clone());
        let kind = match (&referrer, std::mem::take(&mut self.visit.external)) {
            (None, _) => Referrer::None,
            (Some(_), true) => Referrer::External,
            (Some(_), false) => Referrer::Internal,
        };
        let body = hit_body(
            &uuid::Uuid::now_v7().to_string(),
            &self.plan.visitors[visitor],
            &url,
            referrer.as_deref(),
        );
        let step = Step {
            visitor,
            body,
            page_url: url,
            resend: false,
            new_pair,
            referrer: kind,
        };
        self.visit.views_left -= 1;
        if self.rng.chance(self.resend_chance) {
            self.visit.pending.push(Step {
                resend: true,
                new_pair: false,
                ..step.clone()
            });
        }
        step
    }
}

pub struct Cache {
    visitor: String,
    n: u64,
    dup_pct: u64,
    recent: Vec<Bytes>,
}

impl Cache {
    fn new(plan: &Plan, conn: usize) -> Self {
        Self {
            visitor: uuid::Uuid::new_v4().to_string(),
            n: conn as u64 * 7,
            dup_pct: plan.args.duplicates,
            recent: Vec::new(),
        }
    }

    fn next_step(&mut self) -> Step {
        let n = self.n;
        self.n += 1;
        // Every (100 / dup_pct)-th request repeats a hit this connection sent before.
        let resend = self.dup_pct > 0 && n % 100 < self.dup_pct && !self.recent.is_empty();
        let url = format!("https://bench.example/p{}", n % 50);
        let body = if resend {
            self.recent[(n as usize) % self.recent.len()].clone()
        } else {
            let b = hit_body(&uuid::Uuid::now_v7().to_string(), &self.visitor, &url, None);
            if self.recent.len() < 64 {
                self.recent.push(b.clone());
            } else {
                self.recent[(n as usize) % 64] = b.clone();
            }
            b
        };
        Step {
            visitor: 0,
            body,
            page_url: url,
            resend,
            new_pair: false,
            referrer: Referrer::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(duplicates: u64) -> MixArgs {
        MixArgs {
            mix: MixKind::Realistic,
            visitors: 10_000,
            pages: 250,
            zipf: 1.0,
            duplicates,
            referred: 40,
            seed: 3,
        }
    }

    /// About six fresh views per visitor, as in a 15 s run at ~5k hits/s.
    #[test]
    fn realistic_mix_has_the_promised_shape() {
        let plan = Plan::new(&args(25), 0);
        let mut g = Generator::new(plan, 0, 4);
        let (mut resends, mut new_pairs, mut fresh, mut top) = (0, 0, 0, 0);
        let n = 20_000;
        for _ in 0..n {
            let s = g.next_step();
            if s.resend {
                resends += 1;
            } else {
                fresh += 1;
                new_pairs += u32::from(s.new_pair);
                top += u32::from(s.page_url.contains("/posts/0-"));
            }
        }
        let dup = f64::from(resends) / f64::from(n);
        assert!((0.22..0.28).contains(&dup), "duplicates {dup}");
        assert!(
            f64::from(new_pairs) / f64::from(fresh) > 0.6,
            "new pairs {new_pairs}/{fresh}"
        );
        // Zipf s=1 over 250 pages: rank 1 has ~16 % of the weight (less after redraws).
        let top = f64::from(top) / f64::from(fresh);
        assert!((0.05..0.2).contains(&top), "top page share {top}");
    }

    #[test]
    fn a_resend_repeats_the_bytes_of_an_earlier_hit_of_the_visit() {
        let plan = Plan::new(&args(50), 0);
        let mut g = Generator::new(plan, 1, 4);
        let mut sent = std::collections::HashSet::new();
        for _ in 0..2000 {
            let s = g.next_step();
            if s.resend {
                assert!(sent.contains(&s.body));
            } else {
                assert!(sent.insert(s.body));
            }
        }
    }
}
