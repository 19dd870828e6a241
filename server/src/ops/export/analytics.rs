//! `tally export --what breakdowns|visits`: the analytics of each local day, asked of the
//! same engine the dashboard and `/api/v2/query` ask (`store::analytics::Analytics`, with the
//! imported breakdowns where they apply), so an exported number is the number shown.
//!
//! Contract:
//! - One day at a time: the days of the range that have counted or imported page views (the
//!   site's daily series), each answered by one read of that day's segment; memory is one
//!   day's answers, whatever the range.
//! - `breakdowns` writes `day,dimension,value,visitors,visits,pageviews,events,bounce_rate,
//!   visit_duration` for every dimension of the API but time (`visit:source` … `event:name`),
//!   rows of a day and dimension by visitors, descending (the API's order); a metric the API
//!   does not answer for a dimension (page views of entry pages, bounce rate of event names)
//!   is an empty cell (`null` in JSON). Empty values are written as the API shows them
//!   ("Direct / None", "(not set)").
//! - `visits` writes `day,visitors,visits,pageviews,views_per_visit,bounce_rate,
//!   visit_duration`.

use std::sync::Arc;

use jiff::civil::Date;
use serde_json::json;

use super::{ExportWhat, Rows};
use crate::core::ids::SiteId;
use crate::core::query::{Dimension, Grain, Metric, Query, Value};
use crate::store::Store;
use crate::store::analytics::Analytics;

/// The metrics of the breakdown columns, in column order.
const COLUMNS: [Metric; 6] = [
    Metric::Visitors,
    Metric::Visits,
    Metric::Pageviews,
    Metric::Events,
    Metric::BounceRate,
    Metric::VisitDuration,
];

/// The metrics the API answers for `d` (the others are empty cells).
fn metrics_of(d: Dimension) -> Vec<Metric> {
    use crate::core::query::VisitDim::{EntryPage, ExitPage};
    COLUMNS
        .into_iter()
        .filter(|m| match d {
            Dimension::Name => !matches!(m, Metric::BounceRate | Metric::VisitDuration),
            Dimension::Visit(EntryPage | ExitPage) => {
                !matches!(m, Metric::Pageviews | Metric::Events)
            }
            _ => true,
        })
        .collect()
}

fn question(metrics: Vec<Metric>, dimensions: Vec<Dimension>) -> Query {
    Query {
        metrics,
        dimensions,
        filters: Vec::new(),
        order_by: Vec::new(),
        limit: usize::MAX,
        offset: 0,
    }
}

fn cell(v: Option<&Value>) -> (String, serde_json::Value) {
    match v {
        Some(Value::Int(n)) => (n.to_string(), json!(n)),
        Some(Value::Float(x)) => (x.to_string(), json!(x)),
        Some(Value::Null) | None => (String::new(), serde_json::Value::Null),
    }
}

/// Write `what` (breakdowns or visits) of `site` over `from..=to`; the rows written.
pub(super) async fn export(
    store: Arc<dyn Store>,
    site: &SiteId,
    (from, to): (Date, Date),
    what: ExportWhat,
    rows: &mut Rows<'_>,
) -> anyhow::Result<u64> {
    let zone = store
        .get_site(site)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no site {site}"))?
        .zone;
    let days: Vec<Date> = store
        .series(site, from, to)
        .await?
        .into_iter()
        .map(|r| r.day)
        .collect();
    // Each day is read and asked once: nothing is worth keeping but the dictionary (kept
    // apart from this budget).
    let analytics = Analytics::new(store, 0);
    let dims: Vec<Dimension> = Dimension::ALL
        .iter()
        .map(|(_, d)| *d)
        .filter(|d| !matches!(d, Dimension::Time(_)))
        .collect();
    let day_dim = Dimension::Time(Grain::Day);
    let visits = [
        Metric::Visitors,
        Metric::Visits,
        Metric::Pageviews,
        Metric::ViewsPerVisit,
        Metric::BounceRate,
        Metric::VisitDuration,
    ];
    let questions: Vec<Query> = match what {
        ExportWhat::Visits => vec![question(visits.to_vec(), vec![day_dim])],
        _ => dims
            .iter()
            .map(|d| question(metrics_of(*d), vec![day_dim, *d]))
            .collect(),
    };
    match what {
        ExportWhat::Visits => rows.start(&[
            "day",
            "visitors",
            "visits",
            "pageviews",
            "views_per_visit",
            "bounce_rate",
            "visit_duration",
        ])?,
        _ => rows.start(&[
            "day",
            "dimension",
            "value",
            "visitors",
            "visits",
            "pageviews",
            "events",
            "bounce_rate",
            "visit_duration",
        ])?,
    }
    let mut written = 0u64;
    for day in days {
        let answers = analytics
            .answer_with(site, &zone, day, day, &questions, true)
            .await?;
        for (q, (answer, _)) in questions.iter().zip(&answers) {
            for row in &answer.rows {
                let label = row.dimensions.first().cloned().unwrap_or_default();
                let (mut csv, mut json) = (vec![label.clone()], serde_json::Map::new());
                json.insert("day".into(), json!(label));
                let metrics: &[Metric] = match what {
                    ExportWhat::Visits => &visits,
                    _ => {
                        let d = q.dimensions[1];
                        let value = row.dimensions.get(1).cloned().unwrap_or_default();
                        csv.push(d.name().to_owned());
                        csv.push(value.clone());
                        json.insert("dimension".into(), json!(d.name()));
                        json.insert("value".into(), json!(value));
                        &COLUMNS
                    }
                };
                for m in metrics {
                    let at = q.metrics.iter().position(|x| x == m);
                    let (text, value) = cell(at.and_then(|i| row.metrics.get(i)));
                    csv.push(text);
                    json.insert(m.name().into(), value);
                }
                rows.row(&csv, serde_json::Value::Object(json))?;
                written += 1;
            }
        }
    }
    Ok(written)
}
