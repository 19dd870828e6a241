//! What of the imported breakdowns (`store::imported`) an answer includes, and how: the
//! rules of [`plan`] (one imported table must answer the whole question: every dimension it
//! breaks down or filters by is one of its fields; never hourly buckets) and the rows read
//! for it as the evaluator's extras (`core::query::Extra`), with what the answer must say
//! about them ([`Imports`]).

use jiff::civil::Date;

use super::imported::{ImportedSums, Table, decode};
use super::{SegmentSource, StoreError};
use crate::core::ids::SiteId;
use crate::core::query::{Dimension, Extra, Grain, Metric, Query, Sums};

/// Whether an answer includes imported rows, and what its reader should know.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Imports {
    pub included: bool,
    pub warning: Option<String>,
}

/// What a question reads of the imported tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Not included, and why.
    Skip(String),
    /// Rows of `table`; with `Page`, the entry pages too (bounces and durations of visits
    /// entering on a page); with `Name`, the daily totals as the page views' row.
    Read(Table),
}

/// What `query` reads of the imported tables (the module's rules).
pub fn plan(query: &Query) -> Plan {
    if query.dimensions.contains(&Dimension::Time(Grain::Hour)) {
        return Plan::Skip("imported data is daily: hourly buckets do not include it".into());
    }
    let mut wanted: Vec<Dimension> = query
        .dimensions
        .iter()
        .chain(query.filters.iter().map(|f| &f.dimension))
        .copied()
        .filter(|d| !matches!(d, Dimension::Time(_)))
        .collect();
    wanted.sort_by_key(|d| d.name());
    wanted.dedup();
    if wanted.is_empty() {
        return Plan::Read(Table::Visitors);
    }
    match Table::ALL
        .into_iter()
        .find(|t| wanted.iter().all(|d| t.fields().contains(d)))
    {
        Some(t) => Plan::Read(t),
        None => Plan::Skip(format!(
            "imported data has no breakdown by {} together",
            wanted
                .iter()
                .map(|d| d.name())
                .collect::<Vec<_>>()
                .join(" and ")
        )),
    }
}

/// What a row of `table` adds to an answer.
fn sums_of(table: Table, s: &ImportedSums) -> Sums {
    match table {
        Table::Pages => Sums {
            visitors: s.visitors,
            visits: s.visits,
            pageviews: s.pageviews,
            events: s.pageviews,
            ..Sums::default()
        },
        Table::CustomEvents => Sums {
            visitors: s.visitors,
            events: s.events,
            ..Sums::default()
        },
        _ => Sums {
            visitors: s.visitors,
            visits: s.visits,
            pageviews: s.pageviews,
            events: s.pageviews,
            whole_visits: s.visits,
            whole_pageviews: s.pageviews,
            bounces: s.bounces,
            duration_s: s.visit_duration,
        },
    }
}

/// `row` as an extra of `query`, if it passes the filters. `fields` name its values (the
/// table's, or another dimension's for the companion rows of [`Plan::Read`]).
fn extra(
    query: &Query,
    by_day: bool,
    fields: &[Dimension],
    values: &[String],
    sums: Sums,
    day: Date,
) -> Option<Extra> {
    let value_of = |d: &Dimension| {
        fields
            .iter()
            .position(|f| f == d)
            .and_then(|i| values.get(i))
            .map_or("", String::as_str)
    };
    if !query
        .filters
        .iter()
        .all(|f| f.accepts(value_of(&f.dimension)))
    {
        return None;
    }
    Some(Extra {
        day: by_day.then_some(day),
        values: query
            .dimensions
            .iter()
            .filter(|d| !matches!(d, Dimension::Time(_)))
            .map(|d| value_of(d).to_owned())
            .collect(),
        sums,
    })
}

/// The extras of `query` over `site`'s local days `from..=to`, read from `source`, and what
/// the answer says about them.
pub(super) async fn extras(
    source: &dyn SegmentSource,
    site: &SiteId,
    from: Date,
    to: Date,
    query: &Query,
) -> Result<(Vec<Extra>, Imports), StoreError> {
    let by_day = query
        .dimensions
        .iter()
        .any(|d| matches!(d, Dimension::Time(_)));
    let table = match plan(query) {
        Plan::Read(t) => t,
        Plan::Skip(why) => {
            let any = !source
                .imported(site, Table::Visitors, from, to, false)
                .await?
                .is_empty();
            return Ok((
                Vec::new(),
                Imports {
                    included: false,
                    warning: any.then(|| format!("Imported data is not included: {why}.")),
                },
            ));
        }
    };
    // Companions: bounces and durations of a page come from its entries; the page views'
    // row of an event-name breakdown from the daily totals.
    let mut reads = vec![(table, table.fields())];
    match table {
        Table::Pages => reads.push((Table::EntryPages, Table::Pages.fields())),
        Table::CustomEvents => reads.push((Table::Visitors, Table::CustomEvents.fields())),
        _ => {}
    }
    let mut out = Vec::new();
    let mut found = false;
    for (read, fields) in reads {
        let rows = source.imported(site, read, from, to, by_day).await?;
        // The table asked (its companions alone include nothing of it).
        found |= read == table && !rows.is_empty();
        for row in rows {
            let (values, sums) = match (table, read) {
                (Table::Pages, Table::EntryPages) => {
                    let s = &row.sums;
                    let sums = Sums {
                        whole_visits: s.visits,
                        whole_pageviews: s.pageviews,
                        bounces: s.bounces,
                        duration_s: s.visit_duration,
                        ..Sums::default()
                    };
                    (decode(read, &row.value), sums)
                }
                (Table::CustomEvents, Table::Visitors) => {
                    let s = &row.sums;
                    let sums = Sums {
                        visitors: s.visitors,
                        pageviews: s.pageviews,
                        events: s.pageviews,
                        ..Sums::default()
                    };
                    (vec!["pageview".to_owned()], sums)
                }
                _ => (decode(read, &row.value), sums_of(read, &row.sums)),
            };
            if let Some(e) = extra(query, by_day, fields, &values, sums, row.day) {
                out.push(e);
            }
        }
    }
    if !found {
        let any = !source
            .imported(site, Table::Visitors, from, to, false)
            .await?
            .is_empty();
        return Ok((
            Vec::new(),
            Imports {
                included: false,
                warning: any.then(|| {
                    format!(
                        "Imported data is not included: the import holds no {} rows for \
                         this range.",
                        table.name()
                    )
                }),
            },
        ));
    }
    let mut warning = String::from(
        "Visitors of imported days are sums of daily numbers (the export has no visitor ids): \
         a visitor of several days or rows counts in each.",
    );
    if query
        .metrics
        .iter()
        .any(|m| matches!(m, Metric::TimeOnPage | Metric::ScrollDepth))
    {
        warning.push_str(" time_on_page and scroll_depth do not include imported data.");
    }
    Ok((
        out,
        Imports {
            included: true,
            warning: Some(warning),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::query::{Filter, Op, VisitDim};
    use crate::store::imported::encode;

    use Dimension::{Name, Page, Visit};
    use VisitDim as V;

    fn q(dims: &[Dimension], filters: &[(Dimension, &str)]) -> Query {
        Query {
            metrics: vec![Metric::Visitors],
            dimensions: dims.to_vec(),
            filters: filters
                .iter()
                .map(|(d, v)| Filter {
                    dimension: *d,
                    op: Op::Is,
                    values: vec![(*v).to_owned()],
                    case_sensitive: true,
                })
                .collect(),
            order_by: Vec::new(),
            limit: 10,
            offset: 0,
        }
    }

    #[test]
    fn imports_are_read_only_where_one_table_answers_the_whole_question() {
        let day = Dimension::Time(Grain::Day);
        assert_eq!(plan(&q(&[], &[])), Plan::Read(Table::Visitors));
        assert_eq!(plan(&q(&[day], &[])), Plan::Read(Table::Visitors));
        assert_eq!(
            plan(&q(&[Visit(V::Browser), Visit(V::BrowserVersion)], &[])),
            Plan::Read(Table::Browsers)
        );
        assert_eq!(
            plan(&q(&[Visit(V::Source)], &[(Visit(V::UtmCampaign), "x")])),
            Plan::Read(Table::Sources)
        );
        assert_eq!(
            plan(&q(&[], &[(Visit(V::Country), "DE")])),
            Plan::Read(Table::Locations)
        );
        assert_eq!(plan(&q(&[Name], &[])), Plan::Read(Table::CustomEvents));
        for skipped in [
            q(&[Dimension::Time(Grain::Hour)], &[]),
            q(&[Visit(V::Browser)], &[(Visit(V::Country), "DE")]),
            q(&[Visit(V::Source), Page], &[]),
        ] {
            assert!(matches!(plan(&skipped), Plan::Skip(_)), "{skipped:?}");
        }
    }

    #[test]
    fn rows_pass_the_filters_and_give_the_values_in_query_order() {
        let query = q(
            &[Visit(V::BrowserVersion), Visit(V::Browser)],
            &[(Visit(V::Browser), "Chrome")],
        );
        let fields = Table::Browsers.fields();
        let chrome = decode(Table::Browsers, &encode(&["Chrome", "131"]));
        let day = jiff::civil::date(2025, 1, 2);
        let e = extra(&query, false, fields, &chrome, Sums::default(), day).expect("passes");
        assert_eq!(e.values, ["131", "Chrome"]);
        assert_eq!(e.day, None);
        let firefox = decode(Table::Browsers, "Firefox");
        assert_eq!(firefox, ["Firefox", ""]);
        assert!(extra(&query, true, fields, &firefox, Sums::default(), day).is_none());
    }
}
