//! [`ShareStore`] on PostgreSQL: the `shares` table (migration 2), read on every request, so
//! a link revoked through one collector is refused by every other one at its next request.

use async_trait::async_trait;

use super::{PgStore, retry};
use crate::core::ids::SiteId;
use crate::store::{Share, ShareRow, ShareStore, StoreError, share_from};

const COLUMNS: &str = "id, site, token_hash, password_hash, created_ms, expires_ms";

fn row_of(row: &tokio_postgres::Row) -> ShareRow {
    (
        row.get(0),
        row.get(1),
        row.get(2),
        row.get(3),
        row.get(4),
        row.get(5),
    )
}

#[async_trait]
impl ShareStore for PgStore {
    async fn create_share(&self, share: &Share) -> Result<(), StoreError> {
        let added = retry("create share", || async {
            let client = self.client().await?;
            Ok(client
                .execute(
                    "INSERT INTO shares (id, site, token_hash, password_hash, created_ms, \
                     expires_ms) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
                    &[
                        &share.id,
                        &share.site.as_str(),
                        &&share.token_hash[..],
                        &share.password_hash,
                        &share.created_ms,
                        &share.expires_ms,
                    ],
                )
                .await?)
        })
        .await?;
        match added {
            1 => Ok(()),
            _ => Err(StoreError::Invalid(format!(
                "a shared link with id {:?} or that token exists",
                share.id
            ))),
        }
    }

    async fn list_shares(&self, site: &SiteId) -> Result<Vec<Share>, StoreError> {
        let rows = retry("list shares", || async {
            let client = self.client().await?;
            let rows = client
                .query(
                    &format!(
                        "SELECT {COLUMNS} FROM shares WHERE site = $1 ORDER BY created_ms, id"
                    ),
                    &[&site.as_str()],
                )
                .await?;
            Ok(rows.iter().map(row_of).collect::<Vec<_>>())
        })
        .await?;
        rows.into_iter().map(share_from).collect()
    }

    async fn share_by_token_hash(
        &self,
        token_hash: &[u8; 32],
    ) -> Result<Option<Share>, StoreError> {
        let row = retry("find share", || async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    &format!("SELECT {COLUMNS} FROM shares WHERE token_hash = $1"),
                    &[&&token_hash[..]],
                )
                .await?;
            Ok(row.as_ref().map(row_of))
        })
        .await?;
        row.map(share_from).transpose()
    }

    async fn revoke_share(&self, id: &str) -> Result<bool, StoreError> {
        retry("revoke share", || async {
            let client = self.client().await?;
            Ok(client
                .execute("DELETE FROM shares WHERE id = $1", &[&id])
                .await?
                > 0)
        })
        .await
    }

    async fn revoke_site_shares(&self, site: &SiteId) -> Result<u64, StoreError> {
        retry("revoke site shares", || async {
            let client = self.client().await?;
            Ok(client
                .execute("DELETE FROM shares WHERE site = $1", &[&site.as_str()])
                .await?)
        })
        .await
    }
}
