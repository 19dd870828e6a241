//! Questions about visits, and how they are answered from day segments (`core::segment`): the
//! metrics, dimensions and filters of the analytics API (`POST /api/v2/query`, which speaks
//! Plausible's Stats API v2) and of the dashboard, in one typed model ([`Query`]) and one
//! evaluator ([`run`]).
//!
//! Contract (what each number means; `docs/api.md` says it for users):
//! - **visitors**: distinct visitor numbers, exact over any range and in every row.
//! - **visits**: visits (`core::segment`); with event filters, visits with at least one
//!   matching event; in a page breakdown, visits that viewed the page.
//! - **pageviews** / **events**: matching page views / page views plus custom events.
//! - **bounce_rate**: percent of visits with fewer than two page views and no custom event,
//!   rounded to an integer; with an `event:page` filter or dimension, of the visits that
//!   *entered* on the page (as Plausible).
//! - **visit_duration**: mean seconds from a visit's first to its last event (one page view:
//!   0), rounded; in a page breakdown, of visits entering on the page.
//! - **views_per_visit**: page views of the visits / visits, two decimals.
//! - **time_on_page**: engaged ms summed over the matching page views that reported
//!   engagement, divided by the visits that had such a page view, in seconds (rounded);
//!   `null` without data.
//! - **scroll_depth**: per visit the largest depth reported on the matching page views,
//!   averaged over visits that reported one (rounded percent); `null` without data.
//! - **percentage**: a row's visitors as a percentage of all visitors matching the filters.
//! - Filters are ANDed. A filter on a visit dimension keeps visits; one on an event dimension
//!   (`event:page`, `event:name`; a page view's name is `pageview`) keeps events, and a visit
//!   counts when one of its events matches all event filters.
//! - Time: visit metrics fall in the bucket of the visit's start, event metrics in their
//!   event's. Buckets are local to the site's time zone.

mod eval;
mod local;

pub use eval::{
    Answer, Day, DayInput, Dictionary, Evaluator, Extra, Row, StateError, Sums, Value, order_of,
    run, run_with, set_of,
};

/// A metric that can be asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Metric {
    Visitors,
    Visits,
    Pageviews,
    ViewsPerVisit,
    BounceRate,
    VisitDuration,
    Events,
    TimeOnPage,
    ScrollDepth,
    Percentage,
}

impl Metric {
    /// Every metric, in the order they are documented.
    pub const ALL: [Metric; 10] = [
        Metric::Visitors,
        Metric::Visits,
        Metric::Pageviews,
        Metric::ViewsPerVisit,
        Metric::BounceRate,
        Metric::VisitDuration,
        Metric::Events,
        Metric::TimeOnPage,
        Metric::ScrollDepth,
        Metric::Percentage,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Metric::Visitors => "visitors",
            Metric::Visits => "visits",
            Metric::Pageviews => "pageviews",
            Metric::ViewsPerVisit => "views_per_visit",
            Metric::BounceRate => "bounce_rate",
            Metric::VisitDuration => "visit_duration",
            Metric::Events => "events",
            Metric::TimeOnPage => "time_on_page",
            Metric::ScrollDepth => "scroll_depth",
            Metric::Percentage => "percentage",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Metric::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Metrics of visits as wholes (computed on visits, not on their events).
    fn of_visits(self) -> bool {
        matches!(
            self,
            Metric::BounceRate | Metric::VisitDuration | Metric::ViewsPerVisit
        )
    }
}

/// A property of a visit (taken from its first event, or its entry and exit page views).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VisitDim {
    Source,
    Referrer,
    Channel,
    UtmSource,
    UtmMedium,
    UtmCampaign,
    UtmTerm,
    UtmContent,
    Browser,
    BrowserVersion,
    Os,
    OsVersion,
    Device,
    Country,
    Region,
    EntryPage,
    ExitPage,
}

/// A time bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Grain {
    Hour,
    Day,
    Week,
    Month,
}

/// What rows are grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dimension {
    Visit(VisitDim),
    /// `event:page`: the page of a page view or custom event.
    Page,
    /// `event:name`: a custom event's name, `pageview` for page views.
    Name,
    Time(Grain),
}

impl Dimension {
    /// Every dimension, by its API name.
    pub const ALL: [(&'static str, Dimension); 23] = [
        ("event:page", Dimension::Page),
        ("event:name", Dimension::Name),
        ("visit:source", Dimension::Visit(VisitDim::Source)),
        ("visit:referrer", Dimension::Visit(VisitDim::Referrer)),
        ("visit:channel", Dimension::Visit(VisitDim::Channel)),
        ("visit:utm_source", Dimension::Visit(VisitDim::UtmSource)),
        ("visit:utm_medium", Dimension::Visit(VisitDim::UtmMedium)),
        (
            "visit:utm_campaign",
            Dimension::Visit(VisitDim::UtmCampaign),
        ),
        ("visit:utm_term", Dimension::Visit(VisitDim::UtmTerm)),
        ("visit:utm_content", Dimension::Visit(VisitDim::UtmContent)),
        ("visit:browser", Dimension::Visit(VisitDim::Browser)),
        (
            "visit:browser_version",
            Dimension::Visit(VisitDim::BrowserVersion),
        ),
        ("visit:os", Dimension::Visit(VisitDim::Os)),
        ("visit:os_version", Dimension::Visit(VisitDim::OsVersion)),
        ("visit:device", Dimension::Visit(VisitDim::Device)),
        ("visit:country", Dimension::Visit(VisitDim::Country)),
        ("visit:region", Dimension::Visit(VisitDim::Region)),
        ("visit:entry_page", Dimension::Visit(VisitDim::EntryPage)),
        ("visit:exit_page", Dimension::Visit(VisitDim::ExitPage)),
        ("time:hour", Dimension::Time(Grain::Hour)),
        ("time:day", Dimension::Time(Grain::Day)),
        ("time:week", Dimension::Time(Grain::Week)),
        ("time:month", Dimension::Time(Grain::Month)),
    ];

    pub fn name(self) -> &'static str {
        Dimension::ALL
            .iter()
            .find(|(_, d)| *d == self)
            .map_or("", |(n, _)| n)
    }

    pub fn parse(name: &str) -> Option<Self> {
        Dimension::ALL
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, d)| *d)
    }

    fn is_event(self) -> bool {
        matches!(self, Dimension::Page | Dimension::Name)
    }

    /// The label of an empty value, as Plausible shows it.
    pub fn empty_label(self) -> &'static str {
        match self {
            Dimension::Visit(VisitDim::Source | VisitDim::Referrer) => "Direct / None",
            _ => "(not set)",
        }
    }
}

/// How a filter compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Is,
    IsNot,
    Contains,
    ContainsNot,
}

impl Op {
    pub const ALL: [(&'static str, Op); 4] = [
        ("is", Op::Is),
        ("is_not", Op::IsNot),
        ("contains", Op::Contains),
        ("contains_not", Op::ContainsNot),
    ];

    pub fn name(self) -> &'static str {
        Op::ALL
            .iter()
            .find(|(_, o)| *o == self)
            .map_or("", |(n, _)| n)
    }

    pub fn parse(name: &str) -> Option<Self> {
        Op::ALL.iter().find(|(n, _)| *n == name).map(|(_, o)| *o)
    }
}

/// One filter: `dimension op any of values`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub dimension: Dimension,
    pub op: Op,
    /// Matches when the value matches any of these (`*_not`: none of them). An empty-value
    /// label ("(not set)", "Direct / None") stands for the empty value.
    pub values: Vec<String>,
    pub case_sensitive: bool,
}

impl Filter {
    /// Whether a stored value passes.
    pub fn accepts(&self, value: &str) -> bool {
        let label = self.dimension.empty_label();
        let hit = self.values.iter().any(|want| {
            let want = if want == label { "" } else { want.as_str() };
            match (self.op, self.case_sensitive) {
                (Op::Is | Op::IsNot, true) => value == want,
                (Op::Is | Op::IsNot, false) => value.to_lowercase() == want.to_lowercase(),
                (Op::Contains | Op::ContainsNot, true) => value.contains(want),
                (Op::Contains | Op::ContainsNot, false) => {
                    value.to_lowercase().contains(&want.to_lowercase())
                }
            }
        });
        match self.op {
            Op::Is | Op::Contains => hit,
            Op::IsNot | Op::ContainsNot => !hit,
        }
    }
}

/// A key rows are sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderKey {
    Metric(Metric),
    Dimension(Dimension),
}

/// A question: over days already chosen by the caller (the segments handed to [`run`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub metrics: Vec<Metric>,
    pub dimensions: Vec<Dimension>,
    pub filters: Vec<Filter>,
    /// (key, descending); rows are then ordered by their dimension values.
    pub order_by: Vec<(OrderKey, bool)>,
    pub limit: usize,
    pub offset: usize,
}

/// A question that cannot be answered as asked; the message says why and what would work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

impl Query {
    /// Check the combination of metrics, dimensions and filters (Plausible's rules).
    pub fn check(&self) -> Result<(), Invalid> {
        if self.metrics.is_empty() {
            return Err(Invalid("at least one metric is needed".into()));
        }
        let event_dims: Vec<Dimension> = self
            .dimensions
            .iter()
            .copied()
            .filter(|d| d.is_event())
            .collect();
        let page_filter = self.filters.iter().any(|f| f.dimension == Dimension::Page);
        let page_dim = self.dimensions.contains(&Dimension::Page);
        for m in &self.metrics {
            if m.of_visits() && event_dims.contains(&Dimension::Name) {
                return Err(Invalid(format!(
                    "Session metric `{}` cannot be queried along with event dimension `event:name`",
                    m.name()
                )));
            }
            if matches!(m, Metric::TimeOnPage | Metric::ScrollDepth) && !page_filter && !page_dim {
                return Err(Invalid(format!(
                    "Metric `{}` can only be queried with event:page filters or dimensions.",
                    m.name()
                )));
            }
            if *m == Metric::ViewsPerVisit && page_filter {
                return Err(Invalid(
                    "Metric `views_per_visit` cannot be queried with a filter on `event:page`."
                        .into(),
                ));
            }
            if matches!(
                m,
                Metric::Pageviews | Metric::Events | Metric::TimeOnPage | Metric::ScrollDepth
            ) && self.dimensions.iter().any(|d| {
                matches!(
                    d,
                    Dimension::Visit(VisitDim::EntryPage | VisitDim::ExitPage)
                )
            }) {
                return Err(Invalid(format!(
                    "Event metric `{}` cannot be queried along with session dimensions `visit:entry_page` or `visit:exit_page`",
                    m.name()
                )));
            }
        }
        if self
            .filters
            .iter()
            .any(|f| matches!(f.dimension, Dimension::Time(_)))
        {
            return Err(Invalid("time dimensions cannot be filtered on".into()));
        }
        if self
            .dimensions
            .iter()
            .filter(|d| matches!(d, Dimension::Time(_)))
            .count()
            > 1
        {
            return Err(Invalid("at most one time dimension".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
