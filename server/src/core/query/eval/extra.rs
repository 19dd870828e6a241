//! Sums kept without visitor ids (another tool's imported daily aggregates) added to the
//! rows of an answer: their visitors as numbers beside the rows' bitmaps (a sum: days and
//! rows cannot be told apart), their visits, bounces and durations as the sums they are, so
//! every ratio stays exact over counted and imported visits together.

use jiff::civil::Date;

use super::{Grain, Invalid, Rows, Slot, Values, bucket_label};

/// Sums of one day (or of the whole range) and one value tuple that have no visitor ids: the
/// imported aggregates of another tool, added to an answer by
/// [`super::Evaluator::add_extra`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extra {
    /// The local day of the sums; `None` (the whole range) only for queries without a time
    /// dimension. Hourly buckets take no extras.
    pub day: Option<Date>,
    /// The value of each non-time dimension of the query, in query order ("" is not set).
    pub values: Vec<String>,
    pub sums: Sums,
}

/// What an [`Extra`] adds to a row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sums {
    /// Visitors, added as a number (days and rows cannot be told apart: a sum).
    pub visitors: u64,
    pub visits: u64,
    pub pageviews: u64,
    /// Page views plus custom events.
    pub events: u64,
    /// Visits counted whole (duration, bounce rate, views per visit) and their page views.
    pub whole_visits: u64,
    pub whole_pageviews: u64,
    pub bounces: u64,
    /// Visit durations summed, seconds.
    pub duration_s: u64,
}

/// Add each extra to the row its values (and day) name; the visitors added in all.
pub(super) fn add(
    extra: &[Extra],
    slots: &[Slot],
    key: &mut [u32],
    values: &mut [Values],
    rows: &mut Rows,
    from: Date,
) -> Result<u64, Invalid> {
    let mut total = 0u64;
    let plain = slots.iter().filter(|s| !matches!(s, Slot::Time(_))).count();
    for e in extra {
        if e.values.len() != plain {
            return Err(Invalid(format!(
                "an imported row has {} values for {plain} dimensions",
                e.values.len()
            )));
        }
        let mut next = e.values.iter();
        for (k, s) in slots.iter().enumerate() {
            key[k] = match s {
                Slot::Time(g) => {
                    let day = e.day.ok_or_else(|| {
                        Invalid("an imported row without a day in a time breakdown".into())
                    })?;
                    if *g == Grain::Hour {
                        return Err(Invalid("imported rows have no hours".into()));
                    }
                    values[k].id(&bucket_label(*g, day, from, 0))
                }
                _ => values[k].id(next.next().map_or("", String::as_str)),
            };
        }
        let r = rows.at(key);
        let acc = &mut rows.accs[r];
        let s = &e.sums;
        acc.counted_visitors += s.visitors;
        acc.visits += s.visits;
        acc.pageviews += s.pageviews;
        acc.events += s.events;
        acc.whole_visits += s.whole_visits;
        acc.whole_pageviews += s.whole_pageviews;
        acc.bounce_visits += s.whole_visits;
        acc.bounces += s.bounces;
        acc.duration_s += s.duration_s;
        total += s.visitors;
    }
    Ok(total)
}
