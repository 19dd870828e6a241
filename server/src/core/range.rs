//! Date ranges of the dashboard and its JSON: named ranges ending today in the site's time
//! zone (`today`, `7d`, `30d`, `90d`, `365d`) or explicit `from`/`to` days.

use jiff::civil::Date;
use jiff::{Timestamp, ToSpan};

use super::day::SiteZone;

/// Longest range, in days.
pub const MAX_DAYS: i64 = 366;

/// Longest range of the analytics API, in days (ten years).
pub const MAX_API_DAYS: i64 = 3660;

/// An inclusive range of local days.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DayRange {
    pub from: Date,
    pub to: Date,
}

/// Why a range was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error("range must be one of today, 7d, 30d, 90d, 365d")]
    Name,
    #[error("from and to must be dates (YYYY-MM-DD)")]
    Date,
    #[error("from must not be after to, and a range spans at most 366 days")]
    Span,
    #[error(
        "date_range must be day, Nd (7d, 28d, 30d, 91d…), month, Nmo (6mo, 12mo…), year, all, or [from, to]"
    )]
    Shortcut,
}

impl DayRange {
    /// The named range `name` ending on the site's today at `now`.
    pub fn named(name: &str, zone: &SiteZone, now: Timestamp) -> Result<Self, RangeError> {
        let days: i64 = match name {
            "today" => 1,
            "7d" => 7,
            "30d" => 30,
            "90d" => 90,
            "365d" => 365,
            _ => return Err(RangeError::Name),
        };
        let to = zone.day_of(now);
        let from = to
            .checked_sub((days - 1).days())
            .map_err(|_| RangeError::Span)?;
        Ok(Self { from, to })
    }

    /// An explicit range.
    pub fn explicit(from: &str, to: &str) -> Result<Self, RangeError> {
        let from: Date = from.parse().map_err(|_| RangeError::Date)?;
        let to: Date = to.parse().map_err(|_| RangeError::Date)?;
        let span = from.until(to).map_err(|_| RangeError::Span)?.get_days();
        if from > to || i64::from(span) >= MAX_DAYS {
            return Err(RangeError::Span);
        }
        Ok(Self { from, to })
    }

    /// A `date_range` shortcut of the analytics API, as Plausible reads it: `day` (today),
    /// `Nd` (the N days before today, today left out), `Nmo` (the N whole months before this
    /// one), `month` / `year` (this calendar month / year, to today), `all` (from `first`, the
    /// site's first day with data, to today).
    pub fn shortcut(
        name: &str,
        zone: &SiteZone,
        now: Timestamp,
        first: Option<Date>,
    ) -> Result<Self, RangeError> {
        let today = zone.day_of(now);
        let span = |from: Date, to: Date| {
            let days = from.until(to).map_err(|_| RangeError::Span)?.get_days();
            if from > to || i64::from(days) >= MAX_API_DAYS {
                return Err(RangeError::Span);
            }
            Ok(Self { from, to })
        };
        match name {
            "day" => span(today, today),
            "month" => span(today.first_of_month(), today),
            "year" => span(today.first_of_year(), today),
            "all" => span(first.unwrap_or(today).min(today), today),
            _ => {
                let (n, unit) = name
                    .find(|c: char| !c.is_ascii_digit())
                    .map(|i| name.split_at(i))
                    .ok_or(RangeError::Shortcut)?;
                let n: i32 = n.parse().map_err(|_| RangeError::Shortcut)?;
                if n < 1 {
                    return Err(RangeError::Shortcut);
                }
                match unit {
                    "d" => {
                        let to = today.yesterday().map_err(|_| RangeError::Span)?;
                        let from = today.checked_sub(n.days()).map_err(|_| RangeError::Span)?;
                        span(from, to)
                    }
                    "mo" => {
                        let this = today.first_of_month();
                        let from = this.checked_sub(n.months()).map_err(|_| RangeError::Span)?;
                        span(from, this.yesterday().map_err(|_| RangeError::Span)?)
                    }
                    _ => Err(RangeError::Shortcut),
                }
            }
        }
    }

    /// An explicit range of the analytics API (up to [`MAX_API_DAYS`]).
    pub fn explicit_api(from: Date, to: Date) -> Result<Self, RangeError> {
        let days = from.until(to).map_err(|_| RangeError::Span)?.get_days();
        if from > to || i64::from(days) >= MAX_API_DAYS {
            return Err(RangeError::Span);
        }
        Ok(Self { from, to })
    }

    /// Every day of the range, oldest first.
    pub fn days(&self) -> Vec<Date> {
        let mut out = Vec::new();
        let mut d = self.from;
        while d <= self.to && out.len() < MAX_DAYS as usize {
            out.push(d);
            match d.tomorrow() {
                Ok(next) => d = next,
                Err(_) => break,
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_ranges_end_today_in_the_site_zone() {
        let zone = SiteZone::parse("Asia/Tokyo").expect("zone");
        let now: Timestamp = "2026-03-01T16:00:00Z".parse().expect("ts"); // 01:00 on 2 March in Tokyo
        let r = DayRange::named("7d", &zone, now).expect("range");
        assert_eq!(
            (r.from.to_string(), r.to.to_string()),
            ("2026-02-24".into(), "2026-03-02".into())
        );
        assert_eq!(r.days().len(), 7);
        assert_eq!(
            DayRange::named("today", &zone, now)
                .expect("r")
                .days()
                .len(),
            1
        );
        assert_eq!(DayRange::named("2w", &zone, now), Err(RangeError::Name));
    }

    #[test]
    fn shortcuts_read_as_plausible_reads_them() {
        let zone = SiteZone::utc();
        let now: Timestamp = "2026-03-15T12:00:00Z".parse().expect("ts");
        let r = |name| {
            DayRange::shortcut(name, &zone, now, Some(jiff::civil::date(2025, 1, 10)))
                .map(|r| (r.from.to_string(), r.to.to_string()))
        };
        let pair = |a: &str, b: &str| Ok((a.to_owned(), b.to_owned()));
        assert_eq!(r("day"), pair("2026-03-15", "2026-03-15"));
        assert_eq!(r("7d"), pair("2026-03-08", "2026-03-14"), "today left out");
        assert_eq!(r("month"), pair("2026-03-01", "2026-03-15"));
        assert_eq!(r("6mo"), pair("2025-09-01", "2026-02-28"));
        assert_eq!(r("year"), pair("2026-01-01", "2026-03-15"));
        assert_eq!(r("all"), pair("2025-01-10", "2026-03-15"));
        assert_eq!(r("0d"), Err(RangeError::Shortcut));
        assert_eq!(r("7w"), Err(RangeError::Shortcut));
        assert_eq!(r("99999d"), Err(RangeError::Span));
    }

    #[test]
    fn explicit_ranges_are_checked() {
        assert!(DayRange::explicit("2026-01-01", "2026-01-31").is_ok());
        assert_eq!(
            DayRange::explicit("2026-02-01", "2026-01-31"),
            Err(RangeError::Span)
        );
        assert_eq!(
            DayRange::explicit("2025-01-01", "2026-06-01"),
            Err(RangeError::Span)
        );
        assert_eq!(
            DayRange::explicit("yesterday", "2026-01-31"),
            Err(RangeError::Date)
        );
    }
}
