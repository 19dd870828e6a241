//! Interning site names and page paths into integer ids, with the page cap.
//!
//! Contract: an id, once committed, names the same site or (site, path) forever (rows of
//! `site_keys` and `pages` are never deleted, so ids are never reused). The writer keeps the
//! committed ids it has used in [`Interned`], bounded in entries and bytes; ids learned inside
//! a transaction wait in [`Pending`] and join the cache only after the commit (a rolled-back
//! id may be handed out again). Every site has a whole-site scope (path `''`) from its first
//! use. A new page is created only while the site's pages created that local day are below
//! the cap; beyond it, views count under the site's [`OTHER_PAGE`]. Interning runs inside a
//! write (`IMMEDIATE`) transaction, so two stores on one file cannot intern a name twice.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, params};

use super::StoreError;
use crate::store::OTHER_PAGE;

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

/// Committed ids the writer has used recently: the page cache keeps two generations, so the
/// pages in use stay while one-off paths age out.
#[derive(Default)]
pub(super) struct Interned {
    sites: HashMap<Box<str>, i64>,
    young: PageIds,
    old: PageIds,
}

impl Interned {
    fn page(&self, site: i64, path: &str) -> Option<i64> {
        self.young
            .get(site, path)
            .or_else(|| self.old.get(site, path))
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

    fn create(&mut self, site: i64, path: &str) -> Result<i64, StoreError> {
        self.tx
            .prepare_cached("INSERT INTO pages (site, path) VALUES (?1, ?2)")?
            .execute(params![site, path])?;
        let id = self.tx.last_insert_rowid();
        self.pending.pages.insert(site, path, id);
        Ok(id)
    }
}
