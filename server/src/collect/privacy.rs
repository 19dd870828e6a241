//! Keyed hashing of request sources. Raw IP addresses are never written anywhere: where a
//! source must be recognised (visitors without an id, badge and pixel repeat suppression)
//! it becomes `blake3(key = K(day), site | ip | user agent)`, where the day is the site's local
//! day of the event (so one source is one visitor for a whole local day) and
//! `K(day) = derive(server secret, salt of the day)`.
//!
//! Contract:
//! - The salt is random, kept in the store ([`SaltStore`], the first writer of a day wins) so
//!   every collector and every restart agrees, and deleted two days later, so old hashes can
//!   never be recomputed or linked.
//! - The server secret (`secrets::ServerSecret`) is NOT in the store. A reader of the database
//!   (a stolen copy, a backup) has the salts but not the secret, so they cannot test guessed
//!   addresses against a stored hash, not even for today; with the secret too (the machine
//!   itself), only while the day's salt exists.

use std::net::IpAddr;
use std::sync::Arc;

use jiff::civil::Date;
use tokio::sync::Mutex;

use crate::collect::secrets::{ServerSecret, random_bytes};
use crate::core::ids::{SiteId, VisitorKey};
use crate::store::{SaltStore, StoreError};

/// Hashes request sources with the salt of the current UTC day.
pub struct SourceHasher {
    store: Arc<dyn SaltStore>,
    /// Mixed into every day's key; never stored.
    secret: ServerSecret,
    /// Recently used day keys (sites in different zones use neighbouring days).
    recent: Mutex<Vec<(Date, [u8; 32])>>,
}

impl SourceHasher {
    /// A hasher whose salts live in `store`, keyed with `secret` too.
    pub fn new(store: Arc<dyn SaltStore>, secret: ServerSecret) -> Self {
        Self {
            store,
            secret,
            recent: Mutex::new(Vec::new()),
        }
    }

    /// `K(day)`: the day's salt from the store, keyed with the server secret.
    async fn day_key(&self, day: Date) -> Result<[u8; 32], StoreError> {
        let mut recent = self.recent.lock().await;
        if let Some((_, key)) = recent.iter().find(|(d, _)| *d == day) {
            return Ok(*key);
        }
        let salt = self.store.salt_for(day, random_bytes()).await?;
        let key = self
            .secret
            .derive_key("tally 2026-12 visitor day key v1", &salt);
        if recent.len() >= 4 {
            recent.remove(0);
        }
        recent.push((day, key));
        Ok(key)
    }

    /// The key of one source (site, ip, user agent) on `day`.
    pub async fn source_key(
        &self,
        day: Date,
        site: &SiteId,
        ip: IpAddr,
        user_agent: &str,
    ) -> Result<VisitorKey, StoreError> {
        let key = self.day_key(day).await?;
        let mut hasher = blake3::Hasher::new_keyed(&key);
        hasher.update(site.as_str().as_bytes());
        hasher.update(&[0]);
        match ip {
            IpAddr::V4(v4) => hasher.update(&v4.octets()),
            IpAddr::V6(v6) => hasher.update(&v6.octets()),
        };
        hasher.update(&[0]);
        hasher.update(user_agent.as_bytes());
        let mut key = [0u8; 16];
        key.copy_from_slice(&hasher.finalize().as_bytes()[..16]);
        Ok(VisitorKey(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStore;

    #[tokio::test]
    async fn the_salt_alone_does_not_give_the_hash() {
        let dir = tempfile::tempdir().expect("dir");
        let store: Arc<dyn crate::store::SaltStore> = Arc::new(
            SqliteStore::open(&dir.path().join("t.sqlite"), Default::default()).expect("store"),
        );
        let day: Date = "2026-05-10".parse().expect("day");
        let site = SiteId::parse("blog").expect("site");
        let ip: IpAddr = "203.0.113.7".parse().expect("ip");
        let a = SourceHasher::new(Arc::clone(&store), ServerSecret::from_bytes([1; 32]));
        let b = SourceHasher::new(Arc::clone(&store), ServerSecret::from_bytes([2; 32]));
        let key_a = a.source_key(day, &site, ip, "ua").await.expect("key");
        // Same salt (the store's), same secret: the same visitor.
        assert_eq!(
            a.source_key(day, &site, ip, "ua").await.expect("key"),
            key_a
        );
        // Another secret over the same stored salt: another key.
        assert_ne!(
            b.source_key(day, &site, ip, "ua").await.expect("key"),
            key_a
        );
        // What a reader of the database could compute from the salt alone is not the key.
        let salt = store.salt_for(day, [0; 32]).await.expect("stored salt");
        let mut h = blake3::Hasher::new_keyed(&salt);
        h.update(site.as_str().as_bytes());
        h.update(&[0]);
        if let IpAddr::V4(v4) = ip {
            h.update(&v4.octets());
        }
        h.update(&[0]);
        h.update(b"ua");
        assert_ne!(&h.finalize().as_bytes()[..16], &key_a.0[..]);
    }
}
