//! Imported breakdowns: another tool's daily aggregates per dimension value (Plausible's CSV
//! export), as the store keeps them and as the analytics add them to an answer.
//!
//! Contract:
//! - A row is one site, local day, [`Table`] and value tuple (the table's fields joined by a
//!   separator no value holds), with the numbers the export gave: visitors, visits, page
//!   views, custom events, bounces and visit durations summed in seconds. Rows are set, never
//!   recounted: `tally verify` does not compare them, retention does not prune them.
//! - An answer includes them (`store::merge`) only where the tool itself would: when every
//!   dimension the question breaks down or filters by is a field of ONE table (no dimension
//!   and no filter: the daily totals), never in hourly buckets. Otherwise the answer is the
//!   counted events alone and says why.
//! - Visitors of imported rows are SUMS (the export has no visitor ids): a visitor of two
//!   days, or of two rows of one day, counts in each. Every answer that includes imports says
//!   so. `time_on_page` and `scroll_depth` never include them.

use jiff::civil::Date;

use crate::core::query::{Dimension, VisitDim};

/// The separator of a stored value tuple (ASCII unit separator: no value holds a control
/// character).
const SEP: char = '\u{1f}';

/// The tables of Plausible's CSV export, by what they break visits down by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// Daily totals (`imported_visitors`): no dimension.
    Visitors,
    Sources,
    Pages,
    EntryPages,
    ExitPages,
    Locations,
    Devices,
    Browsers,
    OperatingSystems,
    CustomEvents,
}

use Dimension::{Name, Page, Visit};
use VisitDim as V;

impl Table {
    /// Every table.
    pub const ALL: [Table; 10] = [
        Table::Visitors,
        Table::Sources,
        Table::Pages,
        Table::EntryPages,
        Table::ExitPages,
        Table::Locations,
        Table::Devices,
        Table::Browsers,
        Table::OperatingSystems,
        Table::CustomEvents,
    ];

    /// The name stored in the `dim` column (the export's file name without `imported_`).
    pub fn name(self) -> &'static str {
        match self {
            Table::Visitors => "visitors",
            Table::Sources => "sources",
            Table::Pages => "pages",
            Table::EntryPages => "entry_pages",
            Table::ExitPages => "exit_pages",
            Table::Locations => "locations",
            Table::Devices => "devices",
            Table::Browsers => "browsers",
            Table::OperatingSystems => "operating_systems",
            Table::CustomEvents => "custom_events",
        }
    }

    pub fn parse(name: &str) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The dimensions of the value tuple, in its order.
    pub fn fields(self) -> &'static [Dimension] {
        match self {
            Table::Visitors => &[],
            Table::Sources => &[
                Visit(V::Source),
                Visit(V::Referrer),
                Visit(V::Channel),
                Visit(V::UtmSource),
                Visit(V::UtmMedium),
                Visit(V::UtmCampaign),
                Visit(V::UtmContent),
                Visit(V::UtmTerm),
            ],
            Table::Pages => &[Page],
            Table::EntryPages => &[Visit(V::EntryPage)],
            Table::ExitPages => &[Visit(V::ExitPage)],
            Table::Locations => &[Visit(V::Country), Visit(V::Region)],
            Table::Devices => &[Visit(V::Device)],
            Table::Browsers => &[Visit(V::Browser), Visit(V::BrowserVersion)],
            Table::OperatingSystems => &[Visit(V::Os), Visit(V::OsVersion)],
            Table::CustomEvents => &[Name],
        }
    }
}

/// A stored value tuple of `values` (each cleaned by the caller).
pub fn encode(values: &[&str]) -> String {
    values.join(&SEP.to_string())
}

/// The values of a stored tuple of `table` (missing ones read as empty).
pub fn decode(table: Table, stored: &str) -> Vec<String> {
    let mut parts = stored.split(SEP);
    table
        .fields()
        .iter()
        .map(|_| parts.next().unwrap_or("").to_owned())
        .collect()
}

/// The numbers of one imported row, as the export gave them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportedSums {
    pub visitors: u64,
    pub visits: u64,
    pub pageviews: u64,
    /// Custom events (`imported_custom_events`).
    pub events: u64,
    pub bounces: u64,
    /// Visit durations summed, seconds.
    pub visit_duration: u64,
}

impl ImportedSums {
    /// Add `other`, saturating at [`super::MAX_IMPORTED_COUNT`].
    pub fn add(&mut self, other: &ImportedSums) {
        let cap = super::MAX_IMPORTED_COUNT.unsigned_abs();
        let add = |a: &mut u64, b: u64| *a = a.saturating_add(b).min(cap);
        add(&mut self.visitors, other.visitors);
        add(&mut self.visits, other.visits);
        add(&mut self.pageviews, other.pageviews);
        add(&mut self.events, other.events);
        add(&mut self.bounces, other.bounces);
        add(&mut self.visit_duration, other.visit_duration);
    }
}

/// One imported row of a site.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportedRow {
    /// The local day (in a summed read, [`SegmentSource::imported`] with `by_day` false: the
    /// range's first day).
    pub day: Date,
    pub table: Table,
    /// The stored value tuple ([`encode`]; empty for [`Table::Visitors`]).
    pub value: String,
    pub sums: ImportedSums,
}
