//! The site registry: which site ids exist, their allowed origins, time zone and visibility.
//!
//! Contract: sites are read through a small cache with a short time-to-live, so `tally site
//! add|remove` run against the same database takes effect on a running server within
//! [`SITE_TTL`], and unknown ids do not hit the store on every request. With `auto_sites`,
//! an unknown id is created by the first valid COUNTING request for it ([`SiteRegistry::for_counting`]:
//! a hit, a batch record, a counting badge or pixel fetch), never by a read, a `HEAD` or a
//! display-only badge ([`SiteRegistry::get`] never creates). Creation is limited per client
//! network per hour (see `state::limits`) and, with `max_sites`, in total. The cache holds at most
//! [`MAX_CACHED`] ids (a few hundred bytes each).
//!
//! Seams: the registry reads and creates sites through [`SiteStore`] only, remembers them in a
//! [`SiteCache`] and charges creations to a [`RateLimiter`] (in-process implementations in
//! [`crate::state`]; shared ones make a site added through one collector visible to all within
//! the cache's time-to-live).

use std::sync::Arc;

use crate::core::day::SiteZone;
use crate::core::ids::SiteId;
use crate::core::net::ClientNet;
use crate::core::site::Site;
use crate::state::limits::Refusal;
use crate::state::{RateLimiter, SiteCache};
use crate::store::{SiteStore, StoreError};

/// Why a site could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SiteError {
    #[error("unknown site {0:?}")]
    Unknown(String),
    #[error("origin {origin:?} is not allowed to send hits for site {site:?}")]
    Origin { site: String, origin: String },
    #[error("this address created too many sites; retry after {} s", .0.as_secs().max(1))]
    CreationLimited(std::time::Duration),
    #[error("the collector holds its maximum number of sites; site {0:?} cannot be created")]
    SiteLimit(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Cached access to sites.
pub struct SiteRegistry {
    store: Arc<dyn SiteStore>,
    /// Create unknown sites on their first counting request.
    auto_sites: bool,
    /// Most sites auto-sites may create (0 = no limit).
    max_sites: u64,
    /// New sites per client network.
    limits: Arc<dyn RateLimiter>,
    /// id → site or known-absent, for [`SITE_TTL`].
    cache: Arc<dyn SiteCache>,
}

impl SiteRegistry {
    /// A registry over `store`, caching in `cache`.
    pub fn new(
        store: Arc<dyn SiteStore>,
        cache: Arc<dyn SiteCache>,
        auto_sites: bool,
        max_sites: u64,
        limits: Arc<dyn RateLimiter>,
    ) -> Self {
        Self {
            store,
            auto_sites,
            max_sites,
            limits,
            cache,
        }
    }

    /// The site `id` if it exists. Never creates anything (reads, `HEAD`, display-only badges).
    pub async fn get(&self, id: &SiteId) -> Result<Arc<Site>, SiteError> {
        self.lookup(id)
            .await?
            .ok_or_else(|| SiteError::Unknown(id.to_string()))
    }

    async fn lookup(&self, id: &SiteId) -> Result<Option<Arc<Site>>, SiteError> {
        if let Some(site) = self.cache.get(id).await {
            return Ok(site);
        }
        let site = self.store.get_site(id).await?.map(Arc::new);
        self.cache.put(id, site.clone()).await;
        Ok(site)
    }

    /// The site `id` for a read, checked against the request's `Origin` (absent for
    /// non-browser clients).
    pub async fn for_origin(
        &self,
        id: &SiteId,
        origin: Option<&str>,
    ) -> Result<Arc<Site>, SiteError> {
        check_origin(self.get(id).await?, origin)
    }

    /// The site `id` for a counting request from `net`: with auto-sites an unknown id is
    /// created (UTC, any origin, public) if `net` may create one more site now.
    pub async fn for_counting(
        &self,
        id: &SiteId,
        origin: Option<&str>,
        net: ClientNet,
        now: jiff::Timestamp,
    ) -> Result<Arc<Site>, SiteError> {
        let site = match self.lookup(id).await? {
            Some(site) => site,
            None if self.auto_sites => {
                // The store may know it already (created by another request or collector).
                let site = match self.store.get_site(id).await? {
                    Some(site) => site,
                    None => {
                        if let Err(refusal) = self.limits.admit_new_site(net, now).await {
                            return Err(match refusal {
                                Refusal::Wait(wait) => SiteError::CreationLimited(wait),
                                Refusal::Never { .. } => SiteError::SiteLimit(id.to_string()),
                            });
                        }
                        let fresh = Site {
                            id: id.clone(),
                            origins: vec!["*".into()],
                            zone: SiteZone::utc(),
                            public: true,
                            ingest_key: None,
                        };
                        self.store
                            .ensure_site(&fresh, self.max_sites)
                            .await?
                            .ok_or_else(|| SiteError::SiteLimit(id.to_string()))?
                    }
                };
                let site = Arc::new(site);
                self.cache.put(id, Some(Arc::clone(&site))).await;
                site
            }
            None => return Err(SiteError::Unknown(id.to_string())),
        };
        check_origin(site, origin)
    }
}

fn check_origin(site: Arc<Site>, origin: Option<&str>) -> Result<Arc<Site>, SiteError> {
    match origin {
        Some(origin) if !site.allows_origin(origin) => Err(SiteError::Origin {
            site: site.id.to_string(),
            origin: origin.to_owned(),
        }),
        _ => Ok(site),
    }
}
