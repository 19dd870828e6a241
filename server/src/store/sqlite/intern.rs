//! Interning site names, page paths and dimension tuples into integer ids, with the page cap
//! and the tuple cap.
//!
//! Contract: an id, once committed, names the same site or (site, path) forever (rows of
//! `site_keys` and `pages` are never deleted, so ids are never reused). The writer keeps the
//! committed ids it has used in [`Interned`], bounded in entries and bytes; ids learned inside
//! a transaction wait in [`Pending`] and join the cache only after the commit (a rolled-back
//! id may be handed out again). Every site has a whole-site scope (path `''`) from its first
//! use. A new page is created only while the site's pages created that local day are below
//! the cap; beyond it, views count under the site's [`OTHER_PAGE`]. Interning runs inside a
//! write (`IMMEDIATE`) transaction, so two stores on one file cannot intern a name twice.
//! Dimension tuples (`dims`) follow the same rules with their own cap per site, local day and
//! kind ([`DIM_CAP`]); beyond it, an event's tuple of that kind is the site's [`OTHER_DIM`].

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, params};

use super::StoreError;
use crate::store::{DIM_CAP, OTHER_DIM, OTHER_PAGE};

/// Site names cached at most (sites are few; the cache is cleared when full).
const MAX_SITES: usize = 4096;
/// Pages per generation of the page cache (two generations), and their bytes.
const PAGES_PER_GENERATION: usize = 50_000;
const PAGE_BYTES_PER_GENERATION: usize = 4 << 20;
/// Bytes counted per cached page beyond its path (keys, id, map slots).
const PAGE_OVERHEAD: usize = 64;

/// (site id → path → page id).
#[derive(Default)]
struct PageIds {
    map: HashMap<i64, HashMap<Box<str>, i64>>,
    entries: usize,
    bytes: usize,
}

impl PageIds {
    fn get(&self, site: i64, path: &str) -> Option<i64> {
        self.map.get(&site)?.get(path).copied()
    }

    fn insert(&mut self, site: i64, path: &str, id: i64) {
        if self
            .map
            .entry(site)
            .or_default()
            .insert(path.into(), id)
            .is_none()
        {
            self.entries += 1;
            self.bytes += path.len() + PAGE_OVERHEAD;
        }
    }
}

/// Committed ids the writer has used recently: the page and tuple caches keep two generations
/// each, so the names in use stay while one-off ones age out.
#[derive(Default)]
pub(super) struct Interned {
    sites: HashMap<Box<str>, i64>,
    young: PageIds,
    old: PageIds,
    /// Dimension tuples, keyed like pages by `site * 4 + kind`.
    young_dims: PageIds,
    old_dims: PageIds,
}

impl Interned {
    fn page(&self, site: i64, path: &str) -> Option<i64> {
        self.young
            .get(site, path)
            .or_else(|| self.old.get(site, path))
    }

    fn dim(&self, key: i64, value: &str) -> Option<i64> {
        self.young_dims
            .get(key, value)
            .or_else(|| self.old_dims.get(key, value))
    }

    /// Keep what a committed transaction learned.
    pub(super) fn absorb(&mut self, pending: Pending) {
        if self.sites.len() + pending.sites.len() > MAX_SITES {
            self.sites.clear();
        }
        self.sites.extend(pending.sites);
        for (site, paths) in pending.pages.map {
            for (path, id) in paths {
                if self.young.entries >= PAGES_PER_GENERATION
                    || self.young.bytes >= PAGE_BYTES_PER_GENERATION
                {
                    self.old = std::mem::take(&mut self.young);
                }
                self.young.insert(site, &path, id);
            }
        }
        for (key, values) in pending.dims.map {
            for (value, id) in values {
                if self.young_dims.entries >= PAGES_PER_GENERATION
                    || self.young_dims.bytes >= PAGE_BYTES_PER_GENERATION
                {
                    self.old_dims = std::mem::take(&mut self.young_dims);
                }
                self.young_dims.insert(key, &value, id);
            }
        }
    }

    /// Forget everything (after a repair or a migration, to be safe).
    pub(super) fn clear(&mut self) {
        *self = Self::default();
    }
}

/// Ids learned in the open transaction.
#[derive(Default)]
pub(super) struct Pending {
    sites: HashMap<Box<str>, i64>,
    pages: PageIds,
    dims: PageIds,
}

/// Resolves names to ids inside one write transaction.
pub(super) struct Resolver<'a> {
    tx: &'a Connection,
    known: &'a Interned,
    pending: Pending,
    /// New pages per site per local day; 0 = unlimited.
    cap: u32,
}

impl<'a> Resolver<'a> {
    pub(super) fn new(tx: &'a Connection, known: &'a Interned, cap: u32) -> Self {
        Self {
            tx,
            known,
            pending: Pending::default(),
            cap,
        }
    }

    /// What this transaction learned, for [`Interned::absorb`] after the commit.
    pub(super) fn into_pending(self) -> Pending {
        self.pending
    }

    /// The id of site `name`, created (with its whole-site scope) on first use.
    pub(super) fn site(&mut self, name: &str) -> Result<i64, StoreError> {
        if let Some(id) = self
            .known
            .sites
            .get(name)
            .or_else(|| self.pending.sites.get(name))
        {
            return Ok(*id);
        }
        let found: Option<i64> = self
            .tx
            .prepare_cached("SELECT id FROM site_keys WHERE name = ?1")?
            .query_row([name], |r| r.get(0))
            .optional()?;
        let id = match found {
            Some(id) => id,
            None => {
                self.tx
                    .prepare_cached("INSERT INTO site_keys (name) VALUES (?1)")?
                    .execute([name])?;
                let id = self.tx.last_insert_rowid();
                self.tx
                    .prepare_cached("INSERT OR IGNORE INTO pages (site, path) VALUES (?1, '')")?
                    .execute([id])?;
                id
            }
        };
        self.pending.sites.insert(name.into(), id);
        Ok(id)
    }

    /// The whole-site scope of site `site`.
    pub(super) fn site_scope(&mut self, site: i64) -> Result<i64, StoreError> {
        self.page_uncapped(site, "")
    }

    /// The scope a view of `path` on local day `day` counts under: the page, created if the
    /// cap allows, else the site's `(other)` page.
    pub(super) fn page(&mut self, site: i64, path: &str, day: i64) -> Result<i64, StoreError> {
        if let Some(id) = self.lookup(site, path)? {
            return Ok(id);
        }
        if self.cap > 0 {
            let created: i64 = self
                .tx
                .prepare_cached("SELECT created FROM page_quota WHERE site = ?1 AND day = ?2")?
                .query_row([site, day], |r| r.get(0))
                .optional()?
                .unwrap_or(0);
            if created >= i64::from(self.cap) {
                return self.page_uncapped(site, OTHER_PAGE);
            }
            self.tx
                .prepare_cached(
                    "INSERT INTO page_quota (site, day, created) VALUES (?1, ?2, 1) \
                     ON CONFLICT (site, day) DO UPDATE SET created = created + 1",
                )?
                .execute([site, day])?;
        }
        self.create(site, path)
    }

    /// The scope of `path`, created without counting against the cap (whole-site scope,
    /// `(other)`, pages named by an administrator).
    pub(super) fn page_uncapped(&mut self, site: i64, path: &str) -> Result<i64, StoreError> {
        match self.lookup(site, path)? {
            Some(id) => Ok(id),
            None => self.create(site, path),
        }
    }

    fn lookup(&mut self, site: i64, path: &str) -> Result<Option<i64>, StoreError> {
        if let Some(id) = self
            .known
            .page(site, path)
            .or_else(|| self.pending.pages.get(site, path))
        {
            return Ok(Some(id));
        }
        let found: Option<i64> = self
            .tx
            .prepare_cached("SELECT id FROM pages WHERE site = ?1 AND path = ?2")?
            .query_row(params![site, path], |r| r.get(0))
            .optional()?;
        if let Some(id) = found {
            self.pending.pages.insert(site, path, id);
        }
        Ok(found)
    }

    /// The id of the dimension tuple `value` of `kind` for site `site` on local day `day`,
    /// created if the tuple cap allows, else the site's [`OTHER_DIM`] of that kind.
    pub(super) fn dim(
        &mut self,
        site: i64,
        kind: i64,
        value: &str,
        day: i64,
    ) -> Result<i64, StoreError> {
        let key = site * 4 + kind;
        if let Some(id) = self
            .known
            .dim(key, value)
            .or_else(|| self.pending.dims.get(key, value))
        {
            return Ok(id);
        }
        let found: Option<i64> = self
            .tx
            .prepare_cached("SELECT id FROM dims WHERE site = ?1 AND kind = ?2 AND value = ?3")?
            .query_row(params![site, kind, value], |r| r.get(0))
            .optional()?;
        if let Some(id) = found {
            self.pending.dims.insert(key, value, id);
            return Ok(id);
        }
        let created: i64 = self
            .tx
            .prepare_cached(
                "SELECT created FROM dim_quota WHERE site = ?1 AND day = ?2 AND kind = ?3",
            )?
            .query_row([site, day, kind], |r| r.get(0))
            .optional()?
            .unwrap_or(0);
        if value != OTHER_DIM && created >= DIM_CAP {
            return self.dim(site, kind, OTHER_DIM, day);
        }
        if value != OTHER_DIM {
            self.tx
                .prepare_cached(
                    "INSERT INTO dim_quota (site, day, kind, created) VALUES (?1, ?2, ?3, 1) \
                     ON CONFLICT (site, day, kind) DO UPDATE SET created = created + 1",
                )?
                .execute([site, day, kind])?;
        }
        self.tx
            .prepare_cached("INSERT INTO dims (site, kind, value) VALUES (?1, ?2, ?3)")?
            .execute(params![site, kind, value])?;
        let id = self.tx.last_insert_rowid();
        self.pending.dims.insert(key, value, id);
        Ok(id)
    }

    fn create(&mut self, site: i64, path: &str) -> Result<i64, StoreError> {
        self.tx
            .prepare_cached("INSERT INTO pages (site, path) VALUES (?1, ?2)")?
            .execute(params![site, path])?;
        let id = self.tx.last_insert_rowid();
        self.pending.pages.insert(site, path, id);
        Ok(id)
    }
}
