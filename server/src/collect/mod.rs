//! The counting pipeline, free of any transport: what a hit, a batch record, a badge fetch, a
//! pixel fetch and an imported line go through before they count. The edge (`edge::http`)
//! reads a request into a [`Sender`] and a wire hit, calls the [`Collector`] and maps its
//! [`Refused`] to an answer; the import (`ops::import`) uses the same bot filter and builds
//! its records the same way ([`crate::core::classify::View::into_record`]).
//!
//! The stages, in this order for every counting request (what each decides is in
//! [`crate::core::classify`]):
//! 1. **Cost first** ([`Collector::precheck`], before a body is read): a sender with no
//!    allowance left is refused; a sender presenting a key and out of wrong guesses too.
//! 2. **Check** ([`Collector::check`], per record): the record is valid (400 with a code), its
//!    site exists (or, with auto-sites, is created) and allows the sending page's origin (a
//!    refused origin is tallied under "Not counted" and logged), and a bearer key is the
//!    site's ingest key (a wrong one is a throttled guess).
//! 3. **Filter** (the sender's user agent): an empty agent or a listed bot is not counted
//!    (but still charged at step 6: a bot gets no free pass around the address limits).
//! 4. **Visitor**: the client's own id, else the keyed hash of its source, salted for the
//!    event's local day.
//! 5. **Repeat gate** (badge and pixel views only, which carry no visitor id).
//! 6. **Limit**: the request's records without an ingest key are charged to the sender's
//!    address allowance together, all or none; over it, a hit is refused (429) and a badge
//!    or pixel view is served but not counted.
//! 7. **Commit** through the ingest queue; the answer waits for it.
//! 8. **Observe**: metrics and the live window.
//!
//! Every view that stops at stages 2–6 is tallied by reason ([`not_counted`]).

pub mod agents;
pub mod bots;
pub mod dims;
pub mod geo;
pub mod ingest;
pub mod not_counted;
pub mod privacy;
pub mod seal;
pub mod secrets;
pub mod shares;
pub mod sites;
pub mod sources;

use std::net::IpAddr;
use std::sync::Arc;

use jiff::Timestamp;
use tally_wire::Hit;

use crate::core::classify::{Lane, View, live_entry};
use crate::core::clock::Clock;
use crate::core::filtered::Reason;
use crate::core::hit::{HitError, TimeWindow, ValidHit};
use crate::core::ids::{EventId, PagePath, SiteId, VisitorKey, truncate};
use crate::core::net::ClientNet;
use crate::core::record::{Outcome, Record, Source};
use crate::core::site::Site;
use crate::metrics::Metrics;
use crate::state::limits::Refusal;
use crate::state::{LiveState, RateLimiter, RepeatGate};
use crate::store::StoreError;
use bots::BotFilter;
use ingest::{Ingest, IngestError};
use not_counted::NotCounted;
use privacy::SourceHasher;
use sites::{SiteError, SiteRegistry};

/// Longest user agent looked at, in bytes: longer ones are judged (and hashed) by this prefix.
/// Real browsers send 100–300 bytes; the header itself is bounded by the server's header limit.
pub const MAX_USER_AGENT_BYTES: usize = 512;

/// What the pipeline needs to know of the settings of `tally serve`.
#[derive(Debug, Clone, Copy)]
pub struct CollectOptions {
    /// How far from now an event id's time may be.
    pub window: TimeWindow,
    /// Seconds an event stays in the live window.
    pub live_window_secs: u32,
}

/// Who sent a counting request, as read off it by the edge.
#[derive(Debug, Clone)]
pub struct Sender {
    pub ip: IpAddr,
    /// The network the sender's requests are limited by.
    pub net: ClientNet,
    /// The user agent, cut to [`MAX_USER_AGENT_BYTES`].
    pub user_agent: String,
    /// The sending page's origin, when a browser says it.
    pub origin: Option<String>,
    /// An `Authorization: Bearer` value: a site's ingest key, if the sender is the site's
    /// server.
    pub bearer: Option<String>,
}

impl Sender {
    pub fn new(ip: IpAddr, user_agent: &str, origin: Option<&str>, bearer: Option<&str>) -> Self {
        Self {
            ip,
            net: ClientNet::of(ip),
            user_agent: truncate(user_agent, MAX_USER_AGENT_BYTES).to_owned(),
            origin: origin.map(str::to_owned),
            bearer: bearer.map(|b| b.trim().to_owned()),
        }
    }

    /// Whether this sender holds `site`'s ingest key (compared in constant time).
    pub fn has_key_of(&self, site: &Site) -> bool {
        match (&self.bearer, &site.ingest_key) {
            (Some(given), Some(key)) => secrets::constant_time_eq(given, key),
            _ => false,
        }
    }
}

/// Why the pipeline refused a request (or a record of a batch). The edge maps each to an
/// answer (`edge::http::error`).
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error(transparent)]
    Invalid(#[from] HitError),
    #[error(transparent)]
    Site(#[from] SiteError),
    #[error("the bearer key is not the ingest key of site {site:?}")]
    InvalidIngestKey { site: String },
    #[error("over this address's allowance; retry after {retry_after} s")]
    RateLimited { retry_after: u64 },
    #[error("more records in one request than the allowance of {allowance} holds")]
    OverAllowance { allowance: u32 },
    #[error(transparent)]
    Ingest(#[from] IngestError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Refused {
    /// A limiter's refusal of a hit.
    fn of(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Wait(wait) => Refused::RateLimited {
                retry_after: wait.as_secs().max(1),
            },
            Refusal::Never { allowance } => Refused::OverAllowance { allowance },
        }
    }

    /// A guess throttle's refusal (the same wait as the admin token's, `edge::http::auth`).
    fn throttled(refusal: Refusal) -> Self {
        Refused::RateLimited {
            retry_after: refusal.guess_retry_after(),
        }
    }
}

/// A valid record and its site, with the lane it is charged to.
pub struct Checked {
    pub valid: ValidHit,
    pub site: Arc<Site>,
    /// The sender holds the site's ingest key: no address limits, site-wide dedupe keys.
    pub keyed: bool,
}

/// What a view ended as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// Committed: it counts.
    Accepted,
    /// Its event id was already stored: nothing changed.
    Duplicate,
    /// An empty or a bot's user agent.
    Filtered,
    /// A badge or pixel view repeated within the repeat interval.
    Suppressed,
    /// A badge or pixel view over the sender's allowance (a hit is refused instead).
    RateLimited,
}

impl From<Outcome> for Counted {
    fn from(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Accepted => Counted::Accepted,
            Outcome::Duplicate => Counted::Duplicate,
        }
    }
}

/// Where the views of one request come from, which decides the stages that differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Hits and batch records: always the direct lane; a refusal by the limits refuses the
    /// request (the client retries it).
    Hits,
    /// A badge or pixel view made by the server: the lane of its user agent (known image
    /// proxies have their own), the repeat gate, and a refusal by the limits only means "not
    /// counted" (the image is served anyway).
    Server,
}

/// The counting pipeline and the services it owns.
pub struct Collector {
    pub sites: Arc<SiteRegistry>,
    pub ingest: Ingest,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
    /// The live window (events of the last N seconds).
    pub live: Arc<dyn LiveState>,
    pub hasher: SourceHasher,
    pub bots: BotFilter,
    /// Per-address limits of every counting route, of new sites and of key guesses.
    pub limits: Arc<dyn RateLimiter>,
    /// Badge and pixel repeat suppression; known image proxies have their own gate.
    pub repeats: Arc<dyn RepeatGate>,
    /// Views not counted, by site, day and reason.
    pub not_counted: Arc<NotCounted>,
    /// Where visits come from and what they are made with (`dims`).
    pub dims: Arc<dims::Dimensions>,
    options: CollectOptions,
}

/// The parts a [`Collector`] is built from.
pub struct CollectParts {
    pub sites: Arc<SiteRegistry>,
    pub ingest: Ingest,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
    pub live: Arc<dyn LiveState>,
    pub hasher: SourceHasher,
    pub limits: Arc<dyn RateLimiter>,
    pub repeats: Arc<dyn RepeatGate>,
    pub dims: Arc<dims::Dimensions>,
}

impl Collector {
    pub fn new(parts: CollectParts, options: CollectOptions) -> Self {
        let CollectParts {
            sites,
            ingest,
            clock,
            metrics,
            live,
            hasher,
            limits,
            repeats,
            dims,
        } = parts;
        Self {
            not_counted: Arc::new(NotCounted::new(Arc::clone(&metrics), Arc::clone(&clock))),
            bots: BotFilter::bundled(),
            sites,
            ingest,
            clock,
            metrics,
            live,
            hasher,
            limits,
            repeats,
            dims,
            options,
        }
    }

    /// Whether the location database in use asks for an attribution where its results are
    /// shown (DB-IP's lite files).
    pub fn geo_credit(&self) -> bool {
        self.dims.geo_credit()
    }

    /// Stage 1, before a body is read: refuse at once a sender with no allowance left
    /// (unless it presents a key, checked after parsing), or one presenting a key that has
    /// used up its wrong guesses.
    pub async fn precheck(&self, sender: &Sender, now: Timestamp) -> Result<(), Refused> {
        if sender.bearer.is_none() {
            self.limits
                .has_room(Lane::Direct, sender.net, now)
                .await
                .map_err(Refused::of)
        } else {
            self.limits
                .may_guess(sender.net, now)
                .await
                .map_err(Refused::throttled)
        }
    }

    /// Stage 2, per record: validate it, find (or with auto-sites create) its site, check the
    /// sending page's origin and a bearer key.
    pub async fn check(
        &self,
        hit: &Hit,
        sender: &Sender,
        now: Timestamp,
    ) -> Result<Checked, Refused> {
        let valid = ValidHit::parse(hit, now, self.options.window)?;
        let site = self
            .site_for_counting(&valid.site, sender.origin.as_deref(), sender.net, now)
            .await?;
        let keyed = sender.has_key_of(&site);
        if sender.bearer.is_some() && !keyed {
            self.limits.wrong_guess(sender.net, now).await;
            return Err(Refused::InvalidIngestKey {
                site: site.id.to_string(),
            });
        }
        Ok(Checked { valid, site, keyed })
    }

    /// The site `id` for a counting request from a page of `origin` (see
    /// [`SiteRegistry::for_counting`]); a refused origin is tallied and logged.
    pub async fn site_for_counting(
        &self,
        id: &SiteId,
        origin: Option<&str>,
        net: ClientNet,
        now: Timestamp,
    ) -> Result<Arc<Site>, SiteError> {
        match self.sites.for_counting(id, origin, net, now).await {
            Err(e @ SiteError::Origin { .. }) => {
                if let (Ok(site), Some(origin)) = (self.sites.get(id).await, origin) {
                    self.not_counted.origin_refused(&site, origin);
                }
                Err(e)
            }
            other => other,
        }
    }

    /// Stages 3–8 for the checked records of one request, in order: what each ended as. A
    /// refusal by the limits refuses them all (nothing is charged or counted).
    pub async fn count_hits(
        &self,
        checked: Vec<Checked>,
        sender: &Sender,
        now: Timestamp,
    ) -> Result<Vec<Counted>, Refused> {
        let views = checked
            .into_iter()
            .map(|c| {
                let view = View::from_hit(c.valid, &c.site.zone, c.keyed);
                (view, c.site, c.keyed)
            })
            .collect();
        self.count(views, sender, Kind::Hits, now).await
    }

    /// Stages 3–8 for one view of `page` the server counts on behalf of a source without a
    /// visitor id: a badge (`Source::Badge`) or pixel (`Source::Web`) fetch.
    pub async fn count_server_view(
        &self,
        site: Arc<Site>,
        page: &PagePath,
        source: Source,
        sender: &Sender,
    ) -> Result<Counted, Refused> {
        let now = self.clock.now();
        let event_id = EventId::new_at(now, secrets::random_bytes());
        let view = View::server_side(&site.id, &site.zone, page.clone(), source, event_id);
        let counted = self
            .count(vec![(view, site, false)], sender, Kind::Server, now)
            .await?;
        Ok(counted.first().copied().unwrap_or(Counted::Duplicate))
    }

    /// The one sequence of stages 3–8.
    async fn count(
        &self,
        views: Vec<(View, Arc<Site>, bool)>,
        sender: &Sender,
        kind: Kind,
        now: Timestamp,
    ) -> Result<Vec<Counted>, Refused> {
        let mut results = vec![Counted::Filtered; views.len()];
        // 3. Filter: the user agent is the sender's, so one verdict holds for every view. A
        // filtered view is not counted, but it is still charged at step 6 (a bot's traffic
        // gets no free pass around the address limits).
        let filtered = self.bots.reason(&sender.user_agent);
        let lane = match kind {
            Kind::Hits => Lane::Direct,
            Kind::Server => Lane::of(&sender.user_agent),
        };
        // 4. Visitor, and 5. the repeat gate for server-made views.
        let mut going = Vec::with_capacity(views.len());
        for (slot, (view, site, keyed)) in views.into_iter().enumerate() {
            if filtered.is_some() {
                going.push((slot, view, site, keyed, None));
                continue;
            }
            let visitor = self.visitor(&view, sender).await?;
            if kind == Kind::Server {
                let key = view.repeat_key(lane, sender.net, &visitor);
                if !self.repeats.admit(lane, key, now.as_millisecond()).await {
                    self.not_counted
                        .record(&site.id, &site.zone, Reason::Suppressed, 1);
                    self.metrics.hit("suppressed");
                    results[slot] = Counted::Suppressed;
                    continue;
                }
            }
            going.push((slot, view, site, keyed, Some(visitor)));
        }
        // 6. Limit: one record per unkeyed view, per site, charged together or not at all.
        let mut per_site: Vec<(&SiteId, u32)> = Vec::new();
        for (_, view, _, keyed, _) in &going {
            if *keyed {
                continue;
            }
            match per_site.iter_mut().find(|(s, _)| *s == &view.site) {
                Some((_, n)) => *n += 1,
                None => per_site.push((&view.site, 1)),
            }
        }
        if !per_site.is_empty()
            && let Err(refusal) = self
                .limits
                .admit_many(lane, sender.net, &per_site, now)
                .await
        {
            for (slot, _, site, keyed, _) in &going {
                if !*keyed {
                    self.not_counted
                        .record(&site.id, &site.zone, Reason::RateLimited, 1);
                    results[*slot] = Counted::RateLimited;
                }
            }
            return match kind {
                Kind::Hits => Err(Refused::of(refusal)),
                Kind::Server => {
                    self.metrics.hit("suppressed");
                    Ok(results)
                }
            };
        }
        if let Some(reason) = filtered {
            for (slot, _, site, _, _) in &going {
                self.not_counted.record(&site.id, &site.zone, reason, 1);
                self.metrics.hit("filtered");
                results[*slot] = Counted::Filtered;
            }
            return Ok(results);
        }
        // 7. Commit, each record with its dimensions.
        let (slots, records): (Vec<usize>, Vec<Record>) = going
            .into_iter()
            .filter_map(|(slot, view, _, _, visitor)| {
                let dims = self.dims.of(&view, &sender.user_agent, sender.ip);
                Some((slot, view.into_record(visitor?, dims)))
            })
            .unzip();
        if records.is_empty() {
            return Ok(results);
        }
        let outcomes = self.ingest.submit(records.clone()).await?;
        // 8. Observe, together: with `--redis` the live records of a batch share a pipeline.
        let mut observed = Vec::with_capacity(records.len());
        for ((slot, record), outcome) in slots.into_iter().zip(&records).zip(outcomes) {
            observed.push(self.observe(record, outcome));
            results[slot] = outcome.into();
        }
        futures_util::future::join_all(observed).await;
        Ok(results)
    }

    /// The visitor of `view`: the client's own id, else the keyed hash of the sender's source
    /// salted for the view's local day.
    async fn visitor(&self, view: &View, sender: &Sender) -> Result<VisitorKey, StoreError> {
        match view.client_visitor() {
            Some(v) => Ok(v),
            None => {
                self.hasher
                    .source_key(view.day(), &view.site, sender.ip, &sender.user_agent)
                    .await
            }
        }
    }

    /// After commit: metrics and the live window ([`live_entry`] decides what is live).
    async fn observe(&self, record: &Record, outcome: Outcome) {
        match outcome {
            Outcome::Duplicate => self.metrics.hit("duplicate"),
            Outcome::Accepted => {
                self.metrics.hit("accepted");
                let now = self.clock.now().as_millisecond();
                if let Some(entry) = live_entry(record, now, self.options.live_window_secs) {
                    self.live.record(&entry, now).await;
                }
            }
        }
    }
}
