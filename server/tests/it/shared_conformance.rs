//! The shared-state conformance suite: the same checks for every implementation of the live
//! window, the rate limiter, the repeat gate and the site cache (`tally::state`).
//!
//! Every check is a `fn name(state: &impl SharedHarness)` over one fresh shared state; each
//! `handle` call is a new handle on that same state (for a network backend: a new client on
//! the same key prefix, like a second collector), so the checks prove that handles share.
//! `shared_backends!` (at the end) runs every check against every implementation listed
//! there (in-process now; Redis joins here). Time is passed in, never slept.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use tally::core::classify::{Lane, LiveEntry};
use tally::core::day::SiteZone;
use tally::core::ids::{PagePath, SiteId};
use tally::core::net::ClientNet;
use tally::state::limits::{LimitConfig, Refusal};
use tally::state::{LiveState, RateLimiter, RepeatGate, SiteCache};
use tally::store::Site;

/// The settings every check's fresh state is made with.
pub const LIVE_WINDOW_SECS: u32 = 60;
pub const DIRECT_REPEAT_MS: i64 = 30_000;
pub const PROXY_REPEAT_MS: i64 = 1_000;
pub const LIMITS: LimitConfig = LimitConfig {
    per_site_per_minute: 3,
    per_address_per_minute: 5,
    new_sites_per_hour: 2,
    proxy_factor: 10,
};

/// One fresh shared state of an implementation under test.
pub trait SharedHarness: Send + Sync + 'static {
    /// A new, empty state with the settings above; its site cache keeps entries `site_ttl`.
    fn fresh(site_ttl: Duration) -> Self;
    /// Whether the backend can be tested here (a network backend needs its URL in the
    /// environment; without it its checks say so loudly and pass nothing).
    fn available() -> bool {
        true
    }
    fn live(&self) -> Arc<dyn LiveState>;
    fn limiter(&self) -> Arc<dyn RateLimiter>;
    fn repeats(&self) -> Arc<dyn RepeatGate>;
    fn sites(&self) -> Arc<dyn SiteCache>;
}

const T0_MS: i64 = 1_780_000_000_000;

fn site(s: &str) -> SiteId {
    SiteId::parse(s).expect("site")
}

fn page(p: &str) -> PagePath {
    PagePath::parse(p).expect("page")
}

fn net(s: &str) -> ClientNet {
    ClientNet::of(s.parse().expect("ip"))
}

fn at(ms: i64) -> Timestamp {
    Timestamp::from_millisecond(ms).expect("ts")
}

fn entry(s: &str, p: Option<&str>, visitor: u64) -> LiveEntry {
    LiveEntry {
        site: site(s),
        page: p.map(page),
        visitor,
    }
}

/// Distinct visitors over every handle, pages apart from the site, custom events (no page)
/// only on the site; an event leaves the window exactly `window` seconds after its second.
async fn live_window_is_the_union_of_handles(state: &impl SharedHarness) {
    let (a, b) = (state.live(), state.live());
    a.record(&entry("s", Some("/a"), 1), T0_MS).await;
    b.record(&entry("s", Some("/a"), 1), T0_MS + 10).await;
    b.record(&entry("s", Some("/b"), 2), T0_MS + 20).await;
    a.record(&entry("s", None, 3), T0_MS + 30).await;
    a.record(&entry("other", Some("/a"), 9), T0_MS).await;
    let now = T0_MS + 500;
    for h in [&a, &b] {
        let all = h.read(&site("s"), None, now).await;
        assert_eq!((all.events, all.visitors), (4, 3));
        let pa = h.read(&site("s"), Some(&page("/a")), now).await;
        assert_eq!((pa.events, pa.visitors), (2, 1));
        let pb = h.read(&site("s"), Some(&page("/b")), now).await;
        assert_eq!((pb.events, pb.visitors), (1, 1));
        let none = h.read(&site("s"), Some(&page("/c")), now).await;
        assert_eq!((none.events, none.visitors), (0, 0));
    }
    let window_ms = i64::from(LIVE_WINDOW_SECS) * 1000;
    // T0 lies on a whole second: every event above was in that second.
    let last = T0_MS + window_ms - 1;
    assert_eq!(a.read(&site("s"), None, last).await.events, 4);
    let gone = a.read(&site("s"), None, T0_MS + window_ms).await;
    assert_eq!((gone.events, gone.visitors), (0, 0));
}

/// Many records sent at once through two handles (repeat visitors, three pages, custom events,
/// five successive seconds) give exactly the numbers a model of the window gives, while all of
/// them are in it and after the first seconds have left it.
async fn live_counts_many_concurrent_records_exactly(state: &impl SharedHarness) {
    use std::collections::HashSet;
    let (a, b) = (state.live(), state.live());
    let pages = ["/a", "/b", "/c"];
    // (page or None, visitor, ms)
    let records: Vec<(Option<&str>, u64, i64)> = (0..400u64)
        .map(|i| {
            let page = if i % 10 == 9 {
                None
            } else {
                Some(pages[(i % 3) as usize])
            };
            // Time only moves forward, as a server's clock does (seconds 0..=4 in turn).
            (page, i % 97, T0_MS + (i as i64 / 80) * 1000 + i as i64 % 80)
        })
        .collect();
    let sends = records.iter().enumerate().map(|(i, (p, v, ms))| {
        let h = if i % 2 == 0 { &a } else { &b };
        let e = entry("s", *p, *v);
        async move { h.record(&e, *ms).await }
    });
    futures_util::future::join_all(sends).await;
    let window = i64::from(LIVE_WINDOW_SECS);
    // The model: a record is in the window at `now` while now's second - its second < window.
    let model = |scope: Option<&str>, now: i64| -> (u64, u64) {
        let inside: Vec<_> = records
            .iter()
            .filter(|(p, _, _)| scope.is_none() || *p == scope)
            .filter(|(_, _, ms)| now.div_euclid(1000) - ms.div_euclid(1000) < window)
            .collect();
        let visitors: HashSet<u64> = inside.iter().map(|r| r.1).collect();
        (inside.len() as u64, visitors.len() as u64)
    };
    let early = T0_MS + 5_000;
    // Two seconds of records have left the window, three are still in it.
    let late = T0_MS + window * 1000 + 1_000;
    assert_eq!(model(None, early), (400, 97), "the model itself");
    assert!(model(None, late).0 > 0 && model(None, late).0 < 400);
    for now in [early, late] {
        for h in [&a, &b] {
            let all = h.read(&site("s"), None, now).await;
            assert_eq!(
                (all.events, all.visitors),
                model(None, now),
                "site at {now}"
            );
            for p in pages {
                let n = h.read(&site("s"), Some(&page(p)), now).await;
                assert_eq!((n.events, n.visitors), model(Some(p), now), "{p} at {now}");
            }
        }
    }
}

/// Quotas charged through one handle are charged for all; a refused request charges nothing;
/// more than a burst at once is `Never`; other addresses and the proxy lane are apart.
async fn limits_are_shared_and_all_or_nothing(state: &impl SharedHarness) {
    let (a, b) = (state.limiter(), state.limiter());
    let now = at(T0_MS);
    let me = net("192.0.2.1");
    let (s1, s2) = (site("s1"), site("s2"));
    a.admit(Lane::Direct, me, &s1, 2, now)
        .await
        .expect("2 of 3");
    b.admit(Lane::Direct, me, &s1, 1, now)
        .await
        .expect("3 of 3");
    assert!(matches!(
        a.admit(Lane::Direct, me, &s1, 1, now).await,
        Err(Refusal::Wait(_))
    ));
    // Another site has its own per-site bucket but shares the address bucket (5, 3 used):
    // 3 more are refused whole, then 2 pass.
    assert!(b.admit(Lane::Direct, me, &s2, 3, now).await.is_err());
    b.admit(Lane::Direct, me, &s2, 2, now)
        .await
        .expect("2 more");
    assert!(a.has_room(Lane::Direct, me, now).await.is_err());
    assert_eq!(
        a.admit_many(Lane::Direct, net("192.0.2.2"), &[(&s1, 3), (&s2, 3)], now)
            .await,
        Err(Refusal::Never { allowance: 5 })
    );
    b.has_room(Lane::Direct, net("192.0.2.2"), now)
        .await
        .expect("a refused request charged nothing");
    a.admit(Lane::Proxy, me, &s1, 30, now)
        .await
        .expect("the proxy lane is separate and larger");
    // A minute later the address has its allowance back.
    let later = at(T0_MS + 60_000);
    a.admit(Lane::Direct, me, &s1, 3, later)
        .await
        .expect("refilled");
}

/// New sites per address per hour, shared by the handles; an IPv6 /64 is one address.
async fn new_site_creation_is_limited_per_network(state: &impl SharedHarness) {
    let (a, b) = (state.limiter(), state.limiter());
    let now = at(T0_MS);
    a.admit_new_site(net("2001:db8::1"), now).await.expect("1");
    b.admit_new_site(net("2001:db8::2"), now).await.expect("2");
    assert!(
        a.admit_new_site(net("2001:db8::3"), now).await.is_err(),
        "same /64, over 2 an hour"
    );
    b.admit_new_site(net("2001:db8:0:1::1"), now)
        .await
        .expect("another /64");
}

/// Wrong token guesses: 10 a minute per network across handles (a second collector gives no
/// fresh allowance), then one every 6 s; asking costs nothing; other networks are apart.
async fn wrong_guesses_are_limited_per_network_across_handles(state: &impl SharedHarness) {
    let (a, b) = (state.limiter(), state.limiter());
    let guesser = net("192.0.2.7");
    let now = at(T0_MS);
    for i in 0..tally::state::limits::GUESSES_PER_MINUTE {
        let handle = if i % 2 == 0 { &a } else { &b };
        handle.may_guess(guesser, now).await.expect("guesses left");
        handle
            .may_guess(guesser, now)
            .await
            .expect("asking is free");
        handle.wrong_guess(guesser, now).await;
    }
    for handle in [&a, &b] {
        match handle.may_guess(guesser, now).await {
            Err(Refusal::Wait(wait)) => assert!(
                wait > Duration::ZERO && wait <= Duration::from_secs(6),
                "{wait:?}"
            ),
            other => panic!("out of guesses on every handle: {other:?}"),
        }
    }
    a.may_guess(net("192.0.2.8"), now)
        .await
        .expect("another network");
    b.may_guess(guesser, at(T0_MS + 6_000))
        .await
        .expect("one more after 6 s");
    // Guesses sent at the same instant are all compared before any is charged: each wrong one
    // is still charged, so five more push the next guess 5 × 6 s further back.
    for handle in [&a, &b, &a, &b, &a] {
        handle.wrong_guess(guesser, now).await;
    }
    match b.may_guess(guesser, at(T0_MS + 6_000)).await {
        Err(Refusal::Wait(wait)) => assert!(
            wait > Duration::from_secs(24) && wait <= Duration::from_secs(30),
            "{wait:?}"
        ),
        other => panic!("over-allowance guesses are paid for by waiting: {other:?}"),
    }
}

/// A key counts once per lane interval across handles; lanes are apart; a refused repeat
/// does not extend the interval.
async fn repeat_gate_admits_once_per_interval(state: &impl SharedHarness) {
    let (a, b) = (state.repeats(), state.repeats());
    assert!(a.admit(Lane::Direct, 7, T0_MS).await);
    assert!(!b.admit(Lane::Direct, 7, T0_MS + 1).await);
    assert!(a.admit(Lane::Direct, 8, T0_MS + 1).await, "another key");
    assert!(b.admit(Lane::Proxy, 7, T0_MS + 2).await, "lanes are apart");
    assert!(
        !a.admit(Lane::Proxy, 7, T0_MS + 2 + PROXY_REPEAT_MS - 1)
            .await
    );
    assert!(a.admit(Lane::Proxy, 7, T0_MS + 2 + PROXY_REPEAT_MS).await);
    assert!(!b.admit(Lane::Direct, 7, T0_MS + DIRECT_REPEAT_MS - 1).await);
    assert!(
        b.admit(Lane::Direct, 7, T0_MS + DIRECT_REPEAT_MS).await,
        "measured from the admission, not from the refused repeats"
    );
}

fn a_site(id: &str) -> Site {
    Site {
        id: site(id),
        origins: vec!["https://a.example".into()],
        zone: SiteZone::parse("Europe/Berlin").expect("zone"),
        public: false,
        ingest_key: None,
    }
}

/// A site put through one handle is read through another, as are known-absent ids.
async fn site_cache_shares_sites_and_absences(state: &impl SharedHarness) {
    let (a, b) = (state.sites(), state.sites());
    assert!(a.get(&site("blog")).await.is_none(), "nothing cached yet");
    a.put(&site("blog"), Some(Arc::new(a_site("blog")))).await;
    b.put(&site("gone"), None).await;
    let got = b.get(&site("blog")).await.expect("cached").expect("a site");
    assert_eq!(got.origins, ["https://a.example"]);
    assert_eq!(got.zone.name(), "Europe/Berlin");
    assert!(!got.public);
    assert!(matches!(a.get(&site("gone")).await, Some(None)));
    // Replaced, not merged.
    let mut public = a_site("blog");
    public.public = true;
    b.put(&site("blog"), Some(Arc::new(public))).await;
    assert!(a.get(&site("blog")).await.expect("c").expect("s").public);
}

/// An entry is not served past its time-to-live (here zero: never served from cache).
async fn site_cache_entries_expire(state: &impl SharedHarness) {
    let cache = state.sites();
    cache
        .put(&site("blog"), Some(Arc::new(a_site("blog"))))
        .await;
    assert!(cache.get(&site("blog")).await.is_none());
}

/// Runs every check against one implementation, each on a fresh state.
macro_rules! shared_checks {
    ($harness:ty; $($check:ident: $ttl:expr),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $check() {
            if !<$harness as crate::shared_conformance::SharedHarness>::available() {
                return;
            }
            let state = <$harness as crate::shared_conformance::SharedHarness>::fresh($ttl);
            crate::shared_conformance::$check(&state).await;
        }
    )*};
}

/// One module per implementation, each running the whole suite. Every check is listed here.
macro_rules! shared_backends {
    ($($name:ident => $harness:ty),* $(,)?) => {$(
        mod $name {
            const HOUR: std::time::Duration = std::time::Duration::from_secs(3600);
            shared_checks!($harness;
                live_window_is_the_union_of_handles: HOUR,
                live_counts_many_concurrent_records_exactly: HOUR,
                limits_are_shared_and_all_or_nothing: HOUR,
                new_site_creation_is_limited_per_network: HOUR,
                wrong_guesses_are_limited_per_network_across_handles: HOUR,
                repeat_gate_admits_once_per_interval: HOUR,
                site_cache_shares_sites_and_absences: HOUR,
                site_cache_entries_expire: std::time::Duration::ZERO,
            );
        }
    )*};
}

shared_backends! {
    memory => crate::shared_conformance::in_process::Memory,
    redis => crate::shared_conformance::on_redis::Redis,
}

/// The Redis implementations (`TALLY_TEST_REDIS`, e.g. redis://127.0.0.1:6379): every state is
/// a fresh key prefix, every handle a new link (a new connection, as a second collector would
/// have) on it; the prefix's keys are deleted when the state is dropped.
mod on_redis {
    use super::*;
    use tally::state::memory::{MemoryLive, MemoryRepeatGate, MemorySiteCache};
    use tally::state::redis::{
        RedisLimiter, RedisLink, RedisLive, RedisRepeatGate, RedisSiteCache,
    };

    pub struct Redis {
        url: String,
        prefix: String,
        site_ttl: Duration,
    }

    /// The Redis URL of the test environment, if set.
    pub fn url() -> Option<String> {
        crate::support::redis_url()
    }

    impl Redis {
        fn link(&self) -> Arc<RedisLink> {
            RedisLink::new(&self.url, &self.prefix, [7; 32]).expect("redis url")
        }
    }

    impl SharedHarness for Redis {
        fn available() -> bool {
            url().is_some()
        }

        fn fresh(site_ttl: Duration) -> Self {
            Self {
                url: url().expect("checked by available()"),
                prefix: format!("tally-test:{}:", uuid::Uuid::new_v4().simple()),
                site_ttl,
            }
        }

        fn live(&self) -> Arc<dyn LiveState> {
            Arc::new(RedisLive::new(
                self.link(),
                LIVE_WINDOW_SECS,
                MemoryLive::new(LIVE_WINDOW_SECS, 1000, 1000, 10_000),
            ))
        }

        fn limiter(&self) -> Arc<dyn RateLimiter> {
            Arc::new(RedisLimiter::new(self.link(), LIMITS))
        }

        fn repeats(&self) -> Arc<dyn RepeatGate> {
            Arc::new(RedisRepeatGate::new(
                self.link(),
                DIRECT_REPEAT_MS,
                PROXY_REPEAT_MS,
                MemoryRepeatGate::new(DIRECT_REPEAT_MS, PROXY_REPEAT_MS, 1000),
            ))
        }

        fn sites(&self) -> Arc<dyn SiteCache> {
            Arc::new(RedisSiteCache::new(
                self.link(),
                self.site_ttl,
                MemorySiteCache::new(self.site_ttl, 1000),
            ))
        }
    }

    /// Records sent at once share Redis pipelines (one round trip for many views, not one
    /// each), and every one of them is in Redis when its `record` returns.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_live_records_share_pipelines() {
        if url().is_none() {
            return;
        }
        let state = Redis::fresh(Duration::from_secs(3600));
        let live = RedisLive::new(
            state.link(),
            LIVE_WINDOW_SECS,
            MemoryLive::new(LIVE_WINDOW_SECS, 1000, 1000, 10_000),
        );
        let sends = (0..300u64).map(|v| {
            let e = entry("s", Some(if v % 2 == 0 { "/a" } else { "/b" }), v);
            let live = &live;
            async move { live.record(&e, T0_MS).await }
        });
        futures_util::future::join_all(sends).await;
        let tally::state::redis::Flushes {
            pipelines, records, ..
        } = live.flushes();
        assert_eq!(records, 300);
        assert!(
            pipelines <= 30,
            "300 concurrent records took {pipelines} pipelines"
        );
        // Read through another connection, as another collector would.
        let other = state.live();
        let all = other.read(&site("s"), None, T0_MS + 1).await;
        assert_eq!((all.events, all.visitors), (300, 300));
        let a = other.read(&site("s"), Some(&page("/a")), T0_MS + 1).await;
        assert_eq!((a.events, a.visitors), (150, 150));
    }

    /// A flood of records sent at once is cut into pipelines of at most `LIVE_FLUSH_MAX`
    /// records, and none of them is lost. One task per record on one thread: every record is
    /// queued before the flusher (spawned by the first) first runs, so without the cap they
    /// would all go in one pipeline.
    #[tokio::test(flavor = "current_thread")]
    async fn a_flood_of_live_records_is_cut_into_bounded_pipelines() {
        if url().is_none() {
            return;
        }
        let state = Redis::fresh(Duration::from_secs(3600));
        let live = Arc::new(RedisLive::new(
            state.link(),
            LIVE_WINDOW_SECS,
            MemoryLive::new(LIVE_WINDOW_SECS, 10_000, 1000, 100_000),
        ));
        let n = 4 * tally::state::redis::LIVE_FLUSH_MAX as u64 + 1;
        let tasks: Vec<_> = (0..n)
            .map(|v| {
                let live = Arc::clone(&live);
                tokio::spawn(async move { live.record(&entry("s", None, v), T0_MS).await })
            })
            .collect();
        for t in tasks {
            t.await.expect("record task");
        }
        let max = tally::state::redis::LIVE_FLUSH_MAX as u64;
        let flushes = live.flushes();
        assert_eq!(flushes.records, n);
        assert_eq!(flushes.largest, max, "{flushes:?}");
        assert!(flushes.pipelines >= 5, "{flushes:?}");
        let all = state.live().read(&site("s"), None, T0_MS + 1).await;
        assert_eq!((all.events, all.visitors), (n, n));
    }

    /// A visitor set in Redis keeps only the visitors of the window of its latest record, also
    /// when old and new records share one pipeline: its memory is bounded by the window.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn live_visitor_sets_are_trimmed_to_the_window_in_redis() {
        if url().is_none() {
            return;
        }
        let state = Redis::fresh(Duration::from_secs(3600));
        let live = state.live();
        let window_ms = i64::from(LIVE_WINDOW_SECS) * 1000;
        live.record(&entry("s", None, 1), T0_MS).await;
        live.record(&entry("s", None, 2), T0_MS + 1_000).await;
        // Sent together: often one pipeline holding both seconds.
        let late = T0_MS + 10 * window_ms;
        let (old, new) = (entry("s", None, 3), entry("s", None, 4));
        futures_util::join!(live.record(&old, late - window_ms), live.record(&new, late));
        let client = ::redis::Client::open(state.url.as_str()).expect("url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("redis");
        let keys: Vec<String> = ::redis::cmd("KEYS")
            .arg(format!("{}live:v:*", state.prefix))
            .query_async(&mut conn)
            .await
            .expect("keys");
        assert_eq!(keys.len(), 1, "one visitor set: the site's");
        let members: Vec<u64> = ::redis::cmd("ZRANGE")
            .arg(&keys[0])
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .expect("zrange");
        // The first window's visitors are trimmed. Visitor 3 (one window before 4) stays only
        // when its record reached Redis after 4's trim: the two calls race, and the next
        // record trims it; reads count by time either way.
        assert!(
            members.contains(&4) && !members.contains(&1) && !members.contains(&2),
            "the first window's visitors are trimmed, the latest kept: {members:?}"
        );
        let n = live.read(&site("s"), None, late).await;
        assert_eq!((n.events, n.visitors), (1, 1));
    }

    /// A live record whose pipeline Redis answers too late (after 350 ms: more than a call's
    /// 250 ms budget, less than the redis client's own 500 ms response timeout, so tally's
    /// budget is what must catch it) is counted as a fallback, and reads, which skip Redis for
    /// a while after a failure, find it in the collector's own window.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_live_record_that_redis_answers_too_late_counts_as_a_fallback() {
        if url().is_none() {
            return;
        }
        let state = Redis::fresh(Duration::from_secs(3600));
        let slow = crate::support::slow_redis(&state.url, Duration::from_millis(350)).await;
        let link = RedisLink::new(&slow, &state.prefix, [7; 32]).expect("redis url");
        let live = RedisLive::new(
            Arc::clone(&link),
            LIVE_WINDOW_SECS,
            MemoryLive::new(LIVE_WINDOW_SECS, 1000, 1000, 10_000),
        );
        live.record(&entry("s", Some("/a"), 1), T0_MS).await;
        assert_eq!(
            link.health.fallbacks(),
            1,
            "the late record is one fallback"
        );
        assert!(!link.health.is_up());
        let read = live.read(&site("s"), Some(&page("/a")), T0_MS + 1).await;
        assert_eq!((read.events, read.visitors), (1, 1), "{read:?}");
    }

    impl Drop for Redis {
        fn drop(&mut self) {
            // Synchronous: no runtime is guaranteed here.
            let Ok(client) = ::redis::Client::open(self.url.as_str()) else {
                return;
            };
            let Ok(mut conn) = client.get_connection() else {
                return;
            };
            let keys: Vec<String> = ::redis::cmd("KEYS")
                .arg(format!("{}*", self.prefix))
                .query(&mut conn)
                .unwrap_or_default();
            if !keys.is_empty() {
                let _: ::redis::RedisResult<u64> = ::redis::cmd("DEL").arg(&keys).query(&mut conn);
            }
        }
    }
}

/// The in-process implementations: one instance per state, handles are clones of it.
mod in_process {
    use super::*;
    use tally::state::memory::Limits;
    use tally::state::memory::{MemoryLive, MemoryRepeatGate, MemorySiteCache};

    pub struct Memory {
        live: Arc<MemoryLive>,
        limits: Arc<Limits>,
        repeats: Arc<MemoryRepeatGate>,
        sites: Arc<MemorySiteCache>,
    }

    impl SharedHarness for Memory {
        fn fresh(site_ttl: Duration) -> Self {
            Self {
                live: Arc::new(MemoryLive::new(LIVE_WINDOW_SECS, 1000, 1000, 10_000)),
                limits: Arc::new(Limits::new(LIMITS)),
                repeats: Arc::new(MemoryRepeatGate::new(
                    DIRECT_REPEAT_MS,
                    PROXY_REPEAT_MS,
                    1000,
                )),
                sites: Arc::new(MemorySiteCache::new(site_ttl, 1000)),
            }
        }

        fn live(&self) -> Arc<dyn LiveState> {
            Arc::clone(&self.live) as Arc<dyn LiveState>
        }

        fn limiter(&self) -> Arc<dyn RateLimiter> {
            Arc::clone(&self.limits) as Arc<dyn RateLimiter>
        }

        fn repeats(&self) -> Arc<dyn RepeatGate> {
            Arc::clone(&self.repeats) as Arc<dyn RepeatGate>
        }

        fn sites(&self) -> Arc<dyn SiteCache> {
            Arc::clone(&self.sites) as Arc<dyn SiteCache>
        }
    }
}
