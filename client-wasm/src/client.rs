//! What the client does, independent of the browser: which hits it makes, where it keeps its
//! state, how it sends, retries and fills in-page counters.
//!
//! Contract:
//! - All I/O goes through the [`Host`] trait (storage, sending, timers, the page's URL, the
//!   DOM), so this module is plain Rust, tested natively with a fake host. In the browser the
//!   host is `web::Web`, a thin layer over `js/host.js`.
//! - Storage: `localStorage` if it works, else `sessionStorage`, else memory (the page's
//!   lifetime); a storage that starts failing later (full, revoked) is left for memory too.
//!   With [`Options::storage`] off nothing is ever written and the visitor id is `null`. A
//!   stored visitor id is reused only if it is a canonical UUID.
//! - Every hit gets a fresh UUIDv7 event id, is written to the queue, then sent; a retry
//!   resends the stored body byte for byte, so the event id never changes.
//! - Sending: [`Host::send`] (fetch, whose answer comes back through [`Client::answer`]) while
//!   the page lives; [`Host::beacon`] only when the page is being hidden or closed
//!   ([`Client::hide`]), where no answer can be read. A hit leaves the queue only on a 2xx, or
//!   on a 4xx other than 408/425/429, which retrying cannot fix.
//! - Failures (network error, 408, 425, 429, 5xx, and beacons, whose outcome is unknown) are
//!   retried after [`retry::next_delay_ms`]: capped exponential backoff with jitter, never
//!   earlier than `Retry-After`. While a send awaits its answer the entry is leased for
//!   [`LEASE_MS`] (its `due` moved on) so that neither this page nor other tabs sharing the
//!   storage send it again meanwhile, and this page sends no entry again while the host
//!   reports its earlier send still awaiting an answer ([`Host::awaiting`]); the answer names
//!   the event id it settles.
//! - In-page counters are filled from the answer to the page view's own request
//!   (`?counts=1`), asked for only when the page has (or may still get) counter elements.
//!   [`Command::Refresh`] (what a second run of the loader asks for) fills them again for the
//!   current URL without counting: nothing while the answer of a page view with counts is on
//!   its way (it fills them when it comes), else by reading `GET /api/v1/counts`
//!   ([`Host::peek`]; the views it shows are committed, so the current one is included).
//! - Consent ([`Options::consent`], `data-storage="consent"`): the client starts as with
//!   storage off unless consent was given on an earlier page ([`CONSENT_KEY`]);
//!   [`Command::Consent`] `true` switches to the stored visitor id and queue from then on and
//!   remembers it, `false` deletes the stored id, queue and consent.
//! - Ignore ([`Options::ignored`] at the start, [`Command::Ignore`] later; the loader keeps
//!   the choice in `localStorage` and reads `#tally-ignore` / `#tally-unignore`): while set,
//!   nothing is recorded or sent, and the queue is emptied when it is set; counters are still
//!   shown (read, not counted).
//! - Page views carry the screen width ([`Host::screen_width`]) when the browser knows it.
//! - Engagement (docs/behaviour.md §3): for the page view last recorded, the client adds up
//!   the time the page was visible and focused ([`Host::engaged`], asked at the page view and
//!   on every focus or visibility change, [`Client::attention`]) and reads the largest scroll
//!   depth ([`Host::scroll`]). When the visitor leaves for now (blur, hidden), the page is
//!   closed ([`Client::hide`]) or an SPA navigation counts the next page view, it queues an
//!   engagement report (`tally_wire::TYPE_ENGAGEMENT`: the page view's event id, visitor id
//!   and URL) if there is something new to say ([`REPORT_STEP_MS`] more engaged time, or a
//!   deeper scroll). Its numbers are totals, never increments, so a resend never adds.
//! - A report is queued under its page view's event id, like the page view: entries that
//!   share an event id go one at a time, in queue order (only the first of them is sent or
//!   beaconed in a pass; an answer settles the first entry with its id). So a page view is
//!   delivered before its reports, an answer or a fetch in flight never settles a report for
//!   its page view (or a newer report for an older one), and an unsent page view beaconed
//!   while hiding goes just before its report. An ignored browser, and a page view that was
//!   not recorded, report nothing; withdrawn consent ends the reports of the current page
//!   view (they would carry the visitor id the page view was sent with).

use crate::json::{self, HitFields};
use crate::ops::Flag;
use crate::queue::{self, Head};
use crate::{ids, retry};
use tally_wire::{MAX_HIT_BYTES, TYPE_ENGAGEMENT, TYPE_EVENT, TYPE_PAGEVIEW};

/// Storage key of the visitor id.
pub const VISITOR_KEY: &str = "tally:vid";
/// Storage key of the retry queue.
pub const QUEUE_KEY: &str = "tally:q";
/// Storage key written once to check that an area works.
const PROBE_KEY: &str = "tally:probe";
/// Storage key of the remembered consent (`data-storage="consent"`).
pub const CONSENT_KEY: &str = "tally:consent";
/// How long a sent hit is reserved while its answer is awaited.
pub const LEASE_MS: u64 = 15_000;
/// Longest page URL sent whole; longer ones lose their query and fragment.
const MAX_URL_CHARS: usize = 2_048;
/// The engaged time a page view must gain since its last report for a new one (unless its
/// scroll depth grew).
pub const REPORT_STEP_MS: u64 = 1_000;
/// Length of an event id (a UUID's text).
const EVENT_ID_LEN: usize = 36;

/// The status [`Host::send`] reports when the request failed without an HTTP answer.
pub const STATUS_NETWORK_ERROR: u16 = 0;
/// The status [`Host::send`] reports when it could not use fetch and handed the hit to
/// `sendBeacon` instead: delivered or not, nobody knows.
pub const STATUS_BEACON: u16 = 1;

/// A browser storage area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Area {
    /// `localStorage`: survives the tab.
    Local = 0,
    /// `sessionStorage`: lives as long as the tab.
    Session = 1,
}

/// Everything the client needs from its surroundings.
pub trait Host {
    /// Current Unix time in milliseconds.
    fn now_ms(&self) -> u64;
    /// Fills `buf` with cryptographically random bytes.
    fn random(&self, buf: &mut [u8]);
    /// Reads a key; empty when absent or when the storage throws (an empty value is never
    /// stored: [`Host::save`] removes the key instead).
    fn load(&self, area: Area, key: &str) -> String;
    /// Writes a key (an empty value removes it); false when the storage throws.
    fn save(&mut self, area: Area, key: &str, value: &str) -> bool;
    /// POSTs `body` as `text/plain` to `{api}/api/v1/hit?t=<ms>[&counts=1]` (`t` defeats
    /// caches and proxies); the outcome must come back later, never synchronously, as
    /// `Client::answer(id, ...)`.
    fn send(&mut self, api: &str, counts: bool, body: &str, id: &str);
    /// Whether a [`Host::send`] of event `id` by this page still awaits its answer (such an
    /// entry is not sent again, however long the answer takes: its lease only keeps other
    /// tabs away). The host knows its outstanding requests; a list here would cost more.
    fn awaiting(&self, id: &str) -> bool;
    /// Hands `body` to `navigator.sendBeacon` for `{api}/api/v1/hit?t=<ms>`; true if the
    /// browser accepted it.
    fn beacon(&mut self, api: &str, body: &str) -> bool;
    /// Arranges one call of `Client::tick` after `delay_ms`.
    fn schedule(&mut self, delay_ms: u32);
    /// The page's current URL.
    fn href(&self) -> String;
    /// Whether the page's current URL is `url`'s page: the same path when `path_only`, else
    /// the same URL but for the fragment (compared by the browser's URL parser).
    fn same_page(&self, url: &str, path_only: bool) -> bool;
    /// The page's referrer (`document.referrer`), empty when none.
    fn referrer(&self) -> String;
    /// Whether the page has counter elements, or may still get some (still parsing).
    fn wants_counts(&self, busuanzi: bool) -> bool;
    /// Fills the in-page counters from the body of a 2xx answer to `?counts=1` (a
    /// `tally_wire::HitResponse`): `[data-tally=site.views|site.visitors|page.views|
    /// page.visitors|live]` and, if `busuanzi`, the `busuanzi_value_*` ids. Bodies without
    /// counts are ignored.
    fn fill(&mut self, answer: &str, busuanzi: bool);
    /// Reads `GET {api}/api/v1/counts?site=&page=<the current path>` (counting nothing) and
    /// fills the in-page counters from it, as [`Host::fill`] does.
    fn peek(&mut self, api: &str, site: &str, busuanzi: bool);
    /// Starts reporting page hides (`Client::hide`), focus and visibility changes
    /// (`Client::attention`) and, if `spa`, history changes (`Client::navigate`).
    fn listen(&mut self, spa: bool);
    /// Whether the page is visible (`document.visibilityState`) and focused
    /// (`document.hasFocus()`) now.
    fn engaged(&self) -> bool;
    /// The largest scroll depth seen since the last reset, the current one included: percent
    /// of the document seen, `(scrollY + innerHeight) / scrollHeight`, at most 100 (a page that
    /// fits the window is 100). `reset` starts again from 0 (a new page view).
    fn scroll(&mut self, reset: bool) -> u8;
    /// `screen.width` in CSS pixels, 0 when unknown.
    fn screen_width(&self) -> u32;
    /// `s` as a JSON string literal (`JSON.stringify`).
    fn quote(&self, s: &str) -> String;
}

/// The `data-*` options of the script tag, as the loader passes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Site id (`data-site`, default: the page's host name).
    pub site: String,
    /// Collector base URL without a trailing slash (`data-api`, default: the script's origin).
    pub api: String,
    /// Keep a visitor id and queue in storage (off with `data-storage="none"` or
    /// `"consent"`).
    pub storage: bool,
    /// Storage waits for consent (`data-storage="consent"`): on when given on an earlier page.
    pub consent: bool,
    /// This browser is excluded from counting (the loader read it from `localStorage`).
    pub ignored: bool,
    /// Also fill the classic busuanzi ids (`data-busuanzi`).
    pub busuanzi: bool,
    /// Count page views automatically (off with `data-auto="false"`).
    pub auto: bool,
    /// Count history changes as page views (off with `data-spa="false"`).
    pub spa: bool,
}

impl Options {
    /// Builds the options from the loader's arguments: `flags` holds [`Flag`] bits.
    pub fn new(site: String, api: String, flags: u32) -> Self {
        let consent = Flag::Consent.is_in(flags);
        Options {
            site,
            api,
            storage: !Flag::NoStorage.is_in(flags) && !consent,
            consent,
            ignored: Flag::Ignored.is_in(flags),
            busuanzi: Flag::Busuanzi.is_in(flags),
            auto: !Flag::Manual.is_in(flags),
            spa: !Flag::NoSpa.is_in(flags),
        }
    }
}

/// A `tally(kind, value, {dedupe})` call from the page (its strings borrowed from the call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command<'a> {
    /// `tally('pageview')`: count a page view of the current URL.
    PageView,
    /// `tally('event', name, {dedupe})`.
    Event {
        /// The event's name (not empty).
        name: &'a str,
        /// Counted once per (site, name, dedupe) when present.
        dedupe: Option<&'a str>,
    },
    /// `tally('consent', given)`: store the visitor id and queue from now on, or delete them.
    Consent(bool),
    /// `tally('ignore', on)`: exclude this browser from counting, or include it again.
    Ignore(bool),
    /// `tally('refresh')`: fill the in-page counters again for the current URL, counting
    /// nothing (a second run of the loader on the same document asks for this).
    Refresh,
}

impl<'a> Command<'a> {
    /// The command of `tally(kind, value, {dedupe})`; `on` is the value's truthiness, `text`
    /// the value as text. `None` for an unknown kind or an event without a name.
    pub fn parse(
        kind: &str,
        on: bool,
        text: Option<&'a str>,
        dedupe: Option<&'a str>,
    ) -> Option<Self> {
        Some(match kind {
            "pageview" => Command::PageView,
            "event" => Command::Event {
                name: text?,
                dedupe,
            },
            "consent" => Command::Consent(on),
            "ignore" => Command::Ignore(on),
            "refresh" => Command::Refresh,
            _ => return None,
        })
    }
}

/// A history change reported by the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Navigation {
    /// `history.pushState`: counts when the path or query changed.
    Push,
    /// `history.replaceState`: counts only when the path changed (filters and tabs that
    /// rewrite the query are not new pages).
    Replace,
    /// `popstate` (back/forward): counts when the path or query changed.
    Pop,
}

/// Where the visitor id and queue live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Store {
    Area(Area),
    Memory,
}

/// The running client of one page.
pub struct Client<H> {
    host: H,
    opts: Options,
    store: Store,
    /// The anonymous visitor id, empty with storage off (sent as `null`).
    visitor: String,
    /// The queue's text when `store` is memory.
    memory: String,
    /// Event id of the page view whose answer fills the in-page counters (empty: none; an
    /// event id never is).
    counts_for: String,
    /// URL of the last counted page view: SPA change detection and SPA referrer.
    page: String,
    /// When the earliest pending [`Host::schedule`] fires (0: none pending).
    timer_at: u64,
    /// Event id of the last page view recorded: the queue key of its engagement reports.
    view: String,
    /// When that page view was made (Unix ms): its reports expire with it.
    born: u64,
    /// Its engagement report without the numbers ([`json::open`]); empty when it reports
    /// nothing (not recorded, ignored, consent withdrawn).
    report: String,
    /// Its visible and focused time so far, ms, the current stretch not included.
    engaged_ms: u64,
    /// When the current visible and focused stretch began (0: the page is not engaged).
    since: u64,
    /// The engaged ms and scroll depth of its last report (0 and 0 before the first).
    told_ms: u64,
    told_scroll: u8,
    /// A report of the current page view is being queued: older ones leave ([`Client::pass`]).
    replacing: bool,
}

impl<H: Host> Client<H> {
    /// Starts the client: picks storage, restores or creates the visitor id, counts the page
    /// view (unless manual) and sends whatever earlier pages left in the queue.
    pub fn start(host: H, opts: Options) -> Self {
        let mut client = Client {
            host,
            opts,
            store: Store::Memory,
            visitor: String::new(),
            memory: String::new(),
            counts_for: String::new(),
            page: String::new(),
            timer_at: 0,
            view: String::new(),
            born: 0,
            report: String::new(),
            engaged_ms: 0,
            since: 0,
            told_ms: 0,
            told_scroll: 0,
            replacing: false,
        };
        if client.opts.consent && client.consented() {
            client.opts.storage = true;
        }
        if client.opts.storage {
            client.use_storage();
        }
        if client.opts.ignored {
            // What earlier pages left queued is not sent either.
            client.ignore(true);
        }
        let auto = client.opts.auto;
        client.host.listen(auto && client.opts.spa);
        if auto {
            let referrer = client.host.referrer();
            client.page_view(referrer);
        }
        client.tick();
        client
    }

    /// The host, for inspection.
    pub fn host(&self) -> &H {
        &self.host
    }

    /// The host, for changing the fake world in tests.
    pub fn host_mut(&mut self) -> &mut H {
        &mut self.host
    }

    /// Runs a `tally(...)` command.
    pub fn command(&mut self, command: Command) {
        match command {
            Command::PageView => self.page_view(self.host.referrer()),
            Command::Event { name, dedupe } => {
                let url = self.host.href();
                self.record(TYPE_EVENT, &url, "", Some(name), dedupe, false);
            }
            Command::Consent(given) => self.consent(given),
            Command::Ignore(on) => self.ignore(on),
            Command::Refresh => self.refresh(),
        }
    }

    /// Fills the in-page counters again for the current URL, counting nothing: nothing to do
    /// while the answer of a page view with counts is awaited (it fills them when it comes),
    /// else the counts are read from the collector.
    pub fn refresh(&mut self) {
        let busuanzi = self.opts.busuanzi;
        if self.counts_for.is_empty() && self.host.wants_counts(busuanzi) {
            self.host.peek(&self.opts.api, &self.opts.site, busuanzi);
        }
    }

    /// Consent given: the visitor id and queue are stored (and the consent remembered) from
    /// now on, and what was queued in memory moves to storage. Withdrawn: the stored id,
    /// queue and consent are deleted from both areas; the queue stays in memory for this page
    /// and later hits carry no visitor id.
    pub fn consent(&mut self, given: bool) {
        if given {
            if !self.opts.storage {
                self.opts.storage = true;
                let queued = std::mem::take(&mut self.memory);
                self.use_storage();
                if let Store::Area(area) = self.store {
                    self.host.save(area, CONSENT_KEY, "1");
                }
                // After whatever another tab with consent has stored (lines append).
                let mut text = self.load_queue();
                text.push_str(&queued);
                self.pass(text, false, "", 0);
            }
        } else {
            let queued = self.load_queue();
            self.forget(Area::Local);
            self.forget(Area::Session);
            self.opts.storage = false;
            self.store = Store::Memory;
            self.visitor.clear();
            self.memory = queued;
            // Its reports would carry the visitor id the page view was sent with.
            self.report.clear();
        }
    }

    /// Excludes this browser from counting, or includes it again (the loader remembers the
    /// choice for later pages). Setting it empties the queue: nothing is sent while it is set.
    pub fn ignore(&mut self, on: bool) {
        self.opts.ignored = on;
        if on {
            self.save_queue(String::new());
            self.report.clear();
        }
    }

    /// A history change: counts a page view when the URL changed as [`Navigation`] says:
    /// its path for `replaceState`, else anything but its fragment. The browser's URL parser
    /// compares ([`Host::same_page`]).
    /// The page view being left reports its engagement first.
    pub fn navigate(&mut self, how: Navigation) {
        if !self.host.same_page(&self.page, how == Navigation::Replace) {
            self.engagement(false);
            let previous = std::mem::take(&mut self.page);
            self.page_view(previous);
        }
    }

    /// The window gained or lost focus, or the page became visible: an engaged stretch
    /// begins when the page is now visible and focused; when it is not, the visitor left for
    /// now and the page view reports its engagement.
    pub fn attention(&mut self) {
        if !self.host.engaged() {
            self.engagement(false);
        } else if self.since == 0 {
            self.since = self.host.now_ms();
        }
    }

    /// The answer to the send of event `id`: `status` 0 for a network error, 1 for a beacon
    /// hand-off, else the HTTP status, with the `Retry-After` wait in ms (0 when none) and
    /// the body when present. An answer for an event no longer queued changes nothing.
    pub fn answer(&mut self, id: &str, status: u16, retry_after_ms: u64, body: Option<&str>) {
        let retry = matches!(status, 0 | 1 | 408 | 425 | 429 | 500..=599);
        // A retried entry waits at least `Retry-After`; a settled one (u64::MAX) leaves.
        let wait = if retry {
            retry_after_ms.min(retry::MAX_RETRY_AFTER_MS)
        } else {
            u64::MAX
        };
        // Settled: its counts, if any, are no longer on their way (a refresh reads them), and
        // the engagement report that the pass below may send next does not ask for them.
        if !retry && self.counts_for == id {
            self.counts_for.clear();
            if (200..300).contains(&status)
                && let Some(body) = body
            {
                self.host.fill(body, self.opts.busuanzi);
            }
        }
        self.pass(String::new(), false, id, wait);
    }

    /// A timer set through [`Host::schedule`] fired: sends what is due.
    pub fn tick(&mut self) {
        self.timer_at = 0;
        self.pass(String::new(), false, "", 0);
    }

    /// The page is being hidden or closed: the page view reports its engagement, then every
    /// due, unsent hit goes to `sendBeacon`, the one way a request survives the page. The
    /// hits stay queued (a beacon has no answer) with a backoff, so a later page confirms
    /// them; the collector dedupes the repeat.
    pub fn hide(&mut self) {
        self.engagement(true);
    }

    /// Picks the storage area and restores or creates the visitor id there.
    fn use_storage(&mut self) {
        self.store = self.pick_store();
        self.visitor = self.visitor_id();
    }

    /// Whether consent was given on an earlier page (read only: nothing is written before).
    fn consented(&self) -> bool {
        !self.host.load(Area::Local, CONSENT_KEY).is_empty()
            || !self.host.load(Area::Session, CONSENT_KEY).is_empty()
    }

    /// Deletes the visitor id, queue and consent from a storage area.
    fn forget(&mut self, area: Area) {
        self.host.save(area, VISITOR_KEY, "");
        self.host.save(area, QUEUE_KEY, "");
        self.host.save(area, CONSENT_KEY, "");
    }

    fn pick_store(&mut self) -> Store {
        // Not a `for` over an array: that iterator costs more WebAssembly than two calls.
        if self.works(Area::Local) {
            Store::Area(Area::Local)
        } else if self.works(Area::Session) {
            Store::Area(Area::Session)
        } else {
            Store::Memory
        }
    }

    /// Whether a storage area takes a write and reads it back (the probe is removed again).
    fn works(&mut self, area: Area) -> bool {
        let ok = self.host.save(area, PROBE_KEY, "1") && self.host.load(area, PROBE_KEY) == "1";
        if ok {
            self.host.save(area, PROBE_KEY, "");
        }
        ok
    }

    fn visitor_id(&mut self) -> String {
        let Store::Area(area) = self.store else {
            return self.new_visitor_id();
        };
        let id = self.host.load(area, VISITOR_KEY);
        if ids::is_uuid(&id) {
            return id;
        }
        let id = self.new_visitor_id();
        self.host.save(area, VISITOR_KEY, &id);
        id
    }

    fn new_visitor_id(&self) -> String {
        let mut random = [0u8; 16];
        self.host.random(&mut random);
        ids::visitor_id(random)
    }

    /// Counts a page view of the current URL coming from `referrer` (the document's referrer,
    /// or the URL an SPA navigation left), asking for the counts when the page shows them; an
    /// ignored browser counts nothing and reads the counts instead.
    fn page_view(&mut self, referrer: String) {
        let url = self.host.href();
        // Counters now show this page: an earlier page view's answer no longer fills them.
        self.counts_for.clear();
        // Engagement starts again (the page view left has reported: `navigate`).
        self.report.clear();
        self.engaged_ms = 0;
        self.told_ms = 0;
        self.told_scroll = 0;
        if self.opts.ignored {
            self.refresh();
        } else {
            let counts = self.host.wants_counts(self.opts.busuanzi);
            self.record(TYPE_PAGEVIEW, &url, &referrer, None, None, counts);
        }
        self.page = url;
    }

    /// Queues and sends a hit; a page view's also starts its engagement measurement.
    fn record(
        &mut self,
        kind: &str,
        url: &str,
        referrer: &str,
        name: Option<&str>,
        dedupe: Option<&str>,
        counts: bool,
    ) {
        if self.opts.ignored {
            return;
        }
        let now = self.host.now_ms();
        let mut random = [0u8; 10];
        self.host.random(&mut random);
        let id = ids::event_id(now, random);
        let referrer = clip(referrer);
        // A page view is the one hit without a name (cheaper than comparing `kind`).
        let page_view = name.is_none();
        let width = if page_view {
            self.host.screen_width()
        } else {
            0
        };
        let mut fields = HitFields {
            site: &self.opts.site,
            kind,
            event_id: &id,
            visitor_id: (!self.visitor.is_empty()).then_some(&self.visitor),
            url: clip(url),
            referrer: (!referrer.is_empty()).then_some(referrer),
            name,
            dedupe,
            screen_width: (width > 0).then_some(width),
        };
        let body = json::hit(&fields, &|s| self.host.quote(s));
        if body.len() > MAX_HIT_BYTES {
            return; // the collector would refuse it (413); retrying cannot help
        }
        if page_view {
            // Its engagement reports: the same event id, visitor id and URL.
            fields.kind = TYPE_ENGAGEMENT;
            fields.referrer = None;
            fields.screen_width = None;
            self.report = json::open(&fields, &|s| self.host.quote(s));
            self.view = id.clone();
            self.born = now;
            self.since = if self.host.engaged() { now } else { 0 };
            self.host.scroll(true);
        }
        if counts {
            self.counts_for = id.clone();
        }
        self.enqueue(now, &id, &body, false);
    }

    /// Ends the current engaged stretch and, when the page view has something new to say
    /// ([`REPORT_STEP_MS`] more engaged time than its last report, or a deeper scroll),
    /// queues its engagement report; then one pass, beaconing when `hiding`.
    fn engagement(&mut self, hiding: bool) {
        let now = self.host.now_ms();
        // No cap at `tally_wire::MAX_ENGAGED_MS` (30 days) is needed: engaged time never
        // exceeds the page view's age, and a report expires with the page view's event id
        // (71 h, `queue::MAX_AGE_MS`).
        if self.since != 0 {
            self.engaged_ms += now.saturating_sub(self.since);
            self.since = 0;
        }
        if !self.report.is_empty() {
            let ms = self.engaged_ms;
            let scroll = self.host.scroll(false).min(100);
            if ms >= self.told_ms + REPORT_STEP_MS || scroll > self.told_scroll {
                self.told_ms = ms;
                self.told_scroll = scroll;
                let body = json::engagement(&self.report, ms, scroll);
                // Born with its page view: it expires with the page view's event id.
                let view = self.view.clone();
                self.replacing = true;
                self.enqueue(self.born, &view, &body, hiding);
                self.replacing = false;
                return;
            }
        }
        self.pass(String::new(), hiding, "", 0);
    }

    /// Appends a hit made at `born`, due at once, to the queue under `key` (its event id) and
    /// passes over the queue: it is sent after anything older that is due.
    fn enqueue(&mut self, born: u64, key: &str, body: &str, hiding: bool) {
        let head = Head {
            due: 0,
            attempts: 0,
            born,
        };
        let mut queued = self.load_queue();
        queue::line(&mut queued, head, key, body);
        self.pass(queued, hiding, "", 0);
    }

    /// One pass over the queue (`text`, or the stored one when empty). Entries that share an
    /// event id (a page view and its engagement reports) go one at a time, in queue order:
    /// only the first of them kept (and not beaconed) in this pass is sent, and an answer
    /// settles the first entry with its id. The entry `settled` (if any) leaves when `wait`
    /// is `u64::MAX`, else it counts a failed try and waits its backoff, at least `wait` ms.
    /// While `replacing` (a report of the current page view is being queued), its reports that
    /// were tried before (`due` is not 0) and are not on their way leave: the one just queued
    /// says more (a beaconed one is unconfirmed, and would otherwise hold it back while the
    /// page closes). Then every due
    /// entry is sent (and leased for [`LEASE_MS`]: not due again while its answer is awaited,
    /// here or in another tab) or, when `hiding`, beaconed (an unconfirmed try, backed off);
    /// the queue is saved and the timer set for the next due entry.
    fn pass(&mut self, text: String, hiding: bool, mut settled: &str, wait: u64) {
        let now = self.host.now_ms();
        let text = if text.is_empty() {
            self.load_queue()
        } else {
            text
        };
        let mut next = u64::MAX;
        // The event ids of the entries kept so far in this pass, but beaconed ones.
        let mut ahead: Vec<u8> = Vec::new();
        let text = queue::edit(&text, now, |h, id, body| {
            if id == settled {
                settled = "";
                if wait == u64::MAX {
                    return false;
                }
                h.attempts = h.attempts.saturating_add(1);
                h.due = now + retry::next_delay_ms(h.attempts, random_u32(&self.host), wait);
            }
            let busy = self.host.awaiting(id);
            // Reports of the current page view begin with its report's fixed part.
            if self.replacing
                && !busy
                && h.due != 0
                && body.as_bytes().starts_with(self.report.as_bytes())
            {
                return false;
            }
            let key = id.as_bytes();
            if holds(&ahead, key) {
                return true; // after the entry with its id, whose answer passes again
            }
            let mut beaconed = false;
            if !busy && h.due <= now {
                let api = &self.opts.api;
                if !hiding {
                    let counts = self.counts_for == id;
                    self.host.send(api, counts, body, id);
                    h.due = now + LEASE_MS;
                } else if self.host.beacon(api, body) {
                    h.attempts = h.attempts.saturating_add(1);
                    h.due = now + retry::backoff_ms(h.attempts, random_u32(&self.host));
                    beaconed = true;
                }
            }
            if !beaconed {
                ahead.extend_from_slice(key);
            }
            if !busy {
                next = next.min(h.due);
            }
            true
        });
        self.save_queue(text);
        if next < u64::MAX && (self.timer_at == 0 || next < self.timer_at) {
            self.timer_at = next;
            let delay = next.saturating_sub(now).min(i32::MAX as u64) as u32;
            self.host.schedule(delay);
        }
    }

    /// The queue's text; in memory, taken: every caller hands it back to `save_queue`.
    fn load_queue(&mut self) -> String {
        match self.store {
            Store::Area(area) => self.host.load(area, QUEUE_KEY),
            Store::Memory => std::mem::take(&mut self.memory),
        }
    }

    fn save_queue(&mut self, text: String) {
        if let Store::Area(area) = self.store
            && self.host.save(area, QUEUE_KEY, &text)
        {
            return;
        }
        // Memory, or storage that stopped working (full, revoked): keep the queue for this page.
        self.store = Store::Memory;
        self.memory = text;
    }
}

/// Whether `list`, event ids written one after another, holds `id`. (Only a corrupted queue
/// has a key of another length; it shifts the ids after it, which can then be missed, not
/// falsely matched: a window across two random ids is no id.)
fn holds(list: &[u8], id: &[u8]) -> bool {
    let mut i = 0;
    while i + EVENT_ID_LEN <= list.len() {
        if list[i..i + EVENT_ID_LEN] == *id {
            return true;
        }
        i += EVENT_ID_LEN;
    }
    false
}

/// Four random bytes as a number (backoff jitter).
fn random_u32(host: &impl Host) -> u32 {
    let mut b = [0u8; 4];
    host.random(&mut b);
    u32::from_le_bytes(b)
}

/// Cuts the query and fragment off an over-long URL (the page key is the path anyway).
fn clip(url: &str) -> &str {
    if url.len() <= MAX_URL_CHARS {
        return url;
    }
    // The splitter the queue has anyway: before the first `?`, then before the first `#`.
    queue::cut(queue::cut(url, b'?').0, b'#').0
}

#[cfg(test)]
mod tests;
