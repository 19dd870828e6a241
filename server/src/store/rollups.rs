//! Month rollups: the state of each common question ([`questions`]: every question the
//! dashboard asks without a filter, and the API questions of the same families) over the
//! sealed days of one local month, stored beside the day segments, so a year is read as
//! twelve stored states merged, not counted from 365 days.
//!
//! Contract:
//! - **Never stale.** A stored state names the sealed days it counted and their versions
//!   ([`RollupState::days`]); a read uses it only when those are exactly the days of that
//!   month its range holds sealed, at the same versions (a write to a sealed day deletes the
//!   day's segment, and a new seal has a new version, so a state over a changed day is
//!   never used). Open days are always counted from raw events, as without rollups.
//! - **Exact.** A state is an exact question state (`core::query`, [`Evaluator::save`]):
//!   sums, and each row's visitors as a set of visitor numbers, so a year's visitors per page
//!   or source are the union of twelve sets, as exact as counting the days.
//! - **Written after the seal.** The seal pass (`collect::seal`) rolls each month whose
//!   sealed days differ from its stored state's (a newly sealed day, a day sealed again, a
//!   question or [`VERSION`] added by an upgrade): it counts the month's sealed days again
//!   and replaces the month's states in one transaction, only while the month's sealed days
//!   are still those it counted (an older count never replaces a newer one). Until then
//!   reads count those days, as before. A stored state that cannot be read is refused
//!   ([`Evaluator::load`]) and its month counted.
//! - **Recounted.** `tally verify` counts every stored state again from the stored day
//!   segments at the versions it names (which verify recounts from raw events) and reports a
//!   state that differs; `--repair` replaces it. A state over days that changed since is not
//!   drift: no read uses it, and the next seal pass replaces it.
//! - Each state is keyed by its zone and how its question counts
//!   ([`Evaluator::counting_key`]), so another page, order or metric of the same sums is read
//!   from it too.

use jiff::civil::Date;

use crate::core::day::SiteZone;
use crate::core::query::{Dimension, Evaluator, Filter, Grain, Metric, Op, Query, VisitDim};

/// A month's stored state of one question, without its bytes ([`super::SegmentSource::rollup_index`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollupInfo {
    /// The month's first day.
    pub month: Date,
    pub key: String,
    /// The sealed days it counted, with their versions, in day order.
    pub days: Vec<(Date, i64)>,
}

/// A month's stored state of one question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollupState {
    pub key: String,
    /// The sealed days it counted, with their versions, in day order.
    pub days: Vec<(Date, i64)>,
    /// [`Evaluator::save`]'s bytes.
    pub state: Vec<u8>,
}

/// The questions whose month states are stored: the dashboard's without a filter (its
/// cards, its daily series and every panel) and the API's questions of the same families.
/// Another question of one [`Evaluator::counting_key`] (other metrics of the same sums, other
/// order or page) reads the same state.
pub fn questions() -> Vec<Query> {
    let q = |metrics: &[Metric], dimensions: Vec<Dimension>, filters: Vec<Filter>| Query {
        metrics: metrics.to_vec(),
        dimensions,
        filters,
        order_by: Vec::new(),
        limit: 1,
        offset: 0,
    };
    let mut out = vec![
        q(&[Metric::Visitors, Metric::Visits], Vec::new(), Vec::new()),
        q(
            &[Metric::Visitors, Metric::Pageviews],
            vec![Dimension::Time(Grain::Day)],
            Vec::new(),
        ),
        q(
            &[Metric::Visitors, Metric::Pageviews, Metric::TimeOnPage],
            vec![Dimension::Page],
            Vec::new(),
        ),
        q(
            &[Metric::Visitors, Metric::Events],
            vec![Dimension::Name],
            vec![Filter {
                dimension: Dimension::Name,
                op: Op::IsNot,
                values: vec!["pageview".into()],
                case_sensitive: true,
            }],
        ),
        q(
            &[Metric::Visits],
            vec![Dimension::Visit(VisitDim::EntryPage)],
            Vec::new(),
        ),
        q(
            &[Metric::Visits],
            vec![Dimension::Visit(VisitDim::ExitPage)],
            Vec::new(),
        ),
    ];
    for d in [
        VisitDim::Channel,
        VisitDim::Source,
        VisitDim::Referrer,
        VisitDim::UtmCampaign,
        VisitDim::Country,
        VisitDim::Region,
        VisitDim::Browser,
        VisitDim::Os,
        VisitDim::Device,
    ] {
        out.push(q(
            &[Metric::Visitors],
            vec![Dimension::Visit(d)],
            Vec::new(),
        ));
    }
    out
}

/// The version of how states are counted and stored: raise it with any change to what a
/// question's state holds (a metric's definition, the visit rules, [`Evaluator::save`]'s
/// format), so every stored state of an older version is counted again by the next pass
/// instead of being merged with newer ones.
pub const VERSION: u32 = 1;

/// What names a stored state: the rollup version, the site's zone and how its question
/// counts.
pub fn key(zone: &SiteZone, e: &Evaluator) -> String {
    format!("v{VERSION}\u{1f}{}\u{1f}{}", zone.name(), e.counting_key())
}

/// The keys of every question of [`questions`] in `zone`.
pub fn keys(zone: &SiteZone) -> Result<Vec<String>, crate::core::query::Invalid> {
    let day = Date::constant(2000, 1, 1);
    questions()
        .iter()
        .map(|q| Evaluator::new(q, day, day, zone).map(|e| key(zone, &e)))
        .collect()
}

/// Whether stored month states answer every one of `asked` (each question with its [`key`]):
/// each is rollable and of [`questions`]' keys (a filter, another kind of sums: not).
pub fn answers(
    zone: &SiteZone,
    asked: &[(Query, String)],
) -> Result<bool, crate::core::query::Invalid> {
    if asked.is_empty() || !asked.iter().all(|(q, _)| rollable(q)) {
        return Ok(false);
    }
    let rolled = keys(zone)?;
    Ok(asked.iter().all(|(_, k)| rolled.contains(k)))
}

/// Whether a question's state over a month can stand for those days in a longer range: its
/// rows do not depend on where the range starts (weeks are cut at the range's first day).
pub fn rollable(query: &Query) -> bool {
    !query.dimensions.contains(&Dimension::Time(Grain::Week))
}

/// The first day of `day`'s month.
pub fn month_of(day: Date) -> Date {
    day.first_of_month()
}

/// The last day of `day`'s month.
pub fn month_end(day: Date) -> Date {
    day.last_of_month()
}

/// Days and versions as stored: per day its year (2 bytes), month, day, then its version
/// (8 bytes), little-endian.
pub fn encode_days(days: &[(Date, i64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(days.len() * 12);
    for (d, v) in days {
        out.extend_from_slice(&d.year().to_le_bytes());
        out.push(d.month() as u8);
        out.push(d.day() as u8);
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// A stored row's days (`site` and `month` as stored, for the log); a row whose days cannot
/// be read names none, so no read matches it and the next pass replaces it.
pub fn stored_days(bytes: &[u8], site: i64, month: i64) -> Vec<(Date, i64)> {
    decode_days(bytes).unwrap_or_else(|| {
        tracing::warn!(
            site,
            month,
            "a stored month state names bad days; it is rolled again"
        );
        Vec::new()
    })
}

/// [`encode_days`]' bytes as days; `None` when they are not.
pub fn decode_days(bytes: &[u8]) -> Option<Vec<(Date, i64)>> {
    if !bytes.len().is_multiple_of(12) {
        return None;
    }
    bytes
        .chunks_exact(12)
        .map(|c| {
            let year = i16::from_le_bytes([c[0], c[1]]);
            let day = Date::new(year, i8::try_from(c[2]).ok()?, i8::try_from(c[3]).ok()?).ok()?;
            let mut v = [0u8; 8];
            v.copy_from_slice(&c[4..]);
            Some((day, i64::from_le_bytes(v)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_round_trip_and_foreign_bytes_are_refused() {
        let days = vec![
            (jiff::civil::date(2026, 1, 1), 7),
            (jiff::civil::date(2026, 1, 31), i64::MAX),
        ];
        assert_eq!(decode_days(&encode_days(&days)), Some(days));
        assert_eq!(decode_days(&[1, 2, 3]), None);
        let mut bad = encode_days(&[(jiff::civil::date(2026, 2, 28), 1)]);
        bad[3] = 30; // 2026-02-30
        assert_eq!(decode_days(&bad), None);
    }

    #[test]
    fn every_question_is_distinct_and_rollable() {
        assert!(questions().iter().all(rollable));
        let keys: std::collections::HashSet<String> = keys(&SiteZone::utc())
            .expect("valid questions")
            .into_iter()
            .collect();
        assert_eq!(keys.len(), questions().len());
    }
}
