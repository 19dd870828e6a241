//! The site registry: which site ids exist, their allowed origins, time zone and visibility.
//!
//! Contract: sites are read through a small cache with a short time-to-live, so `tally site
//! add|remove` run against the same database takes effect on a running server within
//! [`SITE_TTL`], and unknown ids do not hit the store on every request. With `auto_sites`,
//! an unknown id is created on first use (any origin, UTC, public).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::core::day::SiteZone;
use crate::core::ids::SiteId;
use crate::store::{Site, Store, StoreError};

/// How long a cached site (or the knowledge that it does not exist) is trusted.
pub const SITE_TTL: Duration = Duration::from_secs(5);
/// Most site ids remembered (known and unknown); the cache is cleared when it grows past this.
const MAX_CACHED: usize = 10_000;

/// Why a site could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SiteError {
    #[error("unknown site {0:?}")]
    Unknown(String),
    #[error("origin {origin:?} is not allowed to send hits for site {site:?}")]
    Origin { site: String, origin: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A cached lookup: the site (or `None`: known not to exist) and when it was read.
type Cached = (Option<Arc<Site>>, Instant);

/// Cached access to sites.
pub struct SiteRegistry {
    store: Arc<dyn Store>,
    /// Create unknown sites on first use.
    auto_sites: bool,
    /// id → (site or known-absent, when it was read).
    cache: RwLock<HashMap<SiteId, Cached>>,
}

impl SiteRegistry {
    /// A registry over `store`.
    pub fn new(store: Arc<dyn Store>, auto_sites: bool) -> Self {
        Self {
            store,
            auto_sites,
            cache: RwLock::new(HashMap::new()),
        }
    }

    fn cached(&self, id: &SiteId) -> Option<Option<Arc<Site>>> {
        let cache = self.cache.read().ok()?;
        let (site, at) = cache.get(id)?;
        (at.elapsed() < SITE_TTL).then(|| site.clone())
    }

    fn remember(&self, id: &SiteId, site: Option<Arc<Site>>) {
        if let Ok(mut cache) = self.cache.write() {
            if cache.len() >= MAX_CACHED {
                cache.clear();
            }
            cache.insert(id.clone(), (site, Instant::now()));
        }
    }

    /// The site `id`, creating it when auto-sites is on.
    pub async fn get(&self, id: &SiteId) -> Result<Arc<Site>, SiteError> {
        let site = match self.cached(id) {
            Some(site) => site,
            None => {
                let mut site = self.store.get_site(id).await?.map(Arc::new);
                if site.is_none() && self.auto_sites {
                    let fresh = Site {
                        id: id.clone(),
                        origins: vec!["*".into()],
                        zone: SiteZone::utc(),
                        public: true,
                        ingest_key: None,
                    };
                    site = self.store.ensure_site(&fresh, 0).await?.map(Arc::new);
                }
                self.remember(id, site.clone());
                site
            }
        };
        site.ok_or_else(|| SiteError::Unknown(id.to_string()))
    }

    /// The site `id`, checked against the request's `Origin` (absent for non-browser clients).
    pub async fn for_origin(
        &self,
        id: &SiteId,
        origin: Option<&str>,
    ) -> Result<Arc<Site>, SiteError> {
        let site = self.get(id).await?;
        match origin {
            Some(origin) if !site.allows_origin(origin) => Err(SiteError::Origin {
                site: id.to_string(),
                origin: origin.to_owned(),
            }),
            _ => Ok(site),
        }
    }
}
