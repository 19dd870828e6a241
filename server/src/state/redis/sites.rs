//! The site cache on Redis: a site added or changed through one collector is served by every
//! collector at once.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{RedisLink, ms, name_of};
use crate::core::day::SiteZone;
use crate::core::ids::SiteId;
use crate::core::site::Site;
use crate::state::SiteCache;
use crate::state::memory::MemorySiteCache;
/// The site cache on Redis: a site added or changed through one collector is served by every
/// collector at once (the in-process cache is per collector, up to its TTL behind).
pub struct RedisSiteCache {
    link: Arc<RedisLink>,
    ttl: Duration,
    fallback: MemorySiteCache,
}

impl RedisSiteCache {
    /// Entries live `ttl` in Redis (and in the fallback).
    pub fn new(link: Arc<RedisLink>, ttl: Duration, fallback: MemorySiteCache) -> Self {
        Self {
            link,
            ttl,
            fallback,
        }
    }

    fn key(&self, id: &SiteId) -> String {
        self.link
            .key(format_args!("site:{}", name_of(&[id.as_str()])))
    }
}

fn encode_site(site: Option<&Site>) -> String {
    match site {
        None => serde_json::json!({ "absent": true }).to_string(),
        Some(s) => serde_json::json!({
            "id": s.id.as_str(),
            "origins": s.origins,
            "zone": s.zone.name(),
            "public": s.public,
            "ingest_key": s.ingest_key,
        })
        .to_string(),
    }
}

/// A cached entry: `Some(None)` absent, `Some(Some(site))`, `None` unreadable.
fn decode_site(text: &str) -> Option<Option<Site>> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    if v.get("absent").is_some() {
        return Some(None);
    }
    Some(Some(Site {
        id: SiteId::parse(v.get("id")?.as_str()?).ok()?,
        origins: v
            .get("origins")?
            .as_array()?
            .iter()
            .filter_map(|o| o.as_str().map(str::to_owned))
            .collect(),
        zone: SiteZone::parse(v.get("zone")?.as_str()?).ok()?,
        public: v.get("public")?.as_bool()?,
        ingest_key: v
            .get("ingest_key")
            .and_then(|k| k.as_str())
            .map(str::to_owned),
    }))
}

#[async_trait]
impl SiteCache for RedisSiteCache {
    async fn get(&self, id: &SiteId) -> Option<Option<Arc<Site>>> {
        if self.ttl.is_zero() {
            return None;
        }
        let key = self.key(id);
        let answer = self
            .link
            .run(|mut c| async move {
                redis::cmd("GET")
                    .arg(&key)
                    .query_async::<Option<String>>(&mut c)
                    .await
            })
            .await;
        match answer {
            Some(Some(text)) => decode_site(&text).map(|s| s.map(Arc::new)),
            Some(None) => None,
            None => self.fallback.get(id).await,
        }
    }

    async fn put(&self, id: &SiteId, site: Option<Arc<Site>>) {
        self.fallback.put(id, site.clone()).await;
        if self.ttl.is_zero() {
            return;
        }
        let (key, value, ttl) = (self.key(id), encode_site(site.as_deref()), ms(self.ttl));
        self.link
            .run(|mut c| async move {
                redis::cmd("SET")
                    .arg(&key)
                    .arg(&value)
                    .arg("PX")
                    .arg(ttl)
                    .query_async::<()>(&mut c)
                    .await
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sites_round_trip_through_their_encoding() {
        let site = Site {
            id: SiteId::parse("blog").expect("id"),
            origins: vec!["https://a.example".into(), "*".into()],
            zone: SiteZone::parse("Asia/Tokyo").expect("zone"),
            public: true,
            ingest_key: Some("k".repeat(32)),
        };
        let back = decode_site(&encode_site(Some(&site)))
            .expect("readable")
            .expect("a site");
        assert_eq!(back.id, site.id);
        assert_eq!(back.origins, site.origins);
        assert_eq!(back.zone.name(), "Asia/Tokyo");
        assert!(back.public);
        assert_eq!(back.ingest_key, site.ingest_key);
        assert!(matches!(decode_site(&encode_site(None)), Some(None)));
        assert!(decode_site("not json").is_none());
    }
}
