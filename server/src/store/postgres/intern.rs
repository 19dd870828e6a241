//! Interning site names, page paths and dimension tuples into integer ids, with the page cap
//! and the tuple cap (as in SQLite).
//!
//! Contract: rows of `site_keys` and `pages` are never deleted, so an id names the same site
//! or (site, path) forever. Ids learned inside a transaction wait in [`Pending`] and join the
//! store's cache only after the commit. Creation is `INSERT … ON CONFLICT DO NOTHING
//! RETURNING`, then a read: two collectors creating one name at once get one id. The page
//! cap's tally of a (site, day) is read `FOR UPDATE`, so two writers cannot both create the
//! last allowed page.

use std::collections::HashMap;

use deadpool_postgres::Transaction;

use super::{Fail, PgStore};
use crate::store::{DIM_CAP, OTHER_DIM, OTHER_PAGE};

/// Cached entries at most; the cache is cleared when full (ids are cheap to look up again).
const MAX_ENTRIES: usize = 100_000;

/// Committed ids this store has used.
#[derive(Default)]
pub(super) struct Interned {
    sites: HashMap<String, i64>,
    pages: HashMap<(i64, String), i64>,
    /// (site, kind, value) → id of `dims`.
    dims: HashMap<(i64, i16, String), i64>,
}

impl Interned {
    /// Keep what a committed transaction learned.
    pub(super) fn absorb(&mut self, pending: Pending) {
        if self.sites.len()
            + self.pages.len()
            + self.dims.len()
            + pending.sites.len()
            + pending.pages.len()
            + pending.dims.len()
            > MAX_ENTRIES
        {
            self.clear();
        }
        self.sites.extend(pending.sites);
        self.pages.extend(pending.pages);
        self.dims.extend(pending.dims);
    }

    pub(super) fn clear(&mut self) {
        self.sites.clear();
        self.pages.clear();
        self.dims.clear();
    }
}

/// Ids learned in the open transaction.
#[derive(Default)]
pub(super) struct Pending {
    sites: HashMap<String, i64>,
    pages: HashMap<(i64, String), i64>,
    dims: HashMap<(i64, i16, String), i64>,
}

/// Resolves names to ids inside one transaction.
pub(super) struct Resolver<'a> {
    store: &'a PgStore,
    tx: &'a Transaction<'a>,
    pending: Pending,
    /// New pages per site per local day; 0 = unlimited.
    cap: u32,
}

impl<'a> Resolver<'a> {
    pub(super) fn new(store: &'a PgStore, tx: &'a Transaction<'a>, cap: u32) -> Self {
        Self {
            store,
            tx,
            pending: Pending::default(),
            cap,
        }
    }

    pub(super) fn into_pending(self) -> Pending {
        self.pending
    }

    /// The id of site `name`, created (with its whole-site scope) on first use.
    pub(super) async fn site(&mut self, name: &str) -> Result<i64, Fail> {
        let cached = self.store.known().sites.get(name).copied();
        if let Some(id) = cached.or_else(|| self.pending.sites.get(name).copied()) {
            return Ok(id);
        }
        let select = self
            .tx
            .prepare_cached("SELECT id FROM site_keys WHERE name = $1")
            .await?;
        let id = match self.tx.query_opt(&select, &[&name]).await? {
            Some(row) => row.get(0),
            None => {
                let created = self
                    .tx
                    .query_opt(
                        "INSERT INTO site_keys (name) VALUES ($1) ON CONFLICT (name) DO NOTHING \
                         RETURNING id",
                        &[&name],
                    )
                    .await?;
                match created {
                    Some(row) => {
                        let id: i64 = row.get(0);
                        self.tx
                            .execute(
                                "INSERT INTO pages (site, path) VALUES ($1, '') \
                                 ON CONFLICT (site, path) DO NOTHING",
                                &[&id],
                            )
                            .await?;
                        id
                    }
                    // Created by another writer that committed meanwhile.
                    None => self.tx.query_one(&select, &[&name]).await?.get(0),
                }
            }
        };
        self.pending.sites.insert(name.to_owned(), id);
        Ok(id)
    }

    /// The whole-site scope of site `site`.
    pub(super) async fn site_scope(&mut self, site: i64) -> Result<i64, Fail> {
        self.page_uncapped(site, "").await
    }

    /// The scope a view of `path` on local day `day` counts under: the page, created if the
    /// cap allows, else the site's `(other)` page.
    pub(super) async fn page(&mut self, site: i64, path: &str, day: i32) -> Result<i64, Fail> {
        if let Some(id) = self.lookup(site, path).await? {
            return Ok(id);
        }
        if self.cap > 0 {
            self.tx
                .execute(
                    "INSERT INTO page_quota (site, day, created) VALUES ($1, $2, 0) \
                     ON CONFLICT (site, day) DO NOTHING",
                    &[&site, &day],
                )
                .await?;
            let created: i32 = self
                .tx
                .query_one(
                    "SELECT created FROM page_quota WHERE site = $1 AND day = $2 FOR UPDATE",
                    &[&site, &day],
                )
                .await?
                .get(0);
            // Another writer may have created the page while this one waited for the lock.
            if let Some(id) = self.lookup(site, path).await? {
                return Ok(id);
            }
            if i64::from(created) >= i64::from(self.cap) {
                return self.page_uncapped(site, OTHER_PAGE).await;
            }
            self.tx
                .execute(
                    "UPDATE page_quota SET created = created + 1 WHERE site = $1 AND day = $2",
                    &[&site, &day],
                )
                .await?;
        }
        self.create(site, path).await
    }

    /// The scope of `path`, created without counting against the cap.
    pub(super) async fn page_uncapped(&mut self, site: i64, path: &str) -> Result<i64, Fail> {
        match self.lookup(site, path).await? {
            Some(id) => Ok(id),
            None => self.create(site, path).await,
        }
    }

    async fn lookup(&mut self, site: i64, path: &str) -> Result<Option<i64>, Fail> {
        let key = (site, path.to_owned());
        let cached = self.store.known().pages.get(&key).copied();
        if let Some(id) = cached.or_else(|| self.pending.pages.get(&key).copied()) {
            return Ok(Some(id));
        }
        let select = self
            .tx
            .prepare_cached("SELECT id FROM pages WHERE site = $1 AND path = $2")
            .await?;
        let found: Option<i64> = self
            .tx
            .query_opt(&select, &[&site, &path])
            .await?
            .map(|r| r.get(0));
        if let Some(id) = found {
            self.pending.pages.insert(key, id);
        }
        Ok(found)
    }

    /// The id of the dimension tuple `value` of `kind` for site `site` on local day `day`,
    /// created if the tuple cap allows (its tally read `FOR UPDATE`, as the page cap's), else
    /// the site's [`OTHER_DIM`] of that kind.
    pub(super) async fn dim(
        &mut self,
        site: i64,
        kind: i16,
        value: &str,
        day: i32,
    ) -> Result<i64, Fail> {
        if let Some(id) = self.lookup_dim(site, kind, value).await? {
            return Ok(id);
        }
        if value != OTHER_DIM {
            self.tx
                .execute(
                    "INSERT INTO dim_quota (site, day, kind, created) VALUES ($1, $2, $3, 0) \
                     ON CONFLICT (site, day, kind) DO NOTHING",
                    &[&site, &day, &kind],
                )
                .await?;
            let created: i32 = self
                .tx
                .query_one(
                    "SELECT created FROM dim_quota WHERE site = $1 AND day = $2 AND kind = $3 \
                     FOR UPDATE",
                    &[&site, &day, &kind],
                )
                .await?
                .get(0);
            if let Some(id) = self.lookup_dim(site, kind, value).await? {
                return Ok(id);
            }
            if i64::from(created) >= DIM_CAP {
                return Box::pin(self.dim(site, kind, OTHER_DIM, day)).await;
            }
            self.tx
                .execute(
                    "UPDATE dim_quota SET created = created + 1 \
                     WHERE site = $1 AND day = $2 AND kind = $3",
                    &[&site, &day, &kind],
                )
                .await?;
        }
        let created = self
            .tx
            .query_opt(
                "INSERT INTO dims (site, kind, value) VALUES ($1, $2, $3) \
                 ON CONFLICT (site, kind, value) DO NOTHING RETURNING id",
                &[&site, &kind, &value],
            )
            .await?;
        let id: i64 = match created {
            Some(row) => row.get(0),
            None => self
                .tx
                .query_one(
                    "SELECT id FROM dims WHERE site = $1 AND kind = $2 AND value = $3",
                    &[&site, &kind, &value],
                )
                .await?
                .get(0),
        };
        self.pending.dims.insert((site, kind, value.to_owned()), id);
        Ok(id)
    }

    async fn lookup_dim(&mut self, site: i64, kind: i16, value: &str) -> Result<Option<i64>, Fail> {
        let key = (site, kind, value.to_owned());
        let cached = self.store.known().dims.get(&key).copied();
        if let Some(id) = cached.or_else(|| self.pending.dims.get(&key).copied()) {
            return Ok(Some(id));
        }
        let select = self
            .tx
            .prepare_cached("SELECT id FROM dims WHERE site = $1 AND kind = $2 AND value = $3")
            .await?;
        let found: Option<i64> = self
            .tx
            .query_opt(&select, &[&site, &kind, &value])
            .await?
            .map(|r| r.get(0));
        if let Some(id) = found {
            self.pending.dims.insert(key, id);
        }
        Ok(found)
    }

    async fn create(&mut self, site: i64, path: &str) -> Result<i64, Fail> {
        let created = self
            .tx
            .query_opt(
                "INSERT INTO pages (site, path) VALUES ($1, $2) ON CONFLICT (site, path) \
                 DO NOTHING RETURNING id",
                &[&site, &path],
            )
            .await?;
        let id: i64 = match created {
            Some(row) => row.get(0),
            None => self
                .tx
                .query_one(
                    "SELECT id FROM pages WHERE site = $1 AND path = $2",
                    &[&site, &path],
                )
                .await?
                .get(0),
        };
        self.pending.pages.insert((site, path.to_owned()), id);
        Ok(id)
    }
}
