//! What a report says: views, visitors and visits of a site over one period, its top pages
//! and top sources, each against the previous period of the same kind, as plain text and as
//! HTML (an askama template, auto-escaped, inline styles only, no external assets).
//!
//! Views and visitors are the dashboard's numbers (the larger of web and badge, see
//! `core::counts`); visits come from raw events, so days past the raw-event retention count
//! none, which the report says.

use askama::Template;

use crate::core::counts::combine;
use crate::core::period::Period;
use crate::core::site::Site;
use crate::store::{Store, StoreError};

/// Rows of each top list.
const TOP: u32 = 10;
/// Rows of the previous period searched for a top row's earlier number.
const EARLIER: u32 = 200;

/// One number now and in the previous period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    pub now: u64,
    pub before: u64,
}

impl Change {
    /// `+25 %`, `-10 %`, `±0 %`, or `new` when there was nothing before.
    pub fn percent(&self) -> String {
        if self.before == 0 {
            return if self.now == 0 {
                "±0 %".into()
            } else {
                "new".into()
            };
        }
        let pct = (self.now as f64 - self.before as f64) * 100.0 / self.before as f64;
        match pct.round() as i64 {
            0 => "±0 %".into(),
            p if p > 0 => format!("+{p} %"),
            p => format!("{p} %"),
        }
    }
}

/// One row of a top list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopRow {
    pub name: String,
    pub views: Change,
}

/// A report's numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub site: String,
    pub zone: String,
    pub period: Period,
    pub previous: Period,
    pub views: Change,
    pub visitors: Change,
    pub visits: Change,
    pub pages: Vec<TopRow>,
    pub sources: Vec<TopRow>,
}

impl Summary {
    /// Read the numbers of `period` and of the one before it.
    pub async fn gather(
        store: &dyn Store,
        site: &Site,
        period: Period,
    ) -> Result<Self, StoreError> {
        let previous = period.previous();
        let totals = |p: Period| async move {
            let n = combine(store.range_totals(&site.id, p.first, p.last).await?);
            let v = store.visits(&site.id, p.first, p.last).await?;
            Ok::<_, StoreError>((n, v.web.max(v.badge)))
        };
        let ((now, visits_now), (before, visits_before)) =
            (totals(period).await?, totals(previous).await?);
        let pages_now = store
            .top_pages(&site.id, period.first, period.last, TOP)
            .await?;
        let pages_before = store
            .top_pages(&site.id, previous.first, previous.last, EARLIER)
            .await?;
        let pages = pages_now
            .into_iter()
            .map(|p| TopRow {
                views: Change {
                    now: combine(p.numbers).views,
                    before: pages_before
                        .iter()
                        .find(|b| b.page == p.page)
                        .map_or(0, |b| combine(b.numbers).views),
                },
                name: crate::core::display::display_path(&p.page),
            })
            .collect();
        let sources_now = store
            .top_referrers(&site.id, period.first, period.last, TOP)
            .await?;
        let sources_before = store
            .top_referrers(&site.id, previous.first, previous.last, EARLIER)
            .await?;
        let sources = sources_now
            .into_iter()
            .map(|r| TopRow {
                views: Change {
                    now: r.views,
                    before: sources_before
                        .iter()
                        .find(|b| b.host == r.host)
                        .map_or(0, |b| b.views),
                },
                name: r.host,
            })
            .collect();
        Ok(Self {
            site: site.id.to_string(),
            zone: site.zone.name().to_owned(),
            period,
            previous,
            views: Change {
                now: now.views,
                before: before.views,
            },
            visitors: Change {
                now: now.visitors,
                before: before.visitors,
            },
            visits: Change {
                now: visits_now,
                before: visits_before,
            },
            pages,
            sources,
        })
    }

    /// The subject line.
    pub fn subject(&self) -> String {
        format!("Tally: {}, {}", self.site, self.period.title())
    }

    /// The plain-text part.
    pub fn text(&self) -> String {
        let mut out = format!(
            "{}\n{} to {} ({}), against {} to {}\n\n",
            self.subject(),
            self.period.first,
            self.period.last,
            self.zone,
            self.previous.first,
            self.previous.last
        );
        for (label, c) in self.totals() {
            out.push_str(&format!(
                "{label:<10}{:>10}  {:>7}  (was {})\n",
                c.now,
                c.percent(),
                c.before
            ));
        }
        for (title, rows) in self.lists() {
            out.push_str(&format!("\n{title} (views)\n"));
            if rows.is_empty() {
                out.push_str("  none\n");
            }
            for r in rows {
                out.push_str(&format!(
                    "{:>8}  {:>7}  {}\n",
                    r.views.now,
                    r.views.percent(),
                    r.name
                ));
            }
        }
        out.push_str(&format!("\n{NOTE}\n"));
        out
    }

    /// The HTML part.
    pub fn html(&self) -> Result<String, askama::Error> {
        ReportHtml {
            s: self,
            note: NOTE,
        }
        .render()
    }

    /// (title, rows) of the two top lists, in the report's order.
    pub fn lists(&self) -> [(&'static str, &[TopRow]); 2] {
        [("Top pages", &self.pages), ("Top sources", &self.sources)]
    }

    /// (label, numbers) of the three totals, in the report's order.
    pub fn totals(&self) -> [(&'static str, Change); 3] {
        [
            ("Views", self.views),
            ("Visitors", self.visitors),
            ("Visits", self.visits),
        ]
    }
}

/// What every report says about its numbers.
const NOTE: &str = "Visits are one visitor's page views with gaps of at most 30 minutes, \
                    counted from raw events: days past the raw-event retention count none. \
                    Top sources are referring hosts.";

#[derive(Template)]
#[template(path = "report.html")]
struct ReportHtml<'a> {
    s: &'a Summary,
    note: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_html_part_escapes_what_visitors_sent() {
        let period = Period::last_complete(
            crate::core::period::Every::Week,
            jiff::civil::date(2026, 12, 3),
        );
        let row = |name: &str| TopRow {
            name: name.into(),
            views: Change { now: 2, before: 1 },
        };
        let s = Summary {
            site: "blog".into(),
            zone: "UTC".into(),
            period,
            previous: period.previous(),
            views: Change { now: 4, before: 2 },
            visitors: Change { now: 2, before: 1 },
            visits: Change { now: 3, before: 1 },
            pages: vec![row("/<script>alert(1)</script>")],
            sources: vec![row("evil.example\"><img src=x>")],
        };
        let html = s.html().expect("render");
        assert!(
            !html.contains("<script>") && !html.contains("<img"),
            "{html}"
        );
        assert!(html.contains("&#60;script&#62;"), "{html}");
        assert!(
            s.text().contains("/<script>alert(1)</script>"),
            "plain text stays as sent"
        );
    }

    #[test]
    fn changes_read_as_percentages() {
        assert_eq!(
            Change {
                now: 50,
                before: 40
            }
            .percent(),
            "+25 %"
        );
        assert_eq!(
            Change {
                now: 30,
                before: 40
            }
            .percent(),
            "-25 %"
        );
        assert_eq!(Change { now: 3, before: 0 }.percent(), "new");
        assert_eq!(Change { now: 0, before: 0 }.percent(), "±0 %");
    }
}
