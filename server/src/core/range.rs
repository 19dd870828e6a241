//! Date ranges of the dashboard and its JSON: named ranges ending today in the site's time
//! zone (`today`, `7d`, `30d`, `90d`, `365d`) or explicit `from`/`to` days.

use jiff::civil::Date;
use jiff::{Timestamp, ToSpan};

use super::day::SiteZone;

/// Longest range, in days.
pub const MAX_DAYS: i64 = 366;

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
