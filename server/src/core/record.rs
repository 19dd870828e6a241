//! What a store persists: one [`Record`] per hit that passed validation and filtering, with its
//! day already resolved in the site's time zone, and the [`Outcome`] the store reports.

use jiff::civil::Date;

use super::hit::HitKind;
use super::ids::{EventId, PagePath, SiteId, VisitorKey};

/// Where a view came from. Views of different sources are counted apart so one page can show
/// a badge and run the script without being counted twice (the read side takes the larger).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The script's beacon or the no-JavaScript pixel.
    Web,
    /// The SVG counter badge.
    Badge,
}

impl Source {
    /// Stored code.
    pub fn code(self) -> i64 {
        match self {
            Source::Web => 0,
            Source::Badge => 1,
        }
    }
}

/// One event to store and count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub event_id: EventId,
    pub site: SiteId,
    pub source: Source,
    pub kind: HitKind,
    pub page: PagePath,
    pub visitor: VisitorKey,
    /// The event's time, ms since the epoch (UTC).
    pub at_ms: i64,
    /// The local day of `at_ms` in the site's time zone.
    pub day: Date,
    pub referrer: Option<String>,
    /// Where the visit came from and what it was made with (page views and custom events
    /// of the web source; empty for badges and for engagement reports).
    pub dims: Dims,
}

/// The dimensions of an event in their stored form (`core::dims`), decided once at ingest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dims {
    /// `SourceDims::encode()`; empty: none recorded.
    pub src: String,
    /// `AgentDims::encode()`; empty: none recorded.
    pub agent: std::sync::Arc<str>,
}

/// What storing a record did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Stored and counted.
    Accepted,
    /// Seen before (same event id, or same dedupe key): nothing changed.
    Duplicate,
}
