//! A configured site: its id, the origins allowed to send for it, its time zone, whether its
//! stats are public, and the ingest key of its own server. Stores keep it; the pipeline and the
//! edge read it.

use super::day::SiteZone;
use super::ids::SiteId;

/// A configured site.
#[derive(Clone)]
pub struct Site {
    pub id: SiteId,
    /// Origins allowed to send hits (`https://blog.example.com`), or `*` for any.
    pub origins: Vec<String>,
    pub zone: SiteZone,
    /// Whether the stats (dashboard, series, top) are open without the admin token.
    pub public: bool,
    /// The per-site secret of server-side senders (`Authorization: Bearer …`), if one is set.
    pub ingest_key: Option<String>,
}

/// Like the derived one, but the ingest key is never printed.
impl std::fmt::Debug for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Site")
            .field("id", &self.id)
            .field("origins", &self.origins)
            .field("zone", &self.zone)
            .field("public", &self.public)
            .field(
                "ingest_key",
                &self.ingest_key.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl Site {
    /// Whether a browser `Origin` may send hits for this site.
    pub fn allows_origin(&self, origin: &str) -> bool {
        self.origins
            .iter()
            .any(|o| o == "*" || o.eq_ignore_ascii_case(origin))
    }
}
