//! [`ShareStore`] on SQLite: the `shares` table (schema v7), one row per link. Lookups read a
//! pooled reader, so a link revoked by any process on the file is gone for the next request.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use crate::core::ids::SiteId;
use crate::store::{Share, ShareRow, ShareStore, StoreError, share_from};

const COLUMNS: &str = "id, site, token_hash, password_hash, created_ms, expires_ms";

fn share_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<ShareRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
    ))
}

#[async_trait]
impl ShareStore for SqliteStore {
    async fn create_share(&self, share: &Share) -> Result<(), StoreError> {
        let s = share.clone();
        self.write(move |w| {
            let added = w.conn.execute(
                "INSERT INTO shares (id, site, token_hash, password_hash, created_ms, expires_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
                params![
                    s.id,
                    s.site.as_str(),
                    &s.token_hash[..],
                    s.password_hash,
                    s.created_ms,
                    s.expires_ms
                ],
            )?;
            match added {
                1 => Ok(()),
                _ => Err(StoreError::Invalid(format!(
                    "a shared link with id {:?} or that token exists",
                    s.id
                ))),
            }
        })
        .await
    }

    async fn list_shares(&self, site: &SiteId) -> Result<Vec<Share>, StoreError> {
        let site = site.as_str().to_owned();
        self.read(move |conn| {
            let mut stmt = conn.prepare(&format!(
                "SELECT {COLUMNS} FROM shares WHERE site = ?1 ORDER BY created_ms, id"
            ))?;
            let raws = stmt
                .query_map([site], share_of)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            raws.into_iter().map(share_from).collect()
        })
        .await
    }

    async fn share_by_token_hash(
        &self,
        token_hash: &[u8; 32],
    ) -> Result<Option<Share>, StoreError> {
        let hash = token_hash.to_vec();
        self.read(move |conn| {
            conn.query_row(
                &format!("SELECT {COLUMNS} FROM shares WHERE token_hash = ?1"),
                [hash],
                share_of,
            )
            .optional()?
            .map(share_from)
            .transpose()
        })
        .await
    }

    async fn revoke_share(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.write(move |w| Ok(w.conn.execute("DELETE FROM shares WHERE id = ?1", [id])? > 0))
            .await
    }

    async fn revoke_site_shares(&self, site: &SiteId) -> Result<u64, StoreError> {
        let site = site.as_str().to_owned();
        self.write(move |w| {
            Ok(w.conn
                .execute("DELETE FROM shares WHERE site = ?1", [site])? as u64)
        })
        .await
    }
}
