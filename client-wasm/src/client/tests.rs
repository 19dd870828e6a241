//! The client's behaviour against a fake browser: storage fallbacks, the queue, retries,
//! SPA navigation and counters.

use super::*;
use crate::ops::Flag;
use crate::queue::Entry;
use std::cell::Cell;
use std::collections::HashMap;
use tally_wire::Hit;

const T0: u64 = 1_750_000_000_000;
const API: &str = "https://c.example";

/// A scripted browser: storage areas that can be made to throw, a clock, recorded requests.
#[derive(Default)]
struct Fake {
    now: u64,
    seed: Cell<u8>,
    areas: [HashMap<String, String>; 2],
    broken: [bool; 2],
    /// Storage that reads but refuses writes (quota exceeded).
    full: bool,
    /// (URL, body, event id) of each fetch.
    sends: Vec<(String, String, String)>,
    /// Event ids whose fetch awaits its answer.
    awaiting: std::collections::HashSet<String>,
    beacons: Vec<(String, String)>,
    timers: Vec<u32>,
    href: String,
    referrer: String,
    counters: bool,
    fills: Vec<(String, bool)>,
    /// (API, site, busuanzi) of each read of the counts.
    peeks: Vec<(String, String, bool)>,
    listening: Option<bool>,
    /// Visible and focused.
    engaged: bool,
    /// The largest scroll depth since the last reset.
    depth: u8,
    /// `screen.width` (0: unknown).
    screen: u32,
}

impl Host for Fake {
    fn now_ms(&self) -> u64 {
        self.now
    }
    fn random(&self, buf: &mut [u8]) {
        for b in buf {
            let s = self.seed.get().wrapping_add(37);
            self.seed.set(s);
            *b = s;
        }
    }
    fn load(&self, area: Area, key: &str) -> String {
        let a = area as usize;
        if self.broken[a] {
            String::new()
        } else {
            self.areas[a].get(key).cloned().unwrap_or_default()
        }
    }
    fn save(&mut self, area: Area, key: &str, value: &str) -> bool {
        let a = area as usize;
        if self.broken[a] || self.full {
            return false;
        }
        if value.is_empty() {
            self.areas[a].remove(key);
        } else {
            self.areas[a].insert(key.to_owned(), value.to_owned());
        }
        true
    }
    fn send(&mut self, api: &str, counts: bool, body: &str, id: &str) {
        let url = hit_url(api, counts, self.now);
        self.sends.push((url, body.to_owned(), id.to_owned()));
        self.awaiting.insert(id.to_owned());
    }
    fn awaiting(&self, id: &str) -> bool {
        self.awaiting.contains(id)
    }
    fn beacon(&mut self, api: &str, body: &str) -> bool {
        self.beacons
            .push((hit_url(api, false, self.now), body.to_owned()));
        true
    }
    fn schedule(&mut self, delay_ms: u32) {
        self.timers.push(delay_ms);
    }
    fn href(&self) -> String {
        self.href.clone()
    }
    fn same_page(&self, url: &str, path_only: bool) -> bool {
        if path_only {
            path(url) == path(&self.href)
        } else {
            without_fragment(url) == without_fragment(&self.href)
        }
    }
    fn referrer(&self) -> String {
        self.referrer.clone()
    }
    fn wants_counts(&self, _busuanzi: bool) -> bool {
        self.counters
    }
    fn fill(&mut self, answer: &str, busuanzi: bool) {
        self.fills.push((answer.to_owned(), busuanzi));
    }
    fn peek(&mut self, api: &str, site: &str, busuanzi: bool) {
        self.peeks.push((api.to_owned(), site.to_owned(), busuanzi));
    }
    fn listen(&mut self, spa: bool) {
        self.listening = Some(spa);
    }
    fn engaged(&self) -> bool {
        self.engaged
    }
    fn scroll(&mut self, reset: bool) -> u8 {
        if reset {
            self.depth = 0;
        }
        self.depth
    }
    fn screen_width(&self) -> u32 {
        self.screen
    }
    fn quote(&self, s: &str) -> String {
        serde_json::to_string(s).expect("a string serialises")
    }
}

/// A client driven through a fake host.
struct World {
    client: Client<Fake>,
}

fn fake(href: &str) -> Fake {
    Fake {
        now: T0,
        href: href.into(),
        referrer: "https://ref.example/".into(),
        ..Fake::default()
    }
}

fn options(flags: u32) -> Options {
    Options::new("blog".into(), API.into(), flags)
}

impl World {
    fn start(fake: Fake, flags: u32) -> World {
        World {
            client: Client::start(fake, options(flags)),
        }
    }

    /// A `tally(kind, text, {dedupe})` call, decoded as the browser's are (empty = absent).
    fn command(&mut self, kind: &str, text: &str, dedupe: &str) {
        let present = |x: &str| (!x.is_empty()).then(|| x.to_owned());
        let on = !text.is_empty() && text != "false";
        if let Some(c) = Command::parse(
            kind,
            on,
            present(text).as_deref(),
            present(dedupe).as_deref(),
        ) {
            self.client.command(c);
        }
    }

    fn host(&mut self) -> &mut Fake {
        self.client.host_mut()
    }

    fn sends(&mut self) -> Vec<(String, String, String)> {
        std::mem::take(&mut self.host().sends)
    }

    fn answer(&mut self, id: &str, status: u16, retry_after_ms: u64, body: Option<&str>) {
        self.host().awaiting.remove(id);
        self.client.answer(id, status, retry_after_ms, body);
    }

    fn queue(&mut self) -> Vec<Entry> {
        let fake = self.client.host();
        let text = fake.areas[0]
            .get(QUEUE_KEY)
            .or_else(|| fake.areas[1].get(QUEUE_KEY));
        queue::decode(text.map_or("", |s| s.as_str()))
    }

    fn advance(&mut self, ms: u64) {
        self.host().now += ms;
        self.client.tick();
    }

    /// Restarts on the same storage: the next page load.
    fn reload(self, href: &str) -> World {
        self.reload_with(href, 0)
    }

    /// Restarts on the same storage with other option flags.
    fn reload_with(self, href: &str, flags: u32) -> World {
        let old = self.client.host;
        let mut next = fake(href);
        next.now = old.now;
        next.areas = old.areas;
        next.broken = old.broken;
        next.seed = old.seed;
        next.counters = old.counters;
        World::start(next, flags)
    }
}

/// The URL the browser's host builds for a hit (js/host.js `send`).
fn hit_url(api: &str, counts: bool, now: u64) -> String {
    let counts = if counts { "&counts=1" } else { "" };
    format!("{api}/api/v1/hit?t={now}{counts}")
}

fn field<'a>(body: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("\"{name}\":");
    let rest = &body[body.find(&key)? + key.len()..];
    if let Some(s) = rest.strip_prefix('"') {
        s.split('"').next()
    } else {
        rest.split([',', '}']).next()
    }
}

#[test]
fn first_page_view_is_queued_then_sent_with_ids_and_cache_buster() {
    let mut w = World::start(fake("https://blog.example/a?x=1"), 0);
    let sends = w.sends();
    assert_eq!(sends.len(), 1);
    let (url, body, _) = &sends[0];
    assert_eq!(url, &format!("{API}/api/v1/hit?t={T0}"));
    let hit: Hit = serde_json::from_str(body).expect("the body is a wire hit");
    assert_eq!(hit.site, "blog");
    assert_eq!(hit.kind, TYPE_PAGEVIEW);
    assert_eq!(hit.url, "https://blog.example/a?x=1");
    assert_eq!(hit.referrer.as_deref(), Some("https://ref.example/"));
    let event = uuid::Uuid::try_parse(&hit.event_id).expect("uuid");
    assert_eq!(event.get_version_num(), 7);
    let visitor = hit.visitor_id.expect("visitor id");
    assert_eq!(
        uuid::Uuid::try_parse(&visitor)
            .expect("uuid")
            .get_version_num(),
        4
    );
    assert_eq!(w.client.host().areas[0].get(VISITOR_KEY), Some(&visitor));
    assert!(
        !w.client.host().areas[0].contains_key(PROBE_KEY),
        "the probe is cleaned up"
    );
    let q = w.queue();
    assert_eq!(q.len(), 1, "written ahead of the send");
    assert_eq!(q[0].id, hit.event_id);
    assert_eq!(w.client.host().listening, Some(true));
}

#[test]
fn a_success_empties_the_queue_and_nothing_is_resent() {
    let mut w = World::start(fake("https://blog.example/"), 0);
    let token = w.sends().remove(0).2;
    w.answer(&token, 200, 0, Some(r#"{"status":"accepted"}"#));
    assert!(w.queue().is_empty());
    w.advance(60 * 60 * 1000);
    assert!(w.sends().is_empty());
}

#[test]
fn visitor_id_is_reused_on_the_next_page_and_replaced_when_corrupt() {
    let w = World::start(fake("https://blog.example/"), 0);
    let first = w.client.host().areas[0].get(VISITOR_KEY).cloned();
    let mut w = w.reload("https://blog.example/b");
    assert_eq!(w.client.host().areas[0].get(VISITOR_KEY).cloned(), first);
    w.host().areas[0].insert(VISITOR_KEY.into(), "not-a-uuid".into());
    let w = w.reload("https://blog.example/c");
    let third = w.client.host().areas[0]
        .get(VISITOR_KEY)
        .cloned()
        .expect("id");
    assert!(ids::is_uuid(&third));
    assert_ne!(Some(third), first);
}

#[test]
fn throwing_local_storage_falls_back_to_session_storage() {
    let mut f = fake("https://blog.example/");
    f.broken[0] = true;
    let mut w = World::start(f, 0);
    assert!(w.client.host().areas[1].contains_key(VISITOR_KEY));
    assert_eq!(w.sends().len(), 1);
    assert_eq!(w.queue().len(), 1);
}

#[test]
fn throwing_storage_everywhere_falls_back_to_memory_and_still_counts() {
    let mut f = fake("https://blog.example/");
    f.broken = [true, true];
    let mut w = World::start(f, 0);
    let sends = w.sends();
    assert_eq!(sends.len(), 1);
    let hit: Hit = serde_json::from_str(&sends[0].1).expect("hit");
    assert!(
        hit.visitor_id.is_some(),
        "an in-memory id still counts the visitor for this page"
    );
    // Retries still work from memory.
    w.answer(&sends[0].2, 0, 0, None);
    w.advance(retry::CAP_MS);
    let again = w.sends();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].1, sends[0].1);
}

#[test]
fn storage_none_writes_nothing_and_sends_a_null_visitor() {
    let mut w = World::start(fake("https://blog.example/"), Flag::NoStorage as u32);
    let sends = w.sends();
    assert_eq!(field(&sends[0].1, "visitor_id"), Some("null"));
    assert!(w.client.host().areas.iter().all(HashMap::is_empty));
    // The queue still retries within the page.
    w.answer(&sends[0].2, 503, 1_000, None);
    assert!(w.client.host().areas.iter().all(HashMap::is_empty));
    w.advance(retry::CAP_MS);
    assert_eq!(w.sends()[0].1, sends[0].1);
}

#[test]
fn network_error_is_retried_with_backoff_keeping_the_event_id() {
    let mut w = World::start(fake("https://blog.example/"), 0);
    let first = w.sends().remove(0);
    w.answer(&first.2, STATUS_NETWORK_ERROR, 0, None);
    let q = w.queue();
    assert_eq!(q[0].head.attempts, 1);
    let wait = q[0].head.due - T0;
    assert!(
        (retry::BASE_MS / 2..=retry::BASE_MS).contains(&wait),
        "{wait}"
    );
    assert_eq!(w.client.host().timers.last(), Some(&(wait as u32)));
    w.advance(wait - 1);
    assert!(w.sends().is_empty(), "not before the backoff");
    w.advance(1);
    let second = w.sends();
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].1, first.1, "byte-identical body, same event id");
    assert_ne!(second[0].0, first.0, "a fresh cache buster");
    w.answer(&second[0].2, 200, 0, Some(r#"{"status":"duplicate"}"#));
    assert!(w.queue().is_empty());
}

#[test]
fn retry_after_seconds_is_honoured() {
    let mut w = World::start(fake("https://blog.example/"), 0);
    let first = w.sends().remove(0);
    w.answer(
        &first.2,
        429,
        30_000,
        Some(r#"{"error":"rate_limited","message":"x"}"#),
    );
    assert_eq!(w.queue()[0].head.due, T0 + 30_000);
    w.advance(29_999);
    assert!(w.sends().is_empty());
    w.advance(1);
    assert_eq!(w.sends()[0].1, first.1);
}

#[test]
fn retry_after_is_capped_at_a_day() {
    let mut w = World::start(fake("https://blog.example/"), 0);
    let first = w.sends().remove(0);
    w.answer(&first.2, 503, u64::MAX, None);
    assert_eq!(w.queue()[0].head.due, T0 + retry::MAX_RETRY_AFTER_MS);
}

#[test]
fn permanent_refusals_are_dropped_not_retried() {
    for status in [400u16, 403, 413, 422] {
        let mut w = World::start(fake("https://blog.example/"), 0);
        let first = w.sends().remove(0);
        w.answer(
            &first.2,
            status,
            0,
            Some(r#"{"error":"bad","message":"x"}"#),
        );
        assert!(w.queue().is_empty(), "{status}");
    }
}

#[test]
fn the_next_page_load_resends_what_the_last_one_left() {
    let mut w = World::start(fake("https://blog.example/a"), 0);
    let first = w.sends().remove(0);
    w.answer(&first.2, 0, 0, None);
    w.host().now += retry::CAP_MS;
    let mut w = w.reload("https://blog.example/b");
    let sends = w.sends();
    assert_eq!(sends.len(), 2, "the new page view and the old one");
    assert!(sends.iter().any(|s| s.1 == first.1));
    for (_, _, token) in sends {
        w.answer(&token, 200, 0, Some(r#"{"status":"accepted"}"#));
    }
    assert!(w.queue().is_empty());
}

#[test]
fn a_page_closed_mid_flight_leaves_a_leased_entry_resent_later() {
    let w = World::start(fake("https://blog.example/a"), 0);
    let mut w = w.reload("https://blog.example/b");
    let sends = w.sends();
    assert_eq!(sends.len(), 1, "the first page's hit is still leased");
    assert_eq!(w.queue().len(), 2);
    w.advance(LEASE_MS);
    assert_eq!(w.sends().len(), 1, "the lease expired: resent");
}

#[test]
fn counters_are_filled_from_the_page_views_own_answer() {
    let mut f = fake("https://blog.example/");
    f.counters = true;
    let mut w = World::start(f, Flag::Busuanzi as u32);
    let (url, _, token) = w.sends().remove(0);
    assert!(url.ends_with("&counts=1"));
    let body = r#"{"status":"accepted","counts":{"site":{"views":10,"visitors":4,"today":{"views":1,"visitors":1}},"page":{"views":3,"visitors":2,"today":{"views":1,"visitors":1}},"live":{"events":1,"visitors":1}}}"#;
    w.answer(&token, 200, 0, Some(body));
    assert_eq!(w.client.host().fills, vec![(body.to_owned(), true)]);
    // Built from the wire type: the answer the collector sends parses as a HitResponse.
    let parsed: tally_wire::HitResponse = serde_json::from_str(body).expect("wire answer");
    assert_eq!(parsed.counts.map(|c| c.page.views), Some(3));
}

#[test]
fn counters_survive_a_failed_first_try() {
    let mut f = fake("https://blog.example/");
    f.counters = true;
    let mut w = World::start(f, 0);
    let first = w.sends().remove(0);
    w.answer(&first.2, 0, 0, None);
    w.advance(retry::BASE_MS);
    let (url, _, token) = w.sends().remove(0);
    assert!(url.ends_with("&counts=1"));
    w.answer(&token, 200, 0, Some(r#"{"status":"duplicate","counts":{"site":{"views":1,"visitors":1,"today":{"views":1,"visitors":1}},"page":{"views":1,"visitors":1,"today":{"views":1,"visitors":1}},"live":{"events":1,"visitors":1}}}"#));
    assert_eq!(w.client.host().fills.len(), 1);
    assert!(!w.client.host().fills[0].1, "busuanzi off");
}

#[test]
fn only_the_page_views_own_success_fills_counters() {
    let mut f = fake("https://blog.example/");
    f.counters = true;
    let mut w = World::start(f, 0);
    let first = w.sends().remove(0);
    w.answer(&first.2, 429, 1_000, Some("{}"));
    w.command("event", "x", "");
    let event = w.sends().remove(0);
    assert!(!event.0.contains("counts"));
    w.answer(&event.2, 200, 0, Some("{}"));
    assert!(w.client.host().fills.is_empty());
}

#[test]
fn no_counters_no_counts_request() {
    let mut w = World::start(fake("https://blog.example/"), 0);
    assert!(!w.sends()[0].0.contains("counts"));
}

#[test]
fn spa_navigation_rules() {
    let mut w = World::start(fake("https://blog.example/a"), 0);
    w.sends();
    let nav = |w: &mut World, href: &str, how: Navigation| {
        w.host().href = href.into();
        w.client.navigate(how);
        w.sends()
    };
    let s = nav(&mut w, "https://blog.example/b", Navigation::Push);
    assert_eq!(s.len(), 1);
    assert_eq!(field(&s[0].1, "referrer"), Some("https://blog.example/a"));
    assert!(
        nav(&mut w, "https://blog.example/b", Navigation::Push).is_empty(),
        "same URL"
    );
    assert!(
        nav(&mut w, "https://blog.example/b#top", Navigation::Push).is_empty(),
        "fragment only"
    );
    assert_eq!(
        nav(&mut w, "https://blog.example/b?page=2", Navigation::Push).len(),
        1,
        "query"
    );
    assert!(
        nav(&mut w, "https://blog.example/b?page=3", Navigation::Replace).is_empty(),
        "replace, query only"
    );
    assert_eq!(
        nav(&mut w, "https://blog.example/c", Navigation::Replace).len(),
        1,
        "replace, new path"
    );
    assert_eq!(
        nav(&mut w, "https://blog.example/b?page=2", Navigation::Pop).len(),
        1,
        "back"
    );
}

#[test]
fn manual_mode_counts_only_when_asked() {
    let mut w = World::start(fake("https://blog.example/"), Flag::Manual as u32);
    assert!(w.sends().is_empty());
    assert_eq!(w.client.host().listening, Some(false), "no history hooks");
    w.command("pageview", "", "");
    assert_eq!(w.sends().len(), 1);
}

#[test]
fn custom_events_carry_name_and_dedupe_and_fresh_ids() {
    let mut w = World::start(fake("https://blog.example/shop"), 0);
    w.sends();
    w.command("event", "signup", "user_42");
    w.command("event", "signup", "user_42");
    w.command("event", "", "");
    w.command("bogus", "x", "");
    let s = w.sends();
    assert_eq!(s.len(), 2);
    for (_, body, _) in &s {
        assert_eq!(field(body, "type"), Some("event"));
        assert_eq!(field(body, "name"), Some("signup"));
        assert_eq!(field(body, "dedupe"), Some("user_42"));
        assert_eq!(field(body, "referrer"), Some("null"));
    }
    assert_ne!(field(&s[0].1, "event_id"), field(&s[1].1, "event_id"));
}

#[test]
fn hide_beacons_only_due_idle_entries() {
    let mut w = World::start(fake("https://blog.example/"), 0);
    let first = w.sends().remove(0);
    w.client.hide();
    assert!(
        w.client.host().beacons.is_empty(),
        "in flight: its keepalive fetch survives"
    );
    w.answer(&first.2, 0, 0, None);
    w.client.hide();
    assert!(
        w.client.host().beacons.is_empty(),
        "waiting out its backoff"
    );
    w.host().now += retry::BASE_MS;
    w.client.hide();
    let beacons = &w.client.host().beacons;
    assert_eq!(beacons.len(), 1);
    assert_eq!(beacons[0].1, first.1);
    assert!(!beacons[0].0.contains("counts"));
    let q = w.queue();
    assert_eq!(q.len(), 1, "kept: a beacon has no answer");
    assert_eq!(q[0].head.attempts, 2);
}

#[test]
fn beacon_handoff_is_an_unconfirmed_try() {
    let mut w = World::start(fake("https://blog.example/"), 0);
    let first = w.sends().remove(0);
    w.answer(&first.2, STATUS_BEACON, 0, None);
    assert_eq!(w.queue()[0].head.attempts, 1);
}

#[test]
fn queue_stays_bounded_while_the_collector_is_down() {
    let mut w = World::start(fake("https://blog.example/"), 0);
    for i in 0..40 {
        w.command("event", &format!("e{i}"), "");
        w.host().now += 1;
    }
    for (_, _, token) in w.sends() {
        w.answer(&token, 0, 0, None);
    }
    assert_eq!(w.queue().len(), queue::MAX_ENTRIES);
}

#[test]
fn unknown_and_repeated_answers_are_ignored() {
    let mut w = World::start(fake("https://blog.example/"), 0);
    let first = w.sends().remove(0);
    w.answer("0190b2a0-0000-7000-8000-000000000000", 200, 0, None);
    assert_eq!(w.queue().len(), 1);
    w.answer(&first.2, 200, 0, Some("not json"));
    w.answer(&first.2, 0, 0, None);
    assert!(w.queue().is_empty());
}

#[test]
fn over_long_urls_lose_their_query() {
    let long = format!("https://blog.example/p?{}", "q".repeat(5000));
    let mut w = World::start(fake(&long), 0);
    let s = w.sends();
    assert_eq!(field(&s[0].1, "url"), Some("https://blog.example/p"));
}

#[test]
fn storage_full_after_the_start_keeps_the_queue_in_memory() {
    let mut w = World::start(fake("https://blog.example/"), 0);
    let first = w.sends().remove(0);
    w.host().full = true;
    w.answer(&first.2, 0, 0, None);
    w.advance(retry::CAP_MS);
    let again = w.sends();
    assert_eq!(again.len(), 1, "the failed hit is still retried");
    assert_eq!(again[0].1, first.1);
}

/// `s` up to (not including) the first byte that `stop` matches.
fn before(s: &str, stop: impl Fn(u8) -> bool) -> &str {
    s.bytes().position(stop).map_or(s, |i| &s[..i])
}

/// The fake browser's URL comparison (the real one is the browser's URL parser): the URL
/// without its fragment.
fn without_fragment(url: &str) -> &str {
    before(url, |b| b == b'#')
}

/// The fake browser's path of a URL: after the authority, before the query or fragment.
fn path(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    match rest.find(['/', '?', '#']) {
        Some(i) if rest.as_bytes()[i] == b'/' => before(&rest[i..], |b| b == b'?' || b == b'#'),
        _ => "",
    }
}

#[test]
fn fake_url_helpers() {
    assert_eq!(path("https://a.example/x/y?q#f"), "/x/y");
    assert_eq!(path("https://a.example"), "");
    assert_eq!(path("https://a.example?q"), "");
    assert_eq!(
        without_fragment("https://a.example/x?q#f"),
        "https://a.example/x?q"
    );
}

const COUNTS_ANSWER: &str = r#"{"status":"accepted","counts":{"site":{"views":2,"visitors":1,"today":{"views":2,"visitors":1}},"page":{"views":1,"visitors":1,"today":{"views":1,"visitors":1}},"live":{"events":1,"visitors":1}}}"#;

#[test]
fn refresh_waits_for_an_answer_on_its_way_then_reads_the_counts() {
    let mut f = fake("https://blog.example/a");
    f.counters = true;
    let mut w = World::start(f, Flag::Busuanzi as u32);
    let (_, _, id) = w.sends().remove(0);
    w.command("refresh", "", "");
    assert!(
        w.client.host().peeks.is_empty(),
        "the page view's answer is on its way: it fills the counters"
    );
    w.answer(&id, 200, 0, Some(COUNTS_ANSWER));
    assert_eq!(w.client.host().fills.len(), 1);
    w.command("refresh", "", "");
    assert_eq!(
        w.client.host().peeks,
        vec![(API.to_owned(), "blog".to_owned(), true)]
    );
    assert!(w.sends().is_empty(), "a refresh counts nothing");
}

#[test]
fn refresh_reads_the_counts_of_a_page_that_was_not_counted() {
    // data-spa="false": the history change is not counted, so the last answer is another
    // page's; the counters of the current URL are read from the collector.
    let mut f = fake("https://blog.example/a");
    f.counters = true;
    let mut w = World::start(f, Flag::NoSpa as u32);
    let (_, _, id) = w.sends().remove(0);
    w.answer(&id, 200, 0, Some(COUNTS_ANSWER));
    w.host().href = "https://blog.example/b".into();
    w.command("refresh", "", "");
    assert_eq!(
        w.client.host().peeks,
        vec![(API.to_owned(), "blog".to_owned(), false)]
    );
    assert!(w.sends().is_empty());
    // No counter elements: nothing to refresh, nothing read.
    w.host().counters = false;
    w.command("refresh", "", "");
    assert_eq!(w.client.host().peeks.len(), 1);
}

#[test]
fn an_earlier_page_views_answer_does_not_fill_the_next_pages_counters() {
    let mut f = fake("https://blog.example/a");
    f.counters = true;
    let mut w = World::start(f, 0);
    let (_, _, first) = w.sends().remove(0);
    w.host().href = "https://blog.example/b".into();
    w.client.navigate(Navigation::Push);
    let (_, _, second) = w.sends().remove(0);
    w.answer(&first, 200, 0, Some(COUNTS_ANSWER));
    assert!(
        w.client.host().fills.is_empty(),
        "page a's numbers on page b"
    );
    w.answer(&second, 200, 0, Some(COUNTS_ANSWER));
    assert_eq!(w.client.host().fills.len(), 1);
}

#[test]
fn consent_mode_starts_without_storage_until_consent_is_given() {
    let mut w = World::start(fake("https://blog.example/"), Flag::Consent as u32);
    let s = w.sends();
    assert_eq!(field(&s[0].1, "visitor_id"), Some("null"));
    assert!(
        w.client.host().areas.iter().all(HashMap::is_empty),
        "nothing written before consent, not even the probe"
    );
    // A failed send stays queued in memory; consent moves it into storage.
    w.answer(&s[0].2, 0, 0, None);
    w.command("consent", "true", "");
    let vid = w.client.host().areas[0]
        .get(VISITOR_KEY)
        .cloned()
        .expect("a stored visitor id");
    assert_eq!(
        w.client.host().areas[0]
            .get(CONSENT_KEY)
            .map(String::as_str),
        Some("1")
    );
    assert_eq!(w.queue().len(), 1, "the memory queue moved to storage");
    w.command("event", "signup", "");
    let s = w.sends();
    assert_eq!(field(&s[0].1, "visitor_id"), Some(vid.as_str()));

    // Remembered: the next page load starts with the stored id.
    let mut w = w.reload_with("https://blog.example/b", Flag::Consent as u32);
    let s = w.sends();
    let sent = s.iter().find(|x| field(&x.1, "type") == Some("pageview"));
    assert_eq!(
        sent.and_then(|x| field(&x.1, "visitor_id")),
        Some(vid.as_str())
    );
}

#[test]
fn withdrawn_consent_deletes_the_stored_id_queue_and_consent() {
    let mut w = World::start(fake("https://blog.example/"), Flag::Consent as u32);
    w.command("consent", "true", "");
    let s = w.sends();
    assert_eq!(w.queue().len(), 1);
    w.command("consent", "false", "");
    assert!(
        w.client.host().areas.iter().all(HashMap::is_empty),
        "{:?}",
        w.client.host().areas
    );
    w.command("event", "x", "");
    let later = w.sends();
    assert_eq!(field(&later[0].1, "visitor_id"), Some("null"));
    assert!(w.client.host().areas.iter().all(HashMap::is_empty));
    // The queue lives on in memory for this page: the earlier hit is still settled.
    w.answer(&s[0].2, 200, 0, None);
    w.answer(&later[0].2, 200, 0, None);
    w.advance(60_000);
    assert!(w.sends().is_empty());
    // The next page load starts without storage again.
    let w = w.reload_with("https://blog.example/b", Flag::Consent as u32);
    assert!(w.client.host().areas.iter().all(HashMap::is_empty));
}

#[test]
fn ignore_empties_the_queue_and_sends_nothing_until_cleared() {
    let mut f = fake("https://blog.example/");
    f.counters = true;
    let mut w = World::start(f, 0);
    let (_, _, id) = w.sends().remove(0);
    w.command("ignore", "true", "");
    assert!(w.queue().is_empty(), "the queue is emptied");
    w.answer(&id, 0, 0, None);
    w.advance(60 * 60 * 1000);
    w.command("event", "x", "");
    w.command("pageview", "", "");
    assert!(w.sends().is_empty(), "nothing is sent while ignored");
    assert!(w.queue().is_empty(), "nothing is queued either");
    assert_eq!(w.client.host().peeks.len(), 1, "counters are read instead");
    w.command("ignore", "false", "");
    w.command("pageview", "", "");
    assert_eq!(w.sends().len(), 1);
}

#[test]
fn a_browser_ignored_at_the_start_counts_nothing_and_reads_the_counters() {
    // An earlier page left a hit queued (collector down).
    let w = World::start(fake("https://blog.example/"), 0);
    assert_eq!(w.client.host().sends.len(), 1);
    let mut f = fake("https://blog.example/");
    f.areas = w.client.host.areas;
    f.now = T0 + 60_000;
    f.counters = true;
    let mut w = World::start(f, Flag::Ignored as u32);
    assert!(
        w.sends().is_empty(),
        "neither this view nor the queued one is sent"
    );
    assert!(w.queue().is_empty());
    assert_eq!(w.client.host().peeks.len(), 1);
    w.host().href = "https://blog.example/b".into();
    w.client.navigate(Navigation::Push);
    assert!(w.sends().is_empty(), "SPA views are not counted either");
}

#[test]
fn a_refused_page_view_leaves_refresh_to_read_the_counts() {
    let mut f = fake("https://blog.example/a");
    f.counters = true;
    let mut w = World::start(f, 0);
    let (_, _, id) = w.sends().remove(0);
    w.answer(
        &id,
        403,
        0,
        Some(r#"{"error":"origin_not_allowed","message":"."}"#),
    );
    w.command("refresh", "", "");
    assert_eq!(
        w.client.host().peeks.len(),
        1,
        "no answer is on its way any more"
    );
    assert!(w.client.host().fills.is_empty());
}

// --- Screen width and engagement (docs/behaviour.md §3) ---

/// Starts on `href` with the page visible and focused, the screen `screen` px wide.
fn engaged_world(href: &str, screen: u32) -> World {
    let mut f = fake(href);
    f.engaged = true;
    f.screen = screen;
    World::start(f, 0)
}

impl World {
    /// The window loses focus (`blur`) or the page is shown again without it.
    fn blur(&mut self) {
        self.host().engaged = false;
        self.client.attention();
    }

    /// The window gets focus back with the page visible.
    fn focus(&mut self) {
        self.host().engaged = true;
        self.client.attention();
    }

    /// The page is hidden (`visibilitychange` to hidden, or `pagehide`).
    fn hide(&mut self) {
        self.host().engaged = false;
        self.client.hide();
    }

    fn beacons(&mut self) -> Vec<(String, String)> {
        std::mem::take(&mut self.host().beacons)
    }

    /// Sends the page view, answers it, and returns its body.
    fn settled_page_view(&mut self) -> String {
        let (_, body, id) = self.sends().remove(0);
        self.answer(&id, 200, 0, Some(r#"{"status":"accepted"}"#));
        body
    }
}

fn wire(body: &str) -> Hit {
    serde_json::from_str(body).expect("the body is a wire hit")
}

#[test]
fn page_views_carry_the_screen_width_and_nothing_else_does() {
    let mut w = engaged_world("https://blog.example/", 390);
    let view = wire(&w.sends().remove(0).1);
    assert_eq!(view.screen_width, Some(390));
    w.command("event", "signup", "");
    assert_eq!(wire(&w.sends().remove(0).1).screen_width, None);

    // Unknown (0): left out.
    let mut w = engaged_world("https://blog.example/", 0);
    assert!(!w.sends().remove(0).1.contains("screen_width"));
}

#[test]
fn blur_reports_the_engaged_time_and_scroll_of_the_page_view() {
    let mut w = engaged_world("https://blog.example/a?x=1", 1440);
    let view = wire(&w.settled_page_view());
    w.host().now += 4_200;
    w.host().depth = 37;
    w.blur();
    let s = w.sends();
    assert_eq!(s.len(), 1, "one report");
    let (url, body, key) = &s[0];
    assert!(!url.contains("counts"));
    let report = wire(body);
    assert_eq!(report.kind, tally_wire::TYPE_ENGAGEMENT);
    assert_eq!(
        report.event_id, view.event_id,
        "the page view's own event id"
    );
    assert_eq!(key, &view.event_id, "queued under it");
    assert_eq!(report.visitor_id, view.visitor_id);
    assert_eq!(report.url, view.url);
    assert_eq!(report.referrer, None);
    assert_eq!(report.screen_width, None);
    assert_eq!(report.engaged_ms, Some(4_200));
    assert_eq!(report.scroll, Some(37));
    assert_eq!(report.site, "blog");
}

#[test]
fn engaged_time_is_a_total_of_visible_and_focused_stretches_only() {
    let mut w = engaged_world("https://blog.example/", 0);
    w.settled_page_view();
    w.host().now += 3_000;
    w.blur();
    let (_, body, id) = w.sends().remove(0);
    assert_eq!(wire(&body).engaged_ms, Some(3_000));
    w.answer(&id, 200, 0, None);
    // Blurred for a minute: not engaged time.
    w.host().now += 60_000;
    w.focus();
    w.host().now += 2_500;
    w.hide();
    let beacons = w.beacons();
    let beaconed = &beacons.last().expect("a report beaconed").1;
    assert_eq!(
        wire(beaconed).engaged_ms,
        Some(5_500),
        "a total, never an increment"
    );
    // Hidden for an hour, then back and left at once: nothing new to say (what is sent is
    // the beaconed report, confirmed now that its backoff is over).
    w.host().now += 3_600_000;
    w.focus();
    w.host().now += 10;
    w.blur();
    let s = w.sends();
    assert_eq!(s.len(), 1);
    assert_eq!(&s[0].1, beaconed);
}

#[test]
fn a_page_shown_without_focus_counts_no_engaged_time() {
    let mut f = fake("https://blog.example/");
    f.engaged = false; // opened in a background tab
    let mut w = World::start(f, 0);
    w.settled_page_view();
    w.host().now += 30_000;
    w.host().engaged = true;
    w.client.attention(); // shown and focused
    w.host().now += 1_500;
    w.blur();
    assert_eq!(wire(&w.sends().remove(0).1).engaged_ms, Some(1_500));
}

#[test]
fn a_report_is_made_only_when_there_is_something_new_to_say() {
    let mut w = engaged_world("https://blog.example/", 0);
    w.settled_page_view();
    w.host().depth = 20;
    w.host().now += 999;
    w.blur();
    let s = w.sends();
    assert_eq!(s.len(), 1, "the first report: scroll grew from nothing");
    w.answer(&s[0].2, 200, 0, None);
    // Under a second more, the same depth: nothing.
    w.focus();
    w.host().now += 900;
    w.blur();
    assert!(w.sends().is_empty(), "less than a second more");
    // Deeper: a report, whatever the time.
    w.focus();
    w.host().depth = 55;
    w.blur();
    let s = w.sends();
    assert_eq!(wire(&s[0].1).scroll, Some(55));
    assert_eq!(wire(&s[0].1).engaged_ms, Some(1_899));
    w.answer(&s[0].2, 200, 0, None);
    // A second more engaged time since the last report: a report.
    w.focus();
    w.host().now += 1_000;
    w.blur();
    assert_eq!(wire(&w.sends()[0].1).engaged_ms, Some(2_899));
}

#[test]
fn scroll_is_capped_at_100() {
    let mut w = engaged_world("https://blog.example/", 0);
    w.settled_page_view();
    w.host().depth = 250;
    w.blur();
    assert_eq!(wire(&w.sends()[0].1).scroll, Some(100));
}

#[test]
fn a_report_is_never_sent_past_its_page_views_event_id_window() {
    // Engaged time never exceeds the page view's age, and the report leaves the queue with
    // the page view's event id (so no report can reach tally_wire::MAX_ENGAGED_MS).
    let mut w = engaged_world("https://blog.example/", 0);
    w.settled_page_view();
    w.host().now += queue::MAX_AGE_MS;
    w.blur();
    assert!(w.sends().is_empty());
    assert!(w.queue().is_empty());
}

#[test]
fn hiding_beacons_the_report() {
    let mut w = engaged_world("https://blog.example/", 0);
    let view = wire(&w.settled_page_view());
    w.host().now += 8_000;
    w.host().depth = 100;
    w.hide();
    assert!(w.sends().is_empty(), "no fetch while hiding");
    let beacons = w.beacons();
    assert_eq!(beacons.len(), 1);
    assert_eq!(beacons[0].0, format!("{API}/api/v1/hit?t={}", T0 + 8_000));
    let report = wire(&beacons[0].1);
    assert_eq!(report.event_id, view.event_id);
    assert_eq!((report.engaged_ms, report.scroll), (Some(8_000), Some(100)));
    let q = w.queue();
    assert_eq!(q.len(), 1, "kept: a beacon has no answer");
    assert_eq!(q[0].body, beacons[0].1);
    // pagehide right after visibilitychange: nothing new, the same entry is not beaconed
    // again before its backoff.
    w.hide();
    assert!(w.beacons().is_empty());
}

#[test]
fn a_failed_report_is_retried_byte_for_byte() {
    let mut w = engaged_world("https://blog.example/", 0);
    w.settled_page_view();
    w.host().now += 2_000;
    w.blur();
    let first = w.sends().remove(0);
    w.answer(&first.2, 503, 0, None);
    w.advance(retry::CAP_MS);
    let again = w.sends();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].1, first.1, "the same body");
    w.answer(&again[0].2, 200, 0, Some(r#"{"status":"duplicate"}"#));
    assert!(w.queue().is_empty());
}

#[test]
fn a_pending_page_view_and_its_report_are_both_delivered_in_that_order() {
    let mut w = engaged_world("https://blog.example/", 0);
    let (_, view_body, id) = w.sends().remove(0);
    w.answer(&id, 503, 60_000, None); // the page view waits a minute (Retry-After)
    w.host().now += 3_000;
    w.blur();
    assert!(
        w.sends().is_empty(),
        "the report waits behind its page view, under the same event id"
    );
    let q = w.queue();
    assert_eq!(q.len(), 2);
    assert_eq!(
        (q[0].id.as_str(), q[1].id.as_str()),
        (id.as_str(), id.as_str())
    );
    assert_eq!(q[0].body, view_body);
    w.advance(retry::CAP_MS);
    let s = w.sends();
    assert_eq!(
        s.len(),
        1,
        "only the page view: one entry per event id at a time"
    );
    assert_eq!(s[0].1, view_body);
    // Its answer settles the page view, not the report, which goes next.
    w.answer(&id, 200, 0, Some(r#"{"status":"accepted"}"#));
    let s = w.sends();
    assert_eq!(s.len(), 1);
    assert_eq!(wire(&s[0].1).kind, tally_wire::TYPE_ENGAGEMENT);
    assert_eq!(w.queue().len(), 1, "the report is queued until answered");
    w.answer(&id, 200, 0, Some(r#"{"status":"accepted"}"#));
    assert!(w.queue().is_empty());
}

#[test]
fn a_page_view_in_flight_keeps_its_report_waiting() {
    let mut w = engaged_world("https://blog.example/", 0);
    let (_, _, id) = w.sends().remove(0); // in flight
    w.host().now += 1_000;
    w.blur();
    assert!(w.sends().is_empty());
    w.hide();
    assert!(
        w.beacons().is_empty(),
        "neither beaconed: the page view's keepalive fetch is on its way, its report after it"
    );
    w.answer(&id, 200, 0, None);
    assert_eq!(wire(&w.sends()[0].1).engaged_ms, Some(1_000));
}

#[test]
fn hiding_beacons_a_due_page_view_and_then_its_report() {
    let mut w = engaged_world("https://blog.example/", 0);
    let (_, view_body, id) = w.sends().remove(0);
    w.answer(&id, 0, 0, None); // network error
    w.host().now += retry::CAP_MS; // due again
    w.hide();
    let beacons = w.beacons();
    assert_eq!(beacons.len(), 2, "{beacons:?}");
    assert_eq!(beacons[0].1, view_body, "the page view first");
    assert_eq!(wire(&beacons[1].1).kind, tally_wire::TYPE_ENGAGEMENT);
}

#[test]
fn a_newer_report_waits_for_an_older_one_on_its_way() {
    let mut w = engaged_world("https://blog.example/", 0);
    w.settled_page_view();
    w.host().now += 2_000;
    w.blur();
    let (_, older, id) = w.sends().remove(0); // in flight
    w.focus();
    w.host().now += 2_000;
    w.blur();
    assert!(w.sends().is_empty(), "one entry per event id at a time");
    // The answer settles the report that was sent; the newer one goes next.
    w.answer(&id, 200, 0, None);
    let s = w.sends();
    assert_eq!(s.len(), 1);
    assert_ne!(s[0].1, older);
    assert_eq!(wire(&s[0].1).engaged_ms, Some(4_000));
    w.answer(&id, 200, 0, None);
    assert!(w.queue().is_empty());
}

#[test]
fn spa_navigation_reports_the_page_left_before_counting_the_next() {
    let mut w = engaged_world("https://blog.example/a", 0);
    let a = wire(&w.settled_page_view());
    w.host().now += 6_000;
    w.host().depth = 80;
    w.host().href = "https://blog.example/b".into();
    w.client.navigate(Navigation::Push);
    let s = w.sends();
    assert_eq!(s.len(), 2, "{s:?}");
    let (report, b) = (wire(&s[0].1), wire(&s[1].1));
    assert_eq!(report.kind, tally_wire::TYPE_ENGAGEMENT);
    assert_eq!(report.event_id, a.event_id);
    assert_eq!(report.url, "https://blog.example/a");
    assert_eq!((report.engaged_ms, report.scroll), (Some(6_000), Some(80)));
    assert_eq!(b.kind, TYPE_PAGEVIEW);
    assert_eq!(w.client.host().depth, 0, "the scroll depth starts again");
    // The next page view measures afresh.
    w.answer(&s[0].2, 200, 0, None);
    w.answer(&s[1].2, 200, 0, None);
    w.host().now += 1_000;
    w.blur();
    let next = wire(&w.sends()[0].1);
    assert_eq!(next.event_id, b.event_id);
    assert_eq!(next.engaged_ms, Some(1_000));
}

#[test]
fn a_report_never_asks_for_counts() {
    let mut f = fake("https://blog.example/");
    f.engaged = true;
    f.counters = true;
    let mut w = World::start(f, 0);
    let (url, _, id) = w.sends().remove(0);
    assert!(url.ends_with("&counts=1"));
    w.host().now += 1_000;
    w.blur(); // waits behind the page view
    w.answer(&id, 200, 0, Some(COUNTS_ANSWER));
    let s = w.sends();
    assert_eq!(wire(&s[0].1).kind, tally_wire::TYPE_ENGAGEMENT);
    assert!(!s[0].0.contains("counts"), "{}", s[0].0);
    w.answer(&id, 200, 0, Some(COUNTS_ANSWER));
    assert_eq!(
        w.client.host().fills.len(),
        1,
        "only the page view's answer fills"
    );
}

#[test]
fn reports_expire_with_their_page_views_event_id() {
    let mut w = engaged_world("https://blog.example/", 0);
    w.settled_page_view();
    w.host().now += 2 * 60 * 60 * 1000; // two hours on the page
    w.blur();
    let (_, _, id) = w.sends().remove(0);
    w.answer(&id, 503, 0, None);
    assert_eq!(w.queue()[0].head.born, T0, "born with the page view");
}

#[test]
fn no_engagement_for_an_ignored_browser() {
    let mut f = fake("https://blog.example/");
    f.engaged = true;
    let mut w = World::start(f, Flag::Ignored as u32);
    w.host().now += 5_000;
    w.host().depth = 90;
    w.blur();
    w.hide();
    assert!(w.sends().is_empty() && w.beacons().is_empty());

    // Ignored mid-page: the page view reports nothing more.
    let mut w = engaged_world("https://blog.example/", 0);
    w.settled_page_view();
    w.command("ignore", "true", "");
    w.host().now += 5_000;
    w.blur();
    w.hide();
    assert!(w.sends().is_empty() && w.beacons().is_empty());
}

#[test]
fn no_engagement_without_a_recorded_page_view() {
    // Manual mode before any tally('pageview').
    let mut f = fake("https://blog.example/");
    f.engaged = true;
    let mut w = World::start(f, Flag::Manual as u32);
    w.host().now += 5_000;
    w.host().depth = 50;
    w.blur();
    w.hide();
    assert!(w.sends().is_empty() && w.beacons().is_empty());

    // A page view too large to send is not recorded, and reports nothing.
    let long = format!("https://blog.example/{}", "p".repeat(MAX_HIT_BYTES));
    let mut w = engaged_world(&long, 0);
    assert!(w.sends().is_empty());
    w.host().now += 5_000;
    w.host().depth = 50;
    w.blur();
    assert!(w.sends().is_empty());
}

#[test]
fn withdrawn_consent_ends_the_reports_of_the_current_page_view() {
    let mut f = fake("https://blog.example/");
    f.engaged = true;
    let mut w = World::start(f, Flag::Consent as u32);
    w.command("consent", "true", "");
    w.settled_page_view();
    w.command("consent", "false", "");
    w.host().now += 5_000;
    w.blur();
    assert!(
        w.sends().is_empty(),
        "its reports would carry the stored visitor id"
    );
}

#[test]
fn a_newer_report_replaces_an_unconfirmed_older_one() {
    let mut w = engaged_world("https://blog.example/", 0);
    w.settled_page_view();
    w.host().now += 2_000;
    w.hide(); // beaconed: kept, unconfirmed
    let beaconed = w.beacons().remove(0).1;
    assert_eq!(w.queue().len(), 1);
    w.focus();
    w.host().now += 3_000;
    w.blur();
    let s = w.sends();
    assert_eq!(
        s.len(),
        1,
        "sent at once, not held back by the older report"
    );
    assert_eq!(wire(&s[0].1).engaged_ms, Some(5_000));
    let q = w.queue();
    assert_eq!(q.len(), 1, "the older report left the queue");
    assert_ne!(q[0].body, beaconed);
}

#[test]
fn hidden_shown_and_hidden_again_beacons_the_last_total() {
    // The tab is switched away and back, then closed: the last report must go out by beacon,
    // not wait behind the first (unconfirmed) one while the page closes.
    let mut w = engaged_world("https://blog.example/", 0);
    w.settled_page_view();
    w.host().now += 2_000;
    w.hide();
    assert_eq!(w.beacons().len(), 1);
    w.host().now += 60_000; // away: the first beacon's backoff is over
    w.focus();
    w.host().now += 1_500;
    w.hide();
    let beacons = w.beacons();
    assert_eq!(beacons.len(), 1, "{beacons:?}");
    assert_eq!(wire(&beacons[0].1).engaged_ms, Some(3_500));
}

#[test]
fn a_report_never_replaces_its_page_view() {
    let mut w = engaged_world("https://blog.example/", 0);
    let (_, view_body, id) = w.sends().remove(0);
    w.answer(&id, 0, 0, None); // tried and failed
    w.host().now += 1_000;
    w.blur();
    w.focus();
    w.host().now += 1_000;
    w.blur();
    let q = w.queue();
    assert_eq!(q[0].body, view_body, "the page view stays, first");
    assert_eq!(q.len(), 3, "reports not yet tried are not replaced: {q:?}");
}
