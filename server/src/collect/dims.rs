//! Deciding a counted event's dimensions, once, at ingest: where its visit came from
//! (`core::dims::classify_source` over the bundled source list) and what it was made with
//! (browser and OS from the user agent, the device class from the screen width or else the
//! user agent, the country from the client address in the optional location database).
//!
//! Contract: what is stored is only the derived names (`core::record::Dims`); the user agent,
//! the address and the page's query string are dropped here as everywhere. Badge views get no
//! dimensions (they are not visits); a request's agent tuple is decided once for all its
//! records. Unknown stays unknown (an empty value), never a guess.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use crate::core::classify::View;
use crate::core::dims::{AgentDims, Campaign, classify_source, device_of_width};
use crate::core::hit::HitKind;
use crate::core::record::{Dims, Source};

use super::agents::AgentParser;
use super::geo::Geo;
use super::sources::SourceList;

/// The classifiers of a collector.
pub struct Dimensions {
    agents: AgentParser,
    sources: SourceList,
    geo: Option<Geo>,
}

impl Dimensions {
    /// The bundled lists, and the location database at `geoip` if given.
    pub fn new(geoip: Option<&Path>) -> Result<Self, super::geo::GeoError> {
        Ok(Self {
            agents: AgentParser::bundled(),
            sources: SourceList::bundled(),
            geo: geoip.map(Geo::open).transpose()?,
        })
    }

    /// Without a location database (tests, tools).
    pub fn bundled() -> Self {
        Self {
            agents: AgentParser::bundled(),
            sources: SourceList::bundled(),
            geo: None,
        }
    }

    /// The location database, to refresh it when its file is replaced.
    pub fn geo(&self) -> Option<&Geo> {
        self.geo.as_ref()
    }

    /// Whether results of the location database must credit it (DB-IP's lite files).
    pub fn geo_credit(&self) -> bool {
        self.geo.as_ref().is_some_and(Geo::is_dbip)
    }

    /// The browser and OS parser (its name table is what imports spell names with).
    pub fn agents(&self) -> &AgentParser {
        &self.agents
    }

    /// The source names and categories (the channel rules of imported sources ask them).
    pub fn sources(&self) -> &SourceList {
        &self.sources
    }

    /// The source tuple (stored form) of a landing with `referrer` (already cleaned, `None`
    /// for direct or internal navigation) and `campaign`.
    pub fn source(&self, referrer: Option<&str>, campaign: &Campaign) -> String {
        classify_source(referrer, campaign, &self.sources).encode()
    }

    /// The agent tuple of a sender (stored form), for every record of its request.
    pub fn agent(&self, user_agent: &str, ip: IpAddr, screen_width: Option<u32>) -> Arc<str> {
        let a = self.agents.parse(user_agent);
        let device = match screen_width {
            Some(w) if w > 0 => device_of_width(w).to_owned(),
            _ => a.device_hint.to_owned(),
        };
        let (country, region) = self
            .geo
            .as_ref()
            .and_then(|g| g.lookup(ip))
            .map(|l| (l.country, l.region))
            .unwrap_or_default();
        AgentDims {
            browser: a.browser,
            browser_version: a.browser_version,
            os: a.os,
            os_version: a.os_version,
            device,
            country,
            region,
        }
        .encode()
        .into()
    }

    /// The dimensions of `view`, sent with `user_agent` from `ip`: none for badge views and
    /// engagement reports.
    pub fn of(&self, view: &View, user_agent: &str, ip: IpAddr) -> Dims {
        if view.source != Source::Web || matches!(view.kind, HitKind::Engagement { .. }) {
            return Dims::default();
        }
        Dims {
            src: self.source(view.referrer.as_deref(), &view.campaign),
            agent: self.agent(user_agent, ip, view.screen_width),
        }
    }
}
